"""Timing helpers shared by benchmarks: interleaved runs and medians, never raw times in claims."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_samples(fns: dict[str, Callable[[], float | None]], repeats: int,
                        warmup: int = 1) -> dict[str, list[float]]:
    """Run each ``fn`` in turn (A B A B ...) ``repeats`` times after ``warmup`` rounds.

    A ``fn`` may return its own measurement (seconds); otherwise its wall time is
    used. Returns every measurement per name; entry ``i`` of every list comes from the
    same round, so per-round ratios are paired units for a timing claim (a slow moment
    of the machine hits both sides of a pair).
    """
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            measured = fn()
            elapsed = time.perf_counter() - start if measured is None else float(measured)
            if i >= warmup:
                samples[name].append(elapsed)
    return samples


def interleaved_medians(fns: dict[str, Callable[[], float | None]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """The median per name of :func:`interleaved_samples`."""
    return {k: statistics.median(v) for k, v in interleaved_samples(fns, repeats, warmup).items()}
