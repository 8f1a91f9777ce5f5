"""Moved to :mod:`lit_lowrank.ops.fed_lowshot.prior_bank`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.fed_lowshot.prior_bank import (  # noqa: F401
    PriorBank,
    gated_prior,
    global_prior,
    retrieve_prior,
    similarity_gate,
)

__all__ = [
    "PriorBank",
    "retrieve_prior",
    "global_prior",
    "similarity_gate",
    "gated_prior",
]
