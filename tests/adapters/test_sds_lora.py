"""SDS-LoRA: the closed-form gradients (ops/sds_lora.py) and its PEFT layer (adapters/sds_lora.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_lowrank.adapters import SDSLoraLinear, inject_adapters
from lit_lowrank.ops.sds_lora import (
    lora_factor_grads,
    orthonormal_basis,
    sds_factor_grads,
    sds_lora_delta,
    sign_canonical_qr,
)


def _factors(m: int = 12, n: int = 10, r: int = 3, seed: int = 0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(r, n, generator=gen, dtype=dtype), torch.randn(m, r, generator=gen, dtype=dtype),
            torch.randn(7, 5, n, generator=gen, dtype=dtype), torch.randn(7, 5, m, generator=gen, dtype=dtype))


@pytest.mark.parametrize("basis", ["qr", "polar"])
def test_gradients_equal_closed_form(basis):
    a, b, x, g = _factors()
    a.requires_grad_(True), b.requires_grad_(True), x.requires_grad_(True)
    out = sds_lora_delta(x, a, b, scaling=2.5, basis=basis)
    torch.testing.assert_close(out, 2.5 * x @ a.t() @ b.t())  # LoRA's forward
    (out * g).sum().backward()
    full = g.reshape(-1, 12).t() @ x.detach().reshape(-1, 10)  # ∂L/∂W for W of shape (m, n)
    want_a, want_b = sds_factor_grads(full, a.detach(), b.detach(), scaling=2.5, basis=basis)
    torch.testing.assert_close(a.grad, want_a)
    torch.testing.assert_close(b.grad, want_b)
    torch.testing.assert_close(x.grad, 2.5 * g @ b.detach() @ a.detach())  # input gradient stays exact
    # and it is not LoRA's gradient (the test cannot pass by construction)
    lora_a, lora_b = lora_factor_grads(full, a.detach(), b.detach(), scaling=2.5)
    assert (a.grad - lora_a).abs().max() > 1e-3 and (b.grad - lora_b).abs().max() > 1e-3


def test_closed_form_matches_definition():
    a, b, _, _ = _factors()
    full = torch.randn(12, 10, dtype=torch.float64)
    q_a, r_a = torch.linalg.qr(a.t())
    q_b, r_b = torch.linalg.qr(b)
    q_a, q_b = q_a * torch.sign(torch.diagonal(r_a)), q_b * torch.sign(torch.diagonal(r_b))
    grad_a, grad_b = sds_factor_grads(full, a, b)
    torch.testing.assert_close(grad_b, full @ q_a)
    torch.testing.assert_close(grad_a, q_b.t() @ full)


def test_sign_canonical_basis_is_orthonormal_unique_and_scale_free():
    _, b, _, _ = _factors()
    q = sign_canonical_qr(b)
    torch.testing.assert_close(q.t() @ q, torch.eye(3, dtype=q.dtype))
    assert (torch.diagonal(q.t() @ b) > 0).all()  # diag R = Qᵀ B > 0: the canonical sign
    # positive column scaling (any condition number) leaves the basis, hence SDS's ∂A, unchanged
    scaled = b * torch.tensor([1e-4, 1.0, 1e4], dtype=b.dtype)
    torch.testing.assert_close(sign_canonical_qr(scaled), q)
    torch.testing.assert_close(orthonormal_basis(scaled, "polar").t() @ orthonormal_basis(scaled, "polar"),
                               torch.eye(3, dtype=q.dtype))


def test_ill_conditioned_factors_do_not_rescale_the_gradient():
    a, b, _, _ = _factors()
    full = torch.randn(12, 10, dtype=torch.float64)
    d = torch.tensor([1e-2, 1.0, 1e2], dtype=b.dtype)
    sds_a, sds_b = sds_factor_grads(full, a * d[:, None], b * d)
    ref_a, ref_b = sds_factor_grads(full, a, b)
    torch.testing.assert_close(sds_a, ref_a)
    torch.testing.assert_close(sds_b, ref_b)
    lora_a, _ = lora_factor_grads(full, a, b * d)
    assert lora_a.norm(dim=1).max() / lora_a.norm(dim=1).min() > 100  # LoRA's rows scale with the singular values


def test_zero_b_gates_the_a_gradient():
    a, _, x, g = _factors()
    b = torch.zeros(12, 3, dtype=torch.float64, requires_grad=True)
    a.requires_grad_(True)
    (sds_lora_delta(x, a, b) * g).sum().backward()
    assert torch.count_nonzero(a.grad) == 0  # B = 0 has no column space: like LoRA's first step
    assert b.grad.abs().max() > 0
    assert torch.count_nonzero(sign_canonical_qr(torch.zeros(6, 2))) == 0


def test_bad_arguments_raise():
    a, b, x, _ = _factors()
    with pytest.raises(ValueError, match="basis"):
        sds_lora_delta(x, a, b, basis="svd")
    with pytest.raises(ValueError, match="do not chain"):
        sds_lora_delta(x, a.t(), b)
    with pytest.raises(ValueError, match="exceeds min"):
        SDSLoraLinear(nn.Linear(4, 6), "default", r=5)


def test_layer_trains_and_merges():
    torch.manual_seed(0)
    base = nn.Linear(16, 8)
    layer = SDSLoraLinear(base, "default", r=4, lora_alpha=8)
    x = torch.randn(32, 16)
    with torch.no_grad():
        y0 = base(x).clone()
    torch.testing.assert_close(layer(x), y0)  # ΔW = 0 at init
    opt = torch.optim.SGD([p for n, p in layer.named_parameters() if "lora_" in n], lr=0.1)
    target = torch.randn(32, 8)
    for _ in range(3):
        opt.zero_grad()
        ((layer(x) - target) ** 2).mean().backward()
        opt.step()
    assert layer.lora_B["default"].weight.abs().max() > 0 and layer.lora_A["default"].weight.grad.abs().max() > 0
    with torch.no_grad():
        unmerged = layer(x)
        layer.merge()
        torch.testing.assert_close(layer(x), unmerged, atol=1e-5, rtol=1e-5)
        layer.unmerge()
        torch.testing.assert_close(layer(x), unmerged, atol=1e-5, rtol=1e-5)


def test_injected_sds_uses_sds_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 12), nn.Tanh(), nn.Linear(12, 4))
    inject_adapters(model, method="sds_lora", target_modules=["0"], rank=3, alpha=6)
    layer = model[0]
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    x = torch.randn(9, 10)
    captured = {}

    def hook(module, args, output):
        output.register_hook(lambda g: captured.setdefault("g", g))

    layer.register_forward_hook(hook)
    model(x).pow(2).sum().backward()
    full = captured["g"].t() @ x
    want_a, want_b = sds_factor_grads(full, layer.lora_A["default"].weight.detach(),
                                      layer.lora_B["default"].weight.detach(), scaling=2.0)
    torch.testing.assert_close(layer.lora_A["default"].weight.grad, want_a, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(layer.lora_B["default"].weight.grad, want_b, atol=1e-5, rtol=1e-4)


def test_polar_basis_sds_is_the_half_power_gram_preconditioner_and_qr_is_not():
    """Polar-basis SDS equals G·Aᵀ(AAᵀ)^{-1/2} (and (BᵀB)^{-1/2}·Bᵀ G): a known preconditioner, ScaledGD at power ½."""
    from lit_lowrank.ops.sds_lora import preconditioned_factor_grads

    a, b, _, _ = _factors()
    full = torch.randn(12, 10, dtype=torch.float64)
    polar = sds_factor_grads(full, a, b, scaling=1.5, basis="polar")
    half = preconditioned_factor_grads(full, a, b, scaling=1.5, power=0.5)
    torch.testing.assert_close(polar[0], half[0])
    torch.testing.assert_close(polar[1], half[1])
    qr = sds_factor_grads(full, a, b, scaling=1.5, basis="qr")
    assert (qr[1] - half[1]).abs().max() > 1e-3  # the paper's QR basis is a different (non-symmetric) scaling
    # QR: G Q_A = G Aᵀ R_A⁻¹ with Aᵀ = Q_A R_A (sign-canonical)
    q_a, r_a = torch.linalg.qr(a.t())
    r_a = r_a * torch.sign(torch.diagonal(r_a)).unsqueeze(1)
    torch.testing.assert_close(qr[1], 1.5 * full @ a.t() @ torch.linalg.inv(r_a))


def test_riemannian_preconditioner_on_a_peft_lora_layer_matches_the_closed_form():
    from lit_lowrank.adapters.scaled_gd import precondition_lora_grads_
    from lit_lowrank.ops.sds_lora import preconditioned_factor_grads

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 12)).double()
    inject_adapters(model, method="lora", target_modules=["0"], rank=3, alpha=6)
    layer = model[0]
    nn.init.normal_(layer.lora_B["default"].weight)
    x, g = torch.randn(7, 10, dtype=torch.float64), torch.randn(7, 12, dtype=torch.float64)
    (model(x) * g).sum().backward()
    a, b = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
    want = preconditioned_factor_grads(g.t() @ x, a, b, scaling=2.0, power=1.0, delta=1e-6)
    assert precondition_lora_grads_(model, delta=1e-6) == 1
    torch.testing.assert_close(layer.lora_A["default"].weight.grad, want[0])
    torch.testing.assert_close(layer.lora_B["default"].weight.grad, want[1])
    with pytest.raises(ValueError, match="no PEFT LoRA layer"):
        precondition_lora_grads_(nn.Sequential(nn.Linear(3, 3)))


def test_scaled_gd_is_condition_number_free_like_sds():
    """ScaledGD (power 1) is the known κ-independent rule: the factor sweep cannot tell it from SDS by κ alone."""
    from lit_lowrank.benchmarks.lora_variants.condition_sweep import condition_run

    steps = {k: condition_run("scaled_gd", k, 0.2, 300, seed=0, setting="target").steps for k in (1.0, 1000.0)}
    assert steps[1000.0] <= 2 * steps[1.0] < 300
