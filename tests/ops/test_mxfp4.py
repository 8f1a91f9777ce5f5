"""MXFP4 against two references: an independent brute-force nearest-representable search over the
full E2M1 grid (all 16 signed codes), and torchao 0.18.0's MX reference (``to_mx`` / ``to_dtype``,
floor scale mode) frozen in ``data/torchao_mxfp4_reference.pt`` (torchao is not a dependency: when
installed it is also compared live). The fixture was written by::

    g = torch.Generator().manual_seed(1234)
    x = torch.cat([randn(32,128), randn(16,128)*1e-3, randn(16,128)*3e4, (rand(16,128)-.5)*13,
                   randn(16,128)**3, zeros(2,128)])        # all with generator g
    x[-1, :32] = tensor([.25, .75, 1.25, 1.75, 2.5, 3.5, 5., 7.] * 4)
    s, d = to_mx(x, torch.float4_e2m1fn_x2, 32); y = to_dtype(d, s, torch.float4_e2m1fn_x2, 32, torch.float32)
    torch.save({"x": x, "values": y, "scales": s.view(torch.uint8), "torchao": "0.18.0"}, path)
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from lit_lowrank.ops.mxfp4 import (
    E2M1_GRID,
    mxfp4_bits,
    mxfp4_decode,
    mxfp4_encode,
    mxfp4_fake_quant,
    mxfp4_pack,
    mxfp4_quantize,
    mxfp4_unpack,
)

FIXTURE = Path(__file__).parent / "data" / "torchao_mxfp4_reference.pt"


def brute_force_mxfp4(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Scale from the exact float64 log2 of the block max; element = argmin distance over all 16
    signed E2M1 values, ties to the even code, magnitudes beyond 6 clamp to the largest value."""
    grid = [(s * m, c) for c, m in enumerate(E2M1_GRID) for s in (1, -1)]
    out = torch.empty_like(x, dtype=torch.float64)
    rows = x.double().reshape(-1, block)
    flat = out.reshape(-1, block)
    for i, row in enumerate(rows):
        if not torch.isfinite(row).all():
            flat[i] = float("nan")
            continue
        amax = float(row.abs().max())
        e = -127 if amax == 0 else max(-127, min(127, math.floor(math.log2(amax)) - 2))
        scale = 2.0 ** e
        for j, v in enumerate(row.tolist()):
            t = v / scale
            best = min(grid, key=lambda gc: (abs(gc[0] - t), gc[1] % 2))  # nearest, then even code
            flat[i, j] = math.copysign(abs(best[0]), v) * scale if best[0] == 0 else best[0] * scale
    return out.float()


def test_random_values_match_brute_force():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g) * 1e-5,
                   torch.randn(4, 64, generator=g) ** 3 * 100])
    torch.testing.assert_close(mxfp4_quantize(x), brute_force_mxfp4(x), rtol=0, atol=0)


def test_every_scaled_grid_point_and_every_tie():
    # block max 6 -> scale 2^0: every grid value and every midpoint, both signs
    mids = [(a + b) / 2 for a, b in itertools.pairwise(E2M1_GRID)]
    vals = list(E2M1_GRID) + mids + [6.0] * (32 - len(E2M1_GRID) - len(mids))
    x = torch.tensor([vals, [-v for v in vals]])
    got = mxfp4_quantize(x)
    torch.testing.assert_close(got, brute_force_mxfp4(x), rtol=0, atol=0)
    # round-half-to-even: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
    assert got[0, 8:15].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert torch.equal(got[0, :8], torch.tensor(E2M1_GRID))


def test_zeros_and_signed_zero():
    x = torch.zeros(2, 32)
    x[1] = -0.0
    codes, scales = mxfp4_encode(x)
    assert torch.equal(scales, torch.zeros_like(scales))  # smallest scale 2^-127
    assert torch.equal(mxfp4_quantize(x), x)
    assert torch.signbit(mxfp4_quantize(x)[1]).all()


def test_saturation_at_six_times_scale():
    # block max 7.9 -> scale 2^(2-2)=1, 7.9/1 saturates to 6 (no rounding up past the grid)
    x = torch.full((1, 32), 0.5)
    x[0, 0], x[0, 1] = 7.9, -7.9
    got = mxfp4_quantize(x)
    assert got[0, 0] == 6.0 and got[0, 1] == -6.0
    torch.testing.assert_close(got, brute_force_mxfp4(x), rtol=0, atol=0)


def test_subnormal_scales():
    # block maxima below 2^-125 put the exponent at the E8M0 floor 2^-127 (a float32 subnormal scale)
    x = torch.tensor([[2.0 ** -126] + [2.0 ** -128] * 15 + [3 * 2.0 ** -129] * 16,
                      [1e-45] * 32])   # the smallest float32 subnormal
    codes, scales = mxfp4_encode(x)
    assert scales.tolist() == [[0], [0]]
    torch.testing.assert_close(mxfp4_quantize(x), brute_force_mxfp4(x), rtol=0, atol=0)
    assert mxfp4_quantize(x)[0, 0] == 2.0 ** -126  # 2 * 2^-127, exact


def test_nan_policy_poisons_only_its_block():
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    x[0, 5] = float("nan")
    x[1, 40] = float("inf")
    x[2, 0] = -float("inf")
    codes, scales = mxfp4_encode(x)
    assert scales[0, 0] == 255 and scales[1, 1] == 255 and scales[2, 0] == 255
    q = mxfp4_quantize(x)
    assert q[0, :32].isnan().all() and q[1, 32:].isnan().all() and q[2, :32].isnan().all()
    finite = torch.ones(3, 64, dtype=torch.bool)
    finite[0, :32] = finite[1, 32:] = finite[2, :32] = False
    # the other blocks are exactly what they would be without the non-finite neighbours
    assert torch.equal(q[finite], mxfp4_quantize(torch.where(finite, x, torch.zeros(())))[finite])


def test_matches_torchao_reference_fixture():
    ref = torch.load(FIXTURE, weights_only=True)
    codes, scales = mxfp4_encode(ref["x"])
    assert torch.equal(scales, ref["scales"])
    assert torch.equal(mxfp4_quantize(ref["x"]), ref["values"])


def test_matches_torchao_live_when_installed():
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(3)) * 10
    s, d = mx.to_mx(x, torch.float4_e2m1fn_x2, 32)
    assert torch.equal(s.view(torch.uint8), mxfp4_encode(x)[1])
    assert torch.equal(mx.to_dtype(d, s, torch.float4_e2m1fn_x2, 32, torch.float32), mxfp4_quantize(x))


def test_pack_round_trip_and_bits():
    x = torch.randn(8, 96, generator=torch.Generator().manual_seed(2))
    code_stream, scale_stream = mxfp4_pack(x)
    assert torch.equal(mxfp4_unpack(code_stream, scale_stream, x.shape), mxfp4_quantize(x))
    bits = mxfp4_bits(8, 96)
    assert bits.bits_per_weight == 4.25
    assert (code_stream.numel() - 8) * 8 == bits.payload_bits and (scale_stream.numel() - 8) * 8 == bits.scale_bits
    codes, scales = mxfp4_encode(x)
    assert torch.equal(mxfp4_decode(codes, scales), mxfp4_quantize(x))


def test_fake_quant_value_and_straight_through_gradient():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(4), requires_grad=True)
    g = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    out = mxfp4_fake_quant(w)
    assert torch.equal(out.detach(), mxfp4_quantize(w.detach()))
    (out * g).sum().backward()
    assert torch.equal(w.grad, g)


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="block_size=32"):
        mxfp4_quantize(torch.randn(2, 40))
    with pytest.raises(ValueError, match="floating-point"):
        mxfp4_encode(torch.ones(2, 32, dtype=torch.long))
