"""Moved to :mod:`lit_lowrank.ops.sphquant.triton_gemv`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.sphquant.triton_gemv import (  # noqa: F401
    MAX_ROWS,
    sph_matmul_triton,
    triton_available,
)

__all__ = [
    "MAX_ROWS",
    "triton_available",
    "sph_matmul_triton",
]
