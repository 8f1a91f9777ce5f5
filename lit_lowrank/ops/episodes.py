"""Moved to :mod:`lit_lowrank.ops.fed_lowshot.episodes`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.fed_lowshot.episodes import (  # noqa: F401
    finetuned_head_classify,
    gaussian_classify,
    macro_f1,
    mean_ci,
    prototype_classify,
    sample_episode,
    sampled_logistic_classify,
)

__all__ = [
    "sample_episode",
    "gaussian_classify",
    "prototype_classify",
    "finetuned_head_classify",
    "sampled_logistic_classify",
    "macro_f1",
    "mean_ci",
]
