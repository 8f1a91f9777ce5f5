import numpy as np
import pytest
import torch

from lit_lowrank.ops.lowrank import low_rank_approx, singular_values
from lit_lowrank.ops.sara import (
    break_even_rank,
    brute_force_rank_choice,
    factored_macs,
    lrae_data,
    lrae_spectrum,
    online_rank,
    online_threshold,
    output_change,
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


def test_online_rank_is_monotone_in_the_threshold():
    s = singular_values(_weight(32, 32, seed=3))
    taus = [0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 0.9, 1.5]
    ranks = [online_rank(s, t, 32, 32) for t in taus]
    as_int = [32 if r is None else r for r in ranks]
    assert all(a >= b for a, b in zip(as_int, as_int[1:]))
    assert ranks[0] is None and ranks[-1] == 1
    for t, r in zip(taus[1:-1], ranks[1:-1]):
        if r is not None:  # the chosen rank meets the threshold and one rank less does not
            assert float(lrae_spectrum(s, [r])[0]) <= t + 1e-9
            assert r == 1 or float(lrae_spectrum(s, [r - 1])[0]) > t


def test_online_rank_tolerance_scales_with_the_cost_share():
    s = singular_values(_weight(32, 32, seed=4))
    full = [online_rank(s, 0.5, 32, 32, cost_share=c) for c in (1.0, 0.25, 0.01)]
    as_int = [32 if r is None else r for r in full]
    assert as_int == sorted(as_int)  # cheaper layers keep more rank
    assert online_rank(s, 0.5, 32, 32, cost_share=0.25) == online_rank(s, 0.25, 32, 32)
    with pytest.raises(ValueError, match="cost_share"):
        online_rank(s, 0.5, 32, 32, cost_share=0.0)


def test_online_threshold_from_output_change():
    a, b = torch.ones(4) * 2, torch.ones(4) * 1.5
    assert output_change(None, b) is None
    assert output_change(a, b) == pytest.approx(0.25)
    assert online_threshold(None, None, 1.0) is None  # no history: full rank
    assert online_threshold(0.1, 0.1, 0.7) == pytest.approx(0.7)
    assert online_threshold(0.4, 0.1, 0.8) == pytest.approx(0.2)  # output moves 4x faster: 4x less tolerance
    assert online_threshold(0.05, 0.1, 0.8) == pytest.approx(0.8)  # capped at the scale
    taus = [online_threshold(0.3, 0.1, s) for s in (0.1, 0.5, 1.0)]
    assert taus == sorted(taus)
    with pytest.raises(ValueError, match="threshold"):
        online_threshold(0.1, 0.1, -1.0)
