"""Iterative MLE (RρR) on binned homodyne data (ops/imle.py)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.homodyne import coherent_state, fidelity_to_pure, phase_settings, purity, sample_homodyne
from lit_lowrank.ops.imle import bin_homodyne, imle_reconstruct

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
