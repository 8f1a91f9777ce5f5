"""Stable rank as an annotation-free quality signal: pairwise accuracy, Best-of-N and SR-GRPO (arXiv 2512.02807).

Model: the offline SmolLM2-135M-Instruct (:func:`~lit_lowrank.models.load_smollm2`), which is both the
policy that samples and the scorer whose final-layer hidden states give the stable rank (uncentred,
post-final-norm, special tokens excluded, raw — the defaults of :class:`~lit_lowrank.decoding.ResponseScorer`).

Three sections:

- ``pairwise``: :func:`~lit_lowrank.datamodules.preference.degradation_pairs` — real continuations of Lee-corpus
  news articles vs the same text degraded (repetition loop, truncation, words shuffled within sentences,
  an off-topic continuation). Accuracy = fraction of pairs where the signal scores the real continuation
  strictly higher, for stable rank, mean log-prob, negative entropy, self-certainty, response length and a
  seeded random score. Per-degradation accuracies are in the row.
- ``best_of_n``: seeded single-digit additions/subtractions; ``N = 8`` samples (temperature 1) per prompt;
  task accuracy (exact match of the last integer) of the sample each selector picks: greedy decoding, a
  random sample, highest raw stable rank (the paper's ``srank``), highest length-normalised stable rank
  (``stable_rank_max_rank``: ``srank / min(T, d)``, :class:`ResponseScorer` ``normalize="max_rank"``), mean
  log-prob / negative entropy / self-certainty, and the oracle (any of the ``N`` correct, pass@N).
- ``sr_grpo``: :class:`~lit_lowrank.tasks.grpo.GRPOModule` runs with stable rank (under the frozen initial
  model) as the only reward — no answer is ever used in training — next to the same run with the verifiable
  exact-match reward (``grpo_arithmetic_reward``, an upper baseline). Greedy task accuracy and mean stable-rank
  reward before and after, on the same held-out problems. Quick mode: a tiny byte-level Llama
  (:func:`tiny_arithmetic_policy`, 2 layers, width 64) supervised for 250 steps on the arithmetic format
  (``" 3 + 4 = 7"``; cached under ``$LIT_LOWRANK_CACHE/stable_rank`` or the temp dir, keyed by config + seed)
  so its accuracy is intermediate, then 30 GRPO steps (4 prompts x 8 samples, lr 3e-4 for both rewards —
  chosen so the verifiable baseline learns). Full mode: SmolLM2-135M with only its last decoder layer and
  final norm trainable, 40 steps.

Claims (the paper's headline statements at this scale, computed from the rows): stable rank's pairwise
accuracy beats mean log-prob and random; SR-BoN accuracy > greedy (raw stable rank, the paper's definition;
the normalised row is reported, not claimed); SR-GRPO raises task accuracy without any external reward. At
quick scale the sets are small (16 pairs, 5 BoN prompts, 64 held-out GRPO problems), so a BoN claim that
fails by one problem is noise; the full run uses more of each.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import re
import sys
import tempfile
from pathlib import Path

import torch

from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.datamodules.preference import degradation_pairs
from lit_lowrank.datamodules.prompts import PromptDataModule, arithmetic_problems, arithmetic_reward
from lit_lowrank.decoding.stable_rank import (
    ResponseScorer,
    StableRankReward,
    decode_completion,
    eos_token_ids,
    evaluate_pairs,
    pairwise_accuracy,
    sample_responses,
    select_best,
)

# "stable_rank_max_rank": the length-normalised variant (srank / min(T, d)), its own row next to the paper's raw one
SELECTORS = ("stable_rank", "stable_rank_max_rank", "mean_log_prob", "negative_entropy", "self_certainty")


def _pairwise(model, tok, quick: bool, seed: int) -> list[dict]:
    pairs = degradation_pairs(n_prompts=4 if quick else 24, seed=seed, context_sentences=1, response_sentences=2)
    scorer = ResponseScorer(model, tok, chat=True, batch_size=8)
    table = evaluate_pairs(scorer, pairs)
    rows = [{"section": "pairwise", "method": name, "accuracy": acc["all"], "n": len(pairs),
             **{k: v for k, v in acc.items() if k != "all"}} for name, acc in table.items()]
    rng = random.Random(seed)
    chosen = torch.tensor([rng.random() for _ in pairs])
    rejected = torch.tensor([rng.random() for _ in pairs])
    rows.append({"section": "pairwise", "method": "random", "accuracy": pairwise_accuracy(chosen, rejected),
                 "n": len(pairs)})
    if not quick:  # the centring ablation (METHODS.md §12: "changes the values a lot")
        centred = evaluate_pairs(ResponseScorer(model, tok, chat=True, center=True), pairs, ("stable_rank",))
        rows.append({"section": "pairwise", "method": "stable_rank_centered",
                     "accuracy": centred["stable_rank"]["all"], "n": len(pairs)})
    return rows


def _best_of_n(model, tok, quick: bool, seed: int) -> list[dict]:
    problems = arithmetic_problems(5 if quick else 32, seed=seed + 100)
    prompts, answers = [p["prompt"] for p in problems], [p["answer"] for p in problems]
    n, max_new = 8, 8 if quick else 12
    scorer = ResponseScorer(model, tok, chat=True, batch_size=16)
    prompt_ids = [scorer.prompt_ids(p) for p in prompts]
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    greedy = sample_responses(model, prompt_ids, 1, max_new, eos, pad, do_sample=False)
    samples = sample_responses(model, prompt_ids, n, max_new, eos, pad, generator_seed=seed)
    texts = [decode_completion(tok, c, eos) for c in samples]
    correct = torch.tensor(arithmetic_reward(None, texts, answer=[a for a in answers for _ in range(n)])).view(-1, n)
    scores = scorer.score_ids([p for p in prompt_ids for _ in range(n)], samples, SELECTORS)
    rows = [{"section": "best_of_n", "method": "greedy", "n": len(prompts), "accuracy": sum(arithmetic_reward(
        None, [decode_completion(tok, c, eos) for c in greedy], answer=answers)) / len(prompts)}]
    rng = random.Random(seed)
    picks = {"random": torch.tensor([rng.randrange(n) for _ in prompts])}
    picks.update({name: select_best(scores[name], n) for name in SELECTORS})
    for name, index in picks.items():
        acc = float(correct.gather(1, index.view(-1, 1)).mean())
        rows.append({"section": "best_of_n", "method": name, "n": len(prompts), "accuracy": acc})
    rows.append({"section": "best_of_n", "method": "oracle_pass@8", "n": len(prompts),
                 "accuracy": float(correct.max(1).values.mean())})
    return rows


TINY_POLICY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128}
SFT = {"steps": 250, "batch": 32, "lr": 3e-3, "problems": 2000, "v": 1}


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


def _cache_dir() -> Path:
    root = Path(os.environ.get("LIT_LOWRANK_CACHE", Path(tempfile.gettempdir()) / "lit_lowrank_cache"))
    path = root / "stable_rank"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    path = _cache_dir() / f"tiny_arithmetic_{key}.pt"
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
        torch.save(model.state_dict(), path)
    return model.eval()


def _grpo_run(policy: torch.nn.Module, tok, reward: str, steps: int, seed: int, held_out: list[dict], *,
              chat: bool, group_size: int, max_new_tokens: int, lr: float, batch_size: int,
              trainable: str | None = None) -> list[dict]:
    """Greedy task accuracy and stable-rank reward on ``held_out`` before / after ``steps`` GRPO steps."""
    import lightning.pytorch as pl

    from lit_lowrank.tasks.grpo import GRPOModule

    torch.manual_seed(seed)
    module = GRPOModule(policy=copy.deepcopy(policy), tokenizer=tok, reward=reward, eval_reward="arithmetic",
                        group_size=group_size, max_new_tokens=max_new_tokens, chat=chat, beta=0.04,
                        updates_per_batch=1, trainable=trainable,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0))
    # stable rank under the frozen initial model for both runs, so the two rows are comparable
    sr_reward = StableRankReward(module.reference, tok, chat=chat) if module.reference is not None else None
    prompts, answers = [p["prompt"] for p in held_out], [p["answer"] for p in held_out]

    def evaluate() -> tuple[float, float]:
        texts = module.generate_text(prompts)
        accuracy = sum(arithmetic_reward(prompts, texts, answer=answers)) / len(prompts)
        return accuracy, (sum(sr_reward(prompts, texts)) / len(prompts)) if sr_reward else float("nan")

    acc_before, sr_before = evaluate()
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, datamodule=PromptDataModule("arithmetic", batch_size=batch_size,
                                                     num_train=batch_size * steps, seed=seed))
    acc_after, sr_after = evaluate()
    name = "sr_grpo" if reward == "stable_rank" else f"grpo_{reward}_reward"
    return [
        {"section": "sr_grpo", "method": f"{name}_before", "reward": reward, "n": len(held_out),
         "accuracy": acc_before, "stable_rank_reward": sr_before},
        {"section": "sr_grpo", "method": f"{name}_after", "reward": reward, "n": len(held_out), "steps": steps,
         "accuracy": acc_after, "stable_rank_reward": sr_after,
         "train_reward_last": float(trainer.callback_metrics.get("train/reward", float("nan")))},
    ]


def _sr_grpo(model, tok, quick: bool, seed: int) -> list[dict]:
    held_out = arithmetic_problems(64 if quick else 32, seed=seed + 200)
    if not quick:  # the SmolLM2 setting: last decoder layer + final norm trainable (CPU budget)
        return [row for reward in ("stable_rank", "arithmetic") for row in _grpo_run(
            model, tok, reward, 40, seed, held_out, chat=True, group_size=4, max_new_tokens=12, lr=3e-5,
            batch_size=2, trainable=r"model\.layers\.29\.|model\.norm")]
    from lit_lowrank.datamodules.tokenizers import ByteTokenizer

    # a tiny policy at intermediate accuracy: SmolLM2 backward passes cost minutes per step on 2 CPU cores, and
    # tiny matrices do not parallelise, so one thread is cheaper in CPU time (restored afterwards)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = tiny_arithmetic_policy(seed)
        return [row for reward in ("stable_rank", "arithmetic") for row in _grpo_run(
            policy, ByteTokenizer(), reward, GRPO_QUICK["steps"], seed, held_out, chat=False,
            group_size=GRPO_QUICK["group_size"], max_new_tokens=14, lr=GRPO_QUICK["lr"],
            batch_size=GRPO_QUICK["batch_size"])]
    finally:
        torch.set_num_threads(threads)


GRPO_QUICK = {"steps": 30, "group_size": 8, "lr": 3e-4, "batch_size": 4}


def run(quick: bool, seed: int) -> BenchmarkResult:
    from lit_lowrank.models.pretrained import load_smollm2

    torch.manual_seed(seed)
    model, tok = load_smollm2()
    model.eval()
    rows: list[dict] = []
    for section in (_pairwise, _best_of_n, _sr_grpo):
        rows += section(model, tok, quick, seed)
        # progress on stderr: the sections take minutes on a loaded CPU and the table prints only at the end
        print(f"[stable_rank] {section.__name__[1:]} done: {rows}", file=sys.stderr, flush=True)

    def acc(section: str, method: str) -> float:
        return next(r["accuracy"] for r in rows if r["section"] == section and r["method"] == method)

    claims = [
        legacy_claim("pairwise: stable rank accuracy - mean log-prob accuracy > 0",
              acc("pairwise", "stable_rank") - acc("pairwise", "mean_log_prob"), 0.0, ">"),
        legacy_claim("pairwise: stable rank accuracy - random accuracy > 0",
              acc("pairwise", "stable_rank") - acc("pairwise", "random"), 0.0, ">"),
        legacy_claim("Best-of-8: stable-rank selection accuracy - greedy accuracy > 0",
              acc("best_of_n", "stable_rank") - acc("best_of_n", "greedy"), 0.0, ">"),
        legacy_claim("SR-GRPO (no external reward): task accuracy after - before > 0",
              acc("sr_grpo", "sr_grpo_after") - acc("sr_grpo", "sr_grpo_before"), 0.0, ">"),
    ]
    notes = {"model": "SmolLM2-135M-Instruct (offline GGUF, dequantised) for pairwise and Best-of-N",
             "best_of_n": "the claim uses raw stable rank (the paper's srank = |H|_F^2/|H|_2^2); "
                          "stable_rank_max_rank (/ min(T, d)) is reported as its own row",
             "sr_grpo": ("quick: tiny byte-level Llama supervised on the arithmetic format (intermediate accuracy), "
                         if quick else "full: SmolLM2, only model.layers.29 and the final norm train (CPU budget), ")
                        + "scorer = frozen initial model; grpo_arithmetic_reward = verifiable-reward upper baseline"}
    return BenchmarkResult(rows, claims, notes)
