"""Castor's propagation math and the graph operators, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.castor import (
    bounded_beta,
    castor_hop,
    castor_mix,
    router_mass_by_homophily,
    router_probabilities,
)
from lit_lowrank.ops.graph_propagation import as_edge_index, local_homophily, normalized_adjacency

# path graph 0 - 1 - 2, both directions
PATH = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
S6 = 1 / math.sqrt(6)
# D̃^(-1/2)(A + I)D̃^(-1/2) with degrees (2, 3, 2) after self loops, by hand
A_HAT_PATH = torch.tensor([[1 / 2, S6, 0.0], [S6, 1 / 3, S6], [0.0, S6, 1 / 2]])


def test_normalized_adjacency_matches_hand_values():
    adj = normalized_adjacency(PATH, 3).to_dense()
    torch.testing.assert_close(adj, A_HAT_PATH)


def test_normalized_adjacency_without_self_loops():
    adj = normalized_adjacency(PATH, 3, self_loops=False).to_dense()
    expected = torch.tensor([[0.0, 1 / math.sqrt(2), 0.0], [1 / math.sqrt(2), 0.0, 1 / math.sqrt(2)],
                             [0.0, 1 / math.sqrt(2), 0.0]])
    torch.testing.assert_close(adj, expected)


def test_isolated_node_keeps_its_state_and_self_loops_are_not_doubled():
    # node 3 is isolated: Â_33 = 1, so ÂH keeps its row and the high-pass (I − Â)H is 0 there
    adj = normalized_adjacency(PATH, 4).to_dense()
    assert adj[3, 3] == 1.0 and adj[3, :3].abs().sum() == 0
    # an explicit unit self loop on every node is the same graph as none (remaining self loops)
    loops = torch.arange(3).repeat(2, 1)
    with_loops = normalized_adjacency(torch.cat([PATH, loops], dim=1), 3).to_dense()
    torch.testing.assert_close(with_loops, A_HAT_PATH)


def test_primitives_on_hand_graph():
    h = torch.tensor([[1.0], [0.0], [0.0]])
    ah = normalized_adjacency(PATH, 3) @ h
    eye = torch.eye(3)
    low = castor_mix(h, ah, eye[[0, 0, 0]])
    high = castor_mix(h, ah, eye[[1, 1, 1]])
    ident = castor_mix(h, ah, eye[[2, 2, 2]])
    torch.testing.assert_close(low, torch.tensor([[0.5], [S6], [0.0]]))
    torch.testing.assert_close(high, torch.tensor([[0.5], [-S6], [0.0]]))
    torch.testing.assert_close(ident, h)
    # a different route per node picks that node's primitive
    mixed = castor_mix(h, ah, eye[[1, 0, 2]])
    torch.testing.assert_close(mixed, torch.tensor([[0.5], [S6], [0.0]]))


def test_heavy_ball_hop_adds_the_last_change():
    h, h_prev, ah = torch.randn(5, 2), torch.randn(5, 2), torch.randn(5, 2)
    routes = torch.softmax(torch.randn(5, 3), dim=1)
    out = castor_hop(h, h_prev, ah, routes, beta=0.4)
    expected = routes[:, :1] * ah + routes[:, 1:2] * (h - ah) + routes[:, 2:] * h + 0.4 * (h - h_prev)
    torch.testing.assert_close(out, expected)


def test_router_probabilities_softmax_with_temperature():
    h, h0 = torch.randn(4, 2), torch.randn(4, 2)
    weight, bias = torch.randn(3, 4), torch.randn(3)
    probs = router_probabilities(h, h0, weight, bias, tau=0.5)
    logits = torch.cat([h, h0], 1) @ weight.T + bias
    torch.testing.assert_close(probs, torch.softmax(2 * logits, dim=1))
    with pytest.raises(ValueError, match="`tau`=0"):
        router_probabilities(h, h0, weight, bias, tau=0)
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        router_probabilities(h, h0, torch.randn(3, 2), bias)


def test_bounded_beta():
    raw = torch.tensor([-100.0, 0.0, 100.0])
    beta = bounded_beta(raw, 0.9)
    assert beta[1] == 0 and torch.all(beta.abs() <= 0.9) and beta[2] > 0.89
    with pytest.raises(ValueError, match="`beta_max`=1.0"):
        bounded_beta(raw, 1.0)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
def test_as_edge_index_dense_and_sparse_agree():
    dense = torch.zeros(3, 3)
    dense[PATH[0], PATH[1]] = 1.0
    for adjacency in (dense, dense.to_sparse(), dense.to_sparse_csr()):
        index, weight, n = as_edge_index(adjacency)
        assert n == 3
        torch.testing.assert_close(normalized_adjacency(index, n, weight).to_dense(), A_HAT_PATH)
    with pytest.raises(ValueError, match="edge_index: expected"):
        as_edge_index(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="square"):
        as_edge_index(torch.zeros(3, 4))


def test_local_homophily_and_mass_bins():
    y = torch.tensor([0, 0, 1, 1])  # node 3 isolated
    hom = local_homophily(PATH, y)
    torch.testing.assert_close(hom[:3], torch.tensor([1.0, 0.5, 0.0]))
    assert math.isnan(hom[3])
    routes = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]])
    mass = router_mass_by_homophily(routes, hom, bins=2)
    # bin [0, .5): node 2; bin [.5, 1]: nodes 0 and 1; the isolated node is skipped
    torch.testing.assert_close(mass, torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]))
