"""SpecDrop's pure math: the merge formula, its invariants, tag checks, and the baselines' routers."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.specdrop import (
    branch_of_category,
    diagonal_dominance,
    grouped_sensitivity,
    load_balancing_loss,
    per_category_mean,
    router_entropy,
    sensitivity_matrix,
    soft_moe_weights,
    specdrop_denominator,
    specdrop_dropout_weights,
    specdrop_merge,
    specdrop_weights,
    specialization_gap,
    topk_routing,
    uniform_weights,
    weighted_branch_sum,
)


def test_merge_formula_hand_case():
    # K = 3 constant branches f_k = k + 1, p_a = 1, p_i = 0.25, D = 1.5.
    outs = [torch.full((2, 4), float(k + 1)) for k in range(3)]
    y = specdrop_merge(outs, torch.tensor([0, 2]), p_active=1.0, p_inactive=0.25)
    assert specdrop_denominator(3, 1.0, 0.25) == 1.5
    torch.testing.assert_close(y[0], torch.full((4,), (1 * 1 + 0.25 * 2 + 0.25 * 3) / 1.5))
    torch.testing.assert_close(y[1], torch.full((4,), (0.25 * 1 + 0.25 * 2 + 1 * 3) / 1.5))


def test_merge_matches_direct_formula_random():
    torch.manual_seed(0)
    k, p_a, p_i = 5, 0.8, 0.05
    outs = torch.randn(k, 6, 3, 7)
    category = torch.randint(0, k, (6,))
    expected = torch.stack([
        sum((p_a if j == int(category[b]) else p_i) * outs[j, b] for j in range(k)) / (p_a + (k - 1) * p_i)
        for b in range(6)
    ])
    torch.testing.assert_close(specdrop_merge(outs, category, p_a, p_i), expected)


def test_per_token_tags_broadcast():
    outs = torch.randn(2, 3, 5, 4)  # K=2, (B=3, T=5, H=4)
    category = torch.randint(0, 2, (3, 5))
    y = specdrop_merge(outs, category, 1.0, 0.1)
    w = specdrop_weights(category, 2, 1.0, 0.1)
    torch.testing.assert_close(y, (w[..., None] * outs).sum(0))


@pytest.mark.parametrize("k,p_a,p_i", [(2, 1.0, 0.1), (3, 0.9, 0.3), (7, 1.0, 0.01), (20, 2.0, 0.5)])
def test_uniform_categories_give_one_over_k(k, p_a, p_i):
    weights = specdrop_weights(torch.arange(k), k, p_a, p_i)  # (K branches, K categories)
    torch.testing.assert_close(weights.sum(0), torch.ones(k))  # single-branch scale per sample
    torch.testing.assert_close(weights.mean(1), torch.full((k,), 1.0 / k))  # each branch carries 1/K


def test_uniform_categories_with_map_give_one_over_k():
    mapping = [c // 4 for c in range(20)]  # 20 categories, 5 branches, 4 each
    weights = specdrop_weights(torch.arange(20), 5, 1.0, 0.1, mapping)
    torch.testing.assert_close(weights.mean(1), torch.full((5,), 0.2))


@pytest.mark.parametrize("k", [3, 4])
def test_equal_weights_are_no_routing_exactly(k):
    torch.manual_seed(1)
    outs = torch.randn(k, 8, 16)
    category = torch.randint(0, k, (8,))
    spec = specdrop_merge(outs, category, p_active=0.3, p_inactive=0.3)
    no_routing = weighted_branch_sum(outs, uniform_weights(k, (8,)))
    assert torch.equal(spec, no_routing)
    assert torch.equal(specdrop_weights(category, k, 0.3, 0.3), uniform_weights(k, (8,)))
    if k == 4:  # 1/4 is exact in binary, so the weighted sum is the plain mean bit for bit
        assert torch.equal(spec, outs.mean(0))
    else:
        torch.testing.assert_close(spec, outs.mean(0))


@pytest.mark.parametrize(
    "category,match",
    [
        (torch.tensor([0, 3]), r"contains 3, expected tags in \[0, 3\)"),
        (torch.tensor([0, -1]), "missing category tag"),
        (torch.tensor([0.0, 1.0]), "integer tags"),
    ],
)
def test_bad_tags_raise(category, match):
    with pytest.raises(ValueError, match=match):
        specdrop_merge(torch.randn(3, 2, 4), category, 1.0, 0.1)


def test_missing_tag_none_raises():
    with pytest.raises(ValueError, match="category` is None"):
        specdrop_merge(torch.randn(3, 2, 4), None, 1.0, 0.1)


def test_category_map_checks():
    assert branch_of_category(torch.tensor([0, 5, 9]), 2, [0] * 5 + [1] * 5).tolist() == [0, 1, 1]
    with pytest.raises(ValueError, match="maps only 10 categories"):
        branch_of_category(torch.tensor([10]), 2, [0] * 5 + [1] * 5)
    with pytest.raises(ValueError, match=r"names a branch outside \[0, 2\)"):
        branch_of_category(torch.tensor([0]), 2, [0, 2])


@pytest.mark.parametrize("p_a,p_i,match", [(1.0, 0.0, "hard routing"), (0.0, 0.0, "p_active"), (0.1, 0.5, "exceeds")])
def test_bad_weights_raise(p_a, p_i, match):
    with pytest.raises(ValueError, match=match):
        specdrop_weights(torch.tensor([0]), 3, p_a, p_i)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="leading shape"):
        specdrop_merge(torch.randn(3, 4, 5), torch.tensor([0, 1]), 1.0, 0.1)


def test_stochastic_variant_has_the_deterministic_expectation():
    category = torch.tensor([0, 1, 2]).repeat(4000)
    g = torch.Generator().manual_seed(0)
    masks = specdrop_dropout_weights(category, 3, 0.9, 0.2, generator=g)
    denominator = specdrop_denominator(3, 0.9, 0.2)
    assert set(torch.unique(masks * denominator).tolist()) <= {0.0, 1.0}
    torch.testing.assert_close(masks.view(3, -1, 3).mean(1), specdrop_weights(torch.arange(3), 3, 0.9, 0.2),
                               atol=0.02, rtol=0)
    with pytest.raises(ValueError, match="<= 1"):
        specdrop_dropout_weights(category, 3, 2.0, 0.2)


def test_load_balancing_loss_hand_case():
    probs = torch.tensor([[0.7, 0.3], [0.6, 0.4]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # both routed to expert 0: f = (1, 0), P = (0.65, 0.35)
    assert load_balancing_loss(probs, mask).item() == pytest.approx(2 * 0.65)
    uniform = torch.full((4, 4), 0.25)
    assert load_balancing_loss(uniform, torch.eye(4)).item() == pytest.approx(1.0)
    collapsed = torch.zeros(4, 4)
    collapsed[:, 0] = 1.0
    assert load_balancing_loss(collapsed, collapsed).item() == pytest.approx(4.0)


def test_topk_routing():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, probs, mask = topk_routing(logits, 2)
    assert mask.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))
    torch.testing.assert_close(weights[0, :2], probs[0, :2] / probs[0, :2].sum())
    with pytest.raises(ValueError, match="router_top_k"):
        topk_routing(logits, 5)
    assert router_entropy(torch.full((3, 4), 0.25)).item() == pytest.approx(math.log(4))


def test_soft_moe_weights_normalise_over_tokens_and_slots():
    dispatch, combine = soft_moe_weights(torch.randn(2, 5, 3))
    torch.testing.assert_close(dispatch.sum(1), torch.ones(2, 3))
    torch.testing.assert_close(combine.sum(2), torch.ones(2, 5))


def test_sensitivity_constructed_case():
    # 3 categories, 3 branches: category c loses 0.5 without its own branch, 0.05 without another.
    base = torch.tensor([0.9, 0.8, 0.7], dtype=torch.float64)
    ablated = base.repeat(3, 1) - 0.05
    ablated[torch.arange(3), torch.arange(3)] = base - 0.5
    s = sensitivity_matrix(base, ablated)
    torch.testing.assert_close(torch.diagonal(s), torch.full((3,), 0.5, dtype=torch.float64))
    assert diagonal_dominance(s) == 1.0
    assert specialization_gap(s) == pytest.approx(0.45)
    s[2] = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)  # row 2 no longer dominant
    assert diagonal_dominance(s) == pytest.approx(2 / 3)


def test_grouped_sensitivity_with_map():
    # 4 categories on 2 branches; categories 0, 1 -> branch 0; 2, 3 -> branch 1.
    s = torch.tensor([[0.4, 0.0], [0.2, 0.1], [0.0, 0.3], [0.1, 0.5]], dtype=torch.float64)
    mapping = [0, 0, 1, 1]
    torch.testing.assert_close(grouped_sensitivity(s, mapping),
                               torch.tensor([[0.3, 0.05], [0.05, 0.4]], dtype=torch.float64))
    assert diagonal_dominance(s, mapping) == 1.0
    assert diagonal_dominance(s, mapping, per_category=True) == 1.0
    s[1] = torch.tensor([0.1, 0.2], dtype=torch.float64)
    assert diagonal_dominance(s, mapping, per_category=True) == 0.75
    with pytest.raises(ValueError, match="category_to_branch"):
        grouped_sensitivity(s)


def test_per_category_mean():
    sums, counts = per_category_mean(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 2, 2]), 3)
    assert sums.tolist() == [1.0, 0.0, 2.0] and counts.tolist() == [2.0, 0.0, 2.0]


def test_hard_routing_is_one_hot_on_the_category_branch():
    from lit_lowrank.ops.specdrop import hard_routing_weights

    w = hard_routing_weights(torch.tensor([0, 3, 5]), 3, category_to_branch=[0, 0, 1, 1, 2, 2])
    assert torch.equal(w, torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


def test_renormalise_without_keeps_the_total_and_zeroes_lost_positions():
    from lit_lowrank.ops.specdrop import renormalise_without

    w = specdrop_weights(torch.tensor([0, 1, 2, 0]), 3, 1.0, 0.1)
    r = renormalise_without(w, 0)
    assert torch.all(r[0] == 0)
    torch.testing.assert_close(r.sum(0), w.sum(0))
    torch.testing.assert_close(r[1] / r[2], w[1] / w[2])  # the others keep their ratios
    hard = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # position 0 had all its weight on branch 0
    assert torch.equal(renormalise_without(hard, 0), torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="`branch`=3"):
        renormalise_without(w, 3)


def test_mutual_information_loss_hand_cases():
    from lit_lowrank.ops.specdrop import mutual_information_loss

    category = torch.tensor([0, 0, 1, 1, 2, 2])
    specialised = torch.nn.functional.one_hot(category, 3).float()  # category t always on expert t
    assert float(mutual_information_loss(specialised, category, 3)) == pytest.approx(-math.log(3), rel=1e-5)
    uniform = torch.full((6, 3), 1 / 3)
    assert float(mutual_information_loss(uniform, category, 3)) == pytest.approx(0.0, abs=1e-6)
    tokens = specialised[:, None].expand(6, 4, 3)  # per-token probabilities with per-sample tags
    assert float(mutual_information_loss(tokens, category, 3)) == pytest.approx(-math.log(3), rel=1e-5)
