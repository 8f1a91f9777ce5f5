"""Stable rank where the failure is a checkable representational collapse: SmolLM2's numbered lists (#41 item 7).

On arithmetic, stable rank does not see correctness (per-problem AUC 0.44 on SmolLM2's own samples, the
``stable_rank`` benchmark), so SR-GRPO had nothing to learn from there. Here the task's failure is the one the
paper's signal is about, collapse: SmolLM2-135M-Instruct is asked for "15 different {category}" and a sampled list
*collapses* when a normalised item repeats. The label is checkable, so the premise (the reward tells clean from
collapsed samples of the policy it trains) and the gain (fewer collapsed lists after SR-GRPO) are both measurable.

Every response has at most :data:`WINDOW` new tokens (sampled at T 0.9, top-p 0.95, :data:`SAMPLES` a category);
its items are read by :func:`list_items` from numbered lines *and* inline lists (SmolLM2 writes both; a parser
that reads lines only calls every inline list clean, repeats or not), the fragment the budget may have cut
dropped. Sections:

- ``pairwise`` (quick and full): within a category's samples that fill the window (length controlled), the AUC of
  "a clean list scores higher than a collapsed one", mean over categories with both kinds (what GRPO's group baseline
  sees). Competitors: mean log-prob and self-certainty, read from the same scorer forward. Control: the same AUC with
  the labels permuted within each category.
- ``best_of_n``: the clean rate of the window-filling sample each selector picks against a uniformly random pick
  (its expectation), per category. Premise: an oracle pick beats the random pick (room). Control: the *lowest* stable
  rank must not beat the random pick.
- ``sr_grpo`` (full only; ~18 s a GRPO step on 2 threads): SmolLM2 with PEFT LoRA (r 8 on every projection) trained
  by GRPO on the first :data:`TRAIN_CATEGORIES` categories with, in turn, the checkable strict list reward (items /
  15 without a repeat, 0 with one: the upper baseline that shows the dose can move the quantity), the
  length-normalised stable rank (SR-GRPO, scored by the frozen initial policy), self-certainty (INTUITOR's
  annotation-free reward, the competitor) and two controls: a random reward and the pure length reward (characters).
  The lr is picked from :data:`GRPO_LRS` for the strict reward on :data:`VALIDATION` (section ``sr_grpo_lr``) and
  shared by every reward. Quantities (pre-registered): the collapsed rate of :data:`SAMPLES` sampled lists per
  :data:`HELD_OUT` category, before and after, with the same sampling seeds, and the distinct items per list; items
  per list and early stops are reported beside them, since a shorter list is an easy way not to repeat.

The scorer is SmolLM2 itself (chat template, final-norm hidden states, special tokens excluded), as in
``stable_rank``. Units are categories; CIs are paired percentile bootstraps over them.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lit_lowrank.benchmarks.harness import BenchmarkResult, competitor, premise, statistic_claim
from lit_lowrank.benchmarks.stable_rank import SelfCertaintyReward, _lora_policy, _mean_diff, length_reward
from lit_lowrank.decoding.stable_rank import ResponseScorer, decode_completion, eos_token_ids, sample_responses

#: The 52 list categories: the first :data:`TRAIN_CATEGORIES` train SR-GRPO, :data:`HELD_OUT` measure it,
#: :data:`VALIDATION` pick its lr.
CATEGORIES = (
    "animals", "fruits", "vegetables", "countries", "colors", "sports", "jobs", "cities", "musical instruments",
    "kitchen tools", "flowers", "birds", "fish", "car brands", "board games", "programming languages", "rivers",
    "mountains", "trees", "insects", "desserts", "drinks", "clothes", "furniture", "school subjects", "body parts",
    "planets and moons", "dog breeds", "languages", "famous painters", "breakfast foods", "things in a garden",
    "weather words", "emotions", "hobbies", "farm animals", "ocean animals", "spices", "tools", "shapes",
    # validation categories (full mode): GRPO's lr is picked on these, never on the held-out ones
    "vehicles", "toys", "cheeses", "gemstones", "reptiles", "breads", "nuts", "fabrics", "dances", "music genres",
    "office supplies", "holidays",
)
ITEMS, SAMPLES, WINDOW, TRAIN_CATEGORIES = 15, 6, 64, 24
#: held-out categories (the SR-GRPO quantity) and validation categories (the lr choice), by index
HELD_OUT, VALIDATION = tuple(range(TRAIN_CATEGORIES, 40)), tuple(range(40, 52))
SAMPLING = {"temperature": 0.9, "top_p": 0.95}
SIGNALS = ("stable_rank", "mean_log_prob", "self_certainty")
QUICK_CATEGORIES = 16
GRPO = {"steps": 30, "group_size": 4, "batch_size": 2, "lora_rank": 8, "beta": 0.04}
#: GRPO's lr is picked from this grid for the checkable (strict list) reward on :data:`VALIDATION`, then shared by
#: every reward (the ``stable_rank`` benchmark's protocol with its verifiable reward)
GRPO_LRS = (1e-4, 3e-4)
GRPO_REWARDS = ("strict_list", "stable_rank", "self_certainty", "random", "length")

PAPER_PAIRWISE = "stable rank achieves 84.04% accuracy on RewardBench"
PAPER_BON = "improves task accuracy by an average of 14.1% relative to greedy decoding via Best-of-N sampling"
PAPER_GRPO = "Without external supervision, SR-GRPO improves Qwen2.5-1.5B-Instruct by 10% on STEM and 19% on " \
             "mathematical reasoning"


def list_prompt(category: str) -> str:
    """The user turn asking for :data:`ITEMS` items of ``category``, one numbered line each."""
    return f"List {ITEMS} different {category}. Write one per line, numbered 1 to {ITEMS}, with no other text."


def list_items(text: str, ended: bool = False) -> list[str]:
    """The normalised items (lower case, letters and spaces, numbering and a leading "and" stripped) of a list
    written one per line *or* inline ("1. Apple, 2. Pear", "apple, pear and plum"); the last fragment counts only
    when the response ``ended`` (else the token budget may have cut it)."""
    parts = re.split(r"\n|,|;|(?<=\s)(?=\d+\s*[.)]\s)", text)
    if not ended:
        parts = parts[:-1]
    out = []
    for part in parts:
        item = re.sub(r"^\s*\d+\s*[.):-]?\s*", "", part.lower())
        item = re.sub(r"^\s*and\s+", "", re.sub(r"[^a-z ]", "", item).strip())
        if item:
            out.append(" ".join(item.split()))
    return out


def line_items(text: str, ended: bool = False) -> list[str]:
    """The side measurement's reading (``docs/measurements/stable_rank_lists.py``): numbered lines only, so an
    inline list is one item and never collapses. Kept to measure what that reading mislabels."""
    lines = text.split("\n")
    if not ended:
        lines = lines[:-1]
    out = [re.sub(r"[^a-z ]", "", re.sub(r"^\s*\d+\s*[.):-]?\s*", "", ln.lower())).strip() for ln in lines]
    return [o for o in out if o]


def is_collapsed(items: Sequence[str]) -> bool:
    """A list collapsed when one of its items repeats."""
    return len(set(items)) < len(items)


class StrictListReward:
    """The checkable reward: items / :data:`ITEMS` for a list without a repeated item, 0 for one with, so a repeat
    cannot be bought by length (an earlier (distinct − repeats) / 15 reward paid for length, and GRPO on it raised
    the collapsed rate). TRL-style ``(prompts, completions, **kwargs) -> list[float]``."""

    __name__ = "strict_list"

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        out = []
        for c in completions:
            got = list_items(str(c), ended=True)
            out.append(0.0 if is_collapsed(got) else len(got) / ITEMS)
        return out


class RandomReward:
    """Uniform random rewards (seeded): the GRPO control, which no property of the completions can earn."""

    __name__ = "random"

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return self.rng.random(len(completions)).tolist()


def sample_lists(model: torch.nn.Module, tok: Any, scorer: ResponseScorer, categories: Sequence[int], seed: int,
                 *, score: bool = True) -> list[dict]:
    """:data:`SAMPLES` sampled lists per category index: tokens, whether it ended, items, collapse and (``score``)
    every signal of the frozen ``scorer``. Sampling is seeded per category, so two policies see the same draws."""
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    rows = []
    for c in categories:
        pid = scorer.prompt_ids(list_prompt(CATEGORIES[c]))
        out = sample_responses(model, [pid], SAMPLES, WINDOW, eos, pad, do_sample=True,
                               generator_seed=seed * 1000 + c, keep_eos=True, **SAMPLING)
        for j, ids in enumerate(out):
            ended = any(int(t) in eos for t in ids)
            body = [int(t) for t in ids if int(t) not in eos]
            text = decode_completion(tok, body, eos)
            got = list_items(text, ended=ended)
            rows.append({"category": c, "sample": j, "ids": body, "tokens": len(body), "ended": float(ended),
                         "full_window": not ended and len(body) >= WINDOW, "items": len(got),
                         "distinct": len(set(got)), "collapsed": float(is_collapsed(got)),
                         "collapsed_lines": float(is_collapsed(line_items(text, ended=ended)))})
    if score:
        scores = scorer.score_ids([scorer.prompt_ids(list_prompt(CATEGORIES[r["category"]])) for r in rows],
                                  [r["ids"] for r in rows], SIGNALS)
        for k in SIGNALS:
            for r, v in zip(rows, scores[k].tolist()):
                r[k] = float(v)
    for r in rows:
        del r["ids"]
    return rows


def _groups(rows: list[dict]) -> dict[int, list[dict]]:
    """Window-filling samples by category (the length-controlled units of ``pairwise`` and ``best_of_n``)."""
    out: dict[int, list[dict]] = {}
    for r in rows:
        if r["full_window"]:
            out.setdefault(r["category"], []).append(r)
    return out


def _auc(good: np.ndarray, bad: np.ndarray) -> float:
    diff = good[:, None] - bad[None, :]
    return float((diff > 0).mean() + 0.5 * (diff == 0).mean())


def _within_auc(rows: list[dict], signal: str, label: str) -> tuple[float, int]:
    """Mean within-category AUC of ``signal`` for ``label`` (clean above collapsed) over the categories whose
    window-filling samples hold both kinds, and their number."""
    aucs = []
    for group in _groups(rows).values():
        bad = np.array([r[label] for r in group], dtype=bool)
        if bad.any() and not bad.all():
            s = np.array([r[signal] for r in group])
            aucs.append(_auc(s[~bad], s[bad]))
    return (float(np.mean(aucs)) if aucs else float("nan")), len(aucs)


def _pairwise(rows: list[dict], seed: int) -> list[dict]:
    """Per category with clean and collapsed window-filling samples: each signal's within-category AUC, and the
    stable-rank AUC with the labels permuted within the category (the control)."""
    rng = np.random.default_rng(seed)
    out = []
    for c, group in sorted(_groups(rows).items()):
        bad = np.array([r["collapsed"] for r in group], dtype=bool)
        if bad.all() or not bad.any():
            continue
        row: dict[str, Any] = {"section": "pairwise", "category": c, "clean": int((~bad).sum()),
                               "collapsed": int(bad.sum())}
        for k in SIGNALS:
            s = np.array([r[k] for r in group])
            row[k] = _auc(s[~bad], s[bad])
        perm = rng.permutation(bad)
        s = np.array([r["stable_rank"] for r in group])
        row["stable_rank_permuted"] = _auc(s[~perm], s[perm])
        out.append(row)
    return out


def _best_of_n(rows: list[dict]) -> list[dict]:
    """Per category: the clean indicator of the sample each selector picks among the window-filling ones, the
    random pick's expectation, the oracle, and the lowest stable rank (the control)."""
    out = []
    for c, group in sorted(_groups(rows).items()):
        clean = np.array([1.0 - r["collapsed"] for r in group])
        row: dict[str, Any] = {"section": "best_of_n", "category": c, "n": len(group),
                               "random": float(clean.mean()), "oracle": float(clean.max())}
        for k in SIGNALS:
            row[k] = float(clean[int(np.argmax([r[k] for r in group]))])
        row["lowest_stable_rank"] = float(clean[int(np.argmin([r["stable_rank"] for r in group]))])
        out.append(row)
    return out


_MEASURES = ("collapsed", "items", "distinct", "ended", "tokens")


def _grpo_run(policy: torch.nn.Module, tok: Any, reward: str, seed: int, lr: float,
              evals: dict[str, Sequence[int]], before: list[dict], scorer: ResponseScorer,
              prompts_file: Path) -> list[dict]:
    """GRPO on the training categories with ``reward`` at ``lr``; per category of each split in ``evals`` (split name
    → category indices), the lists before (``before``, the initial policy's samples) and after, with the same
    sampling seeds."""
    import lightning.pytorch as pl

    from lit_lowrank.datamodules.prompts import PromptDataModule
    from lit_lowrank.tasks.grpo import GRPOModule

    torch.manual_seed(seed)
    reward_arg: Any = {"strict_list": StrictListReward(), "random": RandomReward(seed), "length": length_reward,
                       "self_certainty": SelfCertaintyReward(policy, tok, chat=True)}.get(reward, reward)
    module = GRPOModule(policy=copy.deepcopy(policy), tokenizer=tok, reward=reward_arg, group_size=GRPO["group_size"],
                        max_new_tokens=WINDOW, chat=True, beta=GRPO["beta"], updates_per_batch=1, trainable=r"lora_",
                        optimizer=lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0), **SAMPLING)
    trainer = pl.Trainer(max_steps=GRPO["steps"], accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0)
    trainer.fit(module, datamodule=PromptDataModule(str(prompts_file), batch_size=GRPO["batch_size"], num_val=1,
                                                     seed=seed))
    out = []
    for split, categories in evals.items():
        after = sample_lists(module.policy.eval(), tok, scorer, categories, seed, score=False)
        for c in categories:
            b = [r for r in before if r["category"] == c]
            a = [r for r in after if r["category"] == c]
            out.append({"section": "sr_grpo", "split": split, "reward": reward, "lr": lr, "category": c,
                        **{f"{k}_{when}": float(np.mean([r[k] for r in rs])) for when, rs in (("before", b),
                                                                                              ("after", a))
                           for k in _MEASURES}})
    return out


def _collapse_change(rows: list[dict]) -> float:
    return float(np.mean([r["collapsed_after"] - r["collapsed_before"] for r in rows]))


def _sr_grpo(model: torch.nn.Module, tok: Any, scorer: ResponseScorer, samples: list[dict],
             seed: int) -> tuple[list[dict], dict[str, Any]]:
    """The lr runs (the strict list reward at each of :data:`GRPO_LRS`, measured on :data:`VALIDATION` and
    :data:`HELD_OUT`; section ``sr_grpo_lr``), then every reward at the lr that lowered the validation collapsed rate
    most (ties: the lower lr). Rows of section ``sr_grpo`` are the held-out categories at that lr."""
    policy = _lora_policy(model, GRPO["lora_rank"])
    with tempfile.TemporaryDirectory() as tmp:
        # the training categories, then one validation line the module requires (never trained on)
        path = Path(tmp) / "lists.jsonl"
        lines = [list_prompt(CATEGORIES[c]) for c in range(TRAIN_CATEGORIES)] + [list_prompt("things")]
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines), encoding="utf-8")
        lr_runs = {lr: _grpo_run(policy, tok, "strict_list", seed, lr, {"validation": VALIDATION,
                                                                         "held_out": HELD_OUT}, samples, scorer, path)
                   for lr in GRPO_LRS}
        val_change = {lr: _collapse_change([r for r in runs if r["split"] == "validation"])
                      for lr, runs in lr_runs.items()}
        chosen = min(GRPO_LRS, key=lambda lr: (val_change[lr], lr))
        rows = [{**r, "section": "sr_grpo_lr"} for runs in lr_runs.values() for r in runs]
        rows += [r for r in lr_runs[chosen] if r["split"] == "held_out"]
        for reward in GRPO_REWARDS[1:]:
            rows += _grpo_run(policy, tok, reward, seed, chosen, {"held_out": HELD_OUT}, samples, scorer, path)
    return rows, {"lr": chosen, "validation_collapse_change": {f"{lr:g}": v for lr, v in val_change.items()}}


# ----------------------------------------------------------------------------- claims


def _stat(rows: list[dict], key: str, minus: str | float) -> Callable[[np.ndarray], float]:
    a = [r[key] for r in rows]
    return _mean_diff(a, [r[minus] for r in rows] if isinstance(minus, str) else [minus] * len(a))


def _per_reward(rows: list[dict], reward: str) -> list[dict]:
    return [r for r in rows if r["section"] == "sr_grpo" and r["reward"] == reward]


def _premises(rows: list[dict]) -> list[dict]:
    """Best-of-N needs a clean sample where a random pick may take a collapsed one (oracle above random); SR-GRPO
    needs a reward that tells clean from collapsed lists of the policy it trains, on the prompts it trains on
    (within-category AUC > 0.5 on the training categories), and a dose that can move the quantity (the checkable
    list reward lowers the held-out collapsed rate)."""
    bon = [r for r in rows if r["section"] == "best_of_n"]
    out = [premise("bon_oracle", "Best-of-N with an oracle pick (any clean sample) above a random pick",
                   needs="a clean sample among the N where a random pick may take a collapsed one: room for selection",
                   quantity="clean rate(oracle pick) - clean rate(random pick), fraction of categories",
                   statistic=_stat(bon, "oracle", "random"), n_units=len(bon), target=0.0, op=">", unit="category")]
    train = [r for r in rows if r["section"] == "pairwise" and r["category"] < TRAIN_CATEGORIES]
    strict = _per_reward(rows, "strict_list")
    if strict:
        out.append(premise(
            "grpo_reward_informative", "on the training prompts, stable rank ranks the initial policy's clean lists "
            "above its collapsed ones", needs="a reward that tells clean from collapsed samples of the policy it "
            "trains (within-category AUC > 0.5)", quantity="within-category AUC of stable rank (clean vs collapsed "
            "window-filling samples), mean over training categories with both", statistic=_stat(train, "stable_rank",
                                                                                                 0.0),
            n_units=len(train), target=0.5, op=">", unit="category"))
        out.append(premise(
            "list_reward_teaches", "GRPO on the checkable (strict list) reward lowers the held-out collapsed rate",
            needs="a dose (steps, lr picked on validation categories, LoRA) that can move the collapsed rate when the "
            "reward is the label itself", quantity="collapsed rate after - before GRPO on the strict list reward, "
            "fraction of a held-out category's samples", statistic=_stat(strict, "collapsed_after",
                                                                          "collapsed_before"),
            n_units=len(strict), target=0.0, op="<", unit="category"))
        out.append(premise(
            "list_reward_adds_distinct", "GRPO on the checkable (strict list) reward raises the held-out distinct "
            "items per list", needs="a dose that can move the distinct-item count when the reward pays for it",
            quantity="distinct items per list after - before GRPO on the strict list reward, mean over a held-out "
            "category's samples", statistic=_stat(strict, "distinct_after", "distinct_before"), n_units=len(strict),
            target=0.0, op=">", unit="category"))
    return out


def _claims(rows: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    pw = [r for r in rows if r["section"] == "pairwise"]
    bon = [r for r in rows if r["section"] == "best_of_n"]
    auc_q = "within-category AUC of {} (clean vs collapsed window-filling samples), mean over categories with both"
    claims = [
        statistic_claim("pairwise: stable rank scores a category's clean lists above its collapsed ones (AUC > 0.5)",
                        paper=PAPER_PAIRWISE, quantity=auc_q.format("stable rank"), n_units=len(pw),
                        statistic=_stat(pw, "stable_rank", 0.0), target=0.5, op=">", unit="category",
                        name="pairwise_lists"),
        statistic_claim("Best-of-N: the highest-stable-rank list is clean more often than a random pick",
                        paper=PAPER_BON, quantity="clean rate(stable-rank pick) - clean rate(random pick), fraction "
                        "of categories", n_units=len(bon), statistic=_stat(bon, "stable_rank", "random"), target=0.0,
                        op=">", unit="category", name="bon_lists", requires="bon_oracle"),
    ]
    controls = [
        statistic_claim("control: stable rank with the labels permuted within each category (AUC > 0.5)",
                        paper="(control)", quantity=auc_q.format("stable rank, permuted labels,"), n_units=len(pw),
                        statistic=_stat(pw, "stable_rank_permuted", 0.0), target=0.5, op=">", unit="category"),
        statistic_claim("control: Best-of-N picking the lowest stable rank is clean more often than a random pick",
                        paper="(control)", quantity="clean rate(lowest-stable-rank pick) - clean rate(random pick), "
                        "fraction of categories", n_units=len(bon), statistic=_stat(bon, "lowest_stable_rank",
                                                                                    "random"),
                        target=0.0, op=">", unit="category"),
    ]
    competitors = []
    for signal, what in (("mean_log_prob", "mean log-prob (the model's own likelihood, same forward)"),
                         ("self_certainty", "self-certainty (the logits' divergence from uniform, same forward)")):
        name = signal.replace("_", " ")
        competitors += [
            competitor("pairwise_lists", f"pairwise: {name} scores a category's clean lists above its collapsed ones",
                       competitor=f"{what} in stable rank's place", quantity=auc_q.format(name), n_units=len(pw),
                       statistic=_stat(pw, signal, 0.0), target=0.5, op=">", unit="category"),
            competitor("bon_lists", f"Best-of-N: the highest-{name} list is clean more often than a random pick",
                       competitor=f"{what} in stable rank's place", quantity=f"clean rate({name} pick) - clean "
                       "rate(random pick), fraction of categories", n_units=len(bon),
                       statistic=_stat(bon, signal, "random"), target=0.0, op=">", unit="category")]
    sr = _per_reward(rows, "stable_rank")
    if sr:
        # two pre-registered quantities: the collapsed rate (the label) and the distinct items per list (the
        # first full run saw SR-GRPO add as many as the checkable reward while the length reward added none)
        for key, op, what, name, requires in (
                ("collapsed", "<", "lowers the held-out collapsed-list rate", "sr_grpo_lists",
                 ["grpo_reward_informative", "list_reward_teaches"]),
                ("distinct", ">", "raises the held-out distinct items per list", "sr_grpo_lists_distinct",
                 ["list_reward_adds_distinct"])):
            q = ("collapsed rate after - before GRPO on the {}, fraction of a held-out category's samples"
                 if key == "collapsed" else
                 "distinct items per list after - before GRPO on the {}, mean over a held-out category's samples")
            stat = lambda rs: _stat(rs, f"{key}_after", f"{key}_before")  # noqa: E731
            claims.append(statistic_claim(
                f"SR-GRPO (length-normalised stable rank, no labels used) {what}", paper=PAPER_GRPO,
                quantity=q.format("stable-rank reward"), n_units=len(sr), statistic=stat(sr), target=0.0, op=op,
                unit="category", name=name, requires=requires))
            sc = _per_reward(rows, "self_certainty")
            competitors.append(competitor(
                name, f"GRPO on self-certainty {what}", competitor="self-certainty (INTUITOR's annotation-free reward, "
                "the same frozen scorer) in stable rank's place", quantity=q.format("self-certainty reward"),
                n_units=len(sc), statistic=stat(sc), target=0.0, op=op, unit="category"))
            for reward, by in (("random", "a random reward"), ("length", "response length (characters)")):
                rs = _per_reward(rows, reward)
                controls.append(statistic_claim(
                    f"control: GRPO on {by} {what}", paper="(control)", quantity=q.format(f"{reward} reward"),
                    n_units=len(rs), statistic=stat(rs), target=0.0, op=op, unit="category"))
    return claims, controls, competitors


def _summary(samples: list[dict], rows: list[dict]) -> list[dict]:
    full = [r for r in samples if r["full_window"]]
    out = [{"section": f"samples ({len(samples)}; {len(full)} fill the {WINDOW}-token window)", "signal": "—",
            "value": float(np.mean([r["collapsed"] for r in full])), "what": "collapsed rate (window-filling)",
            "clean_items": float(np.mean([r["items"] for r in full if not r["collapsed"]] or [np.nan])),
            "collapsed_items": float(np.mean([r["items"] for r in full if r["collapsed"]] or [np.nan]))}]
    auc, n = _within_auc(samples, "stable_rank", "collapsed_lines")
    out.append({"section": f"line-only label ({n} categories with both)", "signal": "stable_rank", "value": auc,
                "what": "within-category AUC when only numbered lines are read (the side measurement's label)",
                "labels_differ": int(sum(r["collapsed"] != r["collapsed_lines"] for r in full))})
    pw = [r for r in rows if r["section"] == "pairwise"]
    for k in (*SIGNALS, "stable_rank_permuted"):
        out.append({"section": f"pairwise ({len(pw)} categories with both)", "signal": k,
                    "value": float(np.mean([r[k] for r in pw])), "what": "within-category AUC"})
    bon = [r for r in rows if r["section"] == "best_of_n"]
    for k in ("random", *SIGNALS, "lowest_stable_rank", "oracle"):
        out.append({"section": f"best_of_n ({len(bon)} categories)", "signal": k,
                    "value": float(np.mean([r[k] for r in bon])), "what": "clean rate of the pick"})
    runs = [(f"sr_grpo_lr: strict_list at lr {lr:g} ({split})",
             [r for r in rows if r["section"] == "sr_grpo_lr" and r["lr"] == lr and r["split"] == split])
            for lr in GRPO_LRS for split in ("validation", "held_out")]
    runs += [(f"sr_grpo ({len(_per_reward(rows, reward))} held-out categories): GRPO reward {reward}",
              _per_reward(rows, reward)) for reward in GRPO_REWARDS]
    for section, items in runs:
        if items:
            row: dict[str, Any] = {"section": section, "signal": items[0]["reward"], "lr": items[0].get("lr"),
                                   "what": "collapsed rate after",
                                   "value": float(np.mean([r["collapsed_after"] for r in items]))}
            for k in _MEASURES:
                for when in ("before", "after"):
                    row[f"{k}_{when}"] = float(np.mean([r[f"{k}_{when}"] for r in items]))
            out.append(row)
    return out


def run(quick: bool, seed: int) -> BenchmarkResult:
    from lit_lowrank.models.pretrained import load_smollm2

    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(seed)
    model, tok = load_smollm2()
    model.eval()
    scorer = ResponseScorer(model, tok, chat=True, batch_size=8)
    phases: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        start = time.time()
        out = fn()
        phases[name] = round(time.time() - start, 1)
        print(f"[stable_rank_lists] {name}: {phases[name]} s", file=sys.stderr, flush=True)
        return out

    categories = list(range(QUICK_CATEGORIES if quick else len(CATEGORIES)))
    samples = timed("samples", lambda: sample_lists(model, tok, scorer, categories, seed))
    rows = _pairwise(samples, seed) + _best_of_n(samples)
    lr_choice: dict[str, Any] = {}
    if not quick:
        grpo_rows, lr_choice = timed("sr_grpo", lambda: _sr_grpo(model, tok, scorer, samples, seed))
        rows += grpo_rows
    claims, controls, competitors = _claims(rows)
    notes = {
        "task": f"'{list_prompt('{category}')}' (chat template), {SAMPLES} samples a category at {SAMPLING}, at most "
                f"{WINDOW} new tokens; collapsed = a normalised item repeats (items from lines and inline lists)",
        "categories": len(categories), "train_categories": TRAIN_CATEGORIES,
        "scorer": "SmolLM2-135M-Instruct (offline GGUF, dequantised), chat template, post-final-norm, special tokens "
                  "excluded; stable_rank = raw / E[srank | T] of Lee test articles",
        "sr_grpo": ("not run in quick mode (SmolLM2 GRPO steps cost ~18 s each)" if quick else
                    f"SmolLM2 + LoRA, {GRPO}, sampling {SAMPLING}; training categories 0..{TRAIN_CATEGORIES - 1}, "
                    f"held-out {HELD_OUT[0]}..{HELD_OUT[-1]}, validation {VALIDATION[0]}..{VALIDATION[-1]}; lr from "
                    f"{GRPO_LRS} for the strict list reward on validation, shared by every reward"),
        "grpo_lr": lr_choice,
        "phase_s": phases,
    }
    return BenchmarkResult(rows, claims, controls, notes, _summary(samples, rows), premises=_premises(rows),
                           competitors=competitors)
