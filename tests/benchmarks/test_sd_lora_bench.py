"""sd_lora benchmark wiring on synthetic rows: the headline is against CLIP-LoRA + the same cache, paired by cell."""

from __future__ import annotations

import pytest

from lit_lowrank.benchmarks.sd_lora import METHODS, _summary, claims_and_controls

SHOTS = (1, 2, 4)


def _rows(sd_gain: float, control_gain: float):
    rows = []
    for shots in SHOTS:
        for seed in range(3):
            base = 0.6 + 0.05 * shots + 0.02 * seed  # cells differ; pairing removes it
            wobble = 0.002 * ((shots + 2 * seed) % 3 - 1)
            acc = {m: base - 0.1 for m in METHODS}
            acc.update({"clip_lora_cache": base, "sd_lora": base + sd_gain + wobble,
                        "sd_lora_shuffled_graph": base + control_gain + wobble,
                        "sd_lora_random_teacher": base + control_gain - wobble})
            for m in METHODS:
                rows.append({"method": m, "shots": shots, "seed": seed, "cell": f"{shots}shot-seed{seed}",
                             "acc": acc[m], "ece": 0.1 - (0.02 if m == "sd_lora" else 0.0) + wobble})
    return rows


def test_headline_is_paired_against_clip_lora_with_the_same_cache():
    claims, controls = claims_and_controls(_rows(sd_gain=0.02, control_gain=-0.01), SHOTS)
    assert len(claims) == len(SHOTS) + 2 and len(controls) == 3
    assert all("CLIP-LoRA + cache" in c["quantity"] for c in claims + controls)
    assert [c["n"] for c in claims] == [3, 3, 3, 9, 9]
    assert all(c["verdict"] == "holds" for c in claims)
    assert all(c["verdict"] == "fails" for c in controls)
    assert claims[3]["estimate"] == pytest.approx(0.02, abs=1e-3)


def test_a_control_that_gains_as_much_as_the_method_holds():
    _, controls = claims_and_controls(_rows(sd_gain=0.02, control_gain=0.02), SHOTS)
    assert all(c["verdict"] == "holds" for c in controls[:2])  # the run would be marked invalid
    # the sensitivity control (CLIP-LoRA without its cache, 0.1 below in every cell) must fail
    assert controls[2]["verdict"] == "fails" and "acc(clip_lora)" in controls[2]["quantity"]


def test_summary_has_every_method_and_shot_count():
    summary = _summary(_rows(0.01, 0.0), SHOTS)
    assert [r["method"] for r in summary] == list(METHODS)
    assert set(summary[0]) >= {f"acc_{k}shot" for k in SHOTS} | {"acc_mean", "ece_mean"}
