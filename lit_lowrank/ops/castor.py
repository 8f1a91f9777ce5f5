"""Castor's propagation math (METHODS.md §6; derived, closest prior work ACM-GNN and GPRGNN).

Castor propagates node states ``H⁰ = MLP(X)`` for ``K`` hops. At hop ``k`` a router reads
each node's current and initial state and mixes three primitives of the normalised
adjacency ``Â = D̃^(-1/2)(A + I)D̃^(-1/2)``:

    r_i  = softmax(W_k [h_iᵏ ‖ h_i⁰] / τ)                  over {low, high, identity}
    u    = r_L ⊙ ÂHᵏ + r_H ⊙ (I − Â)Hᵏ + r_I ⊙ Hᵏ
    Hᵏ⁺¹ = u + β_k (Hᵏ − Hᵏ⁻¹),   H⁻¹ = H⁰,   β_k = β_max tanh(b_k)  (init 0)

so a node's hop operator is ``(r_L − r_H) Â + (r_H + r_I) I``: low-pass when the low
primitive wins, high-pass (``(r_L − r_H) < 0``) when the high one does. ``β = 0`` is
first-order propagation; ``β ≠ 0`` carries the last change forward (heavy ball). The
Nesterov variant evaluates the router and the primitives at the look-ahead point
``Yᵏ = Hᵏ + β_k (Hᵏ − Hᵏ⁻¹)`` instead: ``Hᵏ⁺¹ = route(Yᵏ)``.

.. code-block:: python

    from lit_lowrank.ops.castor import castor_hop, router_probabilities

    ah = adj @ h                                                   # Â Hᵏ, sparse adj (N, N)
    routes = router_probabilities(h, h0, weight, bias, tau=1.0)    # (N, 3)
    h_next = castor_hop(h, h_prev, ah, routes, beta=0.3)           # (N, C)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

#: The primitives in router order: ``Â`` (low-pass), ``I − Â`` (high-pass), ``I`` (identity).
PRIMITIVES: tuple[str, str, str] = ("low", "high", "identity")


def router_probabilities(h: Tensor, h0: Tensor, weight: Tensor, bias: Tensor, tau: float = 1.0) -> Tensor:
    """Per-node mixing weights ``softmax(W [h ‖ h0] / τ)``.

    Args:
        h: ``(N, C)`` current states ``Hᵏ``.
        h0: ``(N, C)`` initial states ``H⁰``.
        weight: ``(3, 2C)`` router matrix ``W_k``.
        bias: ``(3,)`` router bias (the node-independent part of the mix).
        tau: softmax temperature (> 0).

    Returns:
        ``(N, 3)`` rows summing to one, in :data:`PRIMITIVES` order.
    """
    if tau <= 0:
        raise ValueError(f"`tau`={tau!r}: expected a temperature > 0.")
    if h.shape != h0.shape or weight.shape != (3, 2 * h.shape[1]):
        raise ValueError(f"router: h {tuple(h.shape)} and h0 {tuple(h0.shape)} must match and `weight` must be "
                         f"(3, {2 * h.shape[-1]}), got {tuple(weight.shape)}")
    return torch.softmax(F.linear(torch.cat([h, h0], dim=1), weight, bias) / tau, dim=1)


def castor_mix(h: Tensor, ah: Tensor, routes: Tensor) -> Tensor:
    """``u = r_L ⊙ ÂH + r_H ⊙ (I − Â)H + r_I ⊙ H`` from ``H``, ``ÂH`` and ``(N, 3)`` routes."""
    if routes.shape != (h.shape[0], 3) or ah.shape != h.shape:
        raise ValueError(f"castor_mix: h {tuple(h.shape)}, ah {tuple(ah.shape)} and routes (N, 3) expected, "
                         f"got routes {tuple(routes.shape)}")
    r_low, r_high, r_id = routes.unbind(dim=1)
    # (I − Â)H = H − ÂH: one sparse product serves both filters.
    return r_low[:, None] * ah + r_high[:, None] * (h - ah) + r_id[:, None] * h


def castor_hop(h: Tensor, h_prev: Tensor, ah: Tensor, routes: Tensor, beta: Tensor | float = 0.0) -> Tensor:
    """One heavy-ball hop ``Hᵏ⁺¹ = castor_mix(Hᵏ) + β (Hᵏ − Hᵏ⁻¹)``.

    Args:
        h: ``(N, C)`` ``Hᵏ``.
        h_prev: ``(N, C)`` ``Hᵏ⁻¹`` (``H⁰`` at the first hop).
        ah: ``(N, C)`` ``ÂHᵏ``.
        routes: ``(N, 3)`` router probabilities.
        beta: the hop's momentum (scalar tensor or float).
    """
    return castor_mix(h, ah, routes) + beta * (h - h_prev)


def bounded_beta(raw: Tensor, beta_max: float) -> Tensor:
    """``β = β_max tanh(raw)`` in ``(−β_max, β_max)``; ``raw = 0`` gives ``β = 0``.

    Bounding keeps the heavy-ball recursion stable: with ``|β| < 1`` and a hop operator of
    norm ≤ 1 the iterates cannot blow up over ``K`` hops.
    """
    if not 0.0 <= beta_max < 1.0:
        raise ValueError(f"`beta_max`={beta_max!r}: expected a bound in [0, 1) (0 disables momentum).")
    return beta_max * torch.tanh(raw)


def router_mass_by_homophily(routes: Tensor, homophily: Tensor, bins: int = 2) -> Tensor:
    """Mean router mass per primitive within equal-width bins of node local homophily.

    Args:
        routes: ``(N, 3)`` or ``(K, N, 3)`` (averaged over hops first).
        homophily: ``(N,)`` in ``[0, 1]``; NaN (isolated) nodes are skipped.
        bins: number of equal-width homophily bins over ``[0, 1]``.

    Returns:
        ``(bins, 3)``; a bin with no node is NaN.
    """
    if routes.dim() == 3:
        routes = routes.mean(0)
    keep = ~torch.isnan(homophily)
    routes, homophily = routes[keep], homophily[keep]
    which = (homophily * bins).long().clamp(max=bins - 1)
    out = torch.full((bins, 3), math.nan)
    for b in range(bins):
        sel = which == b
        if sel.any():
            out[b] = routes[sel].mean(0)
    return out
