"""Iterative MLE (RρR) on binned homodyne data (ops/imle.py)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.homodyne import coherent_state, fidelity_to_pure, phase_settings, purity, sample_homodyne
from lit_lowrank.ops.imle import bin_homodyne, detector_kernel, imle_reconstruct, leading_eigenvector

pytestmark = pytest.mark.usefixtures("one_thread")



def test_binning_counts_every_record_inside_the_grid():
    x = torch.tensor([[[0.1], [0.2], [-5.0], [9.9]]], dtype=torch.float64)
    theta, centre, freq = bin_homodyne(torch.zeros(1, 1), x, None, quadrature_limit=6.0, num_bins=12)
    assert float(freq.sum()) == 0.75  # the record at 9.9 is outside [-6, 6]
    assert sorted(centre.flatten().tolist()) == [-4.5, 0.5]


def test_imle_converges_on_noiseless_coherent_data():
    alpha = 1.0 + 0.5j
    state = coherent_state(alpha, 30)
    theta = phase_settings([k * math.pi / 6 for k in range(6)], 1)
    x = sample_homodyne(state, theta, 3000, generator=torch.Generator().manual_seed(0))
    result = imle_reconstruct(theta, x, (6,), num_bins=80, max_iter=150)
    # the likelihood iteration contracts: late updates are much smaller than the first ones
    assert result.changes[-1] < 1e-2 * result.changes[0]
    assert float(fidelity_to_pure(state, result.rho)) > 0.98
    assert float(purity(result.rho)) > 0.95
    evals = torch.linalg.eigvalsh(result.rho)
    assert float(evals.min()) > -1e-10 and abs(float(torch.diagonal(result.rho).real.sum()) - 1) < 1e-10


def test_detector_kernel_is_a_conditional_distribution():
    edges = torch.linspace(-6, 6, 49, dtype=torch.float64)
    y = 0.5 * (edges[1:] + edges[:-1])
    ideal = detector_kernel(edges, y)
    torch.testing.assert_close(ideal, torch.eye(48, dtype=torch.float64))   # no noise: the cell of y
    lossy = detector_kernel(edges, y, efficiency=0.8, additive_noise=0.1)
    inner = (y.abs() < 3)
    assert torch.allclose(lossy.sum(0)[inner], torch.ones(int(inner.sum()), dtype=torch.float64), atol=1e-6)
    mean = (y[:, None] * lossy).sum(0)[inner]                      # E[recorded | y] = √η y
    torch.testing.assert_close(mean, math.sqrt(0.8) * y[inner], atol=2e-3, rtol=0)
    with pytest.raises(ValueError, match="efficiency"):
        detector_kernel(edges, y, efficiency=0.0)


def test_loss_corrected_imle_recovers_the_state_before_the_detector():
    alpha = 1.2
    state = coherent_state(alpha, 30)
    theta = phase_settings([k * math.pi / 6 for k in range(6)], 1)
    x = sample_homodyne(state, theta, 4000, efficiency=0.6, generator=torch.Generator().manual_seed(1))
    plain = imle_reconstruct(theta, x, (8,), num_bins=64, max_iter=300)
    corrected = imle_reconstruct(theta, x, (8,), num_bins=64, max_iter=300, efficiency=0.6)
    # loss shrinks the coherent amplitude by √η: the plain fit reconstructs |√η α⟩, the corrected one |α⟩
    f_plain, f_corr = float(fidelity_to_pure(state, plain.rho)), float(fidelity_to_pure(state, corrected.rho))
    assert f_corr > 0.97 and f_corr > f_plain + 0.03
    shrunk = coherent_state(math.sqrt(0.6) * alpha, 30)
    assert float(fidelity_to_pure(shrunk, plain.rho)) > 0.97
    psi = leading_eigenvector(corrected.rho)
    assert psi.shape == (8,) and float(torch.linalg.vector_norm(psi)) == pytest.approx(1.0)
    assert float(fidelity_to_pure(state, torch.outer(psi, psi.conj()))) >= f_corr - 1e-6  # a pure estimate


def test_two_mode_imle_factorised_povm_matches_the_dense_density():
    from lit_lowrank.ops.homodyne import mixed_state_density_points, quadrature_basis
    from lit_lowrank.ops.imle import _ideal_density

    torch.manual_seed(0)
    a = torch.randn(16, 16, dtype=torch.complex128)
    rho = a @ a.conj().T
    rho = rho / torch.diagonal(rho).real.sum()
    theta = torch.tensor([[0.0, 0.7], [1.1, 2.0]], dtype=torch.float64)
    y = torch.linspace(-3, 3, 7, dtype=torch.float64)
    bases = [quadrature_basis(y[None].expand(2, -1), theta[:, m : m + 1], 4).to(torch.complex128) for m in range(2)]
    q = _ideal_density(rho, bases, (4, 4))                              # (2, 7, 7)
    pts = torch.stack(torch.meshgrid(y, y, indexing="ij"), -1)          # (7, 7, 2)
    for s in range(2):
        dense = mixed_state_density_points(rho, theta[s].expand(7, 7, 2), pts, (4, 4))
        torch.testing.assert_close(q[s], dense, atol=1e-10, rtol=0)
