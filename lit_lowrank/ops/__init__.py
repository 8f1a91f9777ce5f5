"""Pure torch functions (no Lightning) that methods and task modules call."""

from lit_lowrank.ops.packing import block_causal_mask, cu_seqlens_from_doc_ids, position_ids_from_doc_ids

__all__ = ["block_causal_mask", "cu_seqlens_from_doc_ids", "position_ids_from_doc_ids"]
