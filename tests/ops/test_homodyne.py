"""Hermite functions, quadrature densities, states and sampling (ops/homodyne.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from numpy.polynomial.hermite import hermval

from lit_lowrank.ops.homodyne import (
    cat_state,
    coherent_state,
    fidelity_pure,
    fidelity_to_pure,
    hermite_functions,
    mixed_state_density_points,
    phase_settings,
    pure_state_density_grid,
    pure_state_density_points,
    sample_homodyne,
    squeezed_vacuum,
    two_mode_cat_state,
)

GRID = torch.linspace(-12.0, 12.0, 3001, dtype=torch.float64)
DX = float(GRID[1] - GRID[0])

pytestmark = pytest.mark.usefixtures("one_thread")



def test_hermite_matches_direct_formula():
    x = np.linspace(-6, 6, 97)
    psi = hermite_functions(torch.from_numpy(x), 25).numpy()
    for n in range(25):
        coef = np.zeros(n + 1)
        coef[n] = 1.0
        direct = hermval(x, coef) * np.exp(-x**2 / 2) / math.sqrt(2.0**n * math.factorial(n) * math.sqrt(math.pi))
        np.testing.assert_allclose(psi[:, n], direct, atol=1e-11, rtol=1e-9)


def test_hermite_orthonormal():
    x = torch.linspace(-16.0, 16.0, 4001, dtype=torch.float64)  # ψ_59 has negligible mass beyond |x| = 16
    psi = hermite_functions(x, 60)
    gram = psi.T @ psi * float(x[1] - x[0])
    torch.testing.assert_close(gram, torch.eye(60, dtype=torch.float64), atol=1e-9, rtol=0)


def test_hermite_large_cutoff_stays_finite_and_normalised():
    # e^{-x²/2} alone underflows at |x| = 40 while ψ_999 is large there: the log scale handles it
    x = torch.linspace(-56, 56, 8001, dtype=torch.float64)
    psi = hermite_functions(x, 1000)
    assert torch.isfinite(psi).all()
    norm = (psi[:, -1] ** 2).sum() * float(x[1] - x[0])
    assert abs(float(norm) - 1.0) < 1e-6
    near_40 = (x - 40).abs() < 0.5
    assert float(psi[near_40, -1].abs().max()) > 1e-3  # a naive e^{-x²/2} start would give exactly 0 here


def test_hermite_rejects_bad_cutoff():
    with pytest.raises(ValueError, match="cutoff"):
        hermite_functions(GRID, 0)


@pytest.mark.parametrize("alpha,theta", [(1.2 * complex(math.cos(0.7), math.sin(0.7)), 0.3), (2.0, 1.9), (-0.8j, 0.0)])
def test_coherent_quadrature_mean_and_variance(alpha, theta):
    c = coherent_state(alpha, 40)
    p = pure_state_density_grid(c, torch.tensor([[theta]], dtype=torch.float64), GRID)[0]
    mean = float((p * GRID).sum() * DX)
    var = float((p * GRID**2).sum() * DX) - mean**2
    expected = math.sqrt(2) * abs(alpha) * math.cos(theta - math.atan2(alpha.imag if isinstance(alpha, complex) else 0.0,
                                                                        complex(alpha).real))
    assert mean == pytest.approx(expected, abs=1e-9)
    assert var == pytest.approx(0.5, abs=1e-9)


def test_squeezed_variance():
    r = 0.5
    p = pure_state_density_grid(squeezed_vacuum(r, 60), torch.tensor([[0.0], [math.pi / 2]], dtype=torch.float64), GRID)
    var = (p * GRID**2).sum(-1) * DX
    torch.testing.assert_close(var, torch.tensor([math.exp(-2 * r) / 2, math.exp(2 * r) / 2], dtype=torch.float64),
                               atol=1e-6, rtol=0)


def test_two_mode_density_normalised_and_consistent():
    c = two_mode_cat_state(1.5, 16)
    theta = phase_settings([0.0, math.pi / 3, 2 * math.pi / 3], 2)
    grid = torch.linspace(-8, 8, 241, dtype=torch.float64)
    p = pure_state_density_grid(c, theta, grid)
    torch.testing.assert_close(p.sum((1, 2)) * float(grid[1] - grid[0]) ** 2, torch.ones(9, dtype=torch.float64),
                               atol=1e-8, rtol=0)
    # the same density from points, and from ρ = ψψ† with the joint basis
    pts = torch.stack(torch.meshgrid(grid[::40], grid[::30], indexing="ij"), -1).reshape(-1, 2)
    th = theta[4].expand(pts.shape[0], 2)
    direct = pure_state_density_points(c, th, pts)
    rho = c.reshape(-1, 1) @ c.reshape(1, -1).conj()
    torch.testing.assert_close(mixed_state_density_points(rho, th, pts, (16, 16)), direct)
    torch.testing.assert_close(direct.reshape(7, 9), p[4, ::40, ::30])


def test_fidelities():
    a, b = cat_state(1.5, 20), cat_state(1.5, 20, parity=-1)
    assert float(fidelity_pure(a, a)) == pytest.approx(1.0)
    assert float(fidelity_pure(a, b)) == pytest.approx(0.0, abs=1e-12)
    rho = torch.outer(a[:12], a[:12].conj())
    assert float(fidelity_to_pure(a, rho)) == pytest.approx(float(fidelity_pure(a, a[:12])), abs=1e-12)


def test_sampling_moments_and_noise():
    alpha = 1.5
    c = coherent_state(alpha, 30)
    theta = torch.tensor([[0.0], [math.pi / 2]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    x = sample_homodyne(c, theta, 40_000, generator=gen)
    assert x.shape == (2, 40_000, 1)
    assert float(x[0].mean()) == pytest.approx(math.sqrt(2) * alpha, abs=0.02)
    assert float(x[1].mean()) == pytest.approx(0.0, abs=0.02)
    assert float(x[0].var()) == pytest.approx(0.5, abs=0.02)
    # inefficiency shrinks the mean by √η and keeps vacuum variance; additive noise adds σ²
    y = sample_homodyne(c, theta, 40_000, efficiency=0.64, additive_noise=0.3, generator=gen)
    assert float(y[0].mean()) == pytest.approx(0.8 * math.sqrt(2) * alpha, abs=0.02)
    assert float(y[0].var()) == pytest.approx(0.5 + 0.09, abs=0.02)
    with pytest.raises(ValueError, match="efficiency"):
        sample_homodyne(c, theta, 10, efficiency=0.0)


def test_states_and_fidelity_match_qutip():
    qutip = pytest.importorskip("qutip")
    alpha = 1.1 - 0.4j
    ours = coherent_state(alpha, 30).numpy()
    ref = qutip.coherent(30, alpha, method="analytic").full().ravel()
    np.testing.assert_allclose(ours, ref, atol=1e-12)
    cat = cat_state(1.5, 30).numpy()
    rho = 0.7 * np.outer(cat, cat.conj()) + 0.3 * np.outer(ref, ref.conj())
    expected = qutip.fidelity(qutip.Qobj(rho), qutip.Qobj(cat.reshape(-1, 1))) ** 2  # qutip's is the root fidelity
    ours_f = fidelity_to_pure(torch.from_numpy(cat), torch.from_numpy(rho))
    assert float(ours_f) == pytest.approx(expected, abs=1e-6)  # qutip goes through sqrtm
