"""Committed results cannot go stale: each records the code it ran, and that code is today's.

A result under ``docs/results/`` records the hash of every ``lit_lowrank`` source its run
imported (:mod:`lit_lowrank.benchmarks._provenance`). When a benchmark module or one of the
private ``benchmarks/_*.py`` helpers it used changes after its committed result, this test
fails until the benchmark is re-run (``lit-lowrank bench NAME --quick --json
docs/results/NAME.json``); a quick result that records no code fails too. ``lit-lowrank bench --stale``
also lists changes to the methods' own code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_lowrank.benchmarks._provenance import benchmark_owned, stale_results
from lit_lowrank.benchmarks._tables import load_results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted(load_results(ROOT))


@pytest.mark.parametrize("name", RESULTS)
def test_committed_result_ran_todays_benchmark_code(name):
    [(found, reason, files)] = stale_results(ROOT, [name]) or [(name, "fresh", [])]
    if reason == "no provenance":
        # a quick result is re-run whenever its code changes, so every one records its code (issue #35); a full
        # run older than provenance (hours on 2 cores) is listed by `lit-lowrank bench --stale` instead
        assert name.endswith(".full"), (f"docs/results/{name}.json records no provenance: re-run "
                                        f"`lit-lowrank bench {name} --quick --json docs/results/{name}.json`.")
        pytest.skip(f"docs/results/{name}.json predates provenance: re-run it (`lit-lowrank bench --stale`).")
    owned = benchmark_owned(name, files)
    assert not owned, (f"docs/results/{name}.json is stale: {owned} changed since it ran; re-run "
                       f"`lit-lowrank bench {name.split('.')[0]}{'' if name.endswith('.full') else ' --quick'} "
                       f"--json docs/results/{name}.json`.")
