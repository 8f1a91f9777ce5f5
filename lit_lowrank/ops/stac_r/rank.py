"""STAC-R's per-layer rank for a fidelity target: the smallest basis that keeps the weight-gradient cosine.

The paper states its fidelity condition as a mean weight-gradient cosine ``≥ 0.98``; a fixed
rank for every layer misses it where a layer's inputs are spread over many directions (MiniLM
at rank 32: mean 0.90, worst layer 0.72). On one calibration step with the exact input
``X (N, d)`` and output gradient ``G (N, d_out)`` of a Linear layer, the cosine a rank-``r``
code in the top-``r`` principal basis ``V_r`` of ``X`` reaches is closed-form: with
``A = Gᵀ X V`` (``V`` the right singular vectors of ``X``, which span its rows),

``cos(Gᵀ X V_r V_rᵀ, Gᵀ X) = ‖A[:, :r]‖_F / ‖A‖_F``

(``V_r`` orthonormal: the inner product and the approximation's norm are both ``‖A[:, :r]‖²``).
The ``energy`` criterion needs no gradient: ``‖X V_r‖_F / ‖X‖_F = √(Σ_{i≤r} σ_i² / Σ σ_i²)``,
the cosine of ``X`` to its rank-``r`` reconstruction. Both ignore the sparse residual (which
only raises the cosine) and the coefficients' bf16 rounding (about ``1e-3``), and a tracked basis
serves later batches, not this one: ``margin`` is added to the target.

.. code-block:: python

    from lit_lowrank.ops.stac_r.rank import select_rank

    choice = select_rank(x2d, g2d, target=0.98, criterion="grad_cosine", margin=0.005, multiple=8)
    choice.rank, choice.basis.shape, choice.cosine     # e.g. 136, (384, 136), 0.9853
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["RankChoice", "rank_cosine_curve", "select_rank"]

Criterion = Literal["grad_cosine", "energy"]


@dataclass(frozen=True)
class RankChoice:
    """``rank``: the chosen rank; ``basis``: orthonormal ``(d, rank)`` float32 (top principal directions of ``X``);
    ``cosine``: the criterion's value at ``rank``; ``curve``: the criterion at every rank ``1..k`` (``k = min(N, d)``)."""

    rank: int
    basis: Tensor
    cosine: float
    curve: Tensor


def _principal(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(σ² descending (k,), V (d, k))`` of ``x (N, d)`` in float32 (``eigh`` of the Gram when ``N ≥ d``)."""
    xf = x.detach().float()
    n, d = xf.shape
    if n >= d:  # (d, d) eigenproblem instead of an (N, d) SVD: N can be thousands of tokens
        evals, evecs = torch.linalg.eigh(xf.T @ xf)
        return evals.flip(0).clamp_min(0.0), evecs.flip(1)
    _, s, vh = torch.linalg.svd(xf, full_matrices=False)
    return s.square(), vh.T


def rank_cosine_curve(x: Tensor, grad_out: Tensor | None = None,
                      criterion: Criterion = "grad_cosine") -> tuple[Tensor, Tensor]:
    """The criterion at every rank and the principal basis: ``(curve (k,), V (d, k))``.

    Args:
        x: ``(N, d)`` exact layer input. grad_out: ``(N, d_out)`` (needed for ``"grad_cosine"``).
        criterion: ``"grad_cosine"`` (``‖A[:, :r]‖/‖A‖``, ``A = GᵀXV``) or ``"energy"`` (``‖XV_r‖/‖X‖``).
    """
    if x.dim() != 2:
        raise ValueError(f"`x` must be a matrix (N, d), got shape {tuple(x.shape)}.")
    if criterion not in ("grad_cosine", "energy"):
        raise ValueError(f"`criterion`={criterion!r}, expected 'grad_cosine' or 'energy'.")
    sigma2, v = _principal(x)
    if criterion == "energy":
        mass = sigma2
    else:
        if grad_out is None or grad_out.dim() != 2 or grad_out.shape[0] != x.shape[0]:
            raise ValueError(f"criterion 'grad_cosine' needs `grad_out` (N={x.shape[0]}, d_out), got "
                             f"{None if grad_out is None else tuple(grad_out.shape)}.")
        a = (grad_out.detach().float().T @ x.detach().float()) @ v  # (d_out, k)
        mass = a.square().sum(0)
    total = float(mass.sum())
    if total <= 0.0:  # a zero input or gradient: every rank is exact
        return torch.ones_like(mass), v
    return (mass.cumsum(0) / total).clamp(0.0, 1.0).sqrt(), v


def select_rank(x: Tensor, grad_out: Tensor | None = None, target: float = 0.98, criterion: Criterion = "grad_cosine",
                margin: float = 0.005, multiple: int = 8, min_rank: int = 1, max_rank: int | None = None) -> RankChoice:
    """The smallest rank (a multiple of ``multiple``, within ``[min_rank, max_rank or d]``) whose criterion
    reaches ``min(target + margin, 1)``; at the cap when none does.

    .. code-block:: python

        choice = select_rank(x2d, g2d, target=0.98)     # x2d (N, d), g2d (N, d_out)
        layer.rank, layer.stac_r_basis = choice.rank, choice.basis
    """
    if not 0.0 < target <= 1.0:
        raise ValueError(f"`target`={target!r}, expected a cosine in (0, 1].")
    if margin < 0 or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"`margin`={margin!r} must be >= 0 and `multiple`={multiple!r} a positive integer.")
    d = x.shape[-1]
    cap = min(d, max_rank or d)
    if not 1 <= min_rank <= cap:
        raise ValueError(f"`min_rank`={min_rank!r}, expected an integer in [1, {cap}] (max_rank / in_features).")
    curve, v = rank_cosine_curve(x, grad_out, criterion)
    goal = min(1.0, target + margin) - 1e-6
    reached = (curve >= goal).nonzero()
    need = int(reached[0]) + 1 if reached.numel() else cap
    rank = min(cap, max(min_rank, multiple * math.ceil(need / multiple)))
    k = v.shape[1]
    basis = v[:, :rank]
    if rank > k:  # fewer rows than the rank: the data's directions plus fixed (seeded) ones, orthonormalised
        gen = torch.Generator(device="cpu").manual_seed(0)
        extra = torch.randn(d, rank - k, generator=gen).to(v.device)
        basis, _ = torch.linalg.qr(torch.cat([v, extra], 1))
    cosine = float(curve[min(rank, k) - 1])
    return RankChoice(rank, basis.contiguous(), cosine, curve)
