"""The stable_rank benchmark's tiny arithmetic policy: target format, caching by config + seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_lowrank.benchmarks.stable_rank import arithmetic_target, tiny_arithmetic_policy
from lit_lowrank.datamodules.prompts import arithmetic_problems, extract_number

SMALL = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 2}


def test_arithmetic_target_restates_and_answers():
    for problem in arithmetic_problems(20, seed=3, ops=("+", "-", "*")):
        target = arithmetic_target(problem)
        a, op, b, eq, value = target.split()
        assert eq == "=" and value == problem["answer"] and extract_number(target) == problem["answer"]
        assert f"What is {a} {op} {b}?" in problem["prompt"]
    with pytest.raises(ValueError, match="problem"):
        arithmetic_target({"prompt": "Name a planet.", "answer": ""})


def test_tiny_policy_is_cached_by_config_and_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_LOWRANK_CACHE", str(tmp_path))
    first = tiny_arithmetic_policy(seed=0, steps=3, config=SMALL)
    files = list((tmp_path / "stable_rank").glob("*.pt"))
    assert len(files) == 1
    again = tiny_arithmetic_policy(seed=0, steps=3, config=SMALL)  # loaded, not retrained
    for (k, a), b in zip(first.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    untrained = tiny_arithmetic_policy(seed=0, steps=0, config=SMALL, cache=False)
    assert any(not torch.equal(a, b) for a, b in zip(first.state_dict().values(), untrained.state_dict().values()))
    tiny_arithmetic_policy(seed=1, steps=3, config=SMALL)
    assert len(list((tmp_path / "stable_rank").glob("*.pt"))) == 2


def test_degenerate_responses_are_runaways_or_loops():
    from lit_lowrank.benchmarks.stable_rank import is_degenerate, repeated_ngram_fraction

    assert repeated_ngram_fraction([1, 2, 3, 4, 5]) == 0.0
    assert repeated_ngram_fraction([1, 2]) == 0.0
    assert repeated_ngram_fraction([7, 8, 9] * 4) == pytest.approx(1 - 3 / 10)
    eos = {0}
    assert not is_degenerate([5, 6, 7, 0], eos, max_new_tokens=8)          # ended, no loop
    assert is_degenerate([5, 6, 7, 8, 9, 10, 11, 12], eos, max_new_tokens=8)  # ran to the budget
    assert is_degenerate([7, 8, 9] * 4 + [0], eos, max_new_tokens=20)       # ended, but a loop


def test_generations_are_cached_by_model_prompts_and_settings(tmp_path, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_lowrank.benchmarks.stable_rank import cached_samples, model_fingerprint

    monkeypatch.setenv("LIT_LOWRANK_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0,
                                         eos_token_id=1, bos_token_id=None)).eval()
    kwargs = {"max_new_tokens": 5, "eos": {1}, "pad": 0, "do_sample": True, "temperature": 1.0, "seed": 3}
    first = cached_samples(model, [[2, 3], [4]], 2, **kwargs)
    assert len(first) == 4 and len(list((tmp_path / "stable_rank").glob("samples_*.json"))) == 1
    assert cached_samples(model, [[2, 3], [4]], 2, **kwargs) == first          # read back, not resampled
    cached_samples(model, [[2, 3], [4]], 2, **{**kwargs, "temperature": 0.5})
    assert len(list((tmp_path / "stable_rank").glob("samples_*.json"))) == 2
    before = model_fingerprint(model)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert model_fingerprint(model) != before


def test_rate_claim_reads_paired_outcomes():
    from lit_lowrank.benchmarks.stable_rank import rate_claim, wins

    assert wins(torch.tensor([2.0, 1.0, 3.0]), torch.tensor([1.0, 1.0, 4.0])) == [1.0, 0.0, 0.0]
    hits = [1.0] * 90 + [0.0] * 10
    c = rate_claim("x", "p", "q", hits, 0.5, "pair")
    assert c["estimate"] == pytest.approx(0.9) and c["verdict"] == "holds" and c["n"] == 100
    tie = rate_claim("x", "p", "q", hits, 0.0, "problem", baseline=hits)
    assert tie["estimate"] == 0.0 and tie["verdict"] != "holds"


def test_grouped_auc_orders_right_above_wrong_within_groups():
    from lit_lowrank.benchmarks.stable_rank import grouped_auc

    values = torch.tensor([[3.0, 1.0, 2.0], [1.0, 1.0, 5.0], [0.0, 9.0, 4.0]])
    correct = torch.tensor([[1, 0, 0], [1, 0, 1], [0, 0, 0]])
    # group 0: right (3) above both wrong -> 1; group 1: rights 1 and 5 vs wrong 1 -> (0.5 + 1) / 2; group 2 skipped
    assert grouped_auc(values, correct) == pytest.approx((1.0 + 0.75) / 2)
    assert np.isnan(grouped_auc(values[2:], correct[2:]))


def test_gaming_claim_needs_a_dose_that_can_show_gaming():
    """"SR-GRPO does not game" requires the premise that GRPO on a pure length reward does game at this dose."""
    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.stable_rank import _claims, _premises

    def rows_with(length_degenerate: float) -> list[dict]:
        rows = [{"section": "pairwise", "stable_rank": float(i % 3 > 0), "mean_log_prob": 0.0,
                 "random": float(i % 2), "length": 0.0, "shortness": 1.0} for i in range(30)]
        rows += [{"section": "best_of_n", "stable_rank": 1.0, "greedy": 0.0, "oracle": 1.0, "random": 0.0,
                  "length": 0.0} for _ in range(10)]
        rows += [{"section": "sr_grpo", "reward": r, "seed": 0, "problem": p, "correct_before": 0.0,
                  "correct_after": 1.0, "degenerate_before": 0.0,
                  "degenerate_after": length_degenerate if r == "length" else 0.0}
                 for r in ("stable_rank", "length") for p in range(12)]
        return rows

    full_claims, full_controls = _claims(rows_with(1.0), [0], informative=False)
    quick_claims, _ = _claims(rows_with(1.0), [0], gaming=False, informative=False)
    assert sum("game" in c["claim"] for c in full_claims) == 1 and not any("game" in c["claim"] for c in quick_claims)
    assert not any("game" in c["claim"] for c in full_controls)  # a premise now, not a control
    for degenerate, expected in ((1.0, "holds"), (0.0, "no_headroom")):
        rows = rows_with(degenerate)
        claims, _ = _claims(rows, [0], informative=False)
        premises = _premises(rows, {})
        assert {p["name"]: p["verdict"] for p in premises}["length_games"] == ("holds" if degenerate else "fails")
        gaming = next(c for c in resolve(claims, premises, []) if c.get("name") == "sr_grpo_no_gaming")
        assert gaming["verdict"] == expected, (degenerate, gaming["verdict"])


def test_bon_and_grpo_claims_need_their_premises():
    """Best-of-8 needs an oracle pick above greedy; SR-GRPO needs a reward that tells right from wrong samples of
    its policy. Without either, the claim is no_headroom (its measured verdict kept), never fails."""
    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.stable_rank import _claims, _premises, group_aucs

    values = torch.tensor([[3.0, 1.0, 2.0], [1.0, 2.0, 0.0], [5.0, 5.0, 5.0]])
    correct = torch.tensor([[1, 0, 0], [1, 0, 1], [0, 0, 0]])
    assert group_aucs(values, correct) == pytest.approx([1.0, 0.0])  # the all-wrong group has no pair

    rows = [{"section": "pairwise", "stable_rank": 1.0, "mean_log_prob": 0.0, "random": 0.0, "length": 0.0,
             "shortness": 0.0} for _ in range(20)]
    # greedy right on every problem: no sample can do better, so Best-of-8 has no room
    rows += [{"section": "best_of_n", "stable_rank": 0.0, "greedy": 1.0, "oracle": 1.0, "random": 0.0,
              "length": 0.0} for _ in range(12)]
    rows += [{"section": "sr_grpo", "reward": r, "seed": 0, "problem": p, "correct_before": 0.0, "correct_after": 0.0,
              "degenerate_before": 0.0, "degenerate_after": 0.0} for r in ("stable_rank", "length") for p in range(12)]
    uninformative = {"stable_rank_per_problem": [0.5, 0.25, 0.75, 0.5, 0.5, 0.5]}
    premises = _premises(rows, uninformative)
    assert [p["name"] for p in premises] == ["bon_oracle", "length_games", "grpo_reward_informative"]
    assert [p["verdict"] for p in premises] == ["fails", "fails", "inconclusive"]
    claims, _ = _claims(rows, [0], gaming=False)
    verdict = {c.get("name"): c for c in resolve(claims, premises, [])}
    assert verdict["bon_greedy"]["verdict"] == "no_headroom" and verdict["bon_greedy"]["measured_verdict"] == "fails"
    assert verdict["sr_grpo_gain"]["verdict"] == "no_headroom"
    informative = _premises(rows, {"stable_rank_per_problem": [0.9, 1.0, 0.8, 0.95, 1.0, 0.85]})
    assert informative[2]["verdict"] == "holds"
    verdict = {c.get("name"): c for c in resolve(claims, informative, [])}
    assert verdict["sr_grpo_gain"]["verdict"] == "fails"  # the premise held: now a fail is news


def test_self_certainty_and_log_prob_selection_compete_for_the_claims():
    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.stable_rank import _claims, _competitors, _premises

    rows = [{"section": "pairwise", "stable_rank": 1.0, "mean_log_prob": float(i % 2), "self_certainty": 1.0,
             "random": 0.0, "length": 0.0, "shortness": 0.0} for i in range(40)]
    rows += [{"section": "best_of_n", "stable_rank": 1.0, "greedy": 0.0, "oracle": 1.0, "random": 0.0,
              "length": 0.0, "mean_log_prob": 0.0} for _ in range(12)]
    claims, _ = _claims(rows, [0], gaming=False, informative=False)
    resolved = {c.get("name"): c for c in resolve(claims, _premises(rows, {}), _competitors(rows))}
    assert resolved["pairwise_vs_logprob"]["verdict"] == "holds"
    assert resolved["pairwise_vs_logprob"]["matched_by"]  # self-certainty beats log-prob as well: not stable rank's
    assert resolved["bon_greedy"]["verdict"] == "holds" and not resolved["bon_greedy"]["matched_by"]


def test_self_certainty_reward_is_the_scorers_signal_and_competes_with_sr_grpo():
    """INTUITOR's reward reads the same scorer forward as stable rank; GRPO on it is SR-GRPO's competitor."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.stable_rank import SelfCertaintyReward, _claims, _competitors, _premises
    from lit_lowrank.datamodules.tokenizers import ByteTokenizer
    from lit_lowrank.decoding.stable_rank import ResponseScorer

    torch.manual_seed(0)
    tok = ByteTokenizer()
    model = LlamaForCausalLM(LlamaConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)).eval()
    prompts, completions = ["What is 2 + 2?", "Name a colour."], [" 4", " blue blue blue"]
    got = SelfCertaintyReward(model, tok)(prompts, completions, answer=["4", ""])  # extra columns are ignored
    want = ResponseScorer(model, tok).signals(prompts, completions, ("self_certainty",))["self_certainty"]
    assert got == pytest.approx(want.tolist()) and len(set(got)) == 2

    def grpo(reward: str, gain: float) -> list[dict]:
        return [{"section": "sr_grpo", "reward": reward, "seed": 0, "problem": p, "correct_before": 0.0,
                 "correct_after": gain if p % 4 else 0.0, "degenerate_before": 0.0, "degenerate_after": 0.0}
                for p in range(40)]

    base = [{"section": "pairwise", "stable_rank": 1.0, "mean_log_prob": 0.0, "random": 0.0, "length": 0.0,
             "shortness": 0.0} for _ in range(20)]
    base += [{"section": "best_of_n", "stable_rank": 1.0, "greedy": 0.0, "oracle": 1.0, "random": 0.0,
              "length": 0.0, "mean_log_prob": 0.0} for _ in range(12)]
    for sc_gain, matched in ((1.0, True), (0.0, False)):
        rows = base + grpo("stable_rank", 1.0) + grpo("length", 0.0) + grpo("self_certainty", sc_gain)
        claims, _ = _claims(rows, [0], gaming=False, informative=False)
        gain = next(c for c in resolve(claims, _premises(rows, {}), _competitors(rows))
                    if c.get("name") == "sr_grpo_gain")
        assert gain["verdict"] == "holds" and bool(gain["matched_by"]) == matched
