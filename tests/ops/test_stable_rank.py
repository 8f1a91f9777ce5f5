"""stable_rank: NumPy SVD reference, invariances, masking, centering, batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_lowrank.ops.stable_rank import (
    LengthReference,
    fit_length_reference,
    masked_center,
    prefix_stable_ranks,
    stable_rank,
)


def _numpy_srank(h: np.ndarray, center: bool = False) -> float:
    h = h.astype(np.float64)
    if center:
        h = h - h.mean(0, keepdims=True)
    s = np.linalg.svd(h, compute_uv=False)
    return float((s ** 2).sum() / s[0] ** 2)


def _correlated(t: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # a shared mean direction plus anisotropic noise, like real hidden states
    return 3.0 * torch.randn(1, d, generator=g) + torch.randn(t, d, generator=g) * torch.linspace(0.1, 2.0, d)


@pytest.mark.parametrize("center", [False, True])
@pytest.mark.parametrize("shape", [(12, 7), (5, 16), (1, 4)])
def test_matches_numpy_svd(shape, center):
    h = _correlated(*shape, seed=sum(shape))
    got = float(stable_rank(h, center=center))
    if center and shape[0] == 1:
        assert got == 0.0  # a single centred row is all zero
    else:
        assert got == pytest.approx(_numpy_srank(h.numpy(), center), rel=1e-5)


def test_scale_invariance_and_bounds():
    h = _correlated(20, 8, 0)
    base = stable_rank(h)
    for c in (1e-3, 0.5, 7.0, 1e3):
        torch.testing.assert_close(stable_rank(c * h), base, rtol=1e-5, atol=0)
    for t, d in [(3, 10), (30, 6), (10, 10)]:
        value = float(stable_rank(torch.randn(t, d)))
        assert 1.0 - 1e-6 <= value <= min(t, d) + 1e-5


def test_rank_one_is_one_and_orthogonal_rows_are_full():
    u, v = torch.randn(9, 1), torch.randn(1, 5)
    assert float(stable_rank(u @ v)) == pytest.approx(1.0, abs=1e-5)
    assert float(stable_rank(torch.eye(6)[:4])) == pytest.approx(4.0, abs=1e-5)


def test_mask_equals_slicing_and_batch_equals_loop():
    torch.manual_seed(0)
    h = torch.randn(3, 10, 6)
    lengths = torch.tensor([10, 4, 7])
    starts = torch.tensor([0, 1, 3])  # a prompt of `start` tokens is masked away too
    pos = torch.arange(10)
    mask = (pos >= starts[:, None]) & (pos < lengths[:, None])
    for center in (False, True):
        batched = stable_rank(h, mask, center=center)
        for i in range(3):
            expected = _numpy_srank(h[i, starts[i]:lengths[i]].numpy(), center)
            assert float(batched[i]) == pytest.approx(expected, rel=1e-5)
    # garbage in masked rows changes nothing
    noisy = h.clone()
    noisy[~mask] = 1e4
    torch.testing.assert_close(stable_rank(noisy, mask), stable_rank(h, mask))


def test_empty_response_is_zero_and_normalized_range():
    h = torch.randn(2, 6, 4)
    mask = torch.tensor([[True] * 6, [False] * 6])
    out = stable_rank(h, mask)
    assert out[1] == 0 and out[0] > 1
    norm = stable_rank(h, mask, normalize="max_rank")
    assert float(norm[0]) == pytest.approx(float(out[0]) / 4, rel=1e-6)
    assert 0 < float(norm[0]) <= 1


def test_half_precision_input_is_scored_in_float32():
    h = _correlated(16, 8, 3)
    out = stable_rank(h.half())
    assert out.dtype == torch.float32
    assert float(out) == pytest.approx(_numpy_srank(h.half().float().numpy()), rel=1e-4)


def test_masked_center_zeroes_masked_rows():
    h = torch.randn(2, 5, 3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    c = masked_center(h, mask)
    assert torch.all(c[~mask] == 0)
    torch.testing.assert_close(c[0, :3].sum(0), torch.zeros(3), atol=1e-6, rtol=0)


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match="hidden_states"):
        stable_rank(torch.randn(5))
    with pytest.raises(ValueError, match="mask"):
        stable_rank(torch.randn(2, 5, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="normalize"):
        stable_rank(torch.randn(5, 3), normalize="length")
    with pytest.raises(ValueError, match="reference"):
        stable_rank(torch.randn(5, 3), normalize="reference")


def test_prefix_stable_ranks_equal_slicing_and_nan_past_the_end():
    h = torch.stack([_correlated(10, 6, seed=s) for s in range(3)])
    mask = torch.arange(10) < torch.tensor([[10], [6], [3]])
    mask[0, 4] = False                                    # a hole: prefixes count valid rows only
    got = prefix_stable_ranks(h, mask, (1, 3, 5, 9))
    for b in range(3):
        rows = h[b][mask[b]]
        for j, n in enumerate((1, 3, 5, 9)):
            if rows.shape[0] >= n:
                assert float(got[b, j]) == pytest.approx(_numpy_srank(rows[:n].numpy()), rel=1e-4)
            else:
                assert torch.isnan(got[b, j])


def test_length_reference_fit_interpolation_and_normalisation():
    h = torch.stack([_correlated(40, 16, seed=s) for s in range(4)])
    mask = torch.arange(40) < torch.tensor([[40], [40], [20], [8]])
    ref = fit_length_reference(h, mask, (1, 4, 16, 32))
    ranks = prefix_stable_ranks(h, mask, (1, 4, 16, 32))
    assert ref.lengths.tolist() == [1, 4, 16, 32] and ref.counts.tolist() == [4, 4, 3, 2]
    torch.testing.assert_close(ref.values, torch.nanmean(ranks, 0))
    # linear in log T between grid points, held flat outside
    mid = float(ref(torch.tensor(8)))
    assert mid == pytest.approx(float(ref.values[1] + ref.values[2]) / 2, rel=1e-5)
    assert float(ref(torch.tensor(1000))) == pytest.approx(float(ref.values[-1]))
    assert float(ref(torch.tensor(0))) == pytest.approx(float(ref.values[0]))
    # "reference" divides the raw stable rank by the curve at the response's own length
    raw = stable_rank(h, mask)
    normed = stable_rank(h, mask, normalize="reference", reference=ref)
    torch.testing.assert_close(normed, raw / ref(mask.sum(-1)))
    # lengths too few sequences reach are dropped; none reached is an error naming the fix
    assert fit_length_reference(h, mask, (1, 40), min_sequences=3).lengths.tolist() == [1]
    with pytest.raises(ValueError, match="longer reference texts"):
        fit_length_reference(h[3:], mask[3:], (16, 32), min_sequences=1)
    assert LengthReference.from_dict(ref.to_dict()).values.tolist() == ref.values.tolist()
    with pytest.raises(ValueError, match="ascending"):
        LengthReference(torch.tensor([4, 2]), torch.tensor([1.0, 2.0]), torch.tensor([1, 1]))
