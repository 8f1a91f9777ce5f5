"""Greedy load-aware rank allocation is optimal: checked against exhaustive search on random spectra."""

from __future__ import annotations

import itertools

import pytest
import torch

from lit_lowrank.ops.rank_allocation import (
    allocate_ranks,
    proportional_ranks,
    uniform_ranks,
    weighted_residual_energy,
)


def brute_force_best(spectra, loads, budget, cap):
    best = None
    for ranks in itertools.product(*[range(min(cap, s.numel()) + 1) for s in spectra]):
        if sum(ranks) != budget:
            continue
        e = weighted_residual_energy(spectra, loads, list(ranks), normalize=False)
        best = e if best is None else min(best, e)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_greedy_matches_brute_force(seed):
    torch.manual_seed(seed)  # the Dirichlet draw uses the global generator
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 5, (1,), generator=g))
    spectra = [torch.sort(torch.rand(int(torch.randint(2, 6, (1,), generator=g)), generator=g) ** 2 * 3,
                          descending=True).values for _ in range(n)]
    loads = torch.distributions.Dirichlet(torch.ones(n)).sample() if seed % 2 else torch.rand(n, generator=g)
    cap = 4
    total = sum(min(cap, s.numel()) for s in spectra)
    for budget in range(0, total + 1):
        ranks = allocate_ranks(spectra, loads, budget, max_rank=cap)
        assert sum(ranks) == budget and all(0 <= r <= min(cap, s.numel()) for r, s in zip(ranks, spectra))
        got = weighted_residual_energy(spectra, loads, ranks, normalize=False)
        assert got == pytest.approx(brute_force_best(spectra, loads, budget, cap), rel=1e-12, abs=1e-12)


def test_greedy_beats_uniform_and_proportional_with_skewed_loads():
    # the spec's setting: 16 experts, Dirichlet load, flat-ish residual spectra
    torch.manual_seed(0)
    loads = torch.distributions.Dirichlet(torch.full((16,), 0.5)).sample()
    spectra = [torch.sort(torch.rand(32) + 0.5, descending=True).values for _ in range(16)]
    budget = 4 * 16
    greedy = weighted_residual_energy(spectra, loads, allocate_ranks(spectra, loads, budget))
    uniform = weighted_residual_energy(spectra, loads, uniform_ranks(16, budget))
    proportional = weighted_residual_energy(spectra, loads, proportional_ranks(loads, budget, max_rank=32))
    assert greedy < proportional < uniform


def test_equal_loads_and_equal_spectra_give_uniform():
    spectra = [torch.tensor([3.0, 2.0, 1.0])] * 4
    assert allocate_ranks(spectra, [0.25] * 4, 8) == [2, 2, 2, 2]


def test_helpers_and_errors():
    assert uniform_ranks(4, 10) == [3, 3, 2, 2]
    assert proportional_ranks([0.5, 0.3, 0.2], 10) == [5, 3, 2]
    assert weighted_residual_energy([torch.tensor([2.0, 1.0])], [1.0], [0]) == 1.0
    assert weighted_residual_energy([torch.tensor([2.0, 1.0])], [1.0], [2]) == 0.0
    with pytest.raises(ValueError, match="descending"):
        allocate_ranks([torch.tensor([1.0, 2.0])], [1.0], 1)
    with pytest.raises(ValueError, match="one load per matrix"):
        allocate_ranks([torch.tensor([1.0])], [1.0, 2.0], 1)
    with pytest.raises(ValueError, match="budget"):
        allocate_ranks([torch.tensor([1.0])], [1.0], -1)
