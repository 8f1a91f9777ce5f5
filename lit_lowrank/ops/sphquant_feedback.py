"""Moved to :mod:`lit_lowrank.ops.sphquant.feedback`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.sphquant.feedback import (  # noqa: F401
    FEEDBACK_BLOCK,
    inverse_hessian_factor,
    sph_feedback_sweep,
    sph_quantize_feedback,
)

__all__ = [
    "FEEDBACK_BLOCK",
    "inverse_hessian_factor",
    "sph_feedback_sweep",
    "sph_quantize_feedback",
]
