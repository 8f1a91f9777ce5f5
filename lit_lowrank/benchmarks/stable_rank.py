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
  random sample, highest stable rank / mean log-prob / negative entropy / self-certainty, and the oracle
  (any of the ``N`` correct, pass@N).
- ``sr_grpo``: a short :class:`~lit_lowrank.tasks.grpo.GRPOModule` run with stable rank (under the frozen
  initial model) as the only reward — no answer is ever used in training — on the 135M model with only its
  last decoder layer and final norm trainable (a full 135M backward per step is too slow for ``--quick`` on 2
  CPU cores; 4 steps in quick mode). Greedy task accuracy and mean stable-rank reward before and after, on the same held-out problems.

Claims (the paper's headline statements at this scale, computed from the rows): stable rank's pairwise
accuracy beats mean log-prob and random; SR-BoN accuracy > greedy; SR-GRPO raises task accuracy without any
external reward. At quick scale the sets are small (tens of pairs, 8 prompts), so a claim that fails by one
problem is noise; the full run uses 4x more of each.
"""

from __future__ import annotations

import copy
import random
import sys

import torch

from lit_lowrank.benchmarks.harness import BenchmarkResult, claim
from lit_lowrank.datamodules.preference import degradation_pairs
from lit_lowrank.datamodules.prompts import PromptDataModule, arithmetic_problems, arithmetic_reward
from lit_lowrank.decoding.stable_rank import (
    ResponseScorer,
    decode_completion,
    eos_token_ids,
    evaluate_pairs,
    pairwise_accuracy,
    sample_responses,
    select_best,
)

SELECTORS = ("stable_rank", "mean_log_prob", "negative_entropy", "self_certainty")


def _pairwise(model, tok, quick: bool, seed: int) -> list[dict]:
    pairs = degradation_pairs(n_prompts=6 if quick else 24, seed=seed, context_sentences=1, response_sentences=2)
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
    problems = arithmetic_problems(8 if quick else 32, seed=seed + 100)
    prompts, answers = [p["prompt"] for p in problems], [p["answer"] for p in problems]
    n, max_new = 8, 12
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


def _sr_grpo(model, tok, quick: bool, seed: int) -> list[dict]:
    import lightning.pytorch as pl

    from lit_lowrank.tasks.grpo import GRPOModule

    torch.manual_seed(seed)
    steps = 4 if quick else 40
    module = GRPOModule(policy=copy.deepcopy(model), tokenizer=tok, reward="stable_rank", eval_reward="arithmetic",
                        group_size=4, max_new_tokens=12, chat=True, beta=0.04, updates_per_batch=1,
                        trainable=r"model\.layers\.29\.|model\.norm",
                        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-5, weight_decay=0.0))
    held_out = arithmetic_problems(8 if quick else 32, seed=seed + 200)

    def evaluate() -> tuple[float, float]:
        prompts, answers = [p["prompt"] for p in held_out], [p["answer"] for p in held_out]
        texts = module.generate_text(prompts)
        accuracy = sum(arithmetic_reward(prompts, texts, answer=answers)) / len(prompts)
        return accuracy, sum(module.reward_fn(prompts, texts)) / len(prompts)

    acc_before, sr_before = evaluate()
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, datamodule=PromptDataModule("arithmetic", batch_size=2, num_train=2 * steps, seed=seed))
    acc_after, sr_after = evaluate()
    return [
        {"section": "sr_grpo", "method": "before", "n": len(held_out), "accuracy": acc_before,
         "stable_rank_reward": sr_before},
        {"section": "sr_grpo", "method": f"after_{steps}_steps", "n": len(held_out), "accuracy": acc_after,
         "stable_rank_reward": sr_after, "train_reward_last": float(trainer.callback_metrics.get("train/reward", 0.0))},
    ]


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
        return next(r["accuracy"] for r in rows if r["section"] == section and r["method"].startswith(method))

    grpo = [r for r in rows if r["section"] == "sr_grpo"]
    claims = [
        claim("pairwise: stable rank accuracy - mean log-prob accuracy > 0",
              acc("pairwise", "stable_rank") - acc("pairwise", "mean_log_prob"), 0.0, ">"),
        claim("pairwise: stable rank accuracy - random accuracy > 0",
              acc("pairwise", "stable_rank") - acc("pairwise", "random"), 0.0, ">"),
        claim("Best-of-8: stable-rank selection accuracy - greedy accuracy > 0",
              acc("best_of_n", "stable_rank") - acc("best_of_n", "greedy"), 0.0, ">"),
        claim("SR-GRPO (no external reward): task accuracy after - before > 0",
              grpo[1]["accuracy"] - grpo[0]["accuracy"], 0.0, ">"),
    ]
    notes = {"model": "SmolLM2-135M-Instruct (offline GGUF, dequantised)",
             "sr_grpo": "only model.layers.29 and the final norm train (CPU budget); scorer = frozen initial model"}
    return BenchmarkResult(rows, claims, notes)
