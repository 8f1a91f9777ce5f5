"""Moved to :mod:`lit_lowrank.ops.sara.svd_linear`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.sara.svd_linear import (  # noqa: F401
    SVDLinear,
    is_factorable_conv,
    is_pointwise_conv,
)

__all__ = [
    "is_pointwise_conv",
    "is_factorable_conv",
    "SVDLinear",
]
