import numpy as np
import pytest
import torch

from lit_lowrank.ops.lowrank import (
    effective_rank_of,
    low_rank_approx,
    low_rank_factors,
    rank_for_energy,
    stable_rank_of,
    truncated_svd,
)


def test_low_rank_approx_matches_numpy_eckart_young():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(12, 7, generator=g, dtype=torch.float64)
    u, s, vh = np.linalg.svd(m.numpy(), full_matrices=False)
    expected = (u[:, :3] * s[:3]) @ vh[:3]
    assert np.allclose(low_rank_approx(m, 3).numpy(), expected, atol=1e-10)
    # the residual's spectral norm is the first dropped singular value
    assert np.isclose(np.linalg.norm(m.numpy() - expected, 2), s[3])


def test_factors_balanced_and_batched():
    m = torch.randn(4, 9, 6, dtype=torch.float64)
    a, b = low_rank_factors(m, 6)
    assert a.shape == (4, 9, 6) and b.shape == (4, 6, 6)
    assert torch.allclose(a @ b, m, atol=1e-10)
    assert torch.allclose(a.norm(dim=-2), b.norm(dim=-1), atol=1e-10)


def test_half_precision_input_is_computed_in_float32():
    m = torch.randn(8, 8).half()
    u, s, vh = truncated_svd(m, 2)
    assert s.dtype == torch.float32
    assert low_rank_approx(m, 2).dtype == torch.float16


@pytest.mark.parametrize("rank", [0, 8, 2.5])
def test_bad_rank_names_the_parameter(rank):
    with pytest.raises(ValueError, match="rank must be an integer in \\[1, min\\(m, n\\)=7\\]"):
        truncated_svd(torch.randn(7, 9), rank)


def test_rank_for_energy():
    s = torch.tensor([[3.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert rank_for_energy(s, 9 / 14).tolist() == [1, 3]
    assert rank_for_energy(s, 1.0).tolist() == [3, 4]
    with pytest.raises(ValueError, match="energy"):
        rank_for_energy(s, 0.0)


def test_stable_and_effective_rank_invariants():
    g = torch.Generator().manual_seed(1)
    rank_one = torch.randn(10, 1, generator=g) @ torch.randn(1, 6, generator=g)
    assert torch.isclose(stable_rank_of(rank_one), torch.tensor(1.0), atol=1e-5)
    assert torch.isclose(effective_rank_of(rank_one), torch.tensor(1.0), atol=1e-3)
    eye = torch.eye(5)
    assert torch.isclose(stable_rank_of(eye), torch.tensor(5.0))
    assert torch.isclose(effective_rank_of(eye), torch.tensor(5.0))
    m = torch.randn(3, 10, 6, generator=g)
    sr = stable_rank_of(m)
    assert torch.allclose(stable_rank_of(7.0 * m), sr, atol=1e-5)
    assert ((sr >= 1) & (sr <= 6)).all()
    assert stable_rank_of(torch.zeros(4, 4)).item() == 0.0 and effective_rank_of(torch.zeros(4, 4)).item() == 0.0
