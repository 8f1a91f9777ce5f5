"""Stable rank of a response's hidden states: an annotation-free quality signal (arXiv 2512.02807).

``srank(H) = ‖H‖_F² / ‖H‖₂²`` for the ``(T, d)`` matrix ``H`` of a response's final-layer hidden
states (prompt tokens excluded). It is the shared :func:`~lit_lowrank.ops.lowrank.stable_rank_of`
applied per response, after masking away the tokens that are not the response (padding, the
prompt, optionally special tokens). Masked rows are zeroed, which leaves the singular values of
the remaining rows unchanged (``HᵀH`` only sums over rows), so one batched SVD scores a padded
batch exactly.

Choices the paper leaves open, exposed here:

- ``center``: subtract the per-response mean hidden state (over the valid rows) first. Uncentred
  (default, the paper's ``‖H‖_F²/‖H‖₂²`` of ``H`` itself) lets the shared mean direction count as
  the top singular direction, so the value says how much of the energy is *not* that mean
  direction; centred values are the stable rank of the token covariance and are much larger.
- ``normalize="max_rank"``: divide by ``min(T_valid, d)``, the upper bound, so responses of
  different lengths compare on ``[0, 1]`` (raw stable rank grows with ``T``).

Everything is computed in float32 (or wider): half-precision SVDs are unreliable.

.. code-block:: python

    from lit_lowrank.ops.stable_rank import stable_rank

    states = model(**batch, output_hidden_states=True).hidden_states[-1]   # (B, T, d)
    srank = stable_rank(states, mask=response_mask)                        # (B,)
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lit_lowrank.ops.lowrank import stable_rank_of

__all__ = ["masked_center", "stable_rank"]

Normalization = Literal["none", "max_rank"]


def _check_mask(mask: Tensor, states: Tensor) -> Tensor:
    if mask.shape != states.shape[:-1]:
        raise ValueError(f"`mask` must have shape {tuple(states.shape[:-1])} (the hidden states' (..., T)), "
                         f"got {tuple(mask.shape)}.")
    return mask.to(device=states.device, dtype=torch.bool)


def masked_center(hidden_states: Tensor, mask: Tensor) -> Tensor:
    """Subtract each response's mean over its valid rows; masked rows become 0.

    Args:
        hidden_states: ``(..., T, d)`` float.
        mask: ``(..., T)`` boolean, True on the response's tokens.
    """
    weights = mask.unsqueeze(-1).to(hidden_states.dtype)
    count = weights.sum(-2, keepdim=True).clamp_min(1.0)
    mean = (hidden_states * weights).sum(-2, keepdim=True) / count
    return (hidden_states - mean) * weights


def stable_rank(
    hidden_states: Tensor,
    mask: Tensor | None = None,
    center: bool = False,
    normalize: Normalization = "none",
) -> Tensor:
    """Stable rank ``‖H‖_F² / ‖H‖₂²`` of each response's hidden-state matrix.

    Args:
        hidden_states: ``(T, d)`` for one response or ``(B, T, d)`` for a padded batch (any leading
            dimensions are batch); computed in float32 whatever the input dtype.
        mask: ``(..., T)`` boolean / 0-1, True on the tokens that belong to the response (prompt,
            padding and excluded special tokens False). ``None`` uses every row.
        center: subtract the per-response mean hidden state over the valid rows first.
        normalize: ``"none"`` (raw, in ``[1, min(T, d)]``) or ``"max_rank"`` (divided by
            ``min(T_valid, d)``, in ``(0, 1]``).

    Returns:
        ``(...)`` float32 stable ranks; 0 for a response with no valid row (or an all-zero one).

    Raises:
        ValueError: on a 1-D input, a mask of the wrong shape or an unknown ``normalize``.

    .. code-block:: python

        h = torch.randn(4, 50, 576)
        mask = torch.arange(50) < torch.tensor([[50], [30], [10], [0]])   # (4, 50) valid lengths
        stable_rank(h, mask)          # (4,), last entry 0
    """
    if hidden_states.dim() < 2:
        raise ValueError(f"`hidden_states` must be (T, d) or (B, T, d), got shape {tuple(hidden_states.shape)}.")
    if normalize not in ("none", "max_rank"):
        raise ValueError(f"`normalize`={normalize!r}, expected 'none' or 'max_rank'.")
    states = hidden_states.float() if hidden_states.dtype != torch.float64 else hidden_states
    if mask is None:
        mask = torch.ones(states.shape[:-1], dtype=torch.bool, device=states.device)
    else:
        mask = _check_mask(mask, states)
    if center:
        states = masked_center(states, mask)
    else:
        states = states * mask.unsqueeze(-1).to(states.dtype)
    srank = stable_rank_of(states)
    if normalize == "max_rank":
        limit = mask.sum(-1).clamp(max=states.shape[-1]).clamp_min(1).to(srank.dtype)
        srank = srank / limit
    return srank
