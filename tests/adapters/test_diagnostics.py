"""Adapter diagnostics: factor-gradient effective ranks (incl. SaMA's 3-D blocks) and the induced-update cosine."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_lowrank.adapters import inject_adapters
from lit_lowrank.adapters.diagnostics import (
    FullGradientCapture,
    adapter_gradient_eranks,
    induced_cosine,
    induced_updates,
)
from lit_lowrank.ops.lowrank import effective_rank_of


def _trained(method: str, **kwargs) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 10)).double()
    inject_adapters(model, method=method, target_modules=["0"], rank=3, alpha=6, **kwargs)
    for p in model.parameters():  # move off the zero init so every factor carries a gradient
        if p.requires_grad:
            nn.init.normal_(p, std=0.3)
    x, g = torch.randn(9, 12, dtype=torch.float64), torch.randn(9, 10, dtype=torch.float64)
    return model, x, g


@pytest.mark.parametrize("method", ["lora", "sds_lora"])
def test_induced_update_is_the_first_order_change_of_delta_w(method):
    model, x, g = _trained(method)
    with FullGradientCapture(model) as cap:
        (model(x) * g).sum().backward()
    layer = model[0]
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    want = 2.0 * (b.grad @ a.detach() + b.detach() @ a.grad)   # d/dt s·(B + t∂B)(A + t∂A) at t = 0
    torch.testing.assert_close(induced_updates(model)["0"], want.float())
    full = g.t() @ x
    torch.testing.assert_close(cap.grads["0"], full.float())
    cos = induced_cosine(model, cap.grads)
    assert -1.0 <= cos.mean <= 1.0
    if method == "lora":  # LoRA's induced move is J Jᵀ G with J Jᵀ PSD: never against the gradient
        assert cos.mean > 0


@pytest.mark.parametrize("method", ["sama", "polar", "mora", "lokr"])
def test_induced_update_matches_a_finite_difference_for_every_variant(method):
    model, x, g = _trained(method)
    (model(x) * g).sum().backward()
    layer = model[0]
    move = induced_updates(model)["0"].double()
    params = [p for p in model.parameters() if p.requires_grad]
    eps = 1e-5
    with torch.no_grad():  # central difference: exact to O(eps²) for the (multi)linear factorisations
        for p in params:
            p.add_(eps * p.grad)
        plus = layer.get_delta_weight("default").clone()
        for p in params:
            p.sub_(2 * eps * p.grad)
        minus = layer.get_delta_weight("default").clone()
    torch.testing.assert_close(move, (plus - minus) / (2 * eps), rtol=1e-4, atol=1e-5)


def test_sama_three_dimensional_block_gradient_is_counted_as_its_block_diagonal():
    model, x, g = _trained("sama")
    (model(x) * g).sum().backward()
    layer = model[0]
    b_grad = layer.lora_sama_B["default"].grad
    assert b_grad.ndim == 3
    ranks = adapter_gradient_eranks(model)
    assert len(ranks) == 2  # A (2-D) and the stacked B (3-D): both counted
    want = float(effective_rank_of(torch.block_diag(*b_grad)))
    assert min(abs(r - want) for r in ranks) < 1e-4 * want
