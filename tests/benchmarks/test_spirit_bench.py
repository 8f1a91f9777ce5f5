"""The spirit benchmark's ceiling summary: geometric mean over prompts and the break-even acceptance."""

from __future__ import annotations

import math

import pytest

from lit_lowrank.benchmarks.spirit import DRAFT_LENGTH, _ceiling
from lit_lowrank.ops.spirit import chain_speedup


def test_ceiling_summary_reads_its_rows_and_inverts_the_cost_model():
    cost = 0.5  # a draft token at half a target step: an always-right drafter reaches 7 / 4 = 1.75x
    top = chain_speedup(1.0, DRAFT_LENGTH, cost)
    rows = [{"method": "ceiling@0.5", "ratio_to_generate": top * f} for f in (0.9, 1 / 0.9)]
    rows += [{"method": "ceiling@0.05", "ratio_to_generate": x} for x in (0.9, 1.0)]
    rows += [{"method": "spirit", "ratio_to_generate": 9.0}]  # other methods are not read
    out = _ceiling(rows, {"0.5": 0.3, "0.05": 0.75, "0.3": 0.4})
    assert out["0.5"]["x_generate"] == pytest.approx(top, abs=1e-3)  # geometric mean of the two prompts
    need = out["0.5"]["break_even_acceptance"]
    assert chain_speedup(need, DRAFT_LENGTH, cost) == pytest.approx(1.0, abs=2e-3)
    assert out["0.5"]["matchness"] == 0.3
    assert out["0.05"]["x_generate"] == pytest.approx(math.sqrt(0.9), abs=1e-3)
    assert out["0.05"]["break_even_acceptance"] is None  # below 1x even when every draft is accepted
    assert "0.3" not in out  # a ratio without ceiling rows is left out, not reported as zero
