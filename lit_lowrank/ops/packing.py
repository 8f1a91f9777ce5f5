"""Sequence packing helpers: several documents share one window without attending across.

Pure torch (no Lightning). ``doc_ids`` marks, per token, which document it belongs
to; documents are contiguous runs of equal ids.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_doc_ids(doc_ids: Tensor, ndim: int, name: str = "doc_ids") -> None:
    if doc_ids.dim() != ndim:
        shape = "(T,)" if ndim == 1 else "(B, T)"
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(doc_ids.shape)}")


def segment_starts(doc_ids: Tensor) -> Tensor:
    """Bool tensor like ``doc_ids``: True where a new run of equal ids begins (position 0 included)."""
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[..., 1:] = doc_ids[..., 1:] != doc_ids[..., :-1]
    return starts


def position_ids_from_doc_ids(doc_ids: Tensor) -> Tensor:
    """Position of each token inside its document run: restarts at 0 at each run start.

    Args:
        doc_ids: ``(..., T)`` integer document ids.

    Returns:
        ``(..., T)`` long positions.

    Example:
        .. code-block:: python

            position_ids_from_doc_ids(torch.tensor([4, 4, 5, 5, 5]))  # [0, 1, 0, 1, 2]
    """
    index = torch.arange(doc_ids.shape[-1], device=doc_ids.device).expand_as(doc_ids)
    start_index = torch.where(segment_starts(doc_ids), index, torch.zeros_like(index))
    return index - torch.cummax(start_index, dim=-1).values


def cu_seqlens_from_doc_ids(doc_ids: Tensor) -> Tensor:
    """Cumulative run lengths in the varlen-attention format (flash-attn ``cu_seqlens``).

    Args:
        doc_ids: ``(T,)`` document ids of one packed sequence.

    Returns:
        ``(D + 1,)`` int32 tensor ``[0, end_1, ..., T]`` for the ``D`` document runs.

    Example:
        .. code-block:: python

            cu_seqlens_from_doc_ids(torch.tensor([0, 0, 1, 2, 2]))  # [0, 2, 3, 5]
    """
    _check_doc_ids(doc_ids, 1)
    starts = torch.nonzero(segment_starts(doc_ids)).flatten()
    end = torch.tensor([doc_ids.numel()], device=doc_ids.device)
    return torch.cat([starts, end]).to(torch.int32)


def block_causal_mask(doc_ids: Tensor) -> Tensor:
    """Attention mask for packed sequences: same document and key position <= query position.

    Documents are compared by id, so ids must be contiguous runs (as packing makes them).

    Args:
        doc_ids: ``(B, T)`` document ids.

    Returns:
        ``(B, 1, T, T)`` bool, True where query ``i`` may attend to key ``j``
        (the convention of ``torch.nn.functional.scaled_dot_product_attention``).

    Example:
        .. code-block:: python

            mask = block_causal_mask(batch["doc_ids"])
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    """
    _check_doc_ids(doc_ids, 2)
    length = doc_ids.shape[-1]
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=doc_ids.device).tril()
    return (same_doc & causal).unsqueeze(1)
