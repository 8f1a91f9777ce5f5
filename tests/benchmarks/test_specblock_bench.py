"""The specblock benchmark's claims read their rows: premise gates the speed claim, the n-gram half competes."""

from __future__ import annotations

import torch

from lit_lowrank.benchmarks._claims import resolve
from lit_lowrank.benchmarks.specblock import _claims, _row, _summary

SPEED = {"generate": 20.0, "prompt_lookup": 26.0, "ngram": 28.0, "hybrid": 34.0, "specblock": 16.0, "eagle": 15.0,
         "oracle": 55.0, "random": 12.0, "plain": 19.8}


def _rows(speed: dict[str, float], n: int = 6) -> list[dict]:
    rows = []
    for p in range(n):
        wobble = 1.0 + 0.01 * ((p * 7) % 5 - 2)  # per-prompt spread, the same for every method
        for name, v in speed.items():
            row = {"method": name, "prompt": p, "tokens_per_s": v * wobble, "ratio_to_generate": v / speed["generate"]}
            if name in ("specblock", "eagle"):
                row["draft_ms_per_round"] = {"specblock": 5.0, "eagle": 15.0}[name] * wobble
            rows.append(row)
    return rows


def test_claims_verdicts_follow_the_rows():
    claims, controls, premises, competitors = _claims(_rows(SPEED))
    by = {c["name"]: c for c in resolve(claims, premises, competitors) if c.get("name")}
    assert premises[0]["verdict"] == "holds"  # oracle 2.75x >= 1.5x
    assert by["hybrid_speed"]["verdict"] == "holds" and abs(by["hybrid_speed"]["estimate"] - 1.7) < 1e-6
    assert by["hybrid_vs_prompt_lookup"]["verdict"] == "holds"
    assert by["hybrid_vs_ngram"]["verdict"] == "holds"
    assert by["specblock_vs_eagle"]["verdict"] == "holds"
    assert by["specblock_draft_time"]["verdict"] == "holds"  # 5 / 15 <= 0.55
    assert by["hybrid_speed"]["matched_by"] == []  # the n-gram half alone (1.4x) does not reach 1.5x
    assert controls[0]["verdict"] == "fails"  # random 0.6x
    assert controls[0]["target"] == by["hybrid_speed"]["target"]  # held to the speed claim's own target
    tie = dict(SPEED, random=20.5)  # a flat verify cost: random ties generate, and still must not reach 1.5x
    assert _claims(_rows(tie))[1][0]["verdict"] == "fails"
    assert any(c["claim"].startswith("our plain_decode") for c in claims)


def test_a_failed_premise_makes_the_speed_claim_no_headroom_and_a_strong_ngram_matches_it():
    slow_oracle = dict(SPEED, oracle=24.0, ngram=33.0)  # ceiling 1.2x < 1.5x; the n-gram half alone 1.65x
    claims, _, premises, competitors = _claims(_rows(slow_oracle))
    by = {c["name"]: c for c in resolve(claims, premises, competitors) if c.get("name")}
    assert premises[0]["verdict"] == "fails"
    assert by["hybrid_speed"]["verdict"] == "no_headroom"
    assert by["hybrid_speed"]["matched_by"]  # the competitor holds too


def test_rows_and_summary():
    ref = {"tokens": torch.tensor([1, 2, 3, 4]), "new_tokens": 2, "decode_tokens": 1, "decode_seconds": 0.1}
    run = dict(ref, tokens=torch.tensor([1, 2, 3, 5]), rounds=1, accepted=0, drafter_forwards=1, draft_seconds=0.01,
               draft_nodes=3)
    row = _row("hybrid", 0, run, ref, "b1")
    assert row["identical_to_generate"] is False and row["first_divergence"] == 3 and row["config"] == "b1"
    assert row["tau"] == 1.0 and row["draft_ms_per_round"] == 10.0
    summary = _summary([row, _row("generate", 0, ref, ref, None)])
    assert summary[0]["identical"] == "0/1" and summary[0]["config"] == "b1" and summary[1]["x_generate"] == 1.0


def test_every_rotation_runs_the_oracle_after_a_real_method():
    """The quick run crashed on the prompt whose rotation put the random control first and the oracle second."""
    from lit_lowrank.benchmarks.specblock import _rotation

    methods = ["generate", "ngram", "prompt_lookup", "specblock", "eagle", "hybrid"]
    firsts = set()
    for i in range(2 * (len(methods) + 2)):
        order = _rotation(methods, i)
        assert sorted(order) == sorted([*methods, "oracle", "random"])
        real = [k for k, name in enumerate(order) if name not in ("oracle", "random")]
        assert real[0] < order.index("oracle")
        firsts.add(order[0])
    assert firsts >= set(methods)  # every method runs first on some prompt
