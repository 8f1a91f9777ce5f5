"""SARA rank-control math: LRAE, rank levels, factored-layer MACs, the DP rank schedule and the online rule.

SARA (Step-Adaptive Rank Adjustment, METHODS.md §17) runs a pretrained diffusion
denoiser with its Linear layers factored by SVD, ``W = U Σ Vᵀ``, and chooses the
rank of each layer per denoising step. This file holds the math only (no layers,
no Lightning); :class:`~lit_lowrank.ops.svd_linear.SVDLinear` is the layer and
:class:`~lit_lowrank.callbacks.sara.SARA` the callback.

- **LRAE** (Low-Rank Approximation Error) of rank ``r``: spectrum-based (input
  isotropic) ``√(Σ_{i>r} σ_i² / Σ σ_i²)`` and data-aware ``‖X V_{>r} Σ_{>r}‖ / ‖X Wᵀ‖``.
- **MACs** of a layer at rank ``r``: ``rows · min(r (m + n), m n)`` — above the
  break-even rank ``m n / (m + n)`` the dense weight runs instead (cheaper and exact).
- **SARA-DP**: a multiple-choice knapsack over (step, block) groups — minimise the sum
  of per-group errors under a total MACs budget — solved exactly by dynamic programming
  on a cost grid (costs rounded *up* to the grid, so the real budget always holds).
- **SARA-Online**: the abstract's premise is that the effective rank of the denoiser *output* varies
  across steps. Per step, the closed-form LRAE of the previous output's own spectrum (each sample's
  output as a matrix) gives the smallest rank fraction ``ρ_t`` that represents it to relative error
  ``τ``; every factored layer runs at ``⌈ρ_t · min(m, n)⌉`` (:func:`online_rank_fraction`).

.. code-block:: python

    from lit_lowrank.ops.sara.rank import lrae_spectrum, solve_rank_dp

    lrae_spectrum(singular_values(weight), torch.tensor([8, 16, 32]))   # (3,)
    rho = online_rank_fraction(previous_output, tau=0.3)                # SARA-Online's step fraction
    choice = solve_rank_dp(errors, costs, budget=0.6 * costs[:, -1].sum())  # (G,) level per group
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from lit_lowrank.ops.lowrank import effective_rank_of
from lit_lowrank.ops.macs import linear_macs

__all__ = [
    "break_even_rank",
    "brute_force_rank_choice",
    "factored_macs",
    "lrae_data",
    "lrae_spectrum",
    "fraction_rank",
    "online_rank_fraction",
    "output_effective_rank",
    "output_lrae",
    "output_matrices",
    "rank_levels",
    "solve_rank_dp",
]


def break_even_rank(out_features: int, in_features: int) -> float:
    """``m n / (m + n)``: a rank-``r`` factor pair saves MACs only for ``r`` below this."""
    return out_features * in_features / (out_features + in_features)


def factored_macs(rows: int, out_features: int, in_features: int, rank: int | None) -> int:
    """MACs of ``rows`` inputs through a layer at ``rank`` (``None`` = dense).

    A factored pair costs ``rows · r (m + n)``; at or above the break-even rank the dense
    weight runs instead (what :class:`~lit_lowrank.ops.svd_linear.SVDLinear` does), so the
    cost is capped at ``rows · m n``.
    """
    dense = linear_macs(rows, in_features, out_features)
    if rank is None:
        return dense
    if rank < 1:
        raise ValueError(f"`rank` must be >= 1 or None (dense), got {rank!r}.")
    return min(dense, linear_macs(rows, in_features, rank) + linear_macs(rows, rank, out_features))


def rank_levels(full_rank: int, fractions: Sequence[float]) -> list[int]:
    """Ranks ``max(1, round(f · full_rank))`` for each fraction, ascending and unique.

    Args:
        full_rank: ``min(m, n)`` of the layer.
        fractions: rank fractions in ``(0, 1]``.
    """
    if not fractions or any(not 0.0 < f <= 1.0 for f in fractions):
        raise ValueError(f"`levels` must be a non-empty list of fractions in (0, 1], got {fractions!r}.")
    return sorted({max(1, min(full_rank, round(f * full_rank))) for f in fractions})


def lrae_spectrum(singular: Tensor, ranks: Tensor | Sequence[int]) -> Tensor:
    """Spectrum-based LRAE ``√(Σ_{i>r} σ_i² / Σ σ_i²)`` for each rank (input assumed isotropic).

    Args:
        singular: descending singular values ``(k,)``.
        ranks: ranks ``(R,)`` in ``[0, k]``.

    Returns:
        ``(R,)`` errors in ``[0, 1]`` (0 at full rank), float64.
    """
    ranks = torch.as_tensor(ranks, dtype=torch.long)
    if singular.dim() != 1:
        raise ValueError(f"`singular` must be 1-D (k,), got shape {tuple(singular.shape)}.")
    if ((ranks < 0) | (ranks > singular.numel())).any():
        raise ValueError(f"`ranks` must lie in [0, {singular.numel()}], got {ranks.tolist()}.")
    power = singular.double().pow(2)
    # tail[r] = Σ_{i >= r} σ_i² (0-based), tail[k] = 0
    tail = torch.cat([power.flip(0).cumsum(0).flip(0), power.new_zeros(1)])
    return (tail[ranks] / power.sum().clamp_min(torch.finfo(torch.float64).tiny)).sqrt()


def lrae_data(x: Tensor, vh: Tensor, singular: Tensor, ranks: Tensor | Sequence[int]) -> Tensor:
    """Data-aware LRAE ``‖X V_{>r} Σ_{>r}‖_F / ‖X Wᵀ‖_F`` on actual layer inputs.

    Because ``U`` is orthonormal, the truncation error of ``X Wᵀ`` at rank ``r`` is
    ``‖X V_{>r} Σ_{>r}‖_F``; one projection ``Z = X V Σ`` gives every rank at once.

    Args:
        x: layer inputs ``(..., n)``.
        vh: right singular vectors ``(k, n)``.
        singular: singular values ``(k,)``.
        ranks: ranks ``(R,)`` in ``[0, k]``.

    Returns:
        ``(R,)`` relative errors (float64).
    """
    if vh.dim() != 2 or x.shape[-1] != vh.shape[-1] or singular.shape != vh.shape[:1]:
        raise ValueError(f"lrae_data: expected x (..., n), vh (k, n), singular (k,); got {tuple(x.shape)}, "
                         f"{tuple(vh.shape)}, {tuple(singular.shape)}.")
    ranks = torch.as_tensor(ranks, dtype=torch.long)
    z = (x.reshape(-1, x.shape[-1]).double() @ vh.double().T) * singular.double()
    column = z.pow(2).sum(0)
    tail = torch.cat([column.flip(0).cumsum(0).flip(0), column.new_zeros(1)])
    return (tail[ranks] / column.sum().clamp_min(torch.finfo(torch.float64).tiny)).sqrt()


def output_matrices(output: Tensor) -> Tensor:
    """Each sample's denoiser output as a matrix: ``(N, C, H, W) -> (N, C·H, W)``; ``(N, L, D)`` is kept.

    The rows of an image output are its channel rows, the columns its pixel columns; a token
    output (``(N, L, D)``, e.g. an audio or sequence DiT) is already a matrix per sample.
    """
    if output.dim() == 4:
        return output.flatten(1, 2)
    if output.dim() == 3:
        return output
    raise ValueError(f"`output` must be (N, C, H, W) or (N, L, D), got shape {tuple(output.shape)}.")


def output_lrae(output: Tensor) -> Tensor:
    """Spectrum LRAE of each sample's output matrix at every rank: ``(N, k + 1)``, column ``r`` = rank ``r``.

    ``√(Σ_{i>r} s_i² / Σ s_i²)`` with ``s`` the singular values of :func:`output_matrices` (float64;
    column 0 is 1, column ``k`` is 0). This is the closed-form LRAE of SARA-Online: how much of the
    output a rank-``r`` approximation misses.
    """
    s = torch.linalg.svdvals(output_matrices(output).double())
    power = s.pow(2)
    tail = torch.cat([power.flip(-1).cumsum(-1).flip(-1), power.new_zeros(power.shape[0], 1)], dim=-1)
    return (tail / power.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)).sqrt()


def output_effective_rank(output: Tensor) -> Tensor:
    """Effective rank (Roy & Vetterli, ``exp`` of the entropy of ``σ / Σσ``) of each sample's output
    matrix as a fraction of its full rank ``k``: ``(N,)`` in ``(0, 1]`` (0 for an all-zero output)."""
    matrices = output_matrices(output).double()
    k = min(matrices.shape[-2:])
    return effective_rank_of(matrices) / k


def online_rank_fraction(output: Tensor, tau: float) -> float:
    """SARA-Online's rank fraction for the next step: the smallest ``ρ = r / k`` at which the batch-mean
    :func:`output_lrae` of the denoiser output is ``≤ tau``, with ``r`` interpolated linearly between
    integer ranks (so ``ρ`` moves continuously with ``tau``).

    A low-rank output (e.g. the smooth, coarse predictions of the noisy steps) gives a small ``ρ``;
    a detailed one a large ``ρ``. ``ρ`` is monotone non-increasing in ``tau``: 1 at ``tau = 0``,
    0 at ``tau >= 1`` (the layers then run at rank 1).

    Args:
        output: the denoiser output of the previous step, ``(N, C, H, W)`` or ``(N, L, D)``.
        tau: tolerated relative truncation error of the output, ``>= 0``.
    """
    if tau < 0:
        raise ValueError(f"`threshold`={tau!r}, expected >= 0.")
    curve = output_lrae(output).mean(0)  # (k + 1,), decreasing from 1 to 0
    k = curve.numel() - 1
    below = torch.nonzero(curve <= tau).flatten()
    r = int(below[0])
    if r == 0:
        return 0.0
    hi, lo = float(curve[r - 1]), float(curve[r])
    crossing = (r - 1) + (hi - tau) / max(hi - lo, 1e-12)
    return float(min(1.0, max(0.0, crossing / k)))


def fraction_rank(fraction: float, full_rank: int) -> int:
    """``max(1, ⌈fraction · full_rank⌉)``, capped at ``full_rank``: a layer's rank at a rank fraction."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"`fraction`={fraction!r}, expected a value in [0, 1].")
    return int(min(full_rank, max(1, math.ceil(fraction * full_rank - 1e-9))))


def solve_rank_dp(errors: Tensor | np.ndarray, costs: Tensor | np.ndarray, budget: float,
                  unit: float | None = None, resolution: int | None = None) -> np.ndarray:
    """Globally optimal level per group under a total-cost budget (multiple-choice knapsack by DP).

    Minimises ``Σ_g errors[g, choice[g]]`` subject to ``Σ_g costs[g, choice[g]] ≤ budget``: the
    additive per-(step, block) error model of SARA-DP. Costs are put on a grid of size
    ``unit`` and rounded **up**, so the returned choice always meets the real budget and is
    optimal for the gridded costs; with integer costs and ``unit=1`` it is exactly optimal.

    Args:
        errors: ``(G, L)`` error of level ``l`` in group ``g``.
        costs: ``(G, L)`` non-negative cost (MACs) of level ``l`` in group ``g``.
        budget: total cost allowed.
        unit: cost grid; default ``budget / resolution``.
        resolution: grid cells in the budget when ``unit`` is not given; default
            ``min(20000, max(2000, 200 G))`` (≤ 0.5% of the budget lost to rounding).

    Returns:
        ``(G,)`` int array of chosen levels.

    Raises:
        ValueError: on shape mismatch, negative costs, or a budget below the cheapest choice.
    """
    e = np.asarray(errors.detach().cpu() if isinstance(errors, Tensor) else errors, dtype=np.float64)
    c = np.asarray(costs.detach().cpu() if isinstance(costs, Tensor) else costs, dtype=np.float64)
    if e.ndim != 2 or e.shape != c.shape or e.shape[1] < 1:
        raise ValueError(f"`errors` and `costs` must both be (G, L); got {e.shape} and {c.shape}.")
    if (c < 0).any():
        raise ValueError("`costs` must be non-negative.")
    groups = e.shape[0]
    cheapest = float(c.min(1).sum())
    if budget < cheapest * (1 - 1e-12):
        raise ValueError(f"`budget`={budget!r} is below the cheapest schedule's cost {cheapest!r}: "
                         "lower the smallest rank level or raise the budget.")
    if unit is None:
        resolution = resolution or min(20000, max(2000, 200 * groups))
        unit = budget / resolution if budget > 0 else 1.0
    if unit <= 0:
        raise ValueError(f"`unit` must be > 0, got {unit!r}.")
    # a tiny slack so integer costs on an integer grid do not round up from float noise
    q = np.ceil(c / unit - 1e-9).astype(np.int64)
    capacity = int(math.floor(budget / unit + 1e-9))
    if q.min(1).sum() > capacity:
        # rounding up made the cheapest schedule infeasible on the grid: refine the grid
        return solve_rank_dp(e, c, budget, unit=unit / 4)
    inf = np.inf
    best = np.full(capacity + 1, 0.0)          # best[cap] = min error of groups so far with cost ≤ cap
    choice = np.zeros((groups, capacity + 1), dtype=np.int16)
    for g in range(groups):
        new = np.full(capacity + 1, inf)
        pick = np.zeros(capacity + 1, dtype=np.int16)
        for level in range(e.shape[1]):
            w = q[g, level]
            if w > capacity:
                continue
            candidate = np.full(capacity + 1, inf)
            candidate[w:] = best[: capacity + 1 - w] + e[g, level]
            better = candidate < new
            new[better], pick[better] = candidate[better], level
        best, choice[g] = new, pick
    result = np.zeros(groups, dtype=np.int64)
    cap = capacity
    for g in range(groups - 1, -1, -1):
        result[g] = choice[g, cap]
        cap -= q[g, result[g]]
    return result


def brute_force_rank_choice(errors: np.ndarray, costs: np.ndarray, budget: float) -> tuple[float, np.ndarray]:
    """Exhaustive search over every level combination (tests only: ``L^G`` choices)."""
    e, c = np.asarray(errors, dtype=np.float64), np.asarray(costs, dtype=np.float64)
    best, arg = math.inf, None
    for combo in itertools.product(range(e.shape[1]), repeat=e.shape[0]):
        idx = np.arange(e.shape[0]), np.asarray(combo)
        if c[idx].sum() <= budget + 1e-9 and e[idx].sum() < best:
            best, arg = float(e[idx].sum()), np.asarray(combo)
    if arg is None:
        raise ValueError("no feasible choice")
    return best, arg
