"""Sliced / max-sliced W1 against POT and SciPy (ops/sliced_wasserstein.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from lit_lowrank.ops.sliced_wasserstein import (
    projected_cdf,
    slice_directions,
    sliced_wasserstein_1,
    w1_between_cdfs,
    wasserstein_1d,
)


def test_wasserstein_1d_matches_scipy_weighted():
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=70), rng.normal(1.0, 2.0, size=45)
    uw, vw = rng.random(70), rng.random(45)
    ours = wasserstein_1d(torch.from_numpy(u), torch.from_numpy(v), torch.from_numpy(uw), torch.from_numpy(vw))
    assert float(ours) == pytest.approx(wasserstein_distance(u, v, uw, vw), rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1])
def test_sliced_w1_matches_pot(seed):
    ot = pytest.importorskip("ot")
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(300, 2)), rng.normal(size=(200, 2)) @ np.array([[1.0, 0.5], [0.0, 2.0]]) + 0.7
    dirs = slice_directions(2, 12)
    proj = dirs.numpy().T
    ours_max = sliced_wasserstein_1(torch.from_numpy(x), torch.from_numpy(y), dirs, reduction="max")
    ours_mean = sliced_wasserstein_1(torch.from_numpy(x), torch.from_numpy(y), dirs, reduction="mean")
    ref_max = ot.max_sliced_wasserstein_distance(x, y, p=1, projections=proj)
    ref_mean = ot.sliced_wasserstein_distance(x, y, p=1, projections=proj)
    assert float(ours_max) == pytest.approx(float(ref_max), rel=1e-8)
    assert float(ours_mean) == pytest.approx(float(ref_mean), rel=1e-8)


def test_binned_w1_approximates_exact_and_is_differentiable():
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.normal(size=(4000, 2)))
    y = torch.from_numpy(rng.normal(size=(3000, 2)) * 1.5 + 0.3)
    dirs = slice_directions(2, 6)
    edges = torch.linspace(-10, 10, 801, dtype=torch.float64)
    wy = torch.ones(1, 3000, dtype=torch.float64, requires_grad=True)
    fx = projected_cdf(x[None], torch.ones(1, 4000, dtype=torch.float64), dirs, edges)
    fy = projected_cdf(y[None], wy, dirs, edges)
    binned = w1_between_cdfs(fy, fx, float(edges[1] - edges[0]), reduction="none")[0]
    exact = sliced_wasserstein_1(x, y, dirs, reduction="none")
    torch.testing.assert_close(binned, exact, atol=0.03, rtol=0)
    binned.max().backward()
    assert wy.grad is not None and torch.isfinite(wy.grad).all() and wy.grad.abs().sum() > 0


def test_bad_reduction():
    with pytest.raises(ValueError, match="reduction"):
        sliced_wasserstein_1(torch.zeros(3, 2), torch.ones(3, 2), slice_directions(2, 2), reduction="sum")
