"""The bandit benchmark's stream prompts, shuffled-label control and claim wiring (no model run)."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.benchmarks.specblock_bandit import (
    REPLY_TEMPLATE,
    _claims,
    _ShuffledLabels,
    _summary,
    tweet_reply_prompts,
)


def test_tweet_prompts_are_distinct_long_tweets_in_a_seeded_order():
    a, b = tweet_reply_prompts(20, seed=0), tweet_reply_prompts(20, seed=1)
    assert a == tweet_reply_prompts(20, seed=0) and a != b
    assert len(set(a)) == 20 and all(p.startswith(REPLY_TEMPLATE.split("{")[0]) for p in a)
    assert all(len(p.split("\n\n", 1)[1].split()) > 12 for p in a)
    with pytest.raises(ValueError, match="n=10000000 exceeds"):
        tweet_reply_prompts(10_000_000)


class _Base:
    pulls: list[str] = []

    def _batch(self, take: int):
        labels = torch.arange(take)[None]
        return torch.zeros(1, take, 2), torch.zeros(1, take, 2), labels


class _Shuffled(_ShuffledLabels, _Base):
    pass


def test_shuffled_control_permutes_the_labels_and_keeps_inputs():
    embeds, feats, labels = _Shuffled()._batch(40)
    assert sorted(labels[0].tolist()) == list(range(40)) and labels[0].tolist() != list(range(40))
    assert embeds.shape == (1, 40, 2) and feats.shape == (1, 40, 2)


def _rows(ratio_bandit: float, ratio_always: float, tau_gain: float) -> list[dict]:
    rows = []
    for s in ("tweets", "lee"):
        for p in range(6):
            noise = 1.0 + 0.01 * (p % 3)
            base = {"stream": s, "prompt": p, "new_tokens": 40, "identical_to_fixed": True}
            rows.append(dict(base, method=f"fixed_{s}", tokens_per_s=10.0, tau=1.5))
            rows.append(dict(base, method=f"bandit_{s}", tokens_per_s=10.0 * ratio_bandit * noise, tau=1.5))
            rows.append(dict(base, method=f"always_{s}", tokens_per_s=10.0 * ratio_always * noise,
                             tau=1.5 * tau_gain * noise))
            if s == "tweets":
                rows.append(dict(base, method="shuffled_tweets", tokens_per_s=9.0, tau=1.5 * 0.9 * noise))
    return rows


def test_claims_read_the_paired_ratios_and_need_the_room_premise():
    claims, controls, premises, competitors = _claims(_rows(1.2, 0.9, 1.2), ["tweets", "lee"])
    by = {c["name"]: c for c in claims}
    assert by["bandit_gain_tweets"]["estimate"] == pytest.approx(1.2 * 1.01, rel=0.01)
    assert by["bandit_gain_tweets"]["verdict"] == "holds" and by["bandit_gain_tweets"]["requires"] == ["room_tweets"]
    assert by["bandit_vs_always"]["verdict"] == "holds"
    assert {p["name"]: p["verdict"] for p in premises} == {"room_tweets": "holds", "room_lee": "holds"}
    assert [c["for"] for c in competitors] == ["bandit_gain_tweets", "bandit_gain_lee"]
    assert competitors[0]["verdict"] == "fails"  # always-update at 0.9x does not match the bandit
    assert controls[0]["verdict"] == "fails"  # shuffled labels lower tau
    claims, *_ = _claims(_rows(0.8, 0.7, 1.0), ["tweets"])
    assert {c["name"]: c["verdict"] for c in claims}["bandit_gain_tweets"] == "fails"


def test_summary_reports_each_method_against_the_fixed_drafter_of_its_stream():
    summary = {r["method"]: r for r in _summary(_rows(1.2, 0.9, 1.2))}
    assert summary["fixed_lee"]["x_fixed"] == 1.0
    assert summary["bandit_tweets"]["x_fixed"] == pytest.approx(1.2 * 1.01, rel=0.01)
    assert summary["shuffled_tweets"]["identical"] == "6/6"
