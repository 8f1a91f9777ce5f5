"""moe_quant benchmark wiring on synthetic rows: claims pair (seed, chunk) units, controls can fail, the summary."""

from __future__ import annotations

import math

import pytest

from lit_lowrank.benchmarks.moe_quant import _summary, claims_and_controls

#: per-method perplexity multiplier over FP (the method best; controls no better than their baselines)
EFFECT = {"fp": 1.0, "rtn": 1.04, "svd_uniform": 1.03, "svd_load": 1.02, "svd_random": 1.04,
          "qat_noreplay_load": 1.015, "qat_replay_uniform": 1.012, "qat_replay_load": 1.008,
          "qat_replay_shuffled": 1.03}
AGREEMENT = {"qat_noreplay_load": 0.95, "qat_replay_load": 0.97, "qat_replay_shuffled": 0.93}


def _rows():
    rows = []
    for seed in range(3):
        for chunk in range(6):
            base = 5.0 + 0.3 * chunk + 0.1 * seed  # chunks differ a lot; pairing removes it
            for m, f in EFFECT.items():
                jitter = 1 + 0.001 * ((seed * 7 + chunk * 3 + len(m)) % 5 - 2)
                rows.append({"method": m, "seed": seed, "chunk": chunk, "unit": f"s{seed}-c{chunk}",
                             "ppl": base * f * jitter, "agreement": AGREEMENT.get(m, 0.9) + 0.002 * (chunk % 3),
                             "weighted_residual": 1.0, "compensator_params": 0, "bits_per_weight": 4.25})
    return rows


def test_claims_hold_and_controls_fail_on_rows_built_that_way():
    claims, controls = claims_and_controls(_rows())
    assert [c["verdict"] for c in claims] == ["holds"] * len(claims)
    assert [c["verdict"] for c in controls] == ["fails"] * len(controls)
    assert all(c["n"] == 18 and c["unit"] == "(seed, chunk)" for c in claims + controls)
    first = claims[0]  # geometric mean of the per-chunk ppl ratios, method over RTN
    assert first["estimate"] == pytest.approx(1.008 / 1.04, rel=2e-3)


def test_unpaired_rows_are_refused():
    rows = [r for r in _rows() if not (r["method"] == "rtn" and r["chunk"] == 0)]
    with pytest.raises(ValueError, match="unpaired"):
        claims_and_controls(rows)


def test_summary_reports_the_share_of_rtn_damage_repaired():
    summary = {r["method"]: r for r in _summary(_rows())}
    assert summary["fp"]["ppl_gap"] == pytest.approx(0.0)
    gap_rtn = summary["rtn"]["ppl_gap"]
    assert gap_rtn > 0 and summary["rtn"]["rtn_gap_repaired"] == pytest.approx(0.0)
    repaired = summary["qat_replay_load"]["rtn_gap_repaired"]
    assert repaired == pytest.approx(1 - summary["qat_replay_load"]["ppl_gap"] / gap_rtn)
    assert 0.7 < repaired < 0.85 and not math.isnan(repaired)
