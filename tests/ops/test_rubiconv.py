"""RubiConv: exact against the direct O(N L) sum, gradients against autograd through it,
dtypes, batches of packs, malformed cu_seqlens and the short convolution."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_lowrank.ops import (
    cu_seqlens_for_rows,
    packed_long_conv,
    packed_long_conv_reference,
    packed_short_conv,
    plan_packed_conv,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


def _inputs(lengths: list[int], channels: int, taps: int, seed: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    x = torch.randn(n, channels, generator=gen, dtype=dtype)
    kernel = torch.randn(channels, taps, generator=gen, dtype=dtype)
    bias = torch.randn(channels, generator=gen, dtype=dtype)
    return x, kernel, bias, _cu(lengths)


def _pow2_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length()


# document lengths: mostly tiny (incl. 1), some longer than the kernel
doc_lengths = st.lists(st.one_of(st.integers(1, 4), st.integers(1, 90)), min_size=1, max_size=8)


@SETTINGS
@given(lengths=doc_lengths, taps=st.integers(1, 40), channels=st.integers(1, 4), seed=st.integers(0, 2**16),
       small_blocks=st.booleans(), direct_max=st.sampled_from([0, 16]))
def test_matches_direct_reference(lengths, taps, channels, seed, small_blocks, direct_max):
    """Float64: equal to the direct sum to round-off, on every bucket path (FFT, Toeplitz,
    overlap-save pieces for documents longer than the block)."""
    x, kernel, bias, cu = _inputs(lengths, channels, taps, seed)
    block = 2 * _pow2_at_least(taps) if small_blocks else None
    y = packed_long_conv(x, kernel, cu, bias, block_size=block, direct_max=direct_max)
    torch.testing.assert_close(y, packed_long_conv_reference(x, kernel, cu, bias), atol=1e-10, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(lengths=doc_lengths, taps=st.integers(1, 30), seed=st.integers(0, 2**16), small_blocks=st.booleans(),
       direct_max=st.sampled_from([0, 16]))
def test_gradients_match_autograd_through_reference(lengths, taps, seed, small_blocks, direct_max):
    x, kernel, bias, cu = _inputs(lengths, 3, taps, seed)
    upstream = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=x.dtype)
    block = 2 * _pow2_at_least(taps) if small_blocks else None
    grads = []
    for fn in (lambda a, k, b: packed_long_conv(a, k, cu, b, block_size=block, direct_max=direct_max),
               lambda a, k, b: packed_long_conv_reference(a, k, cu, b)):
        leaves = [t.clone().requires_grad_() for t in (x, kernel, bias)]
        grads.append(torch.autograd.grad((fn(*leaves) * upstream).sum(), leaves))
    for ours, ref, name in zip(*grads, ("x", "kernel", "bias")):
        torch.testing.assert_close(ours, ref, atol=1e-9, rtol=1e-9, msg=f"grad of {name}")


def test_gradcheck_small():
    x, kernel, bias, cu = _inputs([1, 5, 2, 19], 2, 6, 0)
    leaves = tuple(t.requires_grad_() for t in (x, kernel, bias))
    assert torch.autograd.gradcheck(lambda a, k, b: packed_long_conv(a, k, cu, b, block_size=16), leaves)


def test_float32_relative_error_is_small():
    """The op's promise: float32 error ~1e-5 relative to the direct convolution (here with long filters)."""
    lengths = [1, 1, 3, 700, 2, 64, 1500, 9, 1]
    x, kernel, bias, cu = _inputs(lengths, 8, 1024, 3, dtype=torch.float32)
    kernel = kernel * torch.exp(-torch.arange(1024) / 256.0)
    ref = packed_long_conv_reference(x.double(), kernel.double(), cu, bias.double())
    y = packed_long_conv(x, kernel, cu, bias)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5


def test_special_packs():
    # only length-1 documents: y = kernel[:, 0] * x
    x, kernel, _, _ = _inputs([1] * 7, 3, 5, 0)
    torch.testing.assert_close(packed_long_conv(x, kernel, torch.arange(8)), x * kernel[:, 0])
    # one document, much longer than the kernel, cut into overlap-save pieces
    x, kernel, bias, cu = _inputs([300], 2, 7, 1)
    plan = plan_packed_conv(cu, 7, block_size=16)
    assert plan.num_buckets == 1 and plan.padded_slots > 300
    torch.testing.assert_close(packed_long_conv(x, kernel, cu, bias, plan=plan),
                               packed_long_conv_reference(x, kernel, cu, bias))
    # no tokens at all
    empty = torch.zeros(0, 3)
    assert packed_long_conv(empty, torch.ones(3, 4), torch.zeros(1, dtype=torch.long)).shape == (0, 3)


def test_nothing_crosses_a_boundary():
    """Changing one document leaves every other document's output bit-for-bit in place."""
    x, kernel, bias, cu = _inputs([5, 40, 3], 2, 64, 0, dtype=torch.float32)
    y = packed_long_conv(x, kernel, cu, bias)
    x2 = x.clone()
    x2[5:45] = torch.randn(40, 2)
    y2 = packed_long_conv(x2, kernel, cu, bias)
    assert torch.equal(y[:5], y2[:5]) and torch.equal(y[45:], y2[45:])
    assert not torch.allclose(y[5:45], y2[5:45])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_compute_in_float32(dtype):
    x, kernel, bias, cu = _inputs([3, 50, 1, 20], 4, 32, 0, dtype=torch.float32)
    xl = x.to(dtype).requires_grad_()
    y = packed_long_conv(xl, kernel, cu, bias)
    assert y.dtype == dtype
    expected = packed_long_conv_reference(xl.detach().double(), kernel.double(), cu, bias.double())
    # only the final rounding to `dtype` separates the two
    torch.testing.assert_close(y.double(), expected, atol=0.0, rtol=2 * torch.finfo(dtype).eps)
    y.float().sum().backward()
    assert xl.grad is not None and xl.grad.dtype == dtype


def test_float64_stays_float64():
    x, kernel, _, cu = _inputs([4, 4], 2, 3, 0)
    assert packed_long_conv(x, kernel, cu).dtype == torch.float64


def test_batch_of_packs():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 20, 4, generator=gen, dtype=torch.float64)
    kernel = torch.randn(4, 9, generator=gen, dtype=torch.float64)
    rows = [torch.tensor([0, 20]), torch.tensor([0, 1, 2, 15, 20]), torch.tensor([0, 7, 20])]
    expected = torch.stack([packed_long_conv_reference(x[i], kernel, rows[i]) for i in range(3)])
    torch.testing.assert_close(packed_long_conv(x, kernel, rows), expected)
    flat = torch.tensor([0, 20, 21, 22, 35, 40, 47, 60])
    torch.testing.assert_close(packed_long_conv(x, kernel, flat), expected)
    with pytest.raises(ValueError, match="crosses a row"):
        packed_long_conv(x, kernel, torch.tensor([0, 30, 60]))


def test_cu_seqlens_for_rows():
    doc_ids = torch.tensor([[4, 4, 5, 5, 5], [6, 6, 6, 7, 8]])
    assert cu_seqlens_for_rows(doc_ids).tolist() == [0, 2, 5, 8, 9, 10]
    assert cu_seqlens_for_rows(doc_ids, respect_boundaries=False).tolist() == [0, 5, 10]


@pytest.mark.parametrize(("cu", "match"), [
    ([1, 3, 6], "must start at 0"),
    ([0, 3, 3, 6], "strictly increasing"),
    ([0, 4, 2, 6], "strictly increasing"),
    ([0, 3, 5], "must end at the number of tokens N=6"),
    ([0, 3, 7], "must end at the number of tokens N=6"),
])
def test_malformed_cu_seqlens(cu, match):
    x, kernel = torch.randn(6, 2), torch.randn(2, 3)
    with pytest.raises(ValueError, match=match):
        packed_long_conv(x, kernel, torch.tensor(cu))
    with pytest.raises(ValueError, match=match):
        packed_short_conv(x, kernel, torch.tensor(cu))


def test_bad_shapes_and_arguments():
    x, cu = torch.randn(6, 2), torch.tensor([0, 6])
    with pytest.raises(ValueError, match="integer dtype"):
        packed_long_conv(x, torch.randn(2, 3), cu.float())
    with pytest.raises(ValueError, match="1-D integer tensor"):
        packed_long_conv(x, torch.randn(2, 3), cu[None])
    with pytest.raises(ValueError, match=r"kernel: expected shape \(H, L\) = \(2, L >= 1\)"):
        packed_long_conv(x, torch.randn(3, 3), cu)
    with pytest.raises(ValueError, match=r"bias: expected shape \(H,\)"):
        packed_long_conv(x, torch.randn(2, 3), cu, bias=torch.ones(3))
    with pytest.raises(ValueError, match=r"x: expected shape"):
        packed_long_conv(torch.randn(6), torch.randn(1, 3), cu)
    with pytest.raises(ValueError, match="block_size"):
        plan_packed_conv(cu, kernel_len=8, block_size=8)
    with pytest.raises(ValueError, match="plan: made for N=6, L=3"):
        packed_long_conv(x, torch.randn(2, 4), cu, plan=plan_packed_conv(cu, 3))


def test_plan_is_reusable_and_movable():
    x, kernel, bias, cu = _inputs([2, 30, 1], 2, 8, 0)
    plan = plan_packed_conv(cu, 8).to("cpu")
    torch.testing.assert_close(packed_long_conv(x, kernel, cu, bias, plan=plan), packed_long_conv(x, kernel, cu, bias))
    assert plan.num_documents == 3
    assert plan.taps_used == (1 + 2) + sum(min(p + 1, 8) for p in range(30)) + 1


@SETTINGS
@given(lengths=doc_lengths, width=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_short_conv_matches_reference(lengths, width, seed):
    x, weight, bias, cu = _inputs(lengths, 3, width, seed)
    expected = packed_long_conv_reference(x, weight, cu) + bias
    torch.testing.assert_close(packed_short_conv(x, weight, cu, bias), expected)
    # and as a batch of one pack
    torch.testing.assert_close(packed_short_conv(x[None], weight, cu, bias)[0], expected)
