"""Moved to :mod:`lit_lowrank.ops.stac_r.saved_surface`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.stac_r.saved_surface import (  # noqa: F401
    OTHER,
    LayerSurface,
    SurfaceRecorder,
    SurfaceReport,
    default_loss,
    predict_total_peak,
    predict_total_peak_timeline,
    saved_surface,
    select_linear,
)

__all__ = [
    "OTHER",
    "select_linear",
    "LayerSurface",
    "SurfaceReport",
    "SurfaceRecorder",
    "predict_total_peak_timeline",
    "default_loss",
    "saved_surface",
    "predict_total_peak",
]
