"""The benchmark harness: discovery, claims computed from rows, the JSON contract."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from lit_lowrank.benchmarks import harness
from lit_lowrank.benchmarks._timing import interleaved_medians
from lit_lowrank.benchmarks.harness import (
    BenchmarkResult,
    available_benchmarks,
    claim,
    paired,
    run_benchmark,
    statistic_claim,
    verdict_of,
)

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


def test_fewer_than_three_units_are_inconclusive_by_rule():
    two = claim("a > b", **P, values=[0.9, 0.91], baseline=[0.1, 0.1], target=0.0, op=">")
    assert two["ci"][0] > 0 and two["verdict"] == "inconclusive" and "fewer than 3" in two["note"]
    three = claim("a > b", **P, values=[0.9, 0.91, 0.92], baseline=[0.1, 0.1, 0.1], target=0.0, op=">")
    assert three["verdict"] == "holds"


def _premise_result(oracle_gain):
    from lit_lowrank.benchmarks.harness import competitor, premise

    ceiling = premise("room", "oracle above base", needs="the oracle has headroom", quantity="oracle - base",
                      values=[x + oracle_gain for x in (1.0, 1.1, 1.2)], baseline=[1.0, 1.1, 1.2], target=0.0, op=">")
    ours = claim("m above base", **P, values=[1.5, 1.6, 1.75], baseline=[1.0, 1.1, 1.2], target=0.0, op=">",
                 name="gain", requires="room")
    rand = competitor("gain", "random move above base", competitor="a random move of the same size",
                      quantity="random - base", values=[1.3, 1.5, 1.6], baseline=[1.0, 1.1, 1.2], target=0.0, op=">")
    weak = competitor("gain", "fewer steps above base", competitor="fewer steps", quantity="x - base",
                      values=[0.9, 1.2, 1.1], baseline=[1.0, 1.1, 1.2], target=0.0, op=">")
    return ceiling, ours, [rand, weak]


def test_a_claim_whose_premise_failed_is_no_headroom_never_holds():
    from lit_lowrank.benchmarks.harness import resolve

    held, ours, comps = _premise_result(oracle_gain=0.5)
    [c] = resolve([ours], [held], comps)
    assert held["verdict"] == "holds" and held["name"] == "room" and held["paper"] == "the oracle has headroom"
    assert c["verdict"] == "holds" and "measured_verdict" not in c
    assert c["matched_by"] == ["a random move of the same size"]
    assert [x["verdict"] for x in c["competitors"]] == ["holds", "inconclusive"]
    none, ours, comps = _premise_result(oracle_gain=-0.5)
    [c] = resolve([ours], [none], comps)
    assert c["verdict"] == "no_headroom" and c["holds"] is False
    assert c["measured_verdict"] == "holds" and c["premises_failed"] == ["room"]
    assert ours["verdict"] == "holds"  # inputs unchanged


def test_resolve_names_unknown_premises_and_claims():
    from lit_lowrank.benchmarks.harness import competitor, resolve

    held, ours, comps = _premise_result(oracle_gain=0.5)
    with pytest.raises(ValueError, match="'nope'"):
        resolve([{**ours, "requires": ["nope"]}], [held])
    orphan = competitor("other", "x", competitor="y", quantity="q", values=[1, 2, 3], target=0.0)
    with pytest.raises(ValueError, match="'other'"):
        resolve([ours], [held], [orphan])
    with pytest.raises(ValueError, match="`requires`"):
        claim("x", **P, values=[1, 2, 3], target=0.0, requires=[""])


def test_json_carries_premises_competitors_and_provenance(monkeypatch, tmp_path):
    from lit_lowrank.benchmarks._provenance import code_hash

    held, ours, comps = _premise_result(oracle_gain=-0.5)
    fake = types.ModuleType("lit_lowrank.benchmarks.fake")
    ctl = claim("null", **P, values=[0.0, 0.1, -0.1], target=0.5, op=">")
    fake.run = lambda quick, seed: BenchmarkResult([{"seed": 0}], [ours], [ctl], premises=[held],
                                                   competitors=comps)
    monkeypatch.setitem(sys.modules, "lit_lowrank.benchmarks.fake", fake)
    monkeypatch.setattr(harness, "available_benchmarks", lambda: ["fake"])
    payload = run_benchmark("fake", quick=True, json_path=tmp_path / "f.json", print_table=False)
    assert payload["claims"][0]["verdict"] == "no_headroom" and payload["valid"] is True
    assert payload["premises"][0]["name"] == "room" and len(payload["competitors"]) == 2
    prov = payload["provenance"]
    src = "lit_lowrank/benchmarks/_claims.py"
    assert src in prov["sources"] and "lit_lowrank/benchmarks/_tables.py" not in prov["sources"]
    assert prov["sources"][src] == code_hash(Path(harness.__file__).parent / "_claims.py")


def test_code_hash_ignores_docstrings_and_comments_but_not_code(tmp_path):
    from lit_lowrank.benchmarks._provenance import code_hash

    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""Doc."""\n\ndef f(x):\n    """Say."""\n    return x + 1  # one\n')
    b.write_text('"""Other doc."""\n# note\ndef f(x):\n    return x + 1\n')
    c.write_text('"""Doc."""\n\ndef f(x):\n    return x + 2\n')
    assert code_hash(a) == code_hash(b) != code_hash(c)


def test_stale_results_lists_changed_and_unrecorded_sources(tmp_path, capsys):
    from lit_lowrank.benchmarks._provenance import benchmark_owned, code_hash, stale_results
    from lit_lowrank.cli import main

    pkg = tmp_path / "lit_lowrank" / "benchmarks"
    pkg.mkdir(parents=True)
    (pkg / "toy.py").write_text("X = 1\n")
    (pkg / "_helper.py").write_text("Y = 1\n")
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    sources = {f"lit_lowrank/benchmarks/{f}": code_hash(pkg / f) for f in ("toy.py", "_helper.py")}
    (results / "toy.json").write_text(json.dumps({"provenance": {"commit": "abc", "sources": sources}}))
    (results / "old.json").write_text(json.dumps({"claims": []}))
    assert stale_results(tmp_path) == [("old", "no provenance", [])]
    (pkg / "_helper.py").write_text('"""Now documented."""\nY = 1\n')
    assert stale_results(tmp_path, ["toy"]) == []
    (pkg / "_helper.py").write_text("Y = 2\n")
    assert stale_results(tmp_path, ["toy"]) == [("toy", "code changed", ["lit_lowrank/benchmarks/_helper.py"])]
    assert benchmark_owned("toy.full", ["lit_lowrank/benchmarks/_helper.py", "lit_lowrank/ops/x.py",
                                        "lit_lowrank/benchmarks/other.py"]) == ["lit_lowrank/benchmarks/_helper.py"]
    # a benchmark package owns every file in it, and not another benchmark's package
    assert benchmark_owned("toy", ["lit_lowrank/benchmarks/toy/__init__.py", "lit_lowrank/benchmarks/toy/models.py",
                                   "lit_lowrank/benchmarks/toys/models.py"]) == [
        "lit_lowrank/benchmarks/toy/__init__.py", "lit_lowrank/benchmarks/toy/models.py"]
    assert main(["bench", "--stale", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "old: no provenance" in out and "toy: code changed (lit_lowrank/benchmarks/_helper.py)" in out


def test_a_source_edited_during_the_run_is_recorded_as_changed(tmp_path, monkeypatch):
    import os
    import time

    from lit_lowrank.benchmarks import _provenance

    pkg = tmp_path / "lit_lowrank"
    pkg.mkdir()
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "b.py").write_text("B = 1\n")
    monkeypatch.setattr(_provenance, "PACKAGE", pkg)
    started = time.time()
    os.utime(pkg / "a.py", (started - 60, started - 60))
    os.utime(pkg / "b.py", (started + 60, started + 60))  # edited after the run began
    prov = _provenance.provenance(["lit_lowrank/a.py", "lit_lowrank/b.py"], started=started)
    assert prov["sources"]["lit_lowrank/a.py"] == _provenance.code_hash(pkg / "a.py")
    assert prov["sources"]["lit_lowrank/b.py"] == _provenance.CHANGED_DURING_RUN
    assert _provenance.changed_sources(prov["sources"], tmp_path) == ["lit_lowrank/b.py"]
