"""W4A8 and baseline math beside MXFP4: FP8 activations, MXFP8, GPTQ onto the MXFP4 grid."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.ops.mx_extras import E4M3_MAX, fp8_act_fake_quant, gptq_mxfp4, mxfp8_quantize
from lit_lowrank.ops.mxfp4 import mxfp4_quantize


def _problem(seed: int = 0, batch: int = 3, out: int = 24, inp: int = 64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, inp, generator=g) @ (torch.eye(inp) + 0.5 * torch.randn(inp, inp, generator=g))
    return torch.randn(batch, out, inp, generator=g), (x.T @ x)[None].expand(batch, inp, inp).clone()


def test_fp8_activations_scale_each_token_to_the_e4m3_range_and_pass_gradients():
    x = torch.tensor([[1.0, 0.3, -2.0, 0.0], [1e-3, 5e-4, 0.0, -2e-3]], requires_grad=True)
    y = fp8_act_fake_quant(x)
    torch.testing.assert_close(y.abs().amax(-1), x.detach().abs().amax(-1))   # the max maps to 448 exactly
    assert float(((y - x).detach() / x.detach().abs().amax(-1, keepdim=True)).abs().max()) <= 2.0 ** -4
    grad = torch.randn(2, 4)
    y.backward(grad)
    torch.testing.assert_close(x.grad, grad)                                  # straight-through
    assert torch.equal(fp8_act_fake_quant(torch.zeros(2, 3)), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="floating"):
        fp8_act_fake_quant(torch.ones(2, 2, dtype=torch.long))


def test_mxfp8_matches_a_brute_force_e4m3_grid_with_the_ocp_scale():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)) * 3
    q = mxfp8_quantize(w)
    # every finite E4M3 magnitude, from the dtype itself
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].abs().unique()
    blocks = w.reshape(4, 2, 32)
    exp = torch.floor(torch.log2(blocks.abs().amax(-1, keepdim=True))) - 8
    scaled = (blocks / 2 ** exp).clamp(-E4M3_MAX, E4M3_MAX)
    nearest = grid[(scaled.abs()[..., None] - grid).abs().argmin(-1)] * scaled.sign()
    torch.testing.assert_close(q.reshape(4, 2, 32), nearest * 2 ** exp)
    assert float((q - w).pow(2).sum()) < float((mxfp4_quantize(w) - w).pow(2).sum()) / 10
    with pytest.raises(ValueError, match="block_size"):
        mxfp8_quantize(torch.randn(3, 40))


def test_gptq_mxfp4_is_on_the_grid_and_lowers_the_output_error():
    w, h = _problem()
    q = gptq_mxfp4(w, h)
    assert torch.equal(mxfp4_quantize(q), q)                      # servable as MXFP4 (RTN leaves it unchanged)

    def err(a):
        e = a - w
        return float(((e @ h) * e).sum() / ((w @ h) * w).sum())

    assert err(q) < 0.8 * err(mxfp4_quantize(w))


def test_gptq_mxfp4_with_identity_hessian_is_round_to_nearest():
    w, _ = _problem(batch=2)
    eye = torch.eye(64)[None].expand(2, 64, 64).clone()
    torch.testing.assert_close(gptq_mxfp4(w, eye), mxfp4_quantize(w))


def test_gptq_mxfp4_errors_name_the_shapes():
    w, h = _problem()
    with pytest.raises(ValueError, match="hessian"):
        gptq_mxfp4(w, h[:, :8, :8])
    with pytest.raises(ValueError, match="block_size"):
        gptq_mxfp4(w[..., :40], h[:, :40, :40])
