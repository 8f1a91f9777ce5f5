"""Iterative maximum-likelihood (RρR) homodyne tomography on binned data (Lvovsky 2004).

The baseline of the neural-network tomography (METHODS.md §4). Records of each phase
setting are binned on a ``B^M`` grid of cells over ``[−L, L]^M``; cell ``c`` has the
projector ``Π_c ∝ Φ_c* Φ_cᵀ`` with ``Φ_c`` the :func:`~lit_lowrank.ops.homodyne.joint_basis`
at the cell centre — the same Hermite functions the neural model uses. With frequencies
``f_c`` and ``p_c = tr(Π_c ρ)``:

    R(ρ) = Σ_c (f_c / p_c) Π_c,   ρ ← R ρ R / tr(R ρ R)

starting from the maximally mixed state. No noise model: detector inefficiency and
additive noise are fitted as if they were the state, which is what sets iMLE's noise floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lit_lowrank.ops.homodyne import joint_basis


@dataclass
class IMLEResult:
    """``rho`` ``(D, D)`` complex128, the iterations run and ``‖Δρ‖_F`` per iteration."""

    rho: Tensor
    iterations: int
    changes: list[float] = field(default_factory=list)


def bin_homodyne(
    theta: Tensor, x: Tensor, mask: Tensor | None, quadrature_limit: float, num_bins: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Non-empty cells of the per-setting histograms.

    Args:
        theta: ``(S, M)`` settings; x: ``(S, n, M)`` records; mask: ``(S, n)`` valid records.
        quadrature_limit: the grid ``[−L, L]`` per mode (records outside are dropped).
        num_bins: cells per mode ``B``.

    Returns:
        ``(cell_theta (C, M), cell_centre (C, M), frequency (C,))`` over non-empty cells,
        frequencies normalised over all records.
    """
    num_settings, _, num_modes = x.shape
    if theta.shape != (num_settings, num_modes):
        raise ValueError(f"`theta` has shape {tuple(theta.shape)}, expected ({num_settings}, {num_modes}).")
    mask = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    width = 2 * quadrature_limit / num_bins
    cell = torch.floor((x.double() + quadrature_limit) / width).long()
    inside = mask & ((cell >= 0) & (cell < num_bins)).all(-1)
    flat = torch.zeros(x.shape[:2], dtype=torch.long)
    for m in range(num_modes):
        flat = flat * num_bins + cell[..., m].clamp(0, num_bins - 1)
    setting = torch.arange(num_settings)[:, None].expand_as(flat)
    key = (setting * num_bins**num_modes + flat)[inside]
    counts = torch.bincount(key, minlength=num_settings * num_bins**num_modes).double()
    nonzero = counts.nonzero().squeeze(-1)
    s, rest = nonzero // num_bins**num_modes, nonzero % num_bins**num_modes
    centres = []
    for _ in range(num_modes):
        centres.append(rest % num_bins)
        rest = rest // num_bins
    centre = -quadrature_limit + width * (torch.stack(centres[::-1], dim=-1).double() + 0.5)
    total = mask.sum().clamp_min(1).double()
    return theta.double()[s], centre, counts[nonzero] / total


def imle_reconstruct(
    theta: Tensor,
    x: Tensor,
    cutoffs: Sequence[int],
    mask: Tensor | None = None,
    quadrature_limit: float = 7.0,
    num_bins: int = 48,
    max_iter: int = 300,
    tol: float = 1e-7,
) -> IMLEResult:
    """Reconstruct ``ρ`` from homodyne records by iterative MLE.

    Args:
        theta: ``(S, M)`` settings; x: ``(S, n, M)`` records; mask: ``(S, n)``.
        cutoffs: per-mode Fock cutoffs ``(N₁[, N₂])``, ``D = ∏ N_m``.
        quadrature_limit, num_bins: the binning grid.
        max_iter, tol: stop after ``max_iter`` or when ``‖Δρ‖_F < tol``.

    .. code-block:: python

        result = imle_reconstruct(theta, records, cutoffs=(10, 10))
        fidelity_to_pure(true_state, result.rho)
    """
    if len(cutoffs) != x.shape[-1]:
        raise ValueError(f"`cutoffs`={tuple(cutoffs)} but the records have {x.shape[-1]} modes.")
    cell_theta, centre, freq = bin_homodyne(theta, x, mask, quadrature_limit, num_bins)
    if freq.numel() == 0:
        raise ValueError("imle_reconstruct: no record falls inside the binning grid; raise `quadrature_limit`.")
    phi = joint_basis(centre, cell_theta, cutoffs).to(torch.complex128)  # (C, D)
    dim = phi.shape[-1]
    rho = torch.eye(dim, dtype=torch.complex128) / dim
    changes: list[float] = []
    it = 0
    for it in range(1, max_iter + 1):
        p = ((phi @ rho) * phi.conj()).sum(-1).real.clamp_min(1e-300)
        r = (phi.conj().T * (freq / p)) @ phi
        new = r @ rho @ r
        new = 0.5 * (new + new.conj().T)  # keep it exactly Hermitian against round-off drift
        new = new / torch.diagonal(new).real.sum()
        change = float(torch.linalg.matrix_norm(new - rho))
        changes.append(change)
        rho = new
        if change < tol:
            break
    return IMLEResult(rho=rho, iterations=it, changes=changes)
