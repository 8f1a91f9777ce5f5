"""The benchmark harness: discovery, claims computed from rows, the JSON contract."""

from __future__ import annotations

import json
import sys
import types

import pytest

from lit_lowrank.benchmarks import harness
from lit_lowrank.benchmarks._timing import interleaved_medians
from lit_lowrank.benchmarks.harness import (BenchmarkResult, available_benchmarks, claim, paired, run_benchmark,
                                             statistic_claim, verdict_of)

P = {"paper": "the paper says +1", "quantity": "score difference"}


def test_verdict_reads_the_interval():
    assert verdict_of((0.1, 0.3), 0.0, ">") == "holds"
    assert verdict_of((-0.3, -0.1), 0.0, ">") == "fails"
    assert verdict_of((-0.1, 0.1), 0.0, ">") == "inconclusive"
    assert verdict_of((0.0, 0.2), 0.0, ">") == "inconclusive" and verdict_of((0.0, 0.2), 0.0, ">=") == "holds"
    assert verdict_of((0.9, 1.02), 1.03, "<=") == "holds"
    assert verdict_of((1.05, 1.2), 1.03, "<=") == "fails"
    assert verdict_of((1.0, 1.2), 1.03, "<=") == "inconclusive"
    assert verdict_of(None, 0.0, ">") == "inconclusive"
    with pytest.raises(ValueError, match="`op`"):
        verdict_of((0, 1), 0.0, "==")


def test_paired_t_interval_matches_scipy():
    from scipy import stats

    a, b = [0.8, 0.82, 0.79, 0.85, 0.81], [0.7, 0.74, 0.72, 0.71, 0.73]
    c = claim("a > b", **P, values=a, baseline=b, target=0.0, op=">")
    d = [x - y for x, y in zip(a, b)]
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=sum(d) / len(d), scale=stats.sem(d))
    assert c["n"] == 5 and c["estimate"] == pytest.approx(sum(d) / 5)
    assert c["ci"] == pytest.approx([lo, hi]) and c["verdict"] == "holds" and c["holds"] is True
    assert c["values"] == pytest.approx(d)


def test_pairing_removes_shared_variation():
    # large between-seed spread shared by both methods: unpaired it would be inconclusive
    a = [0.5, 0.9, 0.3, 0.7]
    b = [x - 0.02 + 0.001 * i for i, x in enumerate(a)]
    assert claim("a > b", **P, values=a, baseline=b, target=0.0, op=">")["verdict"] == "holds"


def test_ratio_claim_is_geometric_and_single_unit_is_inconclusive():
    c = claim("t", **P, values=[2.0, 8.0], baseline=[1.0, 2.0], compare="ratio", target=1.0, op=">")
    assert c["estimate"] == pytest.approx(8.0 ** 0.5 * 2.0 ** 0.5 / 2.0 ** 0.5 * 1.0)  # sqrt(2 * 4)
    assert c["values"] == pytest.approx([2.0, 4.0])
    one = claim("t", **P, values=[3.0], target=1.0, op=">")
    assert one["verdict"] == "inconclusive" and one["ci"] is None and one["holds"] is False


def test_claim_errors_name_the_problem():
    with pytest.raises(ValueError, match="same units"):
        claim("x", **P, values=[1, 2, 3], baseline=[1, 2], target=0)
    with pytest.raises(ValueError, match="`paper`"):
        claim("x", paper="", quantity="q", values=[1, 2], target=0)
    with pytest.raises(ValueError, match="non-finite"):
        claim("x", **P, values=[1, float("nan")], target=0)
    with pytest.raises(ValueError, match="`compare`"):
        claim("x", **P, values=[1, 2], target=0, compare="diff")


def test_bootstrap_statistic_claim_is_paired_and_seeded():
    wins = [1, 1, 0, 1, 1, 1, 0, 1, 1, 1] * 3
    c1 = statistic_claim("win rate > 0.5", **P, n_units=len(wins), target=0.5, op=">",
                         statistic=lambda idx: sum(wins[i] for i in idx) / len(idx))
    c2 = statistic_claim("win rate > 0.5", **P, n_units=len(wins), target=0.5, op=">",
                         statistic=lambda idx: sum(wins[i] for i in idx) / len(idx))
    assert c1 == c2 and c1["estimate"] == pytest.approx(0.8) and c1["verdict"] == "holds"
    assert c1["ci_method"] == "bootstrap"


def test_paired_aligns_units_and_refuses_unpaired_rows():
    rows = [{"method": "a", "seed": 1, "acc": 0.9}, {"method": "a", "seed": 0, "acc": 0.8},
            {"method": "b", "seed": 0, "acc": 0.7}, {"method": "b", "seed": 1, "acc": 0.75}]
    a, b, units = paired(rows, "acc", {"method": "a"}, {"method": "b"})
    assert units == [0, 1] and a == [0.8, 0.9] and b == [0.7, 0.75]
    with pytest.raises(ValueError, match="unpaired"):
        paired(rows[:3], "acc", {"method": "a"}, {"method": "b"})
    with pytest.raises(ValueError, match="twice"):
        paired(rows + [{"method": "a", "seed": 0, "acc": 0.1}], "acc", {"method": "a"}, {"method": "b"})


def test_overhead_is_discovered_and_private_modules_are_not():
    names = available_benchmarks()
    assert "overhead" in names
    assert "harness" not in names and "_timing" not in names


def _fake(monkeypatch, control_values):
    fake = types.ModuleType("lit_lowrank.benchmarks.fake")

    def run(quick, seed):
        rows = [{"method": m, "seed": s, "score": base + 0.1 * s} for m, base in (("m", 2.0), ("baseline", 1.0))
                for s in range(3)]
        m, b, seeds = paired(rows, "score", {"method": "m"}, {"method": "baseline"})
        return BenchmarkResult(
            rows, [claim("m above baseline by 0.5", **P, values=m, baseline=b, units=seeds, target=0.5, op=">")],
            controls=[claim("null above baseline by 0.5", **P, values=control_values, baseline=b, units=seeds,
                            target=0.5, op=">")] if control_values else [])

    fake.run = run
    monkeypatch.setitem(sys.modules, "lit_lowrank.benchmarks.fake", fake)
    monkeypatch.setattr(harness, "available_benchmarks", lambda: ["fake"])


def test_json_contract(monkeypatch, tmp_path):
    _fake(monkeypatch, control_values=[1.0, 1.1, 1.2])
    out = tmp_path / "sub" / "fake.json"
    payload = run_benchmark("fake", quick=True, seed=0, json_path=out, print_table=False)
    written = json.loads(out.read_text())
    assert written == payload
    assert set(written) >= {"benchmark", "quick", "device", "seconds", "date", "machine", "valid", "rows", "claims",
                            "controls"}
    assert written["benchmark"] == "fake" and written["quick"] is True and written["device"] in ("cpu", "cuda")
    c = written["claims"][0]
    assert {"claim", "paper", "quantity", "n", "estimate", "ci", "verdict", "holds"} <= set(c)
    assert c["n"] == 3 and c["estimate"] == pytest.approx(1.0) and c["verdict"] == "holds"
    assert written["controls"][0]["verdict"] == "fails" and written["valid"] is True


def test_a_control_that_holds_or_none_makes_the_run_invalid(monkeypatch, capsys):
    from lit_lowrank.cli import main

    _fake(monkeypatch, control_values=[2.0, 2.1, 2.2])
    payload = run_benchmark("fake", quick=True, print_table=False)
    assert payload["valid"] is False and "control holds" in payload["invalid_reasons"][0]
    assert main(["bench", "fake", "--quick", "--strict"]) == 1
    _fake(monkeypatch, control_values=None)
    payload = run_benchmark("fake", quick=True, print_table=False)
    assert payload["valid"] is False and "no control" in payload["invalid_reasons"][0]
    _fake(monkeypatch, control_values=[1.0, 1.1, 1.2])
    assert main(["bench", "fake", "--quick", "--strict"]) == 0


def test_point_claims_without_protocol_fields_make_the_run_invalid():
    from lit_lowrank.benchmarks.harness import validity

    old_style = {"claim": "old", "measured": 1.0, "target": 0.5, "op": ">=", "holds": True}
    reasons = validity([old_style], [])
    assert any("lacks" in r for r in reasons)


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
