"""sd_lora benchmark wiring on synthetic rows: the headline is against CLIP-LoRA + the same cache, paired by cell;
the no-cache claim against CLIP-LoRA; premises gate the verdicts; competitors stand in for the teacher."""

from __future__ import annotations

import pytest

from lit_lowrank.benchmarks.harness import resolve
from lit_lowrank.benchmarks.sd_lora import METHODS, _summary, claims_and_controls, premise_gaps

SHOTS = (1, 2, 4)


def _rows(sd_gain: float, competitor_gain: float, teacher_edge: float = 0.05, graph_edge: float = 0.03):
    rows = []
    for shots in SHOTS:
        for seed in range(3):
            base = 0.6 + 0.05 * shots + 0.02 * seed  # cells differ; pairing removes it
            wobble = 0.002 * ((shots + 2 * seed) % 3 - 1)
            acc = {m: base - 0.1 for m in METHODS}
            acc.update({"clip_lora_cache": base, "sd_lora": base + sd_gain + wobble,
                        "clip_lora": base - 0.1, "sd_lora_nocache": base - 0.1 + sd_gain - wobble,
                        "clip_lora_seed": base - 0.01 + wobble,
                        "sd_lora_shuffled_graph": base + competitor_gain + wobble,
                        "sd_lora_random_teacher": base + competitor_gain - wobble})
            for m in METHODS:
                row = {"method": m, "shots": shots, "seed": seed, "cell": f"{shots}shot-seed{seed}",
                       "acc": acc[m], "ece": 0.1 - (0.02 if m == "sd_lora" else 0.0) + wobble}
                if m == "sd_lora":
                    row.update(teacher_test_acc=base - 0.1 + teacher_edge + wobble,
                               shuffled_teacher_test_acc=base - 0.1 + teacher_edge - graph_edge - wobble)
                rows.append(row)
    return rows


def test_headline_is_paired_against_clip_lora_with_the_same_cache():
    claims, controls, premises, competitors = claims_and_controls(_rows(sd_gain=0.02, competitor_gain=-0.01), SHOTS)
    claims = resolve(claims, premises, competitors)
    assert len(claims) == len(SHOTS) + 3 and len(controls) == 2 and len(premises) == 2
    assert [c["n"] for c in claims] == [3, 3, 3, 9, 9, 9]
    assert all(p["verdict"] == "holds" for p in premises)
    assert all(c["verdict"] == "holds" for c in claims)
    assert all(c["verdict"] == "fails" for c in controls)
    assert claims[3]["estimate"] == pytest.approx(0.02, abs=1e-3)
    nocache = next(c for c in claims if c["name"] == "nocache_pooled")
    assert "acc(sd_lora_nocache) - acc(clip_lora)" in nocache["quantity"]
    pooled = next(c for c in claims if c["name"] == "cache_pooled")
    assert pooled["matched_by"] == [] and len(pooled["competitors"]) == 2


def test_a_competitor_that_gains_as_much_is_listed_and_no_teacher_edge_is_no_headroom():
    claims, _, premises, competitors = claims_and_controls(_rows(sd_gain=0.02, competitor_gain=0.02), SHOTS)
    pooled = next(c for c in resolve(claims, premises, competitors) if c["name"] == "cache_pooled")
    assert len(pooled["matched_by"]) == 2
    claims, _, premises, competitors = claims_and_controls(_rows(0.02, -0.01, teacher_edge=-0.05), SHOTS)
    resolved = resolve(claims, premises, competitors)
    assert premises[0]["verdict"] == "fails"
    assert all(c["verdict"] == "no_headroom" and c["measured_verdict"] == "holds" for c in resolved)
    _, _, premises, _ = claims_and_controls(_rows(0.02, -0.01, graph_edge=-0.03), SHOTS)
    assert premises[1]["verdict"] == "fails"


def test_the_sensitivity_control_fails_and_a_seed_gain_would_hold():
    rows = _rows(sd_gain=0.02, competitor_gain=-0.01)
    _, controls, _, _ = claims_and_controls(rows, SHOTS)
    assert controls[1]["verdict"] == "fails" and "acc(clip_lora)" in controls[1]["quantity"]
    for r in rows:
        if r["method"] == "clip_lora_seed":
            r["acc"] += 0.05
    _, controls, _, _ = claims_and_controls(rows, SHOTS)
    assert controls[0]["verdict"] == "holds"  # the run would be marked invalid


def test_summary_has_every_method_and_shot_count():
    summary = _summary(_rows(0.01, 0.0), SHOTS)
    assert [r["method"] for r in summary] == list(METHODS)
    assert set(summary[0]) >= {f"acc_{k}shot" for k in SHOTS} | {"acc_mean", "ece_mean"}


def test_premise_gaps_per_shot_count_are_the_paired_differences():
    rows = _rows(0.01, 0.0, teacher_edge=0.05, graph_edge=0.03)
    for r in rows:  # the teacher loses at 1 shot only: the pooled premise hides it, the per-shot gap shows it
        if r["method"] == "sd_lora" and r["shots"] == 1:
            r["teacher_test_acc"] -= 0.2
    gaps = premise_gaps(rows, SHOTS)
    assert gaps["teacher_edge_1shot"] == pytest.approx(0.05 - 0.2, abs=1e-3)
    assert gaps["teacher_edge_4shot"] == pytest.approx(0.05, abs=1e-3)
    # the shuffled teacher is wobble-shifted the other way: the graph edge is 0.03 + 2·wobble per cell, mean 0.03
    assert gaps["graph_edge_2shot"] == pytest.approx(0.03, abs=2e-3)
    sd_row = next(r for r in _summary(rows, SHOTS) if r["method"] == "sd_lora")
    assert sd_row["teacher_edge_1shot"] == gaps["teacher_edge_1shot"] and "graph_edge_4shot" in sd_row
