"""The contextual SBM generator: homophily controlled by phi, seeded, a clean undirected graph."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.utils import contains_self_loops, is_undirected

from lit_lowrank.datamodules.csbm import contextual_sbm, csbm_parameters, edge_homophily


def _mean_homophily(phi, seeds=(0, 1, 2), **kwargs):
    values = []
    for seed in seeds:
        data = contextual_sbm(phi=phi, seed=seed, **kwargs)
        values.append(edge_homophily(data.edge_index, data.y))
    return sum(values) / len(values)


def test_homophily_increases_with_phi():
    phis = [-1.0, -0.5, 0.0, 0.5, 1.0]
    values = [_mean_homophily(phi) for phi in phis]
    assert values[0] < 0.3 and values[-1] > 0.7
    assert all(a < b for a, b in zip(values, values[1:]))


def test_homophily_matches_its_expectation():
    # E[h] = 1/2 + lambda / (2 sqrt(d)) for the within/across edge probabilities.
    for phi in (-0.5, 0.5):
        lam, _ = csbm_parameters(phi, 2000, 100, 3.25)
        expected = 0.5 + lam / (2 * math.sqrt(5.0))
        assert abs(_mean_homophily(phi, num_nodes=2000) - expected) < 0.03


def test_graph_shape_degree_and_balance():
    data = contextual_sbm(num_nodes=1000, num_features=50, phi=0.3, seed=0)
    assert data.x.shape == (1000, 50) and data.x.dtype == torch.float32
    assert data.y.dtype == torch.long and data.y.bincount().tolist() == [500, 500]
    assert is_undirected(data.edge_index, num_nodes=1000)
    assert not contains_self_loops(data.edge_index)
    assert abs(data.edge_index.shape[1] / 1000 - 5.0) < 0.5  # average degree ~ avg_degree
    assert data.edge_index.unique(dim=1).shape == data.edge_index.shape  # no duplicate edges


def test_features_carry_the_label_when_phi_is_zero():
    # phi = 0 puts all signal in the features: the class-mean difference separates the classes.
    data = contextual_sbm(num_nodes=1000, num_features=100, phi=0.0, seed=0)
    direction = data.x[data.y == 1].mean(0) - data.x[data.y == 0].mean(0)
    score = data.x @ direction
    accuracy = ((score > score.median()).long() == data.y).float().mean()
    assert accuracy > 0.75
    # phi = 1: no feature signal (mu = 0), so features are pure noise of variance 1/f.
    noise = contextual_sbm(num_nodes=1000, num_features=100, phi=1.0, seed=0)
    assert abs(float(noise.x.var()) * 100 - 1.0) < 0.05


def test_seeded_and_deterministic():
    a, b, c = contextual_sbm(seed=4), contextual_sbm(seed=4), contextual_sbm(seed=5)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.y, c.y)


def test_edge_homophily_counts_same_class_edges():
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    assert edge_homophily(edge_index, torch.tensor([0, 0, 1])) == 0.5


@pytest.mark.parametrize("phi", [-1.5, 1.01])
def test_phi_out_of_range_names_phi(phi):
    with pytest.raises(ValueError, match="phi"):
        contextual_sbm(phi=phi)


def test_impossible_degree_names_parameters():
    with pytest.raises(ValueError, match="avg_degree"):
        contextual_sbm(phi=1.0, avg_degree=1.0)


def test_mixed_csbm_has_node_varying_homophily_and_balanced_regimes():
    from lit_lowrank.datamodules.csbm import mixed_csbm
    from lit_lowrank.ops.graph_propagation import local_homophily

    data = mixed_csbm(num_nodes=600, num_features=50, phis=(-0.75, 0.75), seed=1)
    assert is_undirected(data.edge_index) and not contains_self_loops(data.edge_index)
    assert data.x.shape == (600, 50) and set(data.regime.tolist()) == {0, 1}
    for r in (0, 1):  # class-balanced regimes
        assert abs(float(data.y[data.regime == r].float().mean()) - 0.5) < 0.05
    h = local_homophily(data.edge_index, data.y)
    het, hom = float(h[data.regime == 0].nanmean()), float(h[data.regime == 1].nanmean())
    assert het < 0.3 and hom > 0.7  # the regime shows in the neighbourhood ...
    assert abs(data.edge_index.shape[1] / 600 - 5.0) < 1.0  # ... at the requested average degree
    again = mixed_csbm(num_nodes=600, num_features=50, phis=(-0.75, 0.75), seed=1)
    assert torch.equal(again.edge_index, data.edge_index) and torch.equal(again.x, data.x)


def test_mixed_csbm_errors_name_the_parameter():
    from lit_lowrank.datamodules.csbm import mixed_csbm

    with pytest.raises(ValueError, match="phis"):
        mixed_csbm(num_nodes=100, phis=())
    with pytest.raises(ValueError, match="cross_fraction"):
        mixed_csbm(num_nodes=100, cross_fraction=1.0)
    with pytest.raises(ValueError, match=r"phis\[0\]"):
        mixed_csbm(num_nodes=100, phis=(1.0,), avg_degree=1.0, epsilon=20.0)


def test_regime_sbm_regions_have_their_homophily_and_are_balanced():
    from lit_lowrank.datamodules.csbm import regime_sbm
    from lit_lowrank.ops.graph_propagation import local_homophily

    data = regime_sbm(900, 50, num_classes=3, homophily=(0.05, 0.9), cross_fraction=0.1, seed=0)
    assert is_undirected(data.edge_index) and not contains_self_loops(data.edge_index)
    h = local_homophily(data.edge_index, data.y)
    # within-region share h_r plus the label-blind cross edges (share 0.1, a third same-class)
    for r, target in enumerate((0.05, 0.9)):
        expected = 0.9 * target + 0.1 / 3
        assert float(torch.nanmean(h[data.regime == r])) == pytest.approx(expected, abs=0.04)
    for r in range(2):
        assert torch.bincount(data.y[data.regime == r], minlength=3).tolist() == [150, 150, 150]
    degree = data.edge_index.shape[1] / 900
    assert degree == pytest.approx(6.0, rel=0.1)
    again = regime_sbm(900, 50, num_classes=3, homophily=(0.05, 0.9), cross_fraction=0.1, seed=0)
    assert torch.equal(again.edge_index, data.edge_index) and torch.equal(again.x, data.x)


def test_regime_sbm_features_separate_classes_by_feature_snr():
    from lit_lowrank.datamodules.csbm import regime_sbm

    data = regime_sbm(3000, 200, num_classes=3, feature_snr=2.0, seed=1)
    x = data.x * math.sqrt(200)
    means = torch.stack([x[data.y == c].mean(0) for c in range(3)])
    gap = (means[0] - means[1]).norm()                                 # centroids feature_snr/√2·(u0 − u1)
    assert float(gap) == pytest.approx(2.0, abs=0.35)


@pytest.mark.parametrize("kwargs, match", [({"homophily": (1.2,)}, "homophily"), ({"num_classes": 1}, "num_classes"),
                                           ({"cross_fraction": 1.0}, "cross_fraction"),
                                           ({"num_nodes": 30, "avg_degree": 40.0}, "exceed 1")])
def test_regime_sbm_errors_name_the_parameter(kwargs, match):
    from lit_lowrank.datamodules.csbm import regime_sbm

    with pytest.raises(ValueError, match=match):
        regime_sbm(**kwargs)


def test_periphery_sbm_regions_have_their_homophily_degrees_and_balance():
    from lit_lowrank.datamodules.csbm import periphery_sbm
    from lit_lowrank.ops.graph_propagation import local_homophily

    data = periphery_sbm(900, 50, num_classes=3, periphery_degree=3.0, core_degree=6.0, core_homophily=0.9, seed=0)
    assert is_undirected(data.edge_index) and not contains_self_loops(data.edge_index)
    periphery, core = data.regime == 0, data.regime == 1
    assert int(periphery.sum()) == 300
    assert torch.bincount(data.y[periphery], minlength=3).tolist() == [100, 100, 100]
    src, dst = data.edge_index
    # no edge inside the periphery; every periphery edge joins two classes
    assert not (periphery[src] & periphery[dst]).any()
    assert (data.y[src] != data.y[dst])[periphery[src]].all()
    h = local_homophily(data.edge_index, data.y)
    assert float(torch.nanmean(h[periphery])) == 0.0
    # core: 6 core edges (90% own class) + 3·300/600 = 1.5 periphery edges (other classes)
    assert float(torch.nanmean(h[core])) == pytest.approx(0.9 * 6 / 7.5, abs=0.04)
    degree = torch.bincount(src, minlength=900).float()
    assert float(degree[periphery].mean()) == pytest.approx(3.0, rel=0.15)
    assert float(degree[core].mean()) == pytest.approx(7.5, rel=0.1)
    again = periphery_sbm(900, 50, num_classes=3, seed=0)
    assert torch.equal(again.edge_index, data.edge_index) and torch.equal(again.x, data.x)


def test_periphery_sbm_every_power_of_the_adjacency_reads_the_other_class_in_the_periphery():
    """The property that makes one global filter fail: Âᵏ Y (true one-hot labels) points to the node's own class
    in the core and to another class in the periphery, for k = 1, 2, 3 — a polynomial of Â cannot be right in both."""
    from lit_lowrank.datamodules.csbm import periphery_sbm
    from lit_lowrank.ops.graph_propagation import normalized_adjacency

    data = periphery_sbm(600, 20, num_classes=2, seed=3)
    adj = normalized_adjacency(data.edge_index, 600).to_dense()
    eye = torch.eye(600)
    one_hot = torch.nn.functional.one_hot(data.y, 2).float()
    periphery, core = data.regime == 0, data.regime == 1
    for k in (1, 2, 3):
        # Â has self loops: drop the node's own label from the k-th power to read the neighbourhood alone
        walk = torch.linalg.matrix_power(adj, k)
        reads = ((walk - torch.diag(torch.diag(walk))) @ one_hot).argmax(1) == data.y
        assert float(reads[core].float().mean()) > 0.75, k
        assert float(reads[periphery].float().mean()) < 0.25, k
    # the per-node operator: high-pass in the periphery, low-pass in the core reads both regions (a periphery
    # node without edges, ~e⁻³ of them, is a tie)
    high = ((eye - adj) @ one_hot).argmax(1) == data.y
    low = ((adj - eye * torch.diag(adj)) @ one_hot).argmax(1) == data.y
    assert float(high[periphery].float().mean()) > 0.9 and float(low[core].float().mean()) > 0.75


@pytest.mark.parametrize("kwargs, match", [({"num_classes": 1}, "num_classes"),
                                           ({"periphery_fraction": 1.0}, "periphery_fraction"),
                                           ({"core_homophily": 1.5}, "core_homophily"),
                                           ({"periphery_degree": -1.0}, "periphery_degree"),
                                           ({"num_nodes": 30, "core_degree": 40.0}, "exceeds 1")])
def test_periphery_sbm_errors_name_the_parameter(kwargs, match):
    from lit_lowrank.datamodules.csbm import periphery_sbm

    with pytest.raises(ValueError, match=match):
        periphery_sbm(**kwargs)
