"""Rank allocation for low-rank compensators under a total rank budget (MoE load-aware compensation).

Pure torch (no Lightning). Matrix ``e`` (an expert's weight, or one of its projections) has a
residual ``R_e = W_e - Q(W_e)`` with singular values ``σ_{e,1} ≥ σ_{e,2} ≥ ...`` and a load
``p_e`` (the fraction of routed tokens it serves). A rank-``r_e`` compensator initialised from the
truncated SVD of ``R_e`` leaves the error ``Σ_{k>r_e} σ²_{e,k}`` (Eckart–Young), so the
load-weighted residual energy of an allocation is

    E(r) = Σ_e p_e Σ_{k > r_e} σ²_{e,k}      (normalised by Σ_e p_e ‖R_e‖_F² in :func:`weighted_residual_energy`).

Adding the ``k``-th rank to matrix ``e`` lowers ``E`` by the marginal gain ``p_e σ²_{e,k}``. Because
each matrix's gains are non-increasing in ``k`` (sorted singular values), ``E`` is a separable sum
of convex decreasing functions and the greedy rule — give the next unit of rank to the largest
marginal gain — is optimal for every budget (the classic resource-allocation exchange argument).
:func:`allocate_ranks` implements greedy as "take the ``budget`` largest gains over all
matrices", which selects the same set (each matrix's selected gains form a prefix because they
are sorted); ties go to the lower matrix index, then the lower rank index.

.. code-block:: python

    spectra = [singular_values(w - mxfp4_quantize(w)) for w in expert_weights]
    ranks = allocate_ranks(spectra, loads, budget=4 * len(spectra))     # load-aware
    uniform = uniform_ranks(len(spectra), budget=4 * len(spectra))
    weighted_residual_energy(spectra, loads, ranks) <= weighted_residual_energy(spectra, loads, uniform)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["allocate_ranks", "proportional_ranks", "uniform_ranks", "weighted_residual_energy"]


def _check_inputs(spectra: Sequence[Tensor], loads: Sequence[float] | Tensor) -> tuple[list[Tensor], Tensor]:
    specs = [torch.as_tensor(s).detach().double().reshape(-1) for s in spectra]
    p = torch.as_tensor(loads, dtype=torch.float64).reshape(-1)
    if len(specs) == 0:
        raise ValueError("`spectra` is empty: expected one singular-value vector per matrix.")
    if p.numel() != len(specs):
        raise ValueError(f"`loads` has {p.numel()} entries for {len(specs)} spectra; expected one load per matrix.")
    if bool((p < 0).any()) or not bool(torch.isfinite(p).all()):
        raise ValueError(f"`loads`={p.tolist()}: expected finite non-negative loads.")
    for i, s in enumerate(specs):
        if bool((s < 0).any()) or bool((s[1:] > s[:-1] * (1 + 1e-9) + 1e-30).any()):
            raise ValueError(f"`spectra[{i}]` must be non-negative singular values in descending order "
                             "(greedy allocation is optimal only for sorted spectra).")
    return specs, p


def allocate_ranks(spectra: Sequence[Tensor], loads: Sequence[float] | Tensor, budget: int,
                   max_rank: int | Sequence[int] | None = None) -> list[int]:
    """Load-aware ranks: greedy by marginal load-weighted spectral gain ``p_e σ²_{e,k}``.

    Args:
        spectra: per matrix, its residual's singular values in descending order.
        loads: per matrix, its load ``p_e ≥ 0`` (any scale: only ratios matter).
        budget: total rank ``Σ_e r_e`` to hand out (``≥ 0``; capped by the total available rank).
        max_rank: per-matrix cap (an int for all, or one per matrix); default the spectrum length.

    Returns:
        ``r_e`` per matrix, summing to ``min(budget, Σ caps)``; minimises
        ``Σ_e p_e Σ_{k>r_e} σ²_{e,k}`` over all allocations with that sum.

    .. code-block:: python

        allocate_ranks([torch.tensor([3., 1.]), torch.tensor([2., 2.])], loads=[0.5, 0.5], budget=2)  # [1, 1]
    """
    specs, p = _check_inputs(spectra, loads)
    if int(budget) != budget or budget < 0:
        raise ValueError(f"`budget`={budget!r}: expected a non-negative integer total rank.")
    if max_rank is None:
        caps = [s.numel() for s in specs]
    elif isinstance(max_rank, int):
        caps = [min(max_rank, s.numel()) for s in specs]
    else:
        caps = [min(int(m), s.numel()) for m, s in zip(max_rank, specs)]
        if len(caps) != len(specs):
            raise ValueError(f"`max_rank` has {len(list(max_rank))} entries for {len(specs)} spectra.")
    if any(c < 0 for c in caps):
        raise ValueError(f"`max_rank`={max_rank!r}: expected non-negative caps.")
    gains, owner, position = [], [], []
    for e, (s, cap) in enumerate(zip(specs, caps)):
        gains.append(p[e] * s[:cap].pow(2))
        owner.append(torch.full((cap,), e, dtype=torch.long))
        position.append(torch.arange(cap))
    g, o, k = torch.cat(gains), torch.cat(owner), torch.cat(position)
    take = min(int(budget), g.numel())
    # descending gain, ties: lower matrix index, then lower rank index (lexsort via stable sorts)
    order = torch.argsort(o * (k.max() + 1 if k.numel() else 1) + k, stable=True)
    order = order[torch.argsort(-g[order], stable=True)][:take]
    ranks = torch.bincount(o[order], minlength=len(specs))
    return [int(r) for r in ranks]


def uniform_ranks(num_matrices: int, budget: int, max_rank: int | None = None) -> list[int]:
    """The same rank for every matrix (``budget // n``; the remainder to the first matrices).

    .. code-block:: python

        uniform_ranks(4, budget=10)   # [3, 3, 2, 2]
    """
    if num_matrices < 1 or budget < 0:
        raise ValueError(f"uniform_ranks: num_matrices={num_matrices}, budget={budget}; expected >= 1 and >= 0.")
    base, extra = divmod(int(budget), num_matrices)
    ranks = [base + (1 if i < extra else 0) for i in range(num_matrices)]
    return [min(r, max_rank) for r in ranks] if max_rank is not None else ranks


def proportional_ranks(loads: Sequence[float] | Tensor, budget: int, max_rank: int | None = None) -> list[int]:
    """Ranks proportional to load (largest-remainder rounding): the load-only heuristic baseline.

    .. code-block:: python

        proportional_ranks([0.5, 0.3, 0.2], budget=10)   # [5, 3, 2]
    """
    p = torch.as_tensor(loads, dtype=torch.float64).reshape(-1)
    if p.numel() < 1 or bool((p < 0).any()) or float(p.sum()) <= 0:
        raise ValueError(f"`loads`={p.tolist()}: expected non-negative loads with a positive sum.")
    share = p / p.sum() * int(budget)
    ranks = share.floor().long()
    remainder = int(budget) - int(ranks.sum())
    if remainder > 0:
        ranks[torch.argsort(-(share - ranks), stable=True)[:remainder]] += 1
    out = [int(r) for r in ranks]
    return [min(r, max_rank) for r in out] if max_rank is not None else out


def weighted_residual_energy(spectra: Sequence[Tensor], loads: Sequence[float] | Tensor,
                             ranks: Sequence[int], normalize: bool = True) -> float:
    """``Σ_e p_e Σ_{k>r_e} σ²_{e,k}`` (divided by ``Σ_e p_e Σ_k σ²_{e,k}`` when ``normalize``).

    .. code-block:: python

        weighted_residual_energy(spectra, loads, ranks)   # 1.0 at rank 0, 0.0 at full rank
    """
    specs, p = _check_inputs(spectra, loads)
    if len(ranks) != len(specs):
        raise ValueError(f"`ranks` has {len(ranks)} entries for {len(specs)} spectra.")
    left = sum(float(p[e]) * float(s[int(r):].pow(2).sum()) for e, (s, r) in enumerate(zip(specs, ranks)))
    if not normalize:
        return left
    total = sum(float(p[e]) * float(s.pow(2).sum()) for e, s in enumerate(specs))
    return left / total if total > 0 else 0.0
