"""SD-LoRA math: graph construction, relations, PPA on a hand case, the Tip-Adapter cache formula."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lit_lowrank.ops.sd_lora import (
    EDGE_TYPES,
    NODE_TYPES,
    build_hetero_graph,
    class_prototypes,
    fit_tip_adapter_f,
    logit_distillation_loss,
    prototype_predictive_alignment,
    quadrant_crop_mask,
    relation_agreement,
    relation_distillation_loss,
    relation_matrices,
    search_tip_hparams,
    tip_adapter_logits,
)


def _inputs(b=2, p=16, k=4, c=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, p, d, generator=g), torch.randn(b, d, generator=g), torch.randn(b, k, d, generator=g),
            torch.randn(c, d, generator=g))


def test_quadrant_mask_covers_each_quadrant():
    mask = quadrant_crop_mask(4)
    assert mask.shape == (4, 16) and mask.sum(1).tolist() == [4, 4, 4, 4]
    assert mask.any(0).all() and (mask.sum(0) == 1).all()  # even grid: every patch in exactly one quadrant
    assert mask[0].view(4, 4)[:2, :2].all() and mask[3].view(4, 4)[2:, 2:].all()
    odd = quadrant_crop_mask(7)
    assert (odd.sum(0) >= 1).all() and odd.sum(0).max() == 4  # the centre patch lies in all four halves
    assert quadrant_crop_mask(4, crops=5).shape == (5, 16)
    with pytest.raises(ValueError, match="crops"):
        quadrant_crop_mask(4, crops=3)


def test_graph_node_and_edge_types_and_counts():
    b, p, k, c, pk = 2, 16, 4, 5, 3
    patches, glob, local, text = _inputs(b, p, k, c)
    mask = quadrant_crop_mask(4)
    graph = build_hetero_graph(patches, glob, local, text, mask, patch_k=pk)
    n = p + 1 + k + c
    assert graph.x.shape == (b, n, 8)
    assert graph.node_counts() == {"patch": p, "global": 1, "local": k, "text": c}
    assert [NODE_TYPES[t] for t in graph.node_type[p:p + 2].tolist()] == ["global", "local"]
    counts = graph.edge_counts()
    assert counts == {
        "self": b * n,
        "patch-patch": b * p * pk,
        "global-patch": 2 * b * p,
        "local-patch": 2 * b * int(mask.sum()),
        "global-local": 2 * b * k,
        "visual-text": 2 * b * (p + 1 + k) * c,
    }
    assert int(graph.adjacency.sum()) == sum(counts.values())
    # no text-text edges except self loops, and the text nodes carry the shared class embeddings
    text_block = graph.edge_type[:, -c:, -c:]
    assert (text_block[:, ~torch.eye(c, dtype=torch.bool)] == -1).all()
    torch.testing.assert_close(graph.x[1, -c:], text)
    # patch-patch edges go to the k most cosine-similar other patches
    unit = F.normalize(patches[0], dim=-1)
    sim = unit @ unit.T - 10 * torch.eye(p)
    expected = sim.topk(pk, dim=-1).indices.sort(-1).values
    got = (graph.edge_type[0, :p, :p] == EDGE_TYPES.index("patch-patch")).nonzero()[:, 1].view(p, pk).sort(-1).values
    assert torch.equal(got, expected)
    # local-patch edges follow the crop mask (in both directions)
    lp = graph.edge_type[0, p + 1:p + 1 + k, :p] == EDGE_TYPES.index("local-patch")
    assert torch.equal(lp, mask) and torch.equal(graph.edge_type[0, :p, p + 1:p + 1 + k] == 3, mask.T)
    source, target = graph.edge_index(0)[0]
    assert source.shape == target.shape and source.numel() == sum(counts.values()) // b


def test_graph_rejects_bad_shapes():
    patches, glob, local, text = _inputs()
    with pytest.raises(ValueError, match="patch_k"):
        build_hetero_graph(patches, glob, local, text, quadrant_crop_mask(4), patch_k=16)
    with pytest.raises(ValueError, match="crop_patch_mask"):
        build_hetero_graph(patches, glob, local, text, quadrant_crop_mask(4, crops=5))


def test_ppa_hand_case():
    # f = e1, prototypes e1, e2 -> cosines (1, 0); teacher logits (0, 0); tau = 1
    f = torch.tensor([[1.0, 0.0]])
    protos = torch.eye(2)
    z = torch.zeros(1, 2)
    p = torch.tensor([math.e, 1.0]) / (math.e + 1)  # softmax(1, 0)
    expected = float((p * (p / 0.5).log()).sum())     # KL(p || uniform)
    assert prototype_predictive_alignment(f, protos, z, tau=1.0).item() == pytest.approx(expected, rel=1e-6)
    # tau = 0.5 sharpens both sides; teacher (0, ln 3) -> q = (1/4, 3/4)
    z2 = torch.tensor([[0.0, math.log(3.0)]]) * 0.5
    p2 = torch.tensor([math.e ** 2, 1.0]) / (math.e ** 2 + 1)
    q2 = torch.tensor([0.25, 0.75])
    expected2 = float((p2 * (p2 / q2).log()).sum())
    assert prototype_predictive_alignment(f, protos, z2, tau=0.5).item() == pytest.approx(expected2, rel=1e-5)
    # zero when the student's prototype prediction equals the teacher's; the teacher gets no gradient
    z3 = (f @ protos.T).clone().requires_grad_(True)
    assert prototype_predictive_alignment(f, protos, z3, tau=0.3).item() == pytest.approx(0.0, abs=1e-7)
    prototype_predictive_alignment(f.requires_grad_(True), protos, z3, tau=0.3).backward()
    assert z3.grad is None


def test_relations_and_distillation():
    patches, _, _, text = _inputs(b=2, p=6, c=3)
    pp, pt = relation_matrices(patches, text, tau=0.1)
    assert pp.shape == (2, 6, 6) and pt.shape == (2, 6, 3)
    torch.testing.assert_close(pp.sum(-1), torch.ones(2, 6))
    assert relation_distillation_loss((pp, pt), (pp, pt)).item() == pytest.approx(0.0, abs=1e-6)
    assert relation_agreement(pt, pt).item() == pytest.approx(1.0)
    other = relation_matrices(torch.randn(2, 6, 8), text, tau=0.1)
    assert relation_distillation_loss((pp, pt), other).item() > 0.01
    assert relation_agreement(pt, other[1]).item() < 1.0


def test_class_prototypes():
    feats = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    protos, present = class_prototypes(feats, torch.tensor([0, 0, 2]), 3)
    torch.testing.assert_close(protos[0], torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(protos[2], torch.tensor([0.0, 1.0]))
    assert present.tolist() == [True, False, True]


def test_cache_classifier_matches_tip_adapter_formula():
    g = torch.Generator().manual_seed(1)
    f = F.normalize(torch.randn(7, 6, generator=g), dim=-1)
    wc = F.normalize(torch.randn(3, 6, generator=g), dim=-1)
    keys = F.normalize(torch.randn(9, 6, generator=g), dim=-1)
    labels = torch.arange(9) % 3
    values = F.one_hot(labels, 3).float()
    alpha, beta = 1.7, 5.5
    got = tip_adapter_logits(f, wc, keys, values, alpha, beta)
    # element-wise: 100 <f, w_c> + alpha * sum_{m: y_m = c} exp(-beta (1 - <f, k_m>))
    for i in range(7):
        for c in range(3):
            cache = sum(math.exp(-beta * (1 - float(f[i] @ keys[m]))) for m in range(9) if labels[m] == c)
            assert got[i, c].item() == pytest.approx(100 * float(f[i] @ wc[c]) + alpha * cache, rel=1e-5)
    assert torch.equal(tip_adapter_logits(f, wc, keys, values, 0.0, beta, logit_scale=10.0), 10.0 * f @ wc.T)


def test_tip_search_and_finetune_improve_support_fit():
    g = torch.Generator().manual_seed(2)
    centres = F.normalize(torch.randn(3, 8, generator=g), dim=-1)
    y = torch.arange(30) % 3
    f = F.normalize(centres[y] + 0.4 * torch.randn(30, 8, generator=g), dim=-1)
    wc = F.normalize(torch.randn(3, 8, generator=g), dim=-1)  # useless text weights: the cache must carry it
    keys, values = f[:9], F.one_hot(y[:9], 3).float()
    alpha, beta, acc = search_tip_hparams(f[9:], y[9:], wc, keys, values, logit_scale=10.0)
    zero_shot = float(((f[9:] @ wc.T).argmax(-1) == y[9:]).float().mean())
    assert acc > zero_shot and alpha > 0
    before = F.cross_entropy(tip_adapter_logits(f, wc, keys, values, alpha, beta, 10.0), y)
    tuned = fit_tip_adapter_f(f, y, wc, keys, values, alpha, beta, 10.0, steps=30, lr=1e-2)
    after = F.cross_entropy(tip_adapter_logits(f, wc, tuned, values, alpha, beta, 10.0), y)
    assert after < before
    torch.testing.assert_close(tuned.norm(dim=-1), torch.ones(9))


def test_shuffled_graph_keeps_the_edge_counts_and_drops_the_structure():
    b, p, k, c, pk = 3, 16, 4, 5, 3
    patches, glob, local, text = _inputs(b, p, k, c)
    mask = quadrant_crop_mask(4)
    knn = build_hetero_graph(patches, glob, local, text, mask, patch_k=pk)
    shuffled = build_hetero_graph(patches, glob, local, text, mask, patch_k=pk, structure="shuffled",
                                  generator=torch.Generator().manual_seed(0))
    assert shuffled.edge_counts() == knn.edge_counts()
    pp = EDGE_TYPES.index("patch-patch")
    assert not torch.equal(shuffled.edge_type[:, :p, :p] == pp, knn.edge_type[:, :p, :p] == pp)
    assert ((shuffled.edge_type[:, :p, :p] == pp).sum(-1) == pk).all()  # still k neighbours, never itself
    assert not (shuffled.edge_type[:, :p, :p].diagonal(dim1=1, dim2=2) == pp).any()
    lp = shuffled.edge_type[:, p + 1:p + 1 + k, :p] == EDGE_TYPES.index("local-patch")
    assert (lp.sum(-1) == mask.sum(-1)).all() and not torch.equal(lp, mask.expand_as(lp))
    again = build_hetero_graph(patches, glob, local, text, mask, patch_k=pk, structure="shuffled",
                               generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.edge_type, shuffled.edge_type)  # seeded
    with pytest.raises(ValueError, match="structure"):
        build_hetero_graph(patches, glob, local, text, mask, structure="random")


def test_logit_distillation_is_hintons_kd_with_a_detached_teacher():
    g = torch.Generator().manual_seed(0)
    student = torch.randn(4, 5, generator=g, requires_grad=True)
    teacher = torch.randn(4, 5, generator=g, requires_grad=True)
    tau = 2.0
    loss = logit_distillation_loss(student, teacher, tau)
    q = (teacher / tau).softmax(-1)
    expected = tau**2 * F.kl_div((student / tau).log_softmax(-1), q, reduction="batchmean")
    assert torch.allclose(loss, expected, atol=1e-6)
    loss.backward()
    assert teacher.grad is None and student.grad.abs().sum() > 0
    # the gradient is tau * (softmax(z_s/tau) - softmax(z_t/tau)) / B
    assert torch.allclose(student.grad, tau * ((student / tau).softmax(-1) - q).detach() / 4, atol=1e-6)
    assert float(logit_distillation_loss(teacher.detach(), teacher.detach(), tau)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="tau"):
        logit_distillation_loss(student, teacher, 0.0)
    with pytest.raises(ValueError, match="same"):
        logit_distillation_loss(student, teacher[:, :3])
