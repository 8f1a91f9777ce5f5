"""Stable rank as an annotation-free quality signal: pairwise accuracy, Best-of-N and SR-GRPO (arXiv 2512.02807).

Scorer: the offline SmolLM2-135M-Instruct (:func:`~lit_lowrank.models.load_smollm2`), chat-wrapped prompts,
final-layer hidden states after the final norm, special tokens excluded, uncentred. ``stable_rank`` is the
library default, **length-normalised**: the raw ``srank = ‖H‖_F²/‖H‖₂²`` divided by the mean srank of real
news text of the same length under the same scorer (:meth:`~lit_lowrank.decoding.ResponseScorer.length_reference`,
fitted on gensim's Lee *test* articles); ``stable_rank_raw`` is the paper's unnormalised quantity, reported
beside it. Units are paired: the same pairs / problems for every signal, 95% percentile-bootstrap CIs.

Sections:

- ``pairwise``: preference pairs from shipped text and SmolLM2 generations. (1) Lee-corpus news:
  the real next sentence vs five seeded degradations (:data:`~lit_lowrank.datamodules.preference.DEGRADATIONS`;
  truncation makes the rejected text shorter and the looped tail longer, so length alone cannot sort them);
  (2) ``temperature``: SmolLM2's own continuation of the same prompt sampled at T = 0.7 vs at T = 2.0
  (word salad) with the same token budget; (3) ``correctness``: a right vs a wrong SmolLM2 answer to the
  same Best-of-N problem. Accuracy = the signal scores ``chosen`` strictly above ``rejected``.
- ``best_of_n``: single-digit addition / subtraction, ``N = 8`` SmolLM2 samples at T = 0.7 per problem and
  the greedy answer; exact match of the last integer for the sample each selector picks.
- ``sr_grpo``: GRPO with stable rank as the only reward (no answer is used in training) from a policy at
  intermediate accuracy, next to the verifiable exact-match reward (the upper baseline), the raw stable
  rank, and a pure length reward (a control that games by construction). Greedy accuracy, response
  length and degenerate responses (no end of sequence within the budget, or half the 3-grams repeats)
  on held-out problems before and after; self-certainty (INTUITOR's annotation-free reward) is stable rank's
  competitor. Quick: the tiny byte-level Llama of :func:`tiny_arithmetic_policy`; full: SmolLM2 with LoRA (r = 8
  on the attention and MLP projections, ~10 CPU-s a step of 2 prompts × 4 samples on one thread), its lr picked
  from :data:`GRPO_LRS_FULL` for the verifiable reward on validation problems.

**Premises**: ``bon_oracle`` (an oracle pick among the 8 samples above greedy: room for any selector) for the
Best-of-8 claim; ``length_games`` (GRPO on a pure length reward raises the degenerate rate: the dose can show
gaming) for "SR-GRPO does not game"; ``grpo_reward_informative`` (the stable-rank reward ranks right samples of the initial
policy's groups above wrong ones, per-problem AUC > 0.5) for the SR-GRPO claim. A claim whose premise does
not hold is ``no_headroom``.

Generations are cached under ``$LIT_LOWRANK_CACHE/stable_rank`` (default ``~/.cache/lit_lowrank``), keyed by
the model, the prompts and the sampling settings, so reruns score cached samples.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lit_lowrank.benchmarks.harness import BenchmarkResult, competitor, premise, statistic_claim, torch_threads
from lit_lowrank.datamodules.preference import PreferencePair, degradation_pairs
from lit_lowrank.datamodules.prompts import PromptDataModule, arithmetic_problems, arithmetic_reward
from lit_lowrank.decoding.stable_rank import (
    ResponseScorer,
    decode_completion,
    eos_token_ids,
    sample_responses,
    score_pairs,
    select_best,
)

#: Signals compared everywhere; higher is better for each.
SIGNALS = ("stable_rank", "stable_rank_raw", "stable_rank_max_rank", "mean_log_prob", "negative_entropy",
           "self_certainty", "length")
QUICK = {"lee_prompts": 36, "temperature_prompts": 20, "bon_problems": 24, "grpo_seeds": 3, "held_out": 64}
FULL = {"lee_prompts": 100, "temperature_prompts": 60, "bon_problems": 100, "grpo_seeds": 1, "held_out": 64}
#: Best-of-N and the temperature pairs (fixed before measuring; T = 1 samples of this 135M model are rarely right)
BON = {"n": 8, "temperature": 0.7, "max_new_tokens": 16}
PAIR_SAMPLING = {"good_temperature": 0.7, "bad_temperature": 2.0, "max_new_tokens": 32}

PAPER_PAIRWISE = "stable rank achieves 84.04% accuracy on RewardBench"
PAPER_BON = "improves task accuracy by an average of 14.1% relative to greedy decoding via Best-of-N sampling"
PAPER_GRPO = "Without external supervision, SR-GRPO improves Qwen2.5-1.5B-Instruct by 10% on STEM and 19% on " \
             "mathematical reasoning"
PAPER_HACKING = "reward models are vulnerable to reward hacking (stable rank is proposed as an intrinsic, " \
                "annotation-free alternative)"
PAPER_BASELINES = "outperforming both learned reward models and self-evaluation baselines"


# ----------------------------------------------------------------------------- generation cache


def cache_dir() -> Path:
    """``$LIT_LOWRANK_CACHE/stable_rank`` (default ``~/.cache/lit_lowrank/stable_rank``)."""
    root = Path(os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank")
    path = root / "stable_rank"
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of a model's config and a slice of every parameter: changes when the weights do."""
    h = hashlib.sha256(json.dumps(getattr(getattr(model, "config", None), "to_dict", dict)(), sort_keys=True,
                                  default=str).encode())
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().flatten()[:64].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def cached_samples(model: torch.nn.Module, prompt_ids: Sequence[Sequence[int]], n: int, *, max_new_tokens: int,
                   eos: set[int], pad: int, do_sample: bool, temperature: float, seed: int,
                   batch: int = 32) -> list[list[int]]:
    """``n`` completions per prompt (token ids cut at EOS), read from / written to the generation cache.

    The key covers the model fingerprint, the prompts and every sampling setting; files are written
    atomically (temporary file + rename), so concurrent runs never read half a file.
    """
    settings = {"model": model_fingerprint(model), "prompts": [list(map(int, p)) for p in prompt_ids], "n": n,
                "max_new_tokens": max_new_tokens, "do_sample": do_sample, "temperature": temperature, "seed": seed,
                "eos": sorted(eos), "v": 1}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]
    path = cache_dir() / f"samples_{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    out: list[list[int]] = []
    for start in range(0, len(prompt_ids), batch):
        out += sample_responses(model, prompt_ids[start:start + batch], n, max_new_tokens, eos, pad,
                                do_sample=do_sample, temperature=temperature, generator_seed=seed + start)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, path)
    return out


# ----------------------------------------------------------------------------- claims over pairs / problems


def rate_claim(text: str, paper: str, quantity: str, hits: Sequence[float], target: float, unit: str,
               baseline: Sequence[float] | None = None, note: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """Mean of per-unit 0/1 outcomes (minus a baseline's on the same units) ``> target``, bootstrap CI.

    ``kwargs``: ``name`` / ``requires`` of :func:`statistic_claim`."""
    a = np.asarray(hits, dtype=float)
    b = np.zeros_like(a) if baseline is None else np.asarray(baseline, dtype=float)
    return statistic_claim(text, paper=paper, quantity=quantity, n_units=a.size,
                           statistic=lambda idx: float(a[idx].mean() - b[idx].mean()), target=target, op=">",
                           unit=unit, note=note, **kwargs)


def wins(chosen: torch.Tensor, rejected: torch.Tensor) -> list[float]:
    """1.0 where ``chosen > rejected`` (strict: a tie is a loss, as RewardBench counts it)."""
    return (chosen > rejected).float().tolist()


# ----------------------------------------------------------------------------- pairwise


def temperature_pairs(model, tok, scorer: ResponseScorer, prompts: list[str], seed: int) -> list[PreferencePair]:
    """SmolLM2's continuation at T = 0.7 (chosen) vs at T = 2.0 (rejected), same prompt and token budget."""
    ids = [scorer.prompt_ids(p) for p in prompts]
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    texts = {}
    for kind, temp in (("good", PAIR_SAMPLING["good_temperature"]), ("bad", PAIR_SAMPLING["bad_temperature"])):
        samples = cached_samples(model, ids, 1, max_new_tokens=PAIR_SAMPLING["max_new_tokens"], eos=eos, pad=pad,
                                 do_sample=True, temperature=temp, seed=seed + 7)
        texts[kind] = [decode_completion(tok, c, eos) for c in samples]
    return [PreferencePair(p, g, b, "temperature") for p, g, b in zip(prompts, texts["good"], texts["bad"])
            if g.strip() and b.strip() and g != b]


def _pairwise(model, tok, scorer: ResponseScorer, sizes: dict, seed: int,
              correctness: list[PreferencePair]) -> list[dict]:
    lee = degradation_pairs(n_prompts=sizes["lee_prompts"], seed=seed, context_sentences=1, response_sentences=1)
    prompts = list(dict.fromkeys(p.prompt for p in lee))[: sizes["temperature_prompts"]]
    pairs = lee + temperature_pairs(model, tok, scorer, prompts, seed) + correctness
    chosen, rejected = score_pairs(scorer, pairs, SIGNALS)
    rng = random.Random(seed)
    rows = []
    outcome = {name: wins(chosen[name], rejected[name]) for name in SIGNALS}
    outcome["shortness"] = wins(-chosen["length"], -rejected["length"])
    outcome["random"] = [float(rng.random() > 0.5) for _ in pairs]
    for i, p in enumerate(pairs):
        rows.append({"section": "pairwise", "pair": i, "subset": p.subset,
                     "tokens_chosen": int(chosen["length"][i]), "tokens_rejected": int(rejected["length"][i]),
                     **{name: outcome[name][i] for name in outcome}})
    return rows


# ----------------------------------------------------------------------------- Best-of-N


def _best_of_n(model, tok, scorer: ResponseScorer, sizes: dict, seed: int) -> tuple[list[dict], list[PreferencePair]]:
    problems = arithmetic_problems(sizes["bon_problems"], seed=seed + 100)
    prompts, answers = [p["prompt"] for p in problems], [p["answer"] for p in problems]
    n = BON["n"]
    ids = [scorer.prompt_ids(p) for p in prompts]
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    greedy = cached_samples(model, ids, 1, max_new_tokens=BON["max_new_tokens"], eos=eos, pad=pad, do_sample=False,
                            temperature=1.0, seed=0)
    samples = cached_samples(model, ids, n, max_new_tokens=BON["max_new_tokens"], eos=eos, pad=pad, do_sample=True,
                             temperature=BON["temperature"], seed=seed)
    texts = [decode_completion(tok, c, eos) for c in samples]
    correct = torch.tensor(arithmetic_reward(None, texts, answer=[a for a in answers for _ in range(n)])).view(-1, n)
    greedy_ok = arithmetic_reward(None, [decode_completion(tok, c, eos) for c in greedy], answer=answers)
    scores = scorer.score_ids([p for p in ids for _ in range(n)], samples, SIGNALS)
    rng = random.Random(seed)
    picks = {"random": torch.tensor([rng.randrange(n) for _ in prompts])}
    picks.update({name: select_best(scores[name], n) for name in SIGNALS})
    rows, pairs = [], []
    for b, prompt in enumerate(prompts):
        row = {"section": "best_of_n", "problem": b, "greedy": greedy_ok[b], "pass_rate": float(correct[b].mean()),
               "oracle": float(correct[b].max())}
        row.update({name: float(correct[b, int(index[b])]) for name, index in picks.items()})
        rows.append(row)
        right = [texts[b * n + j] for j in range(n) if correct[b, j]]
        wrong = [texts[b * n + j] for j in range(n) if not correct[b, j] and texts[b * n + j].strip()]
        if right and wrong:
            pairs.append(PreferencePair(prompt, right[0], wrong[0], "correctness"))
    return rows, pairs


# ----------------------------------------------------------------------------- SR-GRPO

TINY_POLICY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128}
SFT = {"steps": 250, "batch": 32, "lr": 3e-3, "problems": 2000, "v": 1}
#: lr picked for the *verifiable* reward on validation problems (seed + 300, never the held-out ones): mean
#: accuracy gain over 2 seeds after 30 steps 3e-4: +0.04, 1e-4: +0.12, 3e-5: +0.09 (60 steps at 1e-4: +0.15, over
#: the quick budget); every reward then runs with it
GRPO_QUICK = {"steps": 30, "group_size": 8, "lr": 1e-4, "batch_size": 4, "max_new_tokens": 14}
GRPO_FULL = {"steps": 40, "group_size": 4, "lr": 1e-4, "batch_size": 2, "max_new_tokens": 16, "lora_rank": 8}
#: full mode: the LoRA lr is picked in the run from this grid, for the *verifiable* reward on validation problems
#: (seed + 300, never the held-out ones), by greedy accuracy after GRPO; every reward then runs with it
GRPO_LRS_FULL = (1e-4, 3e-4, 1e-3)
GRPO_VAL_PROBLEMS = 32
#: GRPO rewards compared: the default (length-normalised) stable rank, the paper's raw one, self-certainty (the
#: learned-reward-free baseline: INTUITOR's reward, arXiv 2505.19590), the verifiable exact match (upper baseline)
#: and the response length (the control: a reward that can only be gamed)
GRPO_REWARDS = ("stable_rank", "stable_rank_raw", "self_certainty", "arithmetic", "length")


def arithmetic_target(problem: dict[str, str]) -> str:
    """The supervised completion of an arithmetic problem: the restated sum and its value (``" 3 + 4 = 7"``).

    Restating the operands gives the response several tokens, so its stable rank is not the trivial 1 of a
    one-token answer; the model must still compute the digits after ``=``.
    """
    match = re.match(r"What is (\d+) ([+\-*]) (\d+)\?", problem["prompt"])
    if match is None:
        raise ValueError(f"`problem`={problem!r} is not an arithmetic_problems prompt.")
    a, op, b = match.groups()
    return f" {a} {op} {b} = {problem['answer']}"


def tiny_arithmetic_policy(seed: int, steps: int = SFT["steps"], config: dict | None = None,
                           cache: bool = True) -> torch.nn.Module:
    """A tiny byte-level Llama supervised on the arithmetic format for ``steps`` steps (cached by config + seed).

    Stopped early on purpose, so its greedy accuracy is intermediate (about 0.3-0.6 at 250 steps): there is room
    for GRPO to move it either way. The loss covers the completion tokens and EOS only.

    .. code-block:: python

        policy = tiny_arithmetic_policy(seed=0)      # transformers LlamaForCausalLM, ByteTokenizer ids
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from lit_lowrank.datamodules.tokenizers import ByteTokenizer

    tok = ByteTokenizer()
    arch = {**TINY_POLICY, **(config or {}), "vocab_size": len(tok), "pad_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id, "bos_token_id": tok.eos_token_id}
    settings = {"arch": arch, **SFT, "steps": steps, "seed": seed}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / f"tiny_arithmetic_{key}.pt"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**arch))
    if cache and path.is_file():
        model.load_state_dict(torch.load(path, map_location="cpu"))
        return model.eval()
    pairs = [(tok.encode(p["prompt"]), tok.encode(arithmetic_target(p)) + [tok.eos_token_id])
             for p in arithmetic_problems(SFT["problems"], seed=seed + 1000)]
    width = max(len(a) + len(b) for a, b in pairs)
    ids = torch.full((len(pairs), width), tok.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    attention = torch.zeros(len(pairs), width, dtype=torch.long)
    for i, (a, b) in enumerate(pairs):
        ids[i, : len(a) + len(b)] = torch.tensor(a + b)
        attention[i, : len(a) + len(b)] = 1
        labels[i, len(a): len(a) + len(b)] = torch.tensor(b)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT["lr"])
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(pairs), (SFT["batch"],), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=attention[idx], labels=labels[idx]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    if cache:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)
    return model.eval()


def repeated_ngram_fraction(ids: Sequence[int], n: int = 3) -> float:
    """Fraction of a response's ``n``-grams that repeat an earlier one (0 for fewer than ``n + 1`` tokens)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    if len(grams) < 2:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def is_degenerate(ids: Sequence[int], eos: set[int], max_new_tokens: int) -> bool:
    """A runaway response: no end of sequence within the budget, or at least half its 3-grams repeats."""
    ended = any(int(t) in eos for t in ids)
    body = [int(t) for t in ids if int(t) not in eos]
    return (not ended and len(ids) >= max_new_tokens) or repeated_ngram_fraction(body) >= 0.5


def length_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Characters of the completion: the GRPO control reward, which only response length can raise."""
    return [float(len(str(c))) for c in completions]


class SelfCertaintyReward:
    """Self-certainty (mean KL(uniform ‖ p) over the completion's next-token distributions, Kang et al.) of a
    frozen scorer as a TRL-style reward: INTUITOR's annotation-free reward (arXiv 2505.19590), the baseline SR-GRPO
    must beat without a learned reward model. Read from the same :class:`ResponseScorer` forward as stable rank."""

    __name__ = "self_certainty"

    def __init__(self, model: Any, tokenizer: Any, **scorer_kwargs: Any) -> None:
        self.scorer = ResponseScorer(model, tokenizer, **scorer_kwargs)

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return self.scorer.signals(prompts, completions, ("self_certainty",))["self_certainty"].tolist()


def _grpo_run(policy: torch.nn.Module, tok, reward: str, seed: int, held_out: list[dict], settings: dict, *,
              chat: bool, trainable: str | None = None) -> list[dict]:
    """Per held-out problem: greedy correctness, tokens and degeneracy before / after GRPO with ``reward``."""
    import lightning.pytorch as pl

    from lit_lowrank.tasks.grpo import GRPOModule

    torch.manual_seed(seed)
    reward_arg: Any = {"stable_rank_raw": "stable_rank", "length": length_reward}.get(reward, reward)
    if reward == "self_certainty":  # scored by the frozen initial policy, as stable rank is
        reward_arg = SelfCertaintyReward(policy, tok, chat=chat)
    module = GRPOModule(policy=copy.deepcopy(policy), tokenizer=tok, reward=reward_arg,
                        reward_kwargs={"normalize": "none"} if reward == "stable_rank_raw" else None,
                        eval_reward="arithmetic", group_size=settings["group_size"],
                        max_new_tokens=settings["max_new_tokens"], chat=chat, beta=0.04, updates_per_batch=1,
                        trainable=trainable, optimizer=lambda p: torch.optim.AdamW(p, lr=settings["lr"],
                                                                                   weight_decay=0.0))
    prompts, answers = [p["prompt"] for p in held_out], [p["answer"] for p in held_out]

    def evaluate() -> list[tuple[float, int, bool]]:
        _, ids, texts = module.sample(prompts, 1, greedy=True)
        ok = arithmetic_reward(prompts, texts, answer=answers)
        return [(ok[i], sum(int(t) not in module.eos_ids for t in ids[i]),
                 is_degenerate(ids[i], module.eos_ids, settings["max_new_tokens"])) for i in range(len(prompts))]

    before = evaluate()
    trainer = pl.Trainer(max_steps=settings["steps"], accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0)
    trainer.fit(module, datamodule=PromptDataModule("arithmetic", batch_size=settings["batch_size"],
                                                     num_train=settings["batch_size"] * settings["steps"], seed=seed))
    after = evaluate()
    return [{"section": "sr_grpo", "reward": reward, "seed": seed, "problem": i,
             "correct_before": b[0], "correct_after": a[0], "tokens_before": b[1], "tokens_after": a[1],
             "degenerate_before": float(b[2]), "degenerate_after": float(a[2])}
            for i, (b, a) in enumerate(zip(before, after))]


def _lora_policy(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """SmolLM2 with PEFT LoRA (r = ``rank``, alpha = 2r) on every attention and MLP projection."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return get_peft_model(copy.deepcopy(model), config)


def group_aucs(values: torch.Tensor, correct: torch.Tensor) -> list[float]:
    """Per group (row) with right and wrong members, P(value(right) > value(wrong)), ties half."""
    per_group = []
    for v, ok in zip(values, correct.bool()):
        if ok.any() and (~ok).any():
            diff = v[ok][:, None] - v[~ok][None, :]
            per_group.append(float((diff > 0).float().mean() + 0.5 * (diff == 0).float().mean()))
    return per_group


def grouped_auc(values: torch.Tensor, correct: torch.Tensor) -> float:
    """Mean of :func:`group_aucs` over groups with right and wrong members.

    ``values``, ``correct``: ``(groups, n)``; NaN when no group has both.
    """
    per_group = group_aucs(values, correct)
    return float(np.mean(per_group)) if per_group else float("nan")


def reward_auc(policy: torch.nn.Module, tok, problems: list[dict], settings: dict, seed: int, *,
               chat: bool) -> dict[str, Any]:
    """How well each GRPO reward tells right from wrong answers of the policy it will train.

    ``group_size`` samples per problem from the initial policy (as GRPO samples them), scored by each reward
    (stable rank under the initial policy itself, as in SR-GRPO); :func:`grouped_auc` over problems with right
    and wrong samples: 0.5 = no information about correctness, 1.0 = the verifiable reward. A reward near 0.5
    cannot raise accuracy; GRPO then follows whatever else it pays for.
    """
    from lit_lowrank.decoding.stable_rank import StableRankReward

    rewards = {"stable_rank": StableRankReward(policy, tok, chat=chat),
               "stable_rank_raw": StableRankReward(policy, tok, chat=chat, normalize="none"),
               "self_certainty": SelfCertaintyReward(policy, tok, chat=chat),
               "length": length_reward}
    g = settings["group_size"]
    prompts = [p["prompt"] for p in problems for _ in range(g)]
    scorer = ResponseScorer(policy, tok, chat=chat)
    eos = eos_token_ids(policy, tok)
    pad = getattr(tok, "pad_token_id", None)
    ids = sample_responses(policy, [scorer.prompt_ids(p["prompt"]) for p in problems], g, settings["max_new_tokens"],
                           eos, pad if pad is not None else min(eos), generator_seed=seed)
    texts = [decode_completion(tok, c, eos) for c in ids]
    correct = torch.tensor(arithmetic_reward(prompts, texts, answer=[p["answer"] for p in problems for _ in range(g)]))
    scores = {name: torch.tensor(fn(prompts, texts)).view(-1, g) for name, fn in rewards.items()}
    out: dict[str, Any] = {name: grouped_auc(v, correct.view(-1, g)) for name, v in scores.items()}
    # per problem: the premise's units (the SR-GRPO claim needs a reward that tells right from wrong)
    out["stable_rank_per_problem"] = [round(x, 4) for x in group_aucs(scores["stable_rank"], correct.view(-1, g))]
    out["problems_with_both"] = float(sum(bool(ok.any() and (~ok).any()) for ok in correct.view(-1, g).bool()))
    return out


def _sr_grpo(model, tok, quick: bool, sizes: dict, seed: int) -> tuple[list[dict], dict[str, Any], dict[str, Any]]:
    """Rows of every (seed, reward) GRPO run, the rewards' AUCs on the initial policy, and the settings used (full
    mode: with the lr chosen on validation problems, whose runs are rows of section ``sr_grpo_lr``)."""
    held_out = arithmetic_problems(sizes["held_out"], seed=seed + 200)
    seeds = range(seed, seed + sizes["grpo_seeds"])
    rows: list[dict] = []
    if quick:
        from lit_lowrank.datamodules.tokenizers import ByteTokenizer

        policy, tok_used, settings, chat, trainable = tiny_arithmetic_policy(seed), ByteTokenizer(), GRPO_QUICK, \
            False, None
    else:  # SmolLM2 with LoRA: only the adapters train
        policy, tok_used, settings, chat, trainable = _lora_policy(model, GRPO_FULL["lora_rank"]), tok, GRPO_FULL, \
            True, r"lora_"
        val = arithmetic_problems(GRPO_VAL_PROBLEMS, seed=seed + 300)
        gains = {}
        for lr in GRPO_LRS_FULL:
            runs = _grpo_run(policy, tok_used, "arithmetic", seed, val, {**settings, "lr": lr}, chat=chat,
                             trainable=trainable)
            rows += [{**r, "section": "sr_grpo_lr", "lr": lr} for r in runs]
            gains[lr] = float(np.mean([r["correct_after"] - r["correct_before"] for r in runs]))
        settings = {**settings, "lr": max(gains, key=gains.get), "lr_val_gain": gains}
    auc = reward_auc(policy, tok_used, held_out, settings, seed, chat=chat)
    rows += [row for s in seeds for reward in GRPO_REWARDS for row in _grpo_run(
        policy, tok_used, reward, s, held_out, settings, chat=chat, trainable=trainable)]
    return rows, auc, settings


# ----------------------------------------------------------------------------- claims


def _claims(rows: list[dict], seeds: Sequence[int], gaming: bool = True, informative: bool = True
            ) -> tuple[list[dict], list[dict]]:
    """Claims and controls from the rows; ``gaming=False`` leaves out the degenerate-response claim;
    ``informative=False`` (no reward-AUC premise measured) leaves the SR-GRPO claim without its premise.

    "SR-GRPO does not game its reward" needs the premise ``length_games`` (GRPO on a pure length reward raises the
    degenerate rate: the dose can show gaming at all); where it does not hold the claim is ``no_headroom``. (It was a
    control that marked the run invalid; the quick policy's length-GRPO moved the degenerate rate by +0.02 in one
    run and +0.2 in another, so the dose is measured each run instead.)
    """
    pw = [r for r in rows if r["section"] == "pairwise"]
    bon = [r for r in rows if r["section"] == "best_of_n"]

    def col(items: list[dict], key: str) -> list[float]:
        return [float(r[key]) for r in items]

    rng = random.Random(1)
    flips = [rng.random() < 0.5 for _ in pw]
    shuffled = [1.0 - v if f else v for v, f in zip(col(pw, "stable_rank"), flips)]
    pairwise_q = "pairwise accuracy: fraction of pairs with score(chosen) > score(rejected)"
    claims = [
        rate_claim("pairwise: length-normalised stable rank ranks the better response higher on > 50% of pairs",
                   PAPER_PAIRWISE, pairwise_q, col(pw, "stable_rank"), 0.5, "pair"),
        rate_claim("pairwise: length-normalised stable rank more accurate than mean log-prob",
                   PAPER_BASELINES, "pairwise accuracy(stable rank) - pairwise accuracy(mean log-prob), fraction",
                   col(pw, "stable_rank"), 0.0, "pair", baseline=col(pw, "mean_log_prob"),
                   name="pairwise_vs_logprob"),
        rate_claim("Best-of-8: stable-rank selection more accurate than greedy decoding",
                   PAPER_BON, "exact-match accuracy(stable-rank BoN) - accuracy(greedy), fraction of problems",
                   col(bon, "stable_rank"), 0.0, "problem", baseline=col(bon, "greedy"), name="bon_greedy",
                   requires="bon_oracle"),
    ]
    controls = [
        rate_claim("control: a random scorer ranks the better response higher on > 50% of pairs",
                   PAPER_PAIRWISE, pairwise_q, col(pw, "random"), 0.5, "pair"),
        rate_claim("control: response length alone ranks the better response higher on > 50% of pairs",
                   PAPER_PAIRWISE, pairwise_q, col(pw, "length"), 0.5, "pair"),
        rate_claim("control: response shortness alone ranks the better response higher on > 50% of pairs",
                   PAPER_PAIRWISE, pairwise_q, col(pw, "shortness"), 0.5, "pair"),
        rate_claim("control: stable rank on pairs whose labels were swapped at random (half of them)",
                   PAPER_PAIRWISE, pairwise_q, shuffled, 0.5, "pair"),
        rate_claim("control: Best-of-8 with a random pick more accurate than greedy decoding",
                   PAPER_BON, "exact-match accuracy(random BoN) - accuracy(greedy), fraction of problems",
                   col(bon, "random"), 0.0, "problem", baseline=col(bon, "greedy")),
        rate_claim("control: Best-of-8 picking the longest sample more accurate than greedy decoding",
                   PAPER_BON, "exact-match accuracy(longest-sample BoN) - accuracy(greedy), fraction of problems",
                   col(bon, "length"), 0.0, "problem", baseline=col(bon, "greedy")),
    ]
    grpo = [r for r in rows if r["section"] == "sr_grpo"]
    if grpo:
        def per_problem(reward: str, key: str) -> list[float]:
            return _grpo_per_problem(rows, reward, key)

        n_seeds = len(seeds)
        gain_q = f"greedy accuracy after - before GRPO on held-out problems (mean over {n_seeds} seed(s)), fraction"
        hack_q = ("degenerate-response rate after - before GRPO (no EOS within the budget, or >= half the 3-grams "
                  f"repeated; mean over {n_seeds} seed(s)), fraction")
        claims += [
            rate_claim("SR-GRPO (length-normalised stable rank, no answers used) raises greedy task accuracy",
                       PAPER_GRPO, gain_q, per_problem("stable_rank", "correct_after"), 0.0, "problem",
                       baseline=per_problem("stable_rank", "correct_before"), name="sr_grpo_gain",
                       requires="grpo_reward_informative" if informative else None),
        ]
        controls += [
            rate_claim("control: GRPO on response length raises greedy task accuracy",
                       PAPER_GRPO, gain_q, per_problem("length", "correct_after"), 0.0, "problem",
                       baseline=per_problem("length", "correct_before")),
        ]
        if gaming:
            claims.append(_not_more_degenerate("SR-GRPO does not game its reward: degenerate responses rise by < 0.05",
                                               per_problem("stable_rank", "degenerate_after"),
                                               per_problem("stable_rank", "degenerate_before"), hack_q,
                                               name="sr_grpo_no_gaming", requires="length_games"))
    return claims, controls


def _not_more_degenerate(text: str, after: list[float], before: list[float], quantity: str,
                         **kwargs: Any) -> dict[str, Any]:
    a, b = np.asarray(after), np.asarray(before)
    return statistic_claim(text, paper=PAPER_HACKING, quantity=quantity, n_units=a.size,
                           statistic=lambda idx: float(a[idx].mean() - b[idx].mean()), target=0.05, op="<",
                           unit="problem", **kwargs)


def _grpo_per_problem(rows: list[dict], reward: str, key: str) -> list[float]:
    items = [r for r in rows if r["section"] == "sr_grpo" and r["reward"] == reward]
    problems = sorted({r["problem"] for r in items})
    return [float(np.mean([r[key] for r in items if r["problem"] == p])) for p in problems]


def _premises(rows: list[dict], auc: dict[str, Any]) -> list[dict]:
    """What the claims' mechanisms need here: Best-of-8 can only beat greedy if some sample is right where greedy
    is not (the oracle pick above greedy); "does not game" is news only if a length reward games at this dose;
    SR-GRPO can only raise accuracy if its reward ranks the policy's right samples above its wrong ones
    (per-problem AUC above 0.5 on the initial policy's groups)."""
    bon = [r for r in rows if r["section"] == "best_of_n"]
    out = [premise("bon_oracle", "Best-of-8 with an oracle pick (any sample right) above greedy decoding",
                   needs="a right sample among the 8 where greedy is wrong: room for selection",
                   quantity="exact-match accuracy(oracle BoN) - accuracy(greedy), fraction of problems",
                   statistic=_mean_diff([float(r["oracle"]) for r in bon], [float(r["greedy"]) for r in bon]),
                   n_units=len(bon), target=0.0, op=">", unit="problem")]
    length_after = _grpo_per_problem(rows, "length", "degenerate_after")
    if length_after:
        out.append(premise(
            "length_games", "GRPO on a pure length reward raises the degenerate-response rate by >= 0.05",
            needs="a dose that can show reward gaming: a reward that pays for length must produce it",
            quantity="degenerate-response rate after - before GRPO on response length, fraction of problems",
            statistic=_mean_diff(length_after, _grpo_per_problem(rows, "length", "degenerate_before")),
            n_units=len(length_after), target=0.05, op=">=", unit="problem"))
    aucs = list(auc.get("stable_rank_per_problem") or [])
    if aucs:
        out.append(premise(
            "grpo_reward_informative", "on the initial policy's groups, stable rank ranks right samples above wrong ones",
            needs="a reward that tells right from wrong samples of the policy it trains (AUC > 0.5)",
            quantity="per-problem AUC of the stable-rank reward (right vs wrong samples of one group), mean over "
                     "problems with both", statistic=_mean_diff(aucs, [0.0] * len(aucs)), n_units=len(aucs),
            target=0.5, op=">", unit="problem"))
    return out


#: (claim, section, unit, signal in stable rank's place, what it is, what it is compared with, quantity)
COMPETITORS = (
    ("pairwise_vs_logprob", "pairwise", "pair", "self_certainty", "mean_log_prob",
     "self-certainty (the logits' divergence from uniform, same forward) in stable rank's place",
     "pairwise: self-certainty more accurate than mean log-prob",
     "pairwise accuracy(self-certainty) - pairwise accuracy(mean log-prob), fraction"),
    ("bon_greedy", "best_of_n", "problem", "mean_log_prob", "greedy",
     "mean log-prob selection (the model's own likelihood) in stable rank's place",
     "Best-of-8: mean log-prob selection more accurate than greedy decoding",
     "exact-match accuracy(log-prob BoN) - accuracy(greedy), fraction of problems"),
)


def _competitors(rows: list[dict]) -> list[dict]:
    """The cheapest alternatives in stable rank's place (:data:`COMPETITORS`): self-certainty, another
    annotation-free signal read from the same forward (pairwise, and as the GRPO reward), and mean log-prob selection
    (Best-of-8)."""
    out = []
    for name, section, unit, signal, base, what, text, quantity in COMPETITORS:
        items = [r for r in rows if r["section"] == section]
        if items and signal in items[0]:
            out.append(competitor(name, text, competitor=what, quantity=quantity, n_units=len(items),
                                  statistic=_mean_diff([float(r[signal]) for r in items],
                                                       [float(r[base]) for r in items]),
                                  target=0.0, op=">", unit=unit))
    after = _grpo_per_problem(rows, "self_certainty", "correct_after")
    if after:
        out.append(competitor(
            "sr_grpo_gain", "GRPO on self-certainty raises greedy task accuracy",
            competitor="self-certainty (INTUITOR's annotation-free reward, the same frozen scorer) in stable rank's place",
            quantity="greedy accuracy after - before GRPO on held-out problems, fraction", n_units=len(after),
            statistic=_mean_diff(after, _grpo_per_problem(rows, "self_certainty", "correct_before")),
            target=0.0, op=">", unit="problem"))
    return out


def _mean_diff(a: Sequence[float], b: Sequence[float]) -> Callable[[np.ndarray], float]:
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return lambda idx: float(x[idx].mean() - y[idx].mean())


def _summary(rows: list[dict], auc: dict[str, float]) -> list[dict]:
    out = []
    pw = [r for r in rows if r["section"] == "pairwise"]
    subsets = sorted({r["subset"] for r in pw})
    for name in (*SIGNALS, "shortness", "random"):
        row = {"section": f"pairwise ({len(pw)} pairs)", "signal": name,
               "accuracy": float(np.mean([r[name] for r in pw]))}
        for s in subsets:
            row[s] = float(np.mean([r[name] for r in pw if r["subset"] == s]))
        out.append(row)
    bon = [r for r in rows if r["section"] == "best_of_n"]
    for name in ("greedy", "random", *SIGNALS, "oracle"):
        out.append({"section": f"best_of_{BON['n']} ({len(bon)} problems)", "signal": name,
                    "accuracy": float(np.mean([r[name] for r in bon]))})
    grpo = [r for r in rows if r["section"] == "sr_grpo"]
    for reward in GRPO_REWARDS:
        items = [r for r in grpo if r["reward"] == reward]
        if items:
            out.append({"section": "sr_grpo", "signal": f"GRPO reward: {reward}",
                        "accuracy": float(np.mean([r["correct_after"] for r in items])),
                        "accuracy_before": float(np.mean([r["correct_before"] for r in items])),
                        "tokens_before": float(np.mean([r["tokens_before"] for r in items])),
                        "tokens_after": float(np.mean([r["tokens_after"] for r in items])),
                        "degenerate_before": float(np.mean([r["degenerate_before"] for r in items])),
                        "degenerate_after": float(np.mean([r["degenerate_after"] for r in items])),
                        "reward_auc": 1.0 if reward == "arithmetic" else auc.get(reward)})
    return out


def run(quick: bool, seed: int) -> BenchmarkResult:
    from lit_lowrank.models.pretrained import load_smollm2

    # at most 2 threads (an OMP_NUM_THREADS=1 setting is kept: cheaper in CPU time on a shared machine)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(seed)
    sizes = QUICK if quick else FULL
    model, tok = load_smollm2()
    model.eval()
    scorer = ResponseScorer(model, tok, chat=True, batch_size=8)
    phases: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        start = time.process_time()
        out = fn()
        phases[name] = round(time.process_time() - start, 1)
        print(f"[stable_rank] {name}: {phases[name]} CPU s", file=sys.stderr, flush=True)
        return out

    reference = timed("length_reference", scorer.length_reference)
    bon_rows, correctness = timed("best_of_n", lambda: _best_of_n(model, tok, scorer, sizes, seed))
    pair_rows = timed("pairwise", lambda: _pairwise(model, tok, scorer, sizes, seed, correctness))
    with torch_threads(1):  # the tiny policy's steps gain nothing from 2 threads (48 vs 111 CPU-s, same rows)
        grpo_rows, auc, grpo_settings = timed("sr_grpo", lambda: _sr_grpo(model, tok, quick, sizes, seed))
    rows = pair_rows + bon_rows + grpo_rows
    seeds = list(range(seed, seed + sizes["grpo_seeds"]))
    premises = _premises(rows, auc)
    claims, controls = _claims(rows, seeds, informative=any(p["name"] == "grpo_reward_informative" for p in premises))
    notes = {
        "scorer": "SmolLM2-135M-Instruct (offline GGUF, dequantised), chat template, post-final-norm, special "
                  "tokens excluded, uncentred; stable_rank = raw / E[srank | T] of Lee test articles",
        "length_reference": reference.to_dict(),
        "pairs": {s: sum(1 for r in pair_rows if r["subset"] == s) for s in sorted({r["subset"] for r in pair_rows})},
        "best_of_n": BON, "pair_sampling": PAIR_SAMPLING,
        "sr_grpo": ("quick: tiny byte-level Llama supervised on the arithmetic format (intermediate accuracy), "
                    f"{grpo_settings}" if quick else f"full: SmolLM2 + LoRA, {grpo_settings}")
                   + f"; seeds {seeds}; scorer = frozen initial policy",
        "sr_grpo_reward_auc": auc,
        "phase_cpu_s": phases,
    }
    return BenchmarkResult(rows, claims, controls, notes, _summary(rows, auc), premises=premises,
                           competitors=_competitors(rows))
