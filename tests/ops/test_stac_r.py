"""STAC-R math: factored gradients vs autograd, losslessness, the bridge, subspace tracking, byte prices."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lit_lowrank.ops.grad_cosine import gradient_cosine
from lit_lowrank.ops.stac_r.compress import (
    compress_activation,
    compressed_nbytes,
    decompress_activation,
    dequantize_residual,
    factored_weight_grad,
    gradient_bridge,
    init_basis,
    iso_byte_rank,
    oja_update,
    quantize_residual,
    random_projection,
    random_projection_rank,
    stac_r_linear,
    subspace_iteration,
)
from lit_lowrank.ops.stac_r.saved_tensors import SavedTensorCounter


def _low_rank_data(n: int, d: int, r: int, noise: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, r, generator=g) @ torch.randn(r, d, generator=g) + noise * torch.randn(n, d, generator=g)


def _orthonormal(d: int, r: int, seed: int) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, r, generator=torch.Generator().manual_seed(seed)))[0]


@pytest.mark.parametrize("store_basis", [False, True])
def test_factored_gradients_match_autograd_on_reconstruction(store_basis):
    """∂W from the factors == autograd's ∂W of F.linear on X̂; ∂X and ∂b are exact."""
    torch.manual_seed(0)
    x = _low_rank_data(2 * 24, 20, 4, 0.3, 0).view(2, 24, 20)
    weight = torch.randn(12, 20, requires_grad=True)
    bias = torch.randn(12, requires_grad=True)
    basis = init_basis(x.view(-1, 20), 6)
    grad_out = torch.randn(2, 24, 12)

    xr = x.clone().requires_grad_()
    stac_r_linear(xr, weight, bias, basis, density=0.05, store_basis=store_basis).backward(grad_out)
    got_w, got_b, got_x = weight.grad.clone(), bias.grad.clone(), xr.grad.clone()

    code = compress_activation(x.view(-1, 20), basis.to(torch.bfloat16).float() if store_basis else basis, 0.05)
    x_hat = decompress_activation(code).view_as(x)
    weight.grad = bias.grad = None
    F.linear(x_hat, weight, bias).backward(grad_out)
    torch.testing.assert_close(got_w, weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_b, bias.grad)
    torch.testing.assert_close(got_x, grad_out @ weight.detach())
    assert (x_hat - x).norm() > 0  # the code is lossy here: the test compares against X̂, not X


def test_full_rank_code_is_lossless():
    """rank = d with float32 coefficients reconstructs X, so the weight gradient is exact."""
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(1))
    basis = init_basis(x, 16)
    code = compress_activation(x, basis, density=0.0, coef_dtype=torch.float32)
    torch.testing.assert_close(decompress_activation(code), x, rtol=0, atol=1e-5)
    weight = torch.randn(8, 16, requires_grad=True)
    stac_r_linear(x, weight, None, basis, density=0.0, coef_dtype=torch.float32).sum().backward()
    torch.testing.assert_close(weight.grad, torch.ones(40, 8).T @ x, rtol=1e-5, atol=1e-4)


def test_exact_rank_data_is_lossless_at_its_rank():
    x = _low_rank_data(50, 24, 5, 0.0, 2)
    code = compress_activation(x, init_basis(x, 5), density=0.0, coef_dtype=torch.float32)
    torch.testing.assert_close(decompress_activation(code), x, rtol=0, atol=1e-4)


def test_residual_reduces_error_and_quantizes_top_entries():
    x = _low_rank_data(64, 32, 4, 0.2, 3)
    basis = init_basis(x, 4)
    errors = [float((decompress_activation(compress_activation(x, basis, rho)) - x).norm()) for rho in (0, .05, .2)]
    assert errors[0] > errors[1] > errors[2]
    e = torch.randn(10, 10, generator=torch.Generator().manual_seed(4))
    values, indices, scale = quantize_residual(e, density=0.1, bits=8)
    assert values.dtype == torch.int8 and indices.dtype == torch.int32 and values.numel() == 10
    assert set(indices.tolist()) == set(e.abs().flatten().topk(10).indices.tolist())
    dense = dequantize_residual(values, indices, scale, (10, 10))
    kept = dense != 0
    assert float((dense - e)[kept].abs().max()) <= float(scale) / 2 + 1e-6


@pytest.mark.parametrize("seed", range(5))
def test_bridge_inequality_on_random_data(seed):
    """cos(GᵀX̂, GᵀX) ≥ √(1−ε²), ε = ‖GᵀE‖/‖GᵀX‖, for random G, X and perturbations of several sizes."""
    g = torch.Generator().manual_seed(seed)
    n, d, k = 30 + 7 * seed, 12, 9
    grad_out, x = torch.randn(n, k, generator=g), torch.randn(n, d, generator=g)
    for size in (1e-3, 0.05, 0.3, 0.9):
        x_hat = x + size * x.norm() / math.sqrt(n * d) * torch.randn(n, d, generator=g)
        s = gradient_bridge(grad_out, x, x_hat)
        err = (grad_out.double().T @ (x - x_hat).double()).norm() / (grad_out.double().T @ x.double()).norm()
        assert s.eps == pytest.approx(float(err), rel=1e-4)
        assert s.cosine >= s.cos_lower - 1e-6
    assert gradient_bridge(grad_out, x, x).cosine == pytest.approx(1.0)


def test_tracked_basis_converges_to_fixed_subspace():
    """Subspace iteration on fresh batches from one fixed r-dim subspace finds it; Oja gets closer every step."""
    d, r = 32, 4
    subspace = _orthonormal(d, r, 5)
    g = torch.Generator().manual_seed(6)

    def batch():
        return torch.randn(64, r, generator=g) @ subspace.T * torch.tensor([4.0, 3.0, 2.0, 1.5]).sum() \
            + 0.01 * torch.randn(64, d, generator=g)

    def distance(basis):  # ‖(I − UUᵀ) V‖_F: 0 when span(U) ⊇ span(V)
        return float((subspace - basis @ (basis.T @ subspace)).norm())

    basis = _orthonormal(d, r, 7)
    start = distance(basis)
    for _ in range(5):
        basis = subspace_iteration(basis, batch())
    assert distance(basis) < 0.01 < start
    torch.testing.assert_close(basis.T @ basis, torch.eye(r), atol=1e-5, rtol=0)
    oja, previous = _orthonormal(d, r, 7), start
    for _ in range(5):
        oja = oja_update(oja, batch(), lr=2.0)
        assert distance(oja) < previous
        previous = distance(oja)


def test_compressed_bytes_are_what_the_counter_measures():
    """The analytic price equals the bytes the pack-hook counter sees for the factored Linear."""
    n, d, r, rho = 48, 20, 5, 0.1
    x = torch.randn(n, d, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(7, d))  # a parameter: model state, not counted
    basis = init_basis(x.detach(), r)
    for store_basis in (False, True):
        with SavedTensorCounter() as counter:
            y = stac_r_linear(x, weight, None, basis, density=rho, store_basis=store_basis)
            held = counter.current_bytes
            y.sum().backward()
        assert held == compressed_nbytes(n, d, r, rho, basis_stored=store_basis)
        assert counter.current_bytes == 0
    assert iso_byte_rank(n, d, r) * (n + d) <= r * n


def test_errors_name_the_parameter():
    x = torch.randn(10, 6)
    with pytest.raises(ValueError, match="rank"):
        init_basis(x, 7)
    with pytest.raises(ValueError, match="residual_density"):
        quantize_residual(x, 1.5)
    with pytest.raises(ValueError, match="residual_bits"):
        quantize_residual(x, 0.1, bits=9)
    with pytest.raises(ValueError, match="basis"):
        compress_activation(x, torch.eye(5)[:, :2], 0.1)


def test_gradient_cosine_per_tensor_mean_and_global():
    exact = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0, 2.0])}
    approx = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0, 5.0])}
    result = gradient_cosine(approx, exact)
    assert result.per_tensor["a"] == pytest.approx(1 / math.sqrt(2))
    assert result.per_tensor["b"] == pytest.approx(1.0)
    assert result.mean == pytest.approx((1 / math.sqrt(2) + 1) / 2)
    assert result.global_cosine == pytest.approx(11 / (math.sqrt(5) * math.sqrt(27)))
    with pytest.raises(ValueError, match="missing"):
        gradient_cosine(approx, exact, names=["c"])


def test_generic_codec_codes_any_saved_tensor():
    """The saved_tensors_hooks path: mm's input and pow's input are coded (lossless here: rank-4 data,
    float32 coefficients), the small weight is stored as is, and fewer bytes are held."""
    from lit_lowrank.ops.stac_r.compress import TrackedSavedTensorCodec

    x = _low_rank_data(256, 32, 4, 0.0, 8).requires_grad_()
    w = torch.randn(32, 16, generator=torch.Generator().manual_seed(9), requires_grad=True)

    def step(codec=None):
        x.grad = w.grad = None
        with SavedTensorCounter(codec=codec) as counter:
            if codec is not None:
                codec.start_step()
            (x @ w).pow(2).sum().backward()
        return counter.peak_bytes, x.grad.clone(), w.grad.clone()

    exact_bytes, gx, gw = step()
    codec = TrackedSavedTensorCodec(rank=8, residual_density=0.0, coef_dtype=torch.float32, min_numel=1000)
    coded_bytes, cx, cw = step(codec)
    assert exact_bytes == 4 * (256 * 32 + 32 * 16 + 256 * 16)
    assert coded_bytes == 4 * (256 * 8 + 32 * 16 + 256 * 8) + 2 * 4  # two codes (coef + scale), w as is
    assert sorted(codec.bases) == ["0:32", "1:16"]
    torch.testing.assert_close(cx, gx, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(cw, gw, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(("n", "d", "r", "rho"), [(48, 20, 5, 0.1), (256, 64, 16, 0.01), (100, 30, 3, 0.0)])
def test_random_projection_code_fits_the_iso_byte_budget(n, d, r, rho):
    """The CompAct control's measured bytes: at most STAC-R's, and less than one more column below them."""
    x = torch.randn(n, d, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(7, d))
    width = random_projection_rank(n, d, r, rho)
    proj = random_projection(d, width, seed=3)
    with SavedTensorCounter() as counter:
        y = stac_r_linear(x, weight, None, proj, density=0.0)
        held = counter.current_bytes
        y.sum().backward()
    stac_bytes = compressed_nbytes(n, d, r, rho)
    assert held == compressed_nbytes(n, d, width, 0.0) == n * width * 2 + 4
    assert stac_bytes - 2 * n < held <= stac_bytes
    assert width >= r  # the residual's bytes buy extra columns


def test_random_projection_gradient_is_unbiased_and_fresh_per_seed():
    """E[P Pᵀ] = I: the factored gradient averaged over seeds approaches GᵀX; one draw is far from it."""
    g = torch.Generator().manual_seed(0)
    x, grad_out = torch.randn(40, 12, generator=g), torch.randn(40, 5, generator=g)
    exact = grad_out.T @ x
    estimates = []
    for seed in range(600):
        code = compress_activation(x, random_projection(12, 4, seed), density=0.0, coef_dtype=torch.float32)
        estimates.append(factored_weight_grad(grad_out, code))
    mean_err = float((torch.stack(estimates).mean(0) - exact).norm() / exact.norm())
    one_err = float((estimates[0] - exact).norm() / exact.norm())
    assert mean_err < 0.1 < one_err
    assert not torch.equal(random_projection(12, 4, 0), random_projection(12, 4, 1))
    assert torch.equal(random_projection(12, 4, 5), random_projection(12, 4, 5))
    with pytest.raises(ValueError, match="rank"):
        random_projection(12, 13, 0)
