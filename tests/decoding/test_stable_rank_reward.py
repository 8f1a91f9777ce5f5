"""The stable-rank scorer, TRL-interface reward, Best-of-N and pairwise evaluation on a tiny random LM."""

from __future__ import annotations

import inspect

import pytest
import torch

from lit_lowrank.datamodules.preference import DEGRADATIONS, PreferencePair, degradation_pairs, load_rewardbench
from lit_lowrank.datamodules.prompts import arithmetic_problems, arithmetic_reward, extract_number
from lit_lowrank.datamodules.tokenizers import ByteTokenizer
from lit_lowrank.decoding.stable_rank import (
    ResponseScorer,
    StableRankReward,
    best_of_n,
    evaluate_pairs,
    pairwise_accuracy,
    select_best,
)
from lit_lowrank.ops.stable_rank import stable_rank

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "max_position_embeddings": 512}


def tiny_lm(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=258, pad_token_id=256, eos_token_id=257, bos_token_id=None, **TINY)
    return LlamaForCausalLM(config).eval()


REFERENCE = ["The council met on Tuesday to discuss the new budget for local roads and schools.",
             "Heavy rain caused flooding across the region, and several families were moved to safety.",
             "The team won its third match in a row after a late goal in the second half."]


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(), ByteTokenizer()


def test_scorer_matches_direct_stable_rank_of_the_response_rows(lm):
    model, tok = lm
    scorer = ResponseScorer(model, tok, batch_size=2, reference_texts=REFERENCE)
    prompts, completions = ["Q: hi?", "A much longer prompt here:"], ["fine, thanks", "ok"]
    got = scorer.signals(prompts, completions)
    reference = scorer.length_reference()
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids = torch.tensor([tok.encode(p) + tok.encode(c)])
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
        n_prompt = len(tok.encode(p))
        expected = stable_rank(out.hidden_states[-1][0, n_prompt:])
        assert float(got["stable_rank_raw"][i]) == pytest.approx(float(expected), rel=1e-4)
        # the default reward: raw / the reference text's mean stable rank at the same length
        ref_at = float(reference(torch.tensor(len(c))))
        assert float(got["stable_rank"][i]) == pytest.approx(float(expected) / ref_at, rel=1e-4)
        logp = torch.log_softmax(out.logits[0, n_prompt - 1:-1].float(), -1)
        expected_lp = logp.gather(-1, ids[0, n_prompt:, None]).mean()
        assert float(got["mean_log_prob"][i]) == pytest.approx(float(expected_lp), rel=1e-4)
        assert float(got["length"][i]) == len(c)
        # the length-normalised signal: srank / min(T, d) of the same rows
        d = model.config.hidden_size
        assert float(got["stable_rank_max_rank"][i]) == pytest.approx(float(expected) / min(len(c), d), rel=1e-4)
    # pre-norm states differ from post-norm ones
    pre = ResponseScorer(model, tok, final_norm=False, normalize="none").signals(prompts, completions, ("stable_rank",))
    assert not torch.allclose(pre["stable_rank"], got["stable_rank_raw"])


def test_shared_prompt_groups_score_like_separate_sequences(lm):
    """Completions sharing a prompt run with the prompt's KV cache repeated: same numbers as one by one."""
    model, tok = lm
    scorer = ResponseScorer(model, tok, batch_size=3, normalize="none")
    prompts = ["Q: same?"] * 4 + ["other"]
    completions = ["yes it is", "no", "", "maybe so, perhaps"] + ["alone"]
    grouped = scorer.signals(prompts, completions)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        single = scorer.signals([p], [c])
        for name, value in single.items():
            assert float(grouped[name][i]) == pytest.approx(float(value[0]), rel=1e-4, abs=1e-5), (name, i)
    assert float(grouped["stable_rank"][2]) == 0.0 and float(grouped["length"][2]) == 0.0


def test_padded_chunks_split_where_padding_costs_most():
    from lit_lowrank.decoding.stable_rank import padded_chunks

    lengths = {0: 30, 1: 31, 2: 29, 3: 80, 4: 30}
    chunks = padded_chunks([0, 1, 2, 3, 4], lengths, prefix=10, max_size=8)
    assert chunks == [[2, 0, 4, 1], [3]]                   # the long one alone: 10 + 4*31 + 10 + 80 < 10 + 5*80
    assert sorted(i for c in padded_chunks(list(range(20)), {i: 5 for i in range(20)}, 50, 8) for i in c) == \
        list(range(20))
    assert all(len(c) <= 8 for c in padded_chunks(list(range(20)), {i: 5 for i in range(20)}, 50, 8))


def test_length_reference_is_fitted_once_from_the_reference_texts(lm):
    model, tok = lm
    scorer = ResponseScorer(model, tok, reference_texts=REFERENCE, reference_tokens=24)
    reference = scorer.length_reference()
    assert scorer.length_reference() is reference
    assert int(reference.lengths.max()) <= 24 and float(reference.values[0]) == pytest.approx(1.0)
    assert bool((reference.counts >= 2).all())
    given = ResponseScorer(model, tok, reference=reference)
    assert given.length_reference() is reference
    with pytest.raises(ValueError, match="normalize"):
        ResponseScorer(model, tok, normalize="sqrt")


def test_reward_has_trl_interface(lm):
    model, tok = lm
    reward = StableRankReward(model, tok, reference_texts=REFERENCE)
    params = inspect.signature(reward.__call__).parameters
    assert list(params)[:2] == ["prompts", "completions"]
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert reward.__name__ == "stable_rank"
    out = reward(prompts=["a", "b", "c"], completions=["one two", "x", "three four five"], answer=["1", "2", "3"])
    assert isinstance(out, list) and len(out) == 3 and all(isinstance(v, float) for v in out)
    # conversational completions (TRL) are read from their content
    conv = reward(prompts=["a"], completions=[[{"role": "assistant", "content": "one two"}]])
    assert conv[0] == pytest.approx(out[0], rel=1e-5)
    with pytest.raises(ValueError, match="prompts"):
        reward(["a"], ["x", "y"])


def test_best_of_n_selects_the_argmax(lm):
    model, tok = lm
    by_length = best_of_n(model, tok, ["ab", "cd"], n=4, selector="length", max_new_tokens=6, seed=0)
    assert len(by_length.samples) == 2 and all(len(s) == 4 for s in by_length.samples)
    lengths = by_length.scores["length"].view(2, 4)
    assert by_length.chosen_index == lengths.argmax(-1).tolist()

    def longest_text(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    custom = best_of_n(model, tok, ["ab"], n=3, selector=longest_text, max_new_tokens=6, seed=1)
    assert custom.chosen[0] == max(custom.samples[0], key=len)
    assert select_best(torch.tensor([0.0, 2.0, 1.0, 5.0, 5.0, 4.0]), 3).tolist() == [1, 0]
    with pytest.raises(ValueError, match="selector"):
        best_of_n(model, tok, ["ab"], n=2, selector="loudness", max_new_tokens=2)


def test_pairwise_accuracy_and_evaluation(lm, tmp_path):
    assert pairwise_accuracy(torch.tensor([2.0, 1.0, 3.0, 1.0]), torch.tensor([1.0, 2.0, 3.0, 0.0])) == 0.5
    model, tok = lm
    pairs = [PreferencePair("p", "good answer", "bad", "s1"), PreferencePair("p", "good answer", "a far worse answer", "s2")]
    table = evaluate_pairs(ResponseScorer(model, tok, normalize="none"), pairs, ("stable_rank", "length"))
    assert table["length"] == {"all": 0.5, "s1": 1.0, "s2": 0.0}
    # real loader: RewardBench columns from a local jsonl; a missing column is named
    path = tmp_path / "rb.jsonl"
    path.write_text('{"prompt": "p", "chosen": "c", "rejected": "r", "subset": "chat"}\n')
    assert load_rewardbench(path) == [PreferencePair("p", "c", "r", "chat")]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "chosen": "c"}\n')
    with pytest.raises(ValueError, match="rejected"):
        load_rewardbench(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError, match="path"):
        load_rewardbench(tmp_path / "missing.parquet")


def test_embedded_pairs_and_arithmetic():
    pairs = degradation_pairs(n_prompts=3, seed=0)
    assert len(pairs) == 3 * len(DEGRADATIONS) and {p.subset for p in pairs} == set(DEGRADATIONS)
    assert all(p.chosen != p.rejected for p in pairs)
    assert degradation_pairs(n_prompts=3, seed=0) == pairs
    problems = arithmetic_problems(20, seed=1)
    for item in problems:
        a, op, b = item["prompt"].split("?")[0].split()[-3:]
        assert str(eval(f"{a}{op}{b}")) == item["answer"]
    assert extract_number("3 + 4 = 7.") == "7" and extract_number("no digits") is None
    assert arithmetic_reward(["q", "q"], ["The answer is 7", "6"], answer=["7", "7"]) == [1.0, 0.0]
