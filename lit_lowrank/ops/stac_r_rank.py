"""Moved to :mod:`lit_lowrank.ops.stac_r.rank`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.stac_r.rank import (  # noqa: F401
    Criterion,
    RankChoice,
    rank_cosine_curve,
    select_rank,
)

__all__ = [
    "Criterion",
    "RankChoice",
    "rank_cosine_curve",
    "select_rank",
]
