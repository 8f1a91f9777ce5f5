"""federated_ids benchmark (quick): the JSON contract and that its gains are paired over the same episodes."""

from __future__ import annotations

import pytest

from lit_lowrank.benchmarks.federated_ids import BASELINES, run
from lit_lowrank.federated.server import METHODS

pytestmark = pytest.mark.usefixtures("one_thread")


def test_quick_rows_cover_every_method_and_gains_are_paired():
    result = run(quick=True, seed=0)
    rows = result.rows
    for skew in ("alpha=1", "alpha=0.05"):
        for shots in (1, 5):
            cell = {r["method"]: r for r in rows if r["skew"] == skew and r["shots"] == shots}
            assert set(METHODS) <= set(cell) and all(cell[m]["episodes"] == 600 for m in METHODS)
            gain = next(r for name, r in cell.items() if name.startswith("gain vs "))
            best = gain["method"].removeprefix("gain vs ")
            assert best in BASELINES and cell[best]["f1"] == max(cell[b]["f1"] for b in BASELINES)
            # the same episodes for every method: mean of paired differences = difference of means
            assert gain["f1"] == pytest.approx(cell["prior_bank"]["f1"] - cell[best]["f1"], abs=2e-4)
            assert 0.0 <= cell["prior_bank"]["f1"] <= cell["oracle_prior"]["f1"] + 0.05
    measured = {c["claim"][:20]: c["measured"] for c in result.claims}
    assert len(result.claims) == 4 and all(isinstance(v, float) for v in measured.values())
