"""SafeCut's gate: which model teaches which, per sample, from cut-statistic z-scores."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

GateMode = Literal["safecut", "naive", "one_way"]


def safecut_gate(
    z_a: Tensor, z_b: Tensor, threshold: float = -1.0, gap_scale: float = 1.0, mode: GateMode = "safecut",
) -> tuple[Tensor, Tensor]:
    """Per-sample weights ``(w_to_a, w_to_b)`` of cross supervision between models a and b.

    ``z_a``/``z_b``: ``(N,)`` local cut z-scores of each model's predicted labels on the
    same graph (lower = more reliable). With ``mode="safecut"``, model b teaches a on
    sample i when b is more reliable (``z_b < z_a``) *and* reliable in absolute terms
    (``z_b < threshold``); the strength is ``tanh((z_a − z_b) / gap_scale)`` in (0, 1],
    and symmetrically for a teaching b. Samples where neither passes get no
    supervision; a sample never teaches both ways. Baselines: ``"naive"`` (both
    directions, weight 1 everywhere) and ``"one_way"`` (b always teaches a).

    .. code-block:: python

        w_to_source, w_to_second = safecut_gate(z_source, z_second, threshold=-1.0)
    """
    if z_a.shape != z_b.shape or z_a.dim() != 1:
        raise ValueError(f"`z_a` and `z_b` must both be (N,), got {tuple(z_a.shape)} and {tuple(z_b.shape)}.")
    if gap_scale <= 0:
        raise ValueError(f"`gap_scale`={gap_scale}, expected > 0.")
    if mode == "naive":
        return torch.ones_like(z_a), torch.ones_like(z_b)
    if mode == "one_way":
        return torch.ones_like(z_a), torch.zeros_like(z_b)
    if mode != "safecut":
        raise ValueError(f"`mode`={mode!r}, expected 'safecut', 'naive' or 'one_way'.")
    strength = torch.tanh((z_a - z_b).abs() / gap_scale)
    to_a = ((z_b < z_a) & (z_b < threshold)).float() * strength
    to_b = ((z_a < z_b) & (z_a < threshold)).float() * strength
    return to_a, to_b
