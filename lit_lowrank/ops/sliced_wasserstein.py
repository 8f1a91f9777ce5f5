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
        directions: ``(K, d)``.
        edges: ``(T + 1,)`` increasing bin edges; projections outside fall in the end bins.

    Returns:
        ``(B, K, T)``: ``F_{b,k}(edges[1:])``; differentiable in ``weights``.
    """
    if weights.dim() != 2:
        raise ValueError(f"`weights` must be (B, P), got shape {tuple(weights.shape)}.")
    num_bins = edges.numel() - 1
    proj = points.to(directions.dtype) @ directions.T  # (P, K) or (B, P, K)
    idx = torch.bucketize(proj.contiguous(), edges.to(proj.dtype)[1:-1])  # in [0, T-1]
    idx = idx.transpose(-1, -2)  # (K, P) or (B, K, P)
    batch, num_dirs = weights.shape[0], directions.shape[0]
    idx = idx.expand(batch, num_dirs, -1) if idx.dim() == 2 else idx
    w = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    hist = torch.zeros(batch, num_dirs, num_bins, dtype=w.dtype, device=w.device)
    hist = hist.scatter_add(2, idx, w[:, None, :].expand(-1, num_dirs, -1))
    return torch.cumsum(hist, dim=-1)


def w1_between_cdfs(model_cdf: Tensor, data_cdf: Tensor, bin_width: float, reduction: str = "max") -> Tensor:
    """``Σ_t |F_model − F_data| Δt`` per slice ``(..., T)``, reduced over every slice and setting.

    ``reduction="max"`` is the max-sliced W1 (max over settings and directions), ``"mean"``
    the sliced W1, ``"none"`` returns ``(...)``.
    """
    if model_cdf.shape != data_cdf.shape:
        raise ValueError(f"`model_cdf` {tuple(model_cdf.shape)} and `data_cdf` {tuple(data_cdf.shape)} differ.")
    values = (model_cdf - data_cdf.to(model_cdf.dtype)).abs().sum(-1) * bin_width
    return _reduce(values.flatten() if reduction != "none" else values, reduction)
