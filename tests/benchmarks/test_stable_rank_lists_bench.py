"""The stable_rank_lists benchmark: list parsing, collapse labels, its rewards, and its claims on synthetic rows."""

from __future__ import annotations

import numpy as np
import pytest

from lit_lowrank.benchmarks.stable_rank_lists import (
    GRPO_LRS,
    HELD_OUT,
    ITEMS,
    VALIDATION,
    RandomReward,
    StrictListReward,
    _best_of_n,
    _claims,
    _pairwise,
    _premises,
    is_collapsed,
    list_items,
)


@pytest.mark.parametrize(("text", "ended", "expected"), [
    ("1. Apple\n2. Pear\n3. Plu", False, ["apple", "pear"]),  # the cut last line is dropped
    ("1. Apple\n2. Pear\n3. Plum", True, ["apple", "pear", "plum"]),
    ("1. Banana, 2. Apple, 3. Banana, 4", False, ["banana", "apple", "banana"]),  # inline numbered
    ("1. Dog 2. Cat 3. Cow", True, ["dog", "cat", "cow"]),
    ("Marble, Love, and Title.", True, ["marble", "love", "title"]),
    ("Here are 15 fruits:\n1. Kiwi!\n", True, ["here are fruits", "kiwi"]),
])
def test_list_items_reads_lines_and_inline_lists(text: str, ended: bool, expected: list[str]) -> None:
    assert list_items(text, ended=ended) == expected


def test_collapse_is_a_repeated_normalised_item() -> None:
    assert is_collapsed(list_items("1. Apple\n2. apple!\n3. x", ended=False))
    assert not is_collapsed(list_items("1. Apple\n2. Apples\n", ended=True))
    # the line-only reading called this inline list clean; it repeats "banana"
    assert is_collapsed(list_items("1. Banana, 2. Apple, 3. Banana", ended=True))


def test_strict_list_reward_pays_items_and_nothing_for_a_repeat() -> None:
    reward = StrictListReward()
    clean, repeated, short, long_repeated = "1. a\n2. b\n3. c", "1. a\n2. b\n3. a", "1. a", "1. a\n2. b\n3. c\n4. a"
    out = reward(["p"] * 4, [clean, repeated, short, long_repeated])
    assert out == pytest.approx([3 / ITEMS, 0.0, 1 / ITEMS, 0.0])  # length cannot buy back a repeat
    assert reward(["p"], [""]) == [0.0]


def test_the_category_splits_are_disjoint() -> None:
    from lit_lowrank.benchmarks.stable_rank_lists import CATEGORIES, TRAIN_CATEGORIES

    assert len(set(CATEGORIES)) == len(CATEGORIES) == TRAIN_CATEGORIES + len(HELD_OUT) + len(VALIDATION)
    assert not set(HELD_OUT) & set(VALIDATION) and min(HELD_OUT + VALIDATION) == TRAIN_CATEGORIES


def test_the_shipped_prompts_are_the_training_then_the_validation_categories() -> None:
    import json
    from pathlib import Path

    from lit_lowrank.benchmarks.stable_rank_lists import CATEGORIES, TRAIN_CATEGORIES, list_prompt

    path = Path(__file__).parents[2] / "configs/language_model/real/stable_rank_lists_prompts.jsonl"
    shipped = [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").splitlines()]
    assert shipped == [list_prompt(CATEGORIES[c]) for c in (*range(TRAIN_CATEGORIES), *VALIDATION)]


def test_grpo_lr_is_picked_on_validation_and_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lr that lowers the *validation* collapsed rate most trains every reward; held-out rows never choose."""
    import lit_lowrank.benchmarks.stable_rank_lists as bench

    calls = []

    def fake_run(policy, tok, reward, seed, lr, evals, before, scorer, path):  # noqa: ANN001, ANN202
        calls.append((reward, lr, tuple(evals)))
        # validation prefers the larger lr, held-out the smaller: a choice made on held-out would differ
        drop = {"validation": 0.2 if lr == max(GRPO_LRS) else 0.1, "held_out": 0.3 if lr == min(GRPO_LRS) else 0.0}
        return [{"section": "sr_grpo", "split": split, "reward": reward, "lr": lr, "category": c,
                 "collapsed_before": 0.5, "collapsed_after": 0.5 - drop[split]}
                for split, cats in evals.items() for c in cats]

    monkeypatch.setattr(bench, "_grpo_run", fake_run)
    monkeypatch.setattr(bench, "_lora_policy", lambda model, rank: model)
    rows, choice = bench._sr_grpo(object(), None, None, [], 0)
    assert choice["lr"] == max(GRPO_LRS)
    assert calls[:len(GRPO_LRS)] == [("strict_list", lr, ("validation", "held_out")) for lr in GRPO_LRS]
    assert {(r, lr) for r, lr, _ in calls[len(GRPO_LRS):]} == {(r, max(GRPO_LRS)) for r in bench.GRPO_REWARDS[1:]}
    held = [r for r in rows if r["section"] == "sr_grpo"]
    assert {r["lr"] for r in held} == {max(GRPO_LRS)} and {r["category"] for r in held} == set(HELD_OUT)
    assert {r["reward"] for r in held} == set(bench.GRPO_REWARDS)
    assert len([r for r in rows if r["section"] == "sr_grpo_lr"]) == len(GRPO_LRS) * (len(VALIDATION) + len(HELD_OUT))


def test_random_reward_is_seeded_and_blind_to_the_text() -> None:
    a, b = RandomReward(3)(["p"] * 4, ["x"] * 4), RandomReward(3)(["q"] * 4, ["1. a\n2. a"] * 4)
    assert a == b and len(set(a)) == 4 and all(0 <= v < 1 for v in a)


def _samples(scores: dict[int, list[tuple[float, bool]]]) -> list[dict]:
    """Window-filling sample rows: per category (stable rank, collapsed); the other signals are its negation."""
    return [{"category": c, "sample": j, "full_window": True, "collapsed": float(bad), "stable_rank": s,
             "mean_log_prob": -s, "self_certainty": -s, "items": 5, "tokens": 64}
            for c, group in scores.items() for j, (s, bad) in enumerate(group)]


def test_pairwise_and_best_of_n_rows_on_a_perfect_signal() -> None:
    samples = _samples({c: [(2.0, False), (1.0, True), (0.5, True), (3.0, False)] for c in range(6)})
    samples.append({**samples[0], "full_window": False, "collapsed": 0.0, "stable_rank": -9.0})  # out of the window
    pw, bon = _pairwise(samples, 0), _best_of_n(samples)
    assert len(pw) == len(bon) == 6
    assert all(r["stable_rank"] == 1.0 and r["mean_log_prob"] == 0.0 for r in pw)
    assert all(r["stable_rank"] == 1.0 and r["random"] == 0.5 and r["oracle"] == 1.0 and r["lowest_stable_rank"] == 0.0
               and r["n"] == 4 for r in bon)


def test_a_category_without_both_kinds_is_no_pairwise_unit() -> None:
    samples = _samples({0: [(1.0, False), (2.0, False)], 1: [(1.0, True), (2.0, False)]})
    assert [r["category"] for r in _pairwise(samples, 0)] == [1]


def test_claims_follow_the_signal_and_the_controls_do_not() -> None:
    rng = np.random.default_rng(0)
    groups = {c: [(float(rng.normal(2.0)), False), (float(rng.normal(2.0)), False), (float(rng.normal(0.0)), True),
                  (float(rng.normal(0.0)), True)] for c in range(30)}
    rows = _pairwise(_samples(groups), 0) + _best_of_n(_samples(groups))
    claims, controls, competitors = _claims(rows)
    by = {c["name"]: c for c in claims}
    assert by["pairwise_lists"]["verdict"] == "holds" and by["bon_lists"]["verdict"] == "holds"
    assert all(c["verdict"] != "holds" for c in controls)
    assert {c["for"] for c in competitors} == {"pairwise_lists", "bon_lists"}
    assert all(c["verdict"] == "fails" for c in competitors)  # the negated signals prefer the collapsed lists
    assert [p["name"] for p in _premises(rows)] == ["bon_oracle"]  # no GRPO rows: no GRPO premises


def test_sr_grpo_claims_need_their_premises() -> None:
    pw = [{"section": "pairwise", "category": c, "stable_rank": 0.5, "mean_log_prob": 0.5, "self_certainty": 0.5,
           "stable_rank_permuted": 0.5} for c in range(5)]
    bon = [{"section": "best_of_n", "category": c, "random": 0.5, "oracle": 1.0, "stable_rank": 0.5,
            "mean_log_prob": 0.5, "self_certainty": 0.5, "lowest_stable_rank": 0.5} for c in range(5)]
    grpo = [{"section": "sr_grpo", "reward": reward, "category": 30 + c, "collapsed_before": 0.5,
             "collapsed_after": 0.5 - drop * (1 + 0.1 * c), "distinct_before": 8.0,
             "distinct_after": 8.0 + 4 * drop * (1 + 0.1 * c)}
            for reward, drop in (("strict_list", 0.3), ("stable_rank", 0.2), ("self_certainty", 0.0),
                                 ("random", 0.0), ("length", -0.1))
            for c in range(8)]
    claims, controls, competitors = _claims(pw + bon + grpo)
    premises = {p["name"]: p for p in _premises(pw + bon + grpo)}
    assert premises["list_reward_teaches"]["verdict"] == "holds"
    assert premises["list_reward_adds_distinct"]["verdict"] == "holds"
    assert premises["grpo_reward_informative"]["verdict"] != "holds"  # AUC 0.5 on every training category
    by = {c["name"]: c for c in claims}
    assert by["sr_grpo_lists"]["verdict"] == "holds"
    assert by["sr_grpo_lists"]["requires"] == ["grpo_reward_informative", "list_reward_teaches"]
    assert by["sr_grpo_lists_distinct"]["verdict"] == "holds"
    assert by["sr_grpo_lists_distinct"]["requires"] == ["list_reward_adds_distinct"]
    assert {c["for"] for c in competitors} >= {"sr_grpo_lists", "sr_grpo_lists_distinct"}
    assert [c["verdict"] for c in controls if "GRPO" in c["claim"]] == ["fails"] * 4


def test_the_line_only_reading_misses_inline_repeats() -> None:
    from lit_lowrank.benchmarks.stable_rank_lists import _within_auc, line_items

    inline = "1. Banana, 2. Apple, 3. Banana, 4. Kiwi"
    assert line_items(inline, ended=True) == ["banana  apple  banana  kiwi"] and not is_collapsed(line_items(inline))
    assert is_collapsed(list_items(inline, ended=True))
    rows = [{**r, "collapsed_lines": 0.0 if r["sample"] == 1 else r["collapsed"]}
            for r in _samples({0: [(2.0, False), (3.0, True), (1.0, True)], 1: [(1.0, False), (2.0, True)]})]
    assert _within_auc(rows, "stable_rank", "collapsed") == (0.25, 2)
    assert _within_auc(rows, "stable_rank", "collapsed_lines") == (1.0, 1)  # category 1 has no line-label repeat
