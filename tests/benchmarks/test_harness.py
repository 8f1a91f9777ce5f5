"""The benchmark harness: discovery, claims computed from rows, the JSON contract."""

from __future__ import annotations

import json
import sys
import types

import pytest

from lit_lowrank.benchmarks import harness
from lit_lowrank.benchmarks._timing import interleaved_medians
from lit_lowrank.benchmarks.harness import BenchmarkResult, available_benchmarks, claim, run_benchmark


def test_claim_is_computed_not_declared():
    assert claim("a", 0.1, 0.07, ">=")["holds"] is True
    assert claim("b", 0.05, 0.07, ">=")["holds"] is False
    assert claim("c", 1.02, 1.03, "<=")["holds"] is True
    with pytest.raises(ValueError, match="`op`"):
        claim("d", 1, 1, "==")


def test_overhead_is_discovered_and_private_modules_are_not():
    names = available_benchmarks()
    assert "overhead" in names
    assert "harness" not in names and "_timing" not in names


def test_json_contract(monkeypatch, tmp_path):
    fake = types.ModuleType("lit_lowrank.benchmarks.fake")

    def run(quick, seed):
        rows = [{"method": "m", "score": 2.0 + seed}, {"method": "baseline", "score": 1.0}]
        ratio = rows[0]["score"] / rows[1]["score"]
        return BenchmarkResult(rows, [claim("m at least 1.5x baseline", ratio, 1.5)])

    fake.run = run
    monkeypatch.setitem(sys.modules, "lit_lowrank.benchmarks.fake", fake)
    monkeypatch.setattr(harness, "available_benchmarks", lambda: ["fake"])
    out = tmp_path / "sub" / "fake.json"
    payload = run_benchmark("fake", quick=True, seed=0, json_path=out, print_table=False)
    written = json.loads(out.read_text())
    assert written == payload
    assert set(written) >= {"benchmark", "quick", "device", "seconds", "rows", "claims"}
    assert written["benchmark"] == "fake" and written["quick"] is True and written["device"] in ("cpu", "cuda")
    assert written["claims"][0] == {"claim": "m at least 1.5x baseline", "measured": 2.0, "target": 1.5,
                                    "op": ">=", "holds": True}


def test_unknown_benchmark_lists_available():
    with pytest.raises(ValueError, match="overhead"):
        run_benchmark("nope")


def test_interleaved_medians_order_and_warmup():
    order = []
    values = iter([9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    medians = interleaved_medians({"a": lambda: order.append("a") or next(values),
                                   "b": lambda: order.append("b") or next(values)}, repeats=3, warmup=1)
    assert order == ["a", "b"] * 4
    assert medians == {"a": 3.0, "b": 4.0}
