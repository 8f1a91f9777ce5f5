"""The implemented Castor baselines: shapes by name, and the polynomial filters' known reductions."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.models import GRAPH_MODELS
from lit_lowrank.models.graph_baselines import GPRGNN, BernNet, ChebNetII

EDGES = torch.tensor([[0, 1, 1, 2, 2, 3, 0, 3, 4, 5], [1, 0, 2, 1, 3, 2, 3, 0, 5, 4]])
N = 7  # node 6 is isolated


@pytest.mark.parametrize("name", sorted(GRAPH_MODELS))
def test_every_graph_model_builds_by_name_and_trains(name):
    torch.manual_seed(0)
    model = GRAPH_MODELS[name](in_channels=5, out_channels=3, hidden_channels=12, num_layers=2)
    out = model(torch.randn(N, 5), EDGES)
    assert out.shape == (N, 3) and torch.isfinite(out).all()
    out.square().sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def _dense_operator(self_loops: bool) -> torch.Tensor:
    a = torch.zeros(N, N)
    a[EDGES[1], EDGES[0]] = 1.0
    if self_loops:
        a = a + torch.eye(N)
    d = a.sum(1)
    inv = torch.where(d > 0, d.rsqrt(), torch.zeros_like(d))
    return inv[:, None] * a * inv[None, :]


def test_bernnet_and_chebnetii_with_constant_coefficients_are_the_identity_filter():
    """θ ≡ 1 (BernNet: Σ C(K,k)/2^K (2−λ)^(K−k) λ^k = 1) and γ ≡ 1 (ChebNetII interpolates 1) pass H through."""
    x = torch.randn(N, 5)
    for cls in (BernNet, ChebNetII):
        model = cls(5, 3, hidden_channels=8, K=6).eval()
        torch.testing.assert_close(model(x, EDGES), model.mlp(x), atol=1e-4, rtol=1e-4)


def test_chebnetii_interpolates_a_low_pass_filter():
    """γ_j = g(λ_j) for a linear g(λ) = 1 − λ/2 is interpolated exactly: the output is (I − L/2) H."""
    x = torch.randn(N, 5)
    model = ChebNetII(5, 3, hidden_channels=8, K=4).eval()
    nodes = torch.cos((torch.arange(5) + 0.5) * torch.pi / 5)  # nodes in λ − 1
    with torch.no_grad():
        model.gamma.copy_(1 - (nodes + 1) / 2)  # g(λ) = 1 − λ/2 at λ = x + 1
    h = model.mlp(x)
    expected = h - 0.5 * (torch.eye(N) - _dense_operator(self_loops=False)) @ h
    torch.testing.assert_close(model(x, EDGES), expected, atol=1e-4, rtol=1e-4)


def test_gprgnn_with_one_hot_gamma_is_a_power_of_a_hat():
    x = torch.randn(N, 5)
    model = GPRGNN(5, 3, hidden_channels=8, K=3).eval()
    with torch.no_grad():
        model.gamma.copy_(torch.tensor([0.0, 0.0, 1.0, 0.0]))
    expected = torch.linalg.matrix_power(_dense_operator(self_loops=True), 2) @ model.mlp(x)
    torch.testing.assert_close(model(x, EDGES), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cls", ["GPRGNN", "BernNet", "ChebNetII"])
def test_dprate_drops_logits_before_propagation_only_in_training(cls):
    from lit_lowrank.models import graph_baselines as gb

    torch.manual_seed(0)
    x, edge_index = torch.randn(20, 8), torch.randint(0, 20, (2, 60))
    model = getattr(gb, cls)(8, 3, dprate=0.9, dropout=0.0)
    model.eval()
    a = model(x, edge_index)
    torch.testing.assert_close(a, model(x, edge_index))  # no dropout in eval
    model.train()
    torch.manual_seed(1)
    assert not torch.allclose(model(x, edge_index), a)
    with pytest.raises(ValueError, match="dprate"):
        getattr(gb, cls)(8, 3, dprate=1.0)
