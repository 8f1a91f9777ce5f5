"""Castor's claims are a function of the rows: the committed quick run's claims are reproduced from its rows; the
oracle premise gates the routing claims; the A/A control can hold."""

from __future__ import annotations

import json
from pathlib import Path

from lit_lowrank.benchmarks.castor import QUICK_BASELINES, claims_and_controls
from lit_lowrank.benchmarks.harness import resolve

RESULT = Path(__file__).resolve().parents[2] / "docs" / "results" / "castor.json"


def _recompute(d, rows=None):
    n = d["notes"]
    return claims_and_controls(rows or d["rows"], n["graphs"], QUICK_BASELINES, n["splits"], d["quick"],
                               n["best_global_filter"])


def test_committed_claims_follow_from_the_committed_rows():
    d = json.loads(RESULT.read_text())
    claims, controls, premises, competitors = _recompute(d)
    got = [(c["claim"], c["verdict"], round(c["estimate"], 9))
           for c in resolve(claims, premises, competitors) + controls + premises + competitors]
    want = [(c["claim"], c["verdict"], round(c["estimate"], 9))
            for c in d["claims"] + d["controls"] + d["premises"] + d["competitors"]]
    assert got == want


def _shifted(d, model, graph, delta):
    rows = [dict(r) for r in d["rows"]]
    for r in rows:
        if r["graph"] == graph and r["model"] == model:
            r["test_acc"] = r["test_acc"] + delta + 0.001 * r["split"]
    return rows


def test_routing_claim_reads_no_headroom_when_the_oracle_is_below_the_global_filter():
    d = json.loads(RESULT.read_text())
    rows = _shifted(d, "castor_oracle", "regions", -1.0)              # the oracle far below every global filter
    claims, _, premises, competitors = _recompute(d, rows)
    premise = next(p for p in premises if p["name"] == "oracle_routes_regions")
    assert premise["verdict"] == "fails"
    routing = next(c for c in resolve(claims, premises, competitors) if c.get("name") == "routing_regions")
    assert routing["verdict"] == "no_headroom" and routing["premises_failed"] == ["oracle_routes_regions"]


def test_aa_control_holds_when_the_copy_is_clearly_worse():
    """The A/A control is the routing claim's test on Castor vs itself: it can hold, and then the run is invalid."""
    d = json.loads(RESULT.read_text())
    rows = _shifted(d, "castor_aa", "periphery", -0.3)
    _, controls, _, _ = _recompute(d, rows)
    aa = next(c for c in controls if c["claim"].startswith("A/A") and "periphery" in c["claim"])
    assert aa["verdict"] == "holds"
    assert next(c for c in _recompute(d)[1] if c["claim"] == aa["claim"])["verdict"] != "holds"


def test_routing_claim_is_measured_when_the_oracle_clears_the_global_filter():
    """The gate opens too: with the oracle far above every global filter the routing claim reads its own CI."""
    d = json.loads(RESULT.read_text())
    rows = _shifted(d, "castor_oracle", "regions", 1.0)
    claims, _, premises, competitors = _recompute(d, rows)
    assert next(p for p in premises if p["name"] == "oracle_routes_regions")["verdict"] == "holds"
    routing = next(c for c in resolve(claims, premises, competitors) if c.get("name") == "routing_regions")
    assert routing["verdict"] in ("holds", "fails", "inconclusive") and not routing.get("premises_failed")
