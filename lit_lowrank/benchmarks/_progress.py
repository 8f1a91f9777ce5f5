"""Progress of a long benchmark run: one line per stage, a tick per unit, elapsed time (rich, on stderr).

A benchmark runs for minutes (longer with cold caches: drafter or FB training); without a
display nothing shows that it is alive. :func:`lit_lowrank.benchmarks.harness.run_benchmark`
opens a display (:func:`reporting`); inside it a benchmark marks its phases and units:

.. code-block:: python

    from lit_lowrank.benchmarks._progress import stage, track

    with stage("tuning on validation", total=len(grid)) as tick:
        for setting in grid:
            ...
            tick()
    for prompt in track(prompts, "decoding test prompts"):
        ...

:func:`lit_lowrank.benchmarks._workers.map_jobs` ticks one unit per finished job by itself.
Outside :func:`reporting` (tests, a benchmark function called from Python) and with
``--quiet`` (or ``LIT_LOWRANK_QUIET=1``) every call is a no-op.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_ACTIVE: Any = None  # the rich Progress of the running benchmark, if any


def quiet() -> bool:
    """``True`` when ``LIT_LOWRANK_QUIET`` is set to a non-empty value other than ``0``."""
    return os.environ.get("LIT_LOWRANK_QUIET", "") not in ("", "0")


@contextlib.contextmanager
def reporting(title: str) -> Iterator[None]:
    """Show the stages of the enclosed run under ``title`` (nothing when quiet)."""
    global _ACTIVE
    if quiet() or _ACTIVE is not None:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    progress.add_task(title, total=None)
    _ACTIVE = progress
    try:
        with progress:
            yield
    finally:
        _ACTIVE = None


def detach() -> None:
    """Forget the display in this process (a forked worker must not draw its parent's display)."""
    global _ACTIVE
    _ACTIVE = None


@contextlib.contextmanager
def stage(name: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """A phase of the run; yields ``tick(n=1)`` to advance it by ``n`` of ``total`` units."""
    progress = _ACTIVE
    if progress is None:
        yield lambda n=1: None
        return
    task = progress.add_task(f"  {name}", total=total)

    def tick(n: int = 1) -> None:
        progress.advance(task, n)

    try:
        yield tick
    finally:
        if total is not None:
            progress.update(task, completed=total)
        else:
            progress.update(task, total=1, completed=1)


def track(iterable: Iterable[T], name: str, total: int | None = None) -> Iterator[T]:
    """``iterable`` unchanged, ticking :func:`stage` ``name`` once per item."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with stage(name, total) as tick:
        for item in iterable:
            yield item
            tick()
