"""Sliced / max-sliced W1 against POT and SciPy (ops/sliced_wasserstein.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from lit_lowrank.ops.sliced_wasserstein import (
    max_sliced_w1_on_grid,
    projected_cdf,
    slice_directions,
    sliced_w1_on_grid,
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


def _gaussian_masses(points, mean):
    return torch.exp(-((points - torch.tensor(mean, dtype=points.dtype)) ** 2).sum(-1) / 2)


def test_max_sliced_w1_optimises_the_continuous_direction():
    # two unit Gaussians whose means differ by 1 along 17°: max-sliced W1 = 1 at φ = 17°, which no
    # direction kπ/8 hits (the best of those gives cos 5.5° = 0.9954)
    g = torch.linspace(-6, 6, 121, dtype=torch.float64)
    points = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    phi = math.radians(17)
    model = _gaussian_masses(points, [0.0, 0.0])[None].requires_grad_(True)
    data = _gaussian_masses(points, [math.cos(phi), math.sin(phi)])[None]
    edges = torch.linspace(-9, 9, 721, dtype=torch.float64)
    value, angle = max_sliced_w1_on_grid(points, model, data, edges)
    fixed = w1_between_cdfs(projected_cdf(points, model, slice_directions(2, 8), edges),
                            projected_cdf(points, data, slice_directions(2, 8), edges), float(edges[1] - edges[0]))
    assert float(value.detach()) == pytest.approx(1.0, abs=2e-3) and float(fixed) < float(value.detach()) - 3e-3
    assert math.degrees(float(angle)) == pytest.approx(17.0, abs=1.0)
    dense_only, _ = max_sliced_w1_on_grid(points, model, data, edges, num_angles=8, refine_steps=0)
    assert float(dense_only) == pytest.approx(float(fixed), abs=1e-9)   # the refinement is what finds 17°
    value.sum().backward()
    assert model.grad is not None and model.grad.abs().sum() > 0
    # the sliced (mean over the half circle) distance of a shift d is (2/π)·d
    assert float(sliced_w1_on_grid(points, model.detach(), data, edges)) == pytest.approx(2 / math.pi, abs=3e-3)


def test_max_sliced_w1_per_set_angles_and_errors():
    g = torch.linspace(-5, 5, 61, dtype=torch.float64)
    points = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    model = torch.stack([_gaussian_masses(points, [0.0, 0.0])] * 2)
    data = torch.stack([_gaussian_masses(points, [0.8, 0.0]), _gaussian_masses(points, [0.0, 0.8])])
    values, angles = max_sliced_w1_on_grid(points, model, data, torch.linspace(-8, 8, 481, dtype=torch.float64))
    assert values.shape == (2,) and torch.allclose(values, torch.full((2,), 0.8, dtype=torch.float64), atol=5e-3)
    assert float(angles[0]) == pytest.approx(0.0, abs=0.03) or float(angles[0]) == pytest.approx(math.pi, abs=0.03)
    assert float(angles[1]) == pytest.approx(math.pi / 2, abs=0.03)
    with pytest.raises(ValueError, match="num_angles"):
        max_sliced_w1_on_grid(points, model, data, torch.linspace(-8, 8, 10), num_angles=2)
    with pytest.raises(ValueError, match="points"):
        max_sliced_w1_on_grid(points[:, :1], model, data, torch.linspace(-8, 8, 10))
