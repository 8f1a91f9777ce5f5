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
- ``normalize``: raw stable rank grows with the number of response rows ``T`` (it is at most
  ``min(T, d)``; for SmolLM2 on news text it rises from 1 at one token to ~2.2 at 32 tokens and then
  stays flat), so a reward that uses it raw favours long responses. ``"reference"`` divides by
  ``E[srank | T]`` of reference text under the same scorer (:class:`LengthReference`, fitted by
  :func:`fit_length_reference` from :func:`prefix_stable_ranks`): 1.0 means "as high-dimensional as
  natural text of the same length", whatever the length. ``"max_rank"`` divides by the bound
  ``min(T_valid, d)`` (kept for comparison: it favours the shortest responses, a one-token response
  scoring the maximum 1).

Everything is computed in float32 (or wider): half-precision SVDs are unreliable.

.. code-block:: python

    from lit_lowrank.ops.stable_rank import stable_rank

    states = model(**batch, output_hidden_states=True).hidden_states[-1]   # (B, T, d)
    srank = stable_rank(states, mask=response_mask)                        # (B,)

    reference = fit_length_reference(reference_states, reference_mask)      # E[srank | T] of real text
    stable_rank(states, mask=response_mask, normalize="reference", reference=reference)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lit_lowrank.ops.lowrank import stable_rank_of

__all__ = ["DEFAULT_REFERENCE_LENGTHS", "NORMALIZATIONS", "LengthReference", "fit_length_reference",
           "length_reference_from_ranks", "masked_center", "prefix_stable_ranks", "stable_rank"]

Normalization = Literal["none", "max_rank", "reference"]
NORMALIZATIONS: tuple[str, ...] = ("none", "max_rank", "reference")
#: Prefix lengths at which :func:`fit_length_reference` measures the reference curve (log-spaced).
DEFAULT_REFERENCE_LENGTHS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


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
    reference: LengthReference | None = None,
) -> Tensor:
    """Stable rank ``‖H‖_F² / ‖H‖₂²`` of each response's hidden-state matrix.

    Args:
        hidden_states: ``(T, d)`` for one response or ``(B, T, d)`` for a padded batch (any leading
            dimensions are batch); computed in float32 whatever the input dtype.
        mask: ``(..., T)`` boolean / 0-1, True on the tokens that belong to the response (prompt,
            padding and excluded special tokens False). ``None`` uses every row.
        center: subtract the per-response mean hidden state over the valid rows first.
        normalize: ``"none"`` (raw, in ``[1, min(T, d)]``), ``"reference"`` (divided by
            ``reference(T_valid)``, the reference text's mean stable rank at the same length) or
            ``"max_rank"`` (divided by ``min(T_valid, d)``, in ``(0, 1]``).
        reference: the length curve for ``normalize="reference"`` (:func:`fit_length_reference`).

    Returns:
        ``(...)`` float32 stable ranks; 0 for a response with no valid row (or an all-zero one).

    Raises:
        ValueError: on a 1-D input, a mask of the wrong shape, an unknown ``normalize`` or
            ``normalize="reference"`` without ``reference``.

    .. code-block:: python

        h = torch.randn(4, 50, 576)
        mask = torch.arange(50) < torch.tensor([[50], [30], [10], [0]])   # (4, 50) valid lengths
        stable_rank(h, mask)          # (4,), last entry 0
    """
    if hidden_states.dim() < 2:
        raise ValueError(f"`hidden_states` must be (T, d) or (B, T, d), got shape {tuple(hidden_states.shape)}.")
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"`normalize`={normalize!r}, expected one of {NORMALIZATIONS}.")
    if normalize == "reference" and reference is None:
        raise ValueError("`normalize`='reference' needs `reference`, a LengthReference (fit_length_reference).")
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
    elif normalize == "reference":
        srank = srank / reference(mask.sum(-1)).to(srank.dtype)  # type: ignore[misc]
    return srank


@dataclass(frozen=True)
class LengthReference:
    """``E[srank | T]``: the mean stable rank of reference text's first ``T`` rows, on a grid of lengths.

    Between grid lengths the curve is linear in ``log T``; beyond the last length it is held constant
    (the stable rank of natural text saturates), below the first it is the first value.

    Attributes:
        lengths: ``(G,)`` ascending positive row counts.
        values: ``(G,)`` mean stable rank of the reference prefixes of each length (> 0).
        counts: ``(G,)`` reference sequences long enough for each length.

    .. code-block:: python

        ref = LengthReference(torch.tensor([1, 8, 32]), torch.tensor([1.0, 1.8, 2.2]), torch.tensor([9, 9, 9]))
        ref(torch.tensor([4, 100]))      # tensor([1.4, 2.2])
    """

    lengths: Tensor
    values: Tensor
    counts: Tensor

    def __post_init__(self) -> None:
        if self.lengths.dim() != 1 or self.lengths.numel() == 0 or self.values.shape != self.lengths.shape:
            raise ValueError(f"`lengths` and `values` must be non-empty 1-D of one length, got "
                             f"{tuple(self.lengths.shape)} and {tuple(self.values.shape)}.")
        if bool((self.lengths[1:] <= self.lengths[:-1]).any()) or int(self.lengths[0]) < 1:
            raise ValueError(f"`lengths` must be positive and strictly ascending, got {self.lengths.tolist()}.")
        if bool((self.values <= 0).any()):
            raise ValueError(f"`values` must be positive (stable ranks are >= 1), got {self.values.tolist()}.")

    def __call__(self, length: Tensor) -> Tensor:
        """The reference stable rank at ``length`` rows (any shape; float32)."""
        x = torch.log(length.float().clamp_min(1.0))
        grid = torch.log(self.lengths.float().to(x.device))
        vals = self.values.float().to(x.device)
        if grid.numel() == 1:
            return vals.expand_as(x).clone()
        x = x.clamp(grid[0], grid[-1])
        hi = torch.searchsorted(grid, x.contiguous()).clamp(1, grid.numel() - 1)
        lo = hi - 1
        frac = (x - grid[lo]) / (grid[hi] - grid[lo])
        return vals[lo] + frac * (vals[hi] - vals[lo])

    def to_dict(self) -> dict[str, list[float]]:
        return {"lengths": self.lengths.tolist(), "values": self.values.tolist(), "counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Sequence[float]]) -> LengthReference:
        return cls(torch.tensor(data["lengths"], dtype=torch.long), torch.tensor(data["values"], dtype=torch.float32),
                   torch.tensor(data["counts"], dtype=torch.long))


def prefix_stable_ranks(hidden_states: Tensor, mask: Tensor | None = None,
                        lengths: Sequence[int] = DEFAULT_REFERENCE_LENGTHS, center: bool = False) -> Tensor:
    """Stable rank of each sequence's first ``L`` valid rows, for every ``L`` in ``lengths``.

    Args:
        hidden_states: ``(B, T, d)`` (or ``(T, d)``).
        mask: ``(B, T)`` valid rows (``None``: all).
        lengths: prefix lengths in valid rows.
        center: as :func:`stable_rank`.

    Returns:
        ``(B, len(lengths))`` float32; NaN where a sequence has fewer than ``L`` valid rows.
    """
    states = hidden_states if hidden_states.dim() == 3 else hidden_states.unsqueeze(0)
    if mask is None:
        mask = torch.ones(states.shape[:-1], dtype=torch.bool, device=states.device)
    else:
        mask = _check_mask(mask if hidden_states.dim() == 3 else mask.unsqueeze(0), states)
    if not lengths or any(int(n) < 1 for n in lengths):
        raise ValueError(f"`lengths` must be non-empty positive integers, got {list(lengths)}.")
    position = mask.long().cumsum(-1)                       # 1-based index among valid rows
    valid = mask.sum(-1)
    out = []
    for n in lengths:
        ranks = stable_rank(states, mask & (position <= int(n)), center=center)
        out.append(torch.where(valid >= int(n), ranks, torch.full_like(ranks, math.nan)))
    return torch.stack(out, -1)


def fit_length_reference(hidden_states: Tensor, mask: Tensor | None = None,
                         lengths: Sequence[int] = DEFAULT_REFERENCE_LENGTHS, center: bool = False,
                         min_sequences: int = 2) -> LengthReference:
    """``E[srank | T]`` of reference sequences (e.g. the scorer's hidden states of natural text).

    Lengths that fewer than ``min_sequences`` sequences reach are dropped (the curve is held
    constant beyond the last one kept).

    Raises:
        ValueError: when no length is reached by ``min_sequences`` sequences.

    .. code-block:: python

        reference = fit_length_reference(states, mask)          # states: (B, T, d) of reference texts
        reference(torch.tensor([5, 50]))
    """
    return length_reference_from_ranks(prefix_stable_ranks(hidden_states, mask, lengths, center), lengths,
                                       min_sequences)


def length_reference_from_ranks(ranks: Tensor, lengths: Sequence[int], min_sequences: int = 2) -> LengthReference:
    """The :class:`LengthReference` of prefix stable ranks ``(N, G)`` (NaN = sequence too short), e.g. the
    concatenated outputs of :func:`prefix_stable_ranks` over batches of reference texts."""
    if ranks.dim() != 2 or ranks.shape[1] != len(lengths):
        raise ValueError(f"`ranks` must be (N, {len(lengths)}) for lengths {list(lengths)}, got {tuple(ranks.shape)}.")
    counts = (~torch.isnan(ranks)).sum(0)
    keep = counts >= min_sequences
    if not bool(keep.any()):
        raise ValueError(f"fit_length_reference: no length in {list(lengths)} is reached by {min_sequences} "
                         "sequences; pass longer reference texts or shorter `lengths`.")
    means = torch.nansum(ranks, 0) / counts.clamp_min(1)
    grid = torch.tensor([int(n) for n in lengths], dtype=torch.long)
    return LengthReference(grid[keep.cpu()], means[keep].float().cpu(), counts[keep].cpu())
