"""Moved to :mod:`lit_lowrank.ops.fed_lowshot.niw`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.fed_lowshot.niw import (  # noqa: F401
    class_moments,
    moments_to_gaussian,
    niw_map,
)

__all__ = [
    "class_moments",
    "moments_to_gaussian",
    "niw_map",
]
