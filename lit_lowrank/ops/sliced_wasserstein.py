"""Sliced and max-sliced Wasserstein-1 distances, exact on samples and binned on densities.

For measures ``μ, ν`` on ``R^d`` and unit directions ``u_k``, the slice distance is the 1-D
``W1(u_k#μ, u_k#ν) = ∫ |F_μ,k(t) − F_ν,k(t)| dt`` between the CDFs of the projections. The
max-sliced distance is the max over slices, the sliced one their mean (the ablation).

Two forms share these definitions:

- on samples (:func:`wasserstein_1d`, :func:`sliced_wasserstein_1`): exact, weighted,
  differentiable in positions and weights; cross-checked against POT in the tests;
- on a density known on a grid (:func:`projected_cdf`, :func:`w1_between_cdfs`): the
  model's quadrature density is evaluated on a fixed grid, each grid point carries mass
  ``p·ΔA``, and projected CDFs are histograms on fixed ``t``-bins (a scatter-add, so
  differentiable in the density). Measured records are binned on the same ``t``-bins, so
  the loss costs the same at 10³ or 10⁵ shots. The binning error is at most one bin width.

The max-sliced distance is a max over the *continuous* direction (Deshpande et al. 2019):
:func:`max_sliced_w1_on_grid` searches the half circle of 2-D directions densely, refines
the best angle by golden-section search, and returns the distance at the maximising angle
(differentiable in the masses; by Danskin's theorem that is the gradient of the max).
A fixed handful of directions only gives a lower bound of it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

REDUCTIONS = ("max", "mean", "none")


def _reduce(values: Tensor, reduction: str) -> Tensor:
    if reduction == "max":
        return values.max()
    if reduction == "mean":
        return values.mean()
    if reduction == "none":
        return values
    raise ValueError(f"`reduction`={reduction!r}, expected one of {REDUCTIONS}.")


def wasserstein_1d(u: Tensor, v: Tensor, u_weights: Tensor | None = None, v_weights: Tensor | None = None) -> Tensor:
    """Exact ``W1`` between two weighted 1-D empirical measures (``∫|F_u − F_v|``).

    Args:
        u: ``(n,)`` positions; v: ``(m,)`` positions.
        u_weights, v_weights: non-negative ``(n,)`` / ``(m,)`` weights (normalised inside);
            uniform when ``None``.

    Returns:
        scalar tensor.

    .. code-block:: python

        wasserstein_1d(torch.tensor([0.0, 1.0]), torch.tensor([0.5]))  # 0.5
    """
    if u.dim() != 1 or v.dim() != 1:
        raise ValueError(f"`u` and `v` must be 1-D, got shapes {tuple(u.shape)} and {tuple(v.shape)}.")
    uw = torch.ones_like(u) if u_weights is None else u_weights.to(u.dtype)
    vw = torch.ones_like(v) if v_weights is None else v_weights.to(v.dtype)
    uw, vw = uw / uw.sum(), vw / vw.sum()
    values = torch.cat([u, v])
    order = torch.argsort(values)
    sorted_values = values[order]
    # signed mass: +u weights, -v weights; its running sum is F_u - F_v between consecutive points
    signed = torch.cat([uw, -vw])[order]
    cdf_diff = torch.cumsum(signed, 0)[:-1]
    return (cdf_diff.abs() * torch.diff(sorted_values)).sum()


def slice_directions(num_dims: int, num_directions: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Deterministic unit directions ``(K, d)``.

    ``d = 1``: the single direction ``[1]``. ``d = 2``: ``u_k = (cos φ_k, sin φ_k)`` with
    ``φ_k = kπ/K`` — a half circle suffices because ``W1`` is symmetric under ``u → −u``,
    and ``k = 0`` and ``k = K/2`` are the two single-mode marginals.
    """
    if num_dims == 1:
        return torch.ones(1, 1, dtype=dtype)
    if num_dims != 2:
        raise ValueError(f"`num_dims`={num_dims}: deterministic directions exist for 1 or 2 dims.")
    if num_directions < 1:
        raise ValueError(f"`num_directions`={num_directions}, expected >= 1.")
    phi = torch.arange(num_directions, dtype=dtype) * math.pi / num_directions
    return torch.stack([phi.cos(), phi.sin()], dim=-1)


def sliced_wasserstein_1(
    x: Tensor,
    y: Tensor,
    directions: Tensor,
    x_weights: Tensor | None = None,
    y_weights: Tensor | None = None,
    reduction: str = "max",
) -> Tensor:
    """Sliced ``W1`` between two weighted sample sets, exact per slice.

    Args:
        x: ``(n, d)``; y: ``(m, d)`` samples.
        directions: ``(K, d)`` unit directions.
        x_weights, y_weights: optional ``(n,)`` / ``(m,)`` weights.
        reduction: ``"max"`` (max-sliced), ``"mean"`` (sliced) or ``"none"`` (``(K,)``).

    .. code-block:: python

        d = slice_directions(2, 16)
        msw = sliced_wasserstein_1(torch.randn(500, 2), torch.randn(400, 2) + 1, d)
    """
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != y.shape[1] or directions.shape[-1] != x.shape[1]:
        raise ValueError(f"`x` {tuple(x.shape)}, `y` {tuple(y.shape)} and `directions` {tuple(directions.shape)}"
                         " must be (n, d), (m, d) and (K, d) with the same d.")
    px, py = x @ directions.T.to(x.dtype), y @ directions.T.to(y.dtype)
    values = torch.stack([wasserstein_1d(px[:, k], py[:, k], x_weights, y_weights)
                          for k in range(directions.shape[0])])
    return _reduce(values, reduction)


def projected_cdf(points: Tensor, weights: Tensor, directions: Tensor, edges: Tensor) -> Tensor:
    """CDFs of weighted point sets projected on each direction, at the right edge of each bin.

    Args:
        points: ``(P, d)`` shared by every set, or ``(B, P, d)``.
        weights: ``(B, P)`` non-negative masses (normalised per set inside; zero = absent).
        directions: ``(K, d)`` shared by every set, or ``(B, K, d)`` per set.
        edges: ``(T + 1,)`` increasing bin edges; projections outside fall in the end bins.

    Returns:
        ``(B, K, T)``: ``F_{b,k}(edges[1:])``; differentiable in ``weights``.
    """
    if weights.dim() != 2:
        raise ValueError(f"`weights` must be (B, P), got shape {tuple(weights.shape)}.")
    w = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    return torch.cumsum(_projected_histogram(points, w, directions, edges), dim=-1)


def _projected_histogram(points: Tensor, masses: Tensor, directions: Tensor, edges: Tensor) -> Tensor:
    """``(B, K, T)`` histograms of ``masses (B, P)`` (not normalised, may be signed) projected on ``directions``."""
    num_bins = edges.numel() - 1
    dirs = directions.to(masses.dtype if masses.is_floating_point() else directions.dtype)
    pts = points.to(dirs.dtype)
    if dirs.dim() == 3:
        if dirs.shape[0] != masses.shape[0]:
            raise ValueError(f"per-set `directions` {tuple(dirs.shape)} must have B = {masses.shape[0]} rows.")
        proj = torch.einsum("pd,bkd->bkp" if pts.dim() == 2 else "bpd,bkd->bkp", pts, dirs)
    else:
        proj = (pts @ dirs.T).transpose(-1, -2)  # (K, P) or (B, K, P)
    idx = torch.bucketize(proj.contiguous(), edges.to(proj.dtype)[1:-1])  # in [0, T-1]
    batch, num_dirs = masses.shape[0], dirs.shape[-2]
    idx = idx.expand(batch, num_dirs, -1) if idx.dim() == 2 else idx
    hist = torch.zeros(batch, num_dirs, num_bins, dtype=masses.dtype, device=masses.device)
    return hist.scatter_add(2, idx, masses[:, None, :].expand(-1, num_dirs, -1))


def w1_between_cdfs(model_cdf: Tensor, data_cdf: Tensor, bin_width: float, reduction: str = "max") -> Tensor:
    """``Σ_t |F_model − F_data| Δt`` per slice ``(..., T)``, reduced over every slice and setting.

    ``reduction="max"`` is the max-sliced W1 (max over settings and directions), ``"mean"``
    the sliced W1, ``"none"`` returns ``(...)``.
    """
    if model_cdf.shape != data_cdf.shape:
        raise ValueError(f"`model_cdf` {tuple(model_cdf.shape)} and `data_cdf` {tuple(data_cdf.shape)} differ.")
    values = (model_cdf - data_cdf.to(model_cdf.dtype)).abs().sum(-1) * bin_width
    return _reduce(values.flatten() if reduction != "none" else values, reduction)


def angle_directions(angles: Tensor) -> Tensor:
    """Unit 2-D directions ``(..., 2)`` = ``(cos φ, sin φ)`` of angles ``(...)``."""
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def _w1_at_angles(points: Tensor, diff: Tensor, angles: Tensor, edges: Tensor, bin_width: float) -> Tensor:
    """``W1`` per set and angle ``(B, K)`` of the signed mass difference ``diff (B, P)``; ``angles (B, K)`` or ``(K,)``."""
    dirs = angle_directions(angles.to(diff.dtype))
    return torch.cumsum(_projected_histogram(points, diff, dirs, edges), dim=-1).abs().sum(-1) * bin_width


def max_sliced_w1_on_grid(points: Tensor, model_weights: Tensor, data_weights: Tensor, edges: Tensor,
                          num_angles: int = 32, refine_steps: int = 8) -> tuple[Tensor, Tensor]:
    """Max-sliced ``W1`` over the continuous direction of 2-D masses on shared grid points.

    For each set ``b`` the slice distance ``W(φ) = ∫|F_model,φ − F_data,φ|`` is evaluated
    (without gradient) at ``num_angles`` angles ``kπ/K`` of the half circle (``W(φ + π) = W(φ)``),
    the best one is refined by ``refine_steps`` golden-section steps on the bracket of its two
    neighbours (the best angle seen is kept, so the result is never below the dense search),
    and ``W`` is evaluated once more, differentiably, at the maximising angle ``φ*_b``. By
    Danskin's theorem ``∇ max_φ W(φ) = ∇W(φ*)``: the gradient reaches every mass through the
    worst slice of each set.

    Args:
        points: ``(P, 2)`` grid points shared by every set.
        model_weights: ``(B, P)`` non-negative masses (normalised per set inside; differentiable).
        data_weights: ``(B, P)`` non-negative masses of the records on the same points.
        edges: ``(T + 1,)`` increasing ``t``-bin edges of the projections.
        num_angles: angles of the dense search (``>= 3``).
        refine_steps: golden-section steps after it (0: the dense search only).

    Returns:
        ``(values (B,), angles (B,))``: the max-sliced distance per set and its angle in ``[0, π)``.

    .. code-block:: python

        w, phi = max_sliced_w1_on_grid(grid_points, model_density, record_counts, t_edges)
        loss = w.mean()                              # one max-sliced distance per setting
    """
    if points.dim() != 2 or points.shape[-1] != 2:
        raise ValueError(f"`points` must be (P, 2), got shape {tuple(points.shape)}.")
    if model_weights.shape != data_weights.shape or model_weights.dim() != 2:
        raise ValueError(f"`model_weights` {tuple(model_weights.shape)} and `data_weights` "
                         f"{tuple(data_weights.shape)} must both be (B, P).")
    if num_angles < 3 or refine_steps < 0:
        raise ValueError(f"`num_angles`={num_angles} (expected >= 3) and `refine_steps`={refine_steps} (>= 0).")
    tiny = torch.finfo(model_weights.dtype).tiny
    bin_width = float(edges[1] - edges[0])
    model = model_weights / model_weights.sum(-1, keepdim=True).clamp_min(tiny)
    data = data_weights.to(model.dtype) / data_weights.sum(-1, keepdim=True).to(model.dtype).clamp_min(tiny)
    with torch.no_grad():
        diff = (model - data).detach()
        step = math.pi / num_angles
        grid = torch.arange(num_angles, dtype=diff.dtype, device=diff.device) * step
        values = _w1_at_angles(points, diff, grid, edges, bin_width)                # (B, K)
        best_value, best_index = values.max(-1)
        best_angle = grid[best_index]
        lo, hi = best_angle - step, best_angle + step
        golden = (math.sqrt(5.0) - 1.0) / 2.0
        a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
        if refine_steps > 0:
            wa = _w1_at_angles(points, diff, a[:, None], edges, bin_width)[:, 0]
            wb = _w1_at_angles(points, diff, b[:, None], edges, bin_width)[:, 0]
        for _ in range(refine_steps):
            for angle, value in ((a, wa), (b, wb)):
                better = value > best_value
                best_value = torch.where(better, value, best_value)
                best_angle = torch.where(better, angle, best_angle)
            left = wa >= wb                       # the max lies in [lo, b] when W(a) >= W(b)
            hi, lo = torch.where(left, b, hi), torch.where(left, lo, a)
            b_new, a_new = torch.where(left, a, lo + golden * (hi - lo)), torch.where(left, hi - golden * (hi - lo), b)
            a, b = a_new, b_new
            fresh = _w1_at_angles(points, diff, torch.where(left, a, b)[:, None], edges, bin_width)[:, 0]
            wa, wb = torch.where(left, fresh, wb), torch.where(left, wa, fresh)
        if refine_steps > 0:
            for angle, value in ((a, wa), (b, wb)):
                better = value > best_value
                best_angle = torch.where(better, angle, best_angle)
        best_angle = torch.remainder(best_angle, math.pi)
    out = _w1_at_angles(points, model - data, best_angle[:, None], edges, bin_width)[:, 0]
    return out, best_angle


def sliced_w1_on_grid(points: Tensor, model_weights: Tensor, data_weights: Tensor, edges: Tensor,
                      num_angles: int = 32) -> Tensor:
    """Sliced ``W1`` (the mean over ``num_angles`` evenly spaced angles of the half circle) per set ``(B,)``."""
    tiny = torch.finfo(model_weights.dtype).tiny
    model = model_weights / model_weights.sum(-1, keepdim=True).clamp_min(tiny)
    data = data_weights.to(model.dtype) / data_weights.sum(-1, keepdim=True).to(model.dtype).clamp_min(tiny)
    grid = torch.arange(num_angles, dtype=model.dtype, device=model.device) * math.pi / num_angles
    return _w1_at_angles(points, model - data, grid, edges, float(edges[1] - edges[0])).mean(-1)
