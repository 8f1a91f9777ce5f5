"""Shared quantization helpers: bit packing, bits accounting, RTN, GPTQ, Hadamard rotation."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.quantization import (
    PACK_PADDING_BYTES,
    gptq_quantize,
    hadamard_block_size,
    hadamard_rotate,
    pack_fields,
    random_signs,
    relative_error,
    rotate_hessian,
    rtn_quantize,
    uniform_bits,
    uniform_dequantize,
    unpack_fields,
)


@pytest.mark.parametrize("widths", [[8, 6, 2], [8, 11, 4], [3], [20, 30], [1, 1, 1]])
def test_pack_unpack_identity(widths):
    gen = torch.Generator().manual_seed(sum(widths))
    count = 1237
    fields = [torch.randint(0, 1 << w, (count,), generator=gen) for w in widths]
    stream = pack_fields(fields, widths)
    assert stream.dtype == torch.uint8
    assert stream.numel() == math.ceil(count * sum(widths) / 8) + PACK_PADDING_BYTES
    for a, b in zip(fields, unpack_fields(stream, widths, count)):
        assert torch.equal(a, b)
    # a slice decodes on its own (the tile-wise GEMV reads only its rows)
    for a, b in zip(fields, unpack_fields(stream, widths, 100, start=555)):
        assert torch.equal(a[555:655], b)


def test_pack_rejects_out_of_range_and_wide_items():
    with pytest.raises(ValueError, match="outside"):
        pack_fields([torch.tensor([4])], [2])
    with pytest.raises(ValueError, match="at most 56"):
        pack_fields([torch.zeros(2, dtype=torch.long)] * 2, [30, 30])


def test_uniform_bits_arithmetic():
    assert uniform_bits(512, 2048, 2, 128).bits_per_weight == pytest.approx(2.25)
    assert uniform_bits(512, 2048, 3, 128).bits_per_weight == pytest.approx(3.25)
    assert uniform_bits(512, 2048, 2, 64).bits_per_weight == pytest.approx(2.5)
    # ragged: 576 = 4.5 groups of 128 -> 5 groups per row
    s = uniform_bits(10, 576, 2, 128)
    assert s.payload_bits == 10 * 576 * 2 and s.scale_bits == 10 * 5 * 32


def test_rtn_matches_known_gaussian_error_and_ragged_groups():
    w = torch.randn(512, 2048, generator=torch.Generator().manual_seed(0))
    # METHODS.md sanity numbers: RTN g128 2.25 bpw ~0.251, 3.25 bpw ~0.046
    assert relative_error(w, uniform_dequantize(rtn_quantize(w, 2, 128))) == pytest.approx(0.251, abs=0.01)
    assert relative_error(w, uniform_dequantize(rtn_quantize(w, 3, 128))) == pytest.approx(0.046, abs=0.005)
    ragged = torch.randn(8, 200)
    q = rtn_quantize(ragged, 4, 128)
    w_hat = uniform_dequantize(q)
    assert w_hat.shape == ragged.shape
    # every weight within half a step of its group's grid
    step = q.step.float()[:, torch.arange(200) // 128]
    assert ((w_hat - ragged).abs() <= step / 2 + 1e-4).all()


def test_gptq_beats_rtn_on_the_hessian_weighted_error():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=gen)
    x = torch.randn(1024, 256, generator=gen) @ (torch.eye(256) + 0.3 * torch.randn(256, 256, generator=gen))
    h = x.T @ x

    def err(w_hat):
        e = w_hat - w
        return float(((e @ h) * e).sum() / ((w @ h) * w).sum())

    rtn = uniform_dequantize(rtn_quantize(w, 2, 64))
    gptq = uniform_dequantize(gptq_quantize(w, h, 2, 64))
    assert err(gptq) < 0.8 * err(rtn)
    with pytest.raises(ValueError, match="hessian"):
        gptq_quantize(w, h[:10, :10], 2, 64)


def test_hadamard_rotation_is_orthogonal():
    signs = random_signs(576, seed=3)
    block = hadamard_block_size(576)
    assert block == 64 and hadamard_block_size(1536) == 512
    x, w = torch.randn(5, 576), torch.randn(7, 576)
    torch.testing.assert_close(hadamard_rotate(x, signs, block) @ hadamard_rotate(w, signs, block).T, x @ w.T,
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(hadamard_rotate(x, signs, block).norm(dim=1), x.norm(dim=1))
    with pytest.raises(ValueError, match="block"):
        hadamard_rotate(x, signs, 128)


def test_clipping_search_never_loses_to_min_max_and_keeps_the_format():
    gen = torch.Generator().manual_seed(2)
    # heavy tails: a few large weights stretch min-max ranges, where clipping helps
    w = torch.distributions.StudentT(3.0).sample((64, 256))
    plain = rtn_quantize(w, 2, 64)
    clipped = rtn_quantize(w, 2, 64, clip_grid=100)
    assert clipped.storage() == plain.storage()
    err_plain = (uniform_dequantize(plain) - w).abs().pow(2.4).view(64, 4, 64).sum(-1)
    err_clip = (uniform_dequantize(clipped) - w).abs().pow(2.4).view(64, 4, 64).sum(-1)
    assert bool((err_clip <= err_plain * (1 + 1e-4)).all())        # per group: min-max is a candidate
    assert relative_error(w, uniform_dequantize(clipped)) < 0.9 * relative_error(w, uniform_dequantize(plain))
    x = torch.randn(512, 256, generator=gen)
    h = x.T @ x
    g_plain, g_clip = gptq_quantize(w, h, 2, 64), gptq_quantize(w, h, 2, 64, clip_grid=100)

    def herr(q):
        e = uniform_dequantize(q) - w
        return float(((e @ h) * e).sum())

    assert herr(g_clip) < herr(g_plain)


def test_rotated_hessian_is_the_gram_matrix_of_rotated_inputs():
    x = torch.randn(300, 96)
    signs = random_signs(96, seed=5)
    block = hadamard_block_size(96)
    x_rot = hadamard_rotate(x, signs, block)
    torch.testing.assert_close(rotate_hessian(x.T @ x, signs, block), x_rot.T @ x_rot, atol=1e-3, rtol=1e-4)
    with pytest.raises(ValueError, match="square"):
        rotate_hessian(torch.randn(3, 4), signs, block)


def test_batched_gptq_sweep_equals_one_problem_at_a_time():
    from lit_lowrank.ops.quantization import gptq_sweep

    gen = torch.Generator().manual_seed(4)
    ws = [torch.randn(24, 96, generator=gen) for _ in range(3)]
    hs = []
    for _ in range(3):
        x = torch.randn(200, 96, generator=gen)
        h = x.T @ x
        h[5, :] = h[:, 5] = 0.0                        # a dead input: zeroed, not a NaN
        hs.append(h)
    codes, lo, step = gptq_sweep(torch.stack(ws), torch.stack(hs), 3, 32, clip_grid=10)
    for i, (w, h) in enumerate(zip(ws, hs)):
        alone = gptq_quantize(w, h, 3, 32, clip_grid=10)
        assert torch.equal(codes[i], alone.codes) and torch.equal(lo[i], alone.minimum)
    assert bool(torch.isfinite(uniform_dequantize(alone)).all())
    with pytest.raises(ValueError, match="B, in, in"):
        gptq_sweep(torch.stack(ws), hs[0], 3, 32)


def test_coarse_to_fine_clipping_search_reaches_the_exhaustive_error():
    from lit_lowrank.ops.quantization import _group_error, _group_params, grouped

    gen = torch.Generator().manual_seed(6)
    for w in (torch.randn(128, 512, generator=gen), torch.distributions.StudentT(3.0).sample((128, 512))):
        for bits in (2, 3):
            groups = grouped(w, 128)
            full = _group_error(groups, *_group_params(groups, bits, 100, coarse_stride=1), bits, 2.4)
            fast = _group_error(groups, *_group_params(groups, bits, 100), bits, 2.4)
            plain = _group_error(groups, *_group_params(groups, bits, 0), bits, 2.4)
            assert bool((fast <= plain * (1 + 1e-5)).all())
            assert float(fast.sum()) <= 1.002 * float(full.sum())
