"""map_jobs: the same results, in job order, with one process or two."""

from __future__ import annotations

import torch

from lit_lowrank.benchmarks._workers import map_jobs


def _job(seed: int, n: int) -> tuple[int, float, int]:
    torch.manual_seed(seed)
    return seed, float(torch.randn(n).sum()), torch.get_num_threads()


def test_two_workers_match_one_and_keep_the_order():
    jobs = [(s, 5) for s in range(5)]
    one = map_jobs(_job, jobs, processes=1)
    two = map_jobs(_job, jobs, processes=2)
    assert [r[:2] for r in two] == [r[:2] for r in one]
    assert all(r[2] == 1 for r in two)  # one torch thread per worker
