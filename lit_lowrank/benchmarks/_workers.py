"""Run independent benchmark jobs (one training run each) on the machine's cores.

Benchmarks of tiny networks are bound by Python overhead: one torch thread per
process is the efficient setting, and two processes then use two cores where two
threads in one process mostly spin-wait. Jobs are top-level functions of picklable
arguments that seed themselves, so results do not depend on which worker ran them or
in what order; they come back in the order of ``jobs``.

.. code-block:: python

    rows = map_jobs(train_one, [(method, seed, lr) for ...])   # train_one(method, seed, lr) -> dict
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any


def _one_thread() -> None:
    import torch

    from lit_lowrank.benchmarks._progress import detach

    torch.set_num_threads(1)
    detach()


def _call(packed: tuple[Callable[..., Any], tuple[Any, ...]]) -> tuple[Any, set[str]]:
    from lit_lowrank.benchmarks._provenance import imported_sources

    fn, args = packed
    result = fn(*args)
    # the code a worker imported belongs to the run's provenance as much as the parent's
    return result, imported_sources()


def workers() -> int:
    """Worker processes to use: ``$LIT_LOWRANK_BENCH_WORKERS`` or the CPU count, at most 2."""
    env = os.environ.get("LIT_LOWRANK_BENCH_WORKERS")
    if env is not None:
        return max(1, int(env))
    return max(1, min(2, os.cpu_count() or 1))


def map_jobs(fn: Callable[..., Any], jobs: Sequence[tuple[Any, ...]], processes: int | None = None) -> list[Any]:
    """``[fn(*job) for job in jobs]``, spread over ``processes`` forked workers of one torch thread each.

    With one process (or one job, or no ``fork`` on the platform) it runs in this process.
    """
    from lit_lowrank.benchmarks._progress import stage
    from lit_lowrank.benchmarks._provenance import WORKER_SOURCES

    processes = workers() if processes is None else processes
    name = getattr(fn, "__name__", "jobs")
    with stage(f"{name} ({len(jobs)} jobs)", total=len(jobs)) as tick:
        if processes <= 1 or len(jobs) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            out = []
            for job in jobs:
                out.append(fn(*job))
                tick()
            return out
        with multiprocessing.get_context("fork").Pool(processes, initializer=_one_thread) as pool:
            done = []
            for item in pool.imap(_call, [(fn, tuple(job)) for job in jobs], chunksize=1):
                done.append(item)
                tick()
    for _, sources in done:
        WORKER_SOURCES.update(sources)
    return [result for result, _ in done]
