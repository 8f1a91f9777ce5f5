import numpy as np
import pytest
import torch

from lit_lowrank.ops.lowrank import low_rank_approx, singular_values
from lit_lowrank.ops.sara.rank import (
    break_even_rank,
    brute_force_rank_choice,
    factored_macs,
    fraction_rank,
    lrae_data,
    lrae_spectrum,
    online_rank_fraction,
    output_effective_rank,
    output_lrae,
    output_matrices,
    rank_levels,
    solve_rank_dp,
)


def _weight(m=12, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=g, dtype=torch.float64) * torch.logspace(0, -1, n, dtype=torch.float64)


def test_lrae_spectrum_is_the_relative_frobenius_truncation_error():
    w = _weight()
    errs = lrae_spectrum(singular_values(w), [1, 3, 5, 9])
    for r, e in zip([1, 3, 5], errs[:3]):
        direct = (w - low_rank_approx(w, r)).norm() / w.norm()
        assert abs(float(e) - float(direct)) < 1e-10
    assert float(errs[-1]) == 0.0
    assert torch.all(errs[:-1].diff() <= 0)


def test_lrae_data_is_the_relative_output_error_on_inputs():
    w = _weight()
    x = torch.randn(50, 9, dtype=torch.float64) @ torch.randn(9, 9, dtype=torch.float64)  # anisotropic inputs
    _, s, vh = torch.linalg.svd(w, full_matrices=False)
    errs = lrae_data(x, vh, s, [2, 4, 9])
    for r, e in zip([2, 4], errs):
        direct = (x @ (w - low_rank_approx(w, r)).T).norm() / (x @ w.T).norm()
        assert abs(float(e) - float(direct)) < 1e-10
    assert float(errs[-1]) < 1e-12
    with pytest.raises(ValueError, match="lrae_data"):
        lrae_data(torch.randn(3, 5), vh, s, [1])


def test_factored_macs_arithmetic_and_break_even():
    assert factored_macs(10, 64, 32, None) == 10 * 64 * 32
    assert factored_macs(10, 64, 32, 4) == 10 * 4 * (64 + 32)
    # at and above m n / (m + n) the dense layer is cheaper and is what runs
    assert break_even_rank(64, 64) == 32
    assert factored_macs(3, 64, 64, 32) == 3 * 64 * 64 == factored_macs(3, 64, 64, 40)
    assert factored_macs(3, 64, 64, 31) == 3 * 31 * 128 < 3 * 64 * 64
    with pytest.raises(ValueError, match="rank"):
        factored_macs(1, 4, 4, 0)


def test_rank_levels():
    assert rank_levels(128, [0.125, 0.25, 1.0]) == [16, 32, 128]
    assert rank_levels(3, [0.01, 0.1]) == [1]
    with pytest.raises(ValueError, match="levels"):
        rank_levels(8, [0.0, 0.5])


@pytest.mark.parametrize("seed", range(6))
def test_dp_matches_brute_force_with_integer_costs(seed):
    rng = np.random.default_rng(seed)
    groups, levels = 5, 3
    costs = np.sort(rng.integers(1, 9, size=(groups, levels)), axis=1)
    errors = np.sort(rng.random((groups, levels)), axis=1)[:, ::-1].copy()
    budget = float(rng.integers(costs[:, 0].sum(), costs[:, -1].sum() + 1))
    best, _ = brute_force_rank_choice(errors, costs, budget)
    choice = solve_rank_dp(errors, costs, budget, unit=1.0)
    idx = (np.arange(groups), choice)
    assert costs[idx].sum() <= budget
    assert errors[idx].sum() == pytest.approx(best, abs=1e-12)


def test_dp_with_real_valued_costs_is_feasible_and_near_optimal():
    rng = np.random.default_rng(7)
    costs = np.sort(rng.random((6, 3)) * 1e6, axis=1)
    errors = rng.random((6, 3))
    errors[:, -1] = 0.0
    budget = 0.6 * costs[:, -1].sum()
    best, _ = brute_force_rank_choice(errors, costs, budget)
    choice = solve_rank_dp(errors, costs, budget)
    idx = (np.arange(6), choice)
    assert costs[idx].sum() <= budget
    # rounding costs up to the grid can only lose what a 0.5% smaller budget would lose
    best_tight, _ = brute_force_rank_choice(errors, costs, budget * 0.99)
    assert best - 1e-12 <= errors[idx].sum() <= best_tight + 1e-12


def test_dp_refuses_an_infeasible_budget():
    with pytest.raises(ValueError, match="budget"):
        solve_rank_dp(np.zeros((2, 2)), np.array([[5, 10], [5, 10]]), 9.0)


def _low_rank_outputs(n=5, rank=2, rows=8, cols=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, rows, rank, generator=g, dtype=torch.float64)
            @ torch.randn(n, rank, cols, generator=g, dtype=torch.float64)).unsqueeze(1)  # (N, 1, H, W)


def test_output_lrae_is_each_samples_relative_truncation_error():
    out = torch.randn(3, 2, 4, 6, dtype=torch.float64)
    curve = output_lrae(out)
    assert curve.shape == (3, 7)  # (C·H = 8) x 6 matrices: ranks 0..6
    for i in range(3):
        m = output_matrices(out)[i]
        for r in (0, 2, 5, 6):
            direct = (m - low_rank_approx(m, r)).norm() / m.norm() if r else torch.tensor(1.0)
            assert float(curve[i, r]) == pytest.approx(float(direct), abs=1e-10)
    with pytest.raises(ValueError, match="output"):
        output_lrae(torch.randn(4, 5))


def test_online_rank_fraction_reads_the_output_rank_and_is_monotone_in_tau():
    low = _low_rank_outputs(rank=2)
    # a rank-2 output is represented exactly at 2 of 8: any tiny tolerance stops there
    assert online_rank_fraction(low, 1e-9) == pytest.approx(2 / 8, abs=1e-6)
    assert online_rank_fraction(_low_rank_outputs(rank=6), 1e-9) == pytest.approx(6 / 8, abs=1e-6)
    full = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    taus = [0.0, 0.05, 0.2, 0.4, 0.7, 0.99, 1.0, 2.0]
    fractions = [online_rank_fraction(full, t) for t in taus]
    assert fractions[0] == 1.0 and fractions[-1] == 0.0
    assert all(a >= b for a, b in zip(fractions, fractions[1:]))
    # interpolation: the batch-mean LRAE at the fractional rank equals tau
    curve = output_lrae(full).mean(0).numpy()
    for t, f in zip(taus[1:5], fractions[1:5]):
        assert np.interp(f * 8, np.arange(9), curve) == pytest.approx(t, abs=1e-9)
    with pytest.raises(ValueError, match="threshold"):
        online_rank_fraction(full, -0.1)


def test_output_effective_rank_and_fraction_rank():
    assert output_effective_rank(_low_rank_outputs(rank=1)).tolist() == pytest.approx([1 / 8] * 5)
    eye = torch.eye(8, dtype=torch.float64).expand(2, 1, 8, 8)
    assert output_effective_rank(eye).tolist() == pytest.approx([1.0, 1.0])
    assert fraction_rank(0.25, 64) == 16 and fraction_rank(0.26, 64) == 17
    assert fraction_rank(0.0, 64) == 1 and fraction_rank(1.0, 64) == 64
    with pytest.raises(ValueError, match="fraction"):
        fraction_rank(1.5, 8)
