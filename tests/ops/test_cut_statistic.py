"""Cut edge weight statistic: clustered labels are significant, random ones are not,
and the closed-form moments match sampling under the null hypothesis."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.ops.cut_statistic import cut_statistic, knn_graph
from lit_lowrank.ops.information_maximization import centroid_pseudo_labels, information_maximization_loss


def _blobs(n_per=40, classes=3, dim=5, spread=0.2, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=g) * 3
    y = torch.arange(classes).repeat_interleave(n_per)
    x = centers[y] + spread * torch.randn(len(y), dim, generator=g)
    return x, y


def test_clustered_labels_give_strongly_negative_z():
    x, y = _blobs()
    stat = cut_statistic(x, y, k=8)
    assert stat.z_global < -8
    assert (stat.z < -2).float().mean() > 0.95
    assert torch.all(stat.cut == 0)


def test_random_labels_give_z_near_zero():
    x, _ = _blobs()
    zs = []
    for seed in range(30):
        y = torch.randint(0, 3, (x.shape[0],), generator=torch.Generator().manual_seed(seed))
        zs.append(float(cut_statistic(x, y, k=8).z_global))
    zs = torch.tensor(zs)
    assert abs(zs.mean()) < 0.6 and 0.5 < zs.std() < 1.6


def test_wrong_labels_on_a_few_samples_are_flagged_locally():
    x, y = _blobs()
    noisy = y.clone()
    flipped = torch.tensor([0, 50, 100])
    noisy[flipped] = (noisy[flipped] + 1) % 3
    z = cut_statistic(x, noisy, k=8).z
    assert torch.all(z[flipped] > 2) and z[flipped].min() > z.median()


def test_global_moments_match_iid_sampling():
    """E and Var of the global cut weight against Monte Carlo under iid labels."""
    x, _ = _blobs(n_per=20)
    w = knn_graph(x, 5, weighting="cosine")
    pi = torch.tensor([0.5, 0.3, 0.2])
    g = torch.Generator().manual_seed(0)
    n = x.shape[0]
    samples = []
    for _ in range(4000):
        y = torch.multinomial(pi, n, replacement=True, generator=g)
        samples.append(float((w * (y[:, None] != y[None, :]).float()).sum() / 2))
    samples = torch.tensor(samples, dtype=torch.float64)
    q = 1 - (pi * pi).sum()
    sum_w, sum_w2 = w.sum() / 2, (w * w).sum() / 2
    deg = w.sum(1)
    var = q * (1 - q) * sum_w2 + ((pi * (1 - pi) ** 2).sum() - q * q) * ((deg * deg).sum() - 2 * sum_w2)
    assert float(samples.mean()) == pytest.approx(float(q * sum_w), rel=0.01)
    assert float(samples.var()) == pytest.approx(float(var), rel=0.08)


def test_global_z_matches_permutation_estimate():
    x, y = _blobs(n_per=30)
    w = knn_graph(x, 6)
    noisy = y.clone()
    noisy[::4] = (noisy[::4] + 1) % 3
    observed = float((w * (noisy[:, None] != noisy[None, :]).float()).sum() / 2)
    g = torch.Generator().manual_seed(1)
    perms = torch.tensor([float((w * (p[:, None] != p[None, :]).float()).sum() / 2)
                          for p in (noisy[torch.randperm(len(noisy), generator=g)] for _ in range(3000))])
    z_perm = (observed - perms.mean()) / perms.std()
    assert float(cut_statistic(None, noisy, weights=w).z_global) == pytest.approx(float(z_perm), rel=0.1)


def test_knn_graph_is_symmetric_without_self_loops():
    x, _ = _blobs(n_per=10)
    w = knn_graph(x, 3)
    assert torch.equal(w, w.T) and torch.all(w.diagonal() == 0)
    assert torch.all(w.sum(1) >= 3)


def test_errors_name_the_parameter():
    x, y = _blobs(n_per=5)
    with pytest.raises(ValueError, match="`k`=15"):
        cut_statistic(x, y, k=15)
    with pytest.raises(ValueError, match="`labels` must be"):
        cut_statistic(x, y[:, None])
    with pytest.raises(ValueError, match="rows"):
        cut_statistic(x, y[:-1])
    with pytest.raises(ValueError, match="weighting"):
        knn_graph(x, 3, weighting="rbf")


def test_information_maximization_prefers_confident_diverse_predictions():
    confident_diverse = torch.eye(4) * 20
    confident_collapsed = torch.zeros(4, 4)
    confident_collapsed[:, 0] = 10
    uniform = torch.zeros(4, 4)
    losses = [float(information_maximization_loss(z)) for z in (confident_diverse, confident_collapsed, uniform)]
    assert losses[0] == pytest.approx(-torch.log(torch.tensor(4.0)).item(), abs=1e-3)
    assert losses[0] < losses[1] and losses[0] < losses[2]


def test_centroid_pseudo_labels_fix_a_wrong_prediction():
    x, y = _blobs()
    logits = torch.nn.functional.one_hot(y, 3).float() * 4
    logits[0] = torch.tensor([0.0, 4.0, 0.0])  # sample 0 predicted wrongly
    assert torch.equal(centroid_pseudo_labels(x, logits), y)


def test_gate_direction_strength_and_suppression():
    from lit_lowrank.ops.safecut_gate import safecut_gate

    z_source = torch.tensor([2.0, -3.0, 0.5, -2.0, -2.0])
    z_second = torch.tensor([-3.0, 2.0, 0.0, -2.0, -2.5])
    to_source, to_second = safecut_gate(z_source, z_second, threshold=-1.0, gap_scale=1.0)
    # 0: second reliable and better -> teaches source; 1: the reverse;
    # 2: neither passes the threshold -> nothing; 3: tie -> nothing; 4: small gap -> weak
    assert to_source.tolist()[:4] == pytest.approx([float(torch.tanh(torch.tensor(5.0))), 0, 0, 0])
    assert to_second.tolist()[:4] == pytest.approx([0, float(torch.tanh(torch.tensor(5.0))), 0, 0])
    assert to_source[4] == pytest.approx(float(torch.tanh(torch.tensor(0.5)))) and to_second[4] == 0
    assert torch.all(to_source * to_second == 0)  # never both ways
    naive = safecut_gate(z_source, z_second, mode="naive")
    assert torch.all(naive[0] == 1) and torch.all(naive[1] == 1)
    one_way = safecut_gate(z_source, z_second, mode="one_way")
    assert torch.all(one_way[0] == 1) and torch.all(one_way[1] == 0)
    with pytest.raises(ValueError, match="mode"):
        safecut_gate(z_source, z_second, mode="both")


def test_local_z_has_zero_mean_unit_variance_under_iid_labels(one_thread):
    """Monte Carlo of the local statistic: with labels drawn iid from pi, J_i has mean
    (1 - pi_r) W_i and variance pi_r (1 - pi_r) sum_j w_ij^2 given y_i = r, so every z_i
    has mean 0 and variance 1 (pi re-estimated from each draw, as the op does)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 6, generator=g)
    w = knn_graph(x, 10, weighting="cosine")
    pi = torch.tensor([0.5, 0.3, 0.2])
    zs = torch.stack([cut_statistic(None, torch.multinomial(pi, 200, replacement=True, generator=g), weights=w,
                                    num_classes=3).z for _ in range(800)]).double()
    assert abs(float(zs.mean())) < 0.03
    assert float(zs.var()) == pytest.approx(1.0, rel=0.06)
    # and per node, the conditional moments of J_i given its label
    node, r = 7, 0
    y = torch.multinomial(pi, 200 * 4000, replacement=True, generator=g).view(4000, 200)
    cut = ((y != r).double() * w[node].double()).sum(1)
    assert float(cut.mean()) == pytest.approx(float((1 - pi[r]) * w[node].sum()), rel=0.02)
    assert float(cut.var()) == pytest.approx(float(pi[r] * (1 - pi[r]) * (w[node] ** 2).sum()), rel=0.08)
