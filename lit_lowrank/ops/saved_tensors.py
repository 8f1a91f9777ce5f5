"""Moved to :mod:`lit_lowrank.ops.stac_r.saved_tensors`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.stac_r.saved_tensors import (  # noqa: F401
    MIB,
    NO_CODEC_ATTR,
    SavedTensorCodec,
    SavedTensorCounter,
    SavedTensorEvent,
    is_parameter_like,
    measure_saved_bytes,
    optimizer_state_bytes,
    storage_key,
    tensor_bytes,
    training_state_bytes,
)

__all__ = [
    "MIB",
    "NO_CODEC_ATTR",
    "SavedTensorCodec",
    "SavedTensorEvent",
    "storage_key",
    "tensor_bytes",
    "is_parameter_like",
    "SavedTensorCounter",
    "measure_saved_bytes",
    "optimizer_state_bytes",
    "training_state_bytes",
]
