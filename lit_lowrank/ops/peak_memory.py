"""Moved to :mod:`lit_lowrank.ops.stac_r.peak_memory`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.stac_r.peak_memory import (  # noqa: F401
    PeakMemory,
    Segment,
    allocator_levels,
)

__all__ = [
    "Segment",
    "allocator_levels",
    "PeakMemory",
]
