"""SPHQuant's block error feedback: nearest-code consistency, the LDL update, and its objective."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.ops.sphquant.codec import (
    SPH_DIM,
    assign_codewords,
    hessian_error,
    positive_orthant_kmeans,
    sph_dequantize,
    sph_directions,
    sph_quantize,
)
from lit_lowrank.ops.sphquant.feedback import inverse_hessian_factor, sph_feedback_sweep, sph_quantize_feedback


def _problem(seed: int = 0, out: int = 48, inp: int = 64, mix: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, inp, generator=g) @ (torch.eye(inp) + mix * torch.randn(inp, inp, generator=g))
    w = torch.randn(out, inp, generator=g)
    codebook = positive_orthant_kmeans(sph_directions([w]), 64, iterations=5, seed=seed).half().float()
    return w, x.T @ x / x.shape[0], codebook


def test_every_vector_gets_its_nearest_code_given_the_updated_weights():
    """Reference: with H diagonal no error is propagated across columns, so each stored code must be the
    nearest codeword and the rounded least-squares radius of the *original* vector, under its group's range."""
    w, _, codebook = _problem()
    h = torch.diag(torch.rand(w.shape[1], generator=torch.Generator().manual_seed(1)) + 0.5)
    codes = sph_quantize_feedback(w, h, codebook, radius_bits=3, group_size=32)
    v = w.reshape(w.shape[0], -1, SPH_DIM)
    mags = v.abs()
    index = assign_codewords((mags / mags.norm(dim=-1, keepdim=True)).reshape(-1, SPH_DIM), codebook)
    assert torch.equal(codes.index.flatten(), index)
    per_group = 32 // SPH_DIM
    norms = mags.norm(dim=-1).reshape(w.shape[0], -1, per_group)
    torch.testing.assert_close(codes.radius_min.float(), norms.amin(-1).half().float())
    rho = (mags * codebook[index].view_as(v)).sum(-1)
    lo = codes.radius_min.float().repeat_interleave(per_group, 1)
    step = codes.radius_step.float().repeat_interleave(per_group, 1)
    assert torch.equal(codes.radius_code, torch.clamp(torch.round((rho - lo) / step), 0, 7).long())
    signs = ((v < 0).long() * (1 << torch.arange(SPH_DIM))).sum(-1)
    assert torch.equal(codes.signs, signs)


def test_feedback_lowers_the_hessian_weighted_error_against_plain_rounding():
    w, h, codebook = _problem()
    plain = hessian_error(w, sph_dequantize(sph_quantize(w, codebook, 3, 32), codebook), h)
    fed = hessian_error(w, sph_dequantize(sph_quantize_feedback(w, h, codebook, 3, 32), codebook), h)
    assert fed < 0.85 * plain


def test_one_vector_step_is_the_least_squares_compensation():
    """After the first 8 columns are fixed, the update of the rest minimises tr(E H E^T) over them."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g) @ (torch.eye(16) + 0.6 * torch.randn(16, 16, generator=g))
    h = x.T @ x / 256
    u, _ = inverse_hessian_factor(h[None], damp=0.0)
    hd = h.double()
    e_b = torch.randn(4, 8, dtype=torch.float64)
    err = torch.linalg.solve_triangular(u[0, :8, :8].double(), e_b, upper=True, left=False)
    delta = -err @ u[0, :8, 8:].double()              # the sweep's update of the remaining weights
    # the optimum: the remaining columns' error d minimising [e_b, d] H [e_b, d]^T is -e_b H_br H_rr^-1,
    # reached (if they are later represented exactly) by the update delta = -d
    best = e_b @ hd[:8, 8:] @ torch.linalg.inv(hd[8:, 8:])
    torch.testing.assert_close(delta, best, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("block_size", [8, 24, 64])
def test_lazy_block_size_does_not_change_the_codes_beyond_rounding(block_size):
    w, h, codebook = _problem(seed=2)
    ref = sph_dequantize(sph_quantize_feedback(w, h, codebook, 3, 32, block_size=128), codebook)
    got = sph_dequantize(sph_quantize_feedback(w, h, codebook, 3, 32, block_size=block_size), codebook)
    assert float(hessian_error(w, got, h)) == pytest.approx(float(hessian_error(w, ref, h)), rel=0.02)


def test_batched_sweep_equals_separate_problems():
    w1, h1, codebook = _problem(seed=3)
    w2, h2, _ = _problem(seed=4)
    both = sph_feedback_sweep(torch.stack([w1, w2]), torch.stack([h1, h2]), codebook, 3, 32)
    for w, h, codes in ((w1, h1, both[0]), (w2, h2, both[1])):
        alone = sph_quantize_feedback(w, h, codebook, 3, 32)
        torch.testing.assert_close(sph_dequantize(codes, codebook), sph_dequantize(alone, codebook))


def test_dead_inputs_are_zeroed_and_errors_name_the_parameter():
    w, h, codebook = _problem()
    h[5, :] = 0
    h[:, 5] = 0
    codes = sph_quantize_feedback(w, h, codebook, 3, 32)
    assert torch.isfinite(sph_dequantize(codes, codebook)).all()
    with pytest.raises(ValueError, match="hessian"):
        sph_quantize_feedback(w, h[:8, :8], codebook, 3, 32)
    with pytest.raises(ValueError, match="block_size"):
        sph_quantize_feedback(w, h, codebook, 3, 32, block_size=12)
    with pytest.raises(ValueError, match="damp"):
        sph_quantize_feedback(w, h, codebook, 3, 32, damp=-1.0)
    with pytest.raises(ValueError, match="group_size"):
        sph_quantize_feedback(w, h, codebook, 3, 12)
