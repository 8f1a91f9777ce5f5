"""Side measurement (issue #41 item 7): how much of the ``stable_rank_lists`` SR-GRPO result is the LoRA draw?

Run from the repository root, one LoRA draw per process (PEFT wraps the loaded model in place)::

    .venv/bin/python docs/measurements/stable_rank_lists_lora_init.py --init-seed 2                  # ~28 min
    .venv/bin/python docs/measurements/stable_rank_lists_lora_init.py --init-seed 2 --rewards length  # ~17 min
    .venv/bin/python docs/measurements/stable_rank_lists_lora_init.py --summarise-only

The benchmark's strict-reward run at lr 3e-4 lowered the held-out collapsed rate by 0.094, the side measurement
``stable_rank_lists_strict_reward.py`` at the same settings by 0.167; the runs differ in the LoRA factors' random
initialisation (the global RNG state when ``_lora_policy`` is called). This script repeats the benchmark's GRPO runs
(:func:`~lit_lowrank.benchmarks.stable_rank_lists._grpo_run`: by default the strict-reward and stable-rank ones, or
the length / random controls; the committed run's lr, seed 0 for GRPO's sampling and the evaluation draws, the same
held-out "before" samples, checked against the committed run) with the LoRA initialised after
``torch.manual_seed(init_seed)``. It adds the rows to those already in
``docs/measurements/stable_rank_lists_lora_init.json`` (a (draw, reward) run again replaces its rows) and rewrites
the summary: each reward per draw and pooled with the committed draw (the mean "after" per category over the draws),
and SR-GRPO's pooled collapsed rate minus each other reward's. The card ``docs/methods/stable_rank_lists.md`` quotes
it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lit_lowrank.benchmarks._claims import bootstrap_interval
from lit_lowrank.benchmarks.stable_rank import _lora_policy
from lit_lowrank.benchmarks.stable_rank_lists import (
    CATEGORIES,
    GRPO,
    HELD_OUT,
    TRAIN_CATEGORIES,
    _grpo_run,
    list_prompt,
    sample_lists,
)
from lit_lowrank.decoding.stable_rank import ResponseScorer
from lit_lowrank.models import load_smollm2

COMMITTED = "docs/results/stable_rank_lists.full.json"
REWARDS = ("strict_list", "stable_rank")
CONTROLS = ("length", "random")  # the benchmark's pure-length and random-reward GRPO controls
OUT = "docs/measurements/stable_rank_lists_lora_init.json"


def _ci(a: np.ndarray, b: np.ndarray) -> list[float] | None:
    ci = bootstrap_interval(len(a), lambda idx: float(a[idx].mean() - b[idx].mean()))
    return list(ci) if ci else None


def _ci_draws(a: np.ndarray, b: np.ndarray) -> list[float] | None:
    """Pooled ``mean(a) − mean(b)`` for (draws × categories) arrays, resampling the categories and, in each resample,
    each side's draws with replacement: the CI that also carries the draw-to-draw spread."""
    rng = np.random.default_rng(1)

    def stat(idx: np.ndarray) -> float:
        da, db = rng.integers(0, len(a), len(a)), rng.integers(0, len(b), len(b))
        return float(a[da][:, idx].mean() - b[db][:, idx].mean())

    ci = bootstrap_interval(a.shape[1], stat)
    return list(ci) if ci else None


def main(init_seed: int, rewards: tuple[str, ...] = REWARDS) -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    start = time.time()
    committed = json.load(open(COMMITTED))
    lr = committed["notes"]["grpo_lr"]["lr"]
    model, tok = load_smollm2()
    model.eval()
    scorer = ResponseScorer(model, tok, chat=True, batch_size=8)
    held_out = list(HELD_OUT)
    before = sample_lists(model, tok, scorer, held_out, 0, score=False)
    rows_c = [r for r in committed["rows"] if r["section"] == "sr_grpo"]
    again = [float(np.mean([r["collapsed"] for r in before if r["category"] == c])) for c in held_out]
    if again != [r["collapsed_before"] for r in rows_c if r["reward"] == "random"]:
        raise RuntimeError(f"the held-out samples differ from {COMMITTED}'s: this checkout does not reproduce it.")
    torch.manual_seed(init_seed)
    policy = _lora_policy(model, GRPO["lora_rank"])
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lists.jsonl"
        lines = [list_prompt(CATEGORIES[c]) for c in range(TRAIN_CATEGORIES)] + [list_prompt("things")]
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines), encoding="utf-8")
        for reward in rewards:
            rows += [{**r, "lora_init_seed": init_seed}
                     for r in _grpo_run(policy, tok, reward, 0, lr, {"held_out": held_out}, before, scorer, path)]
    runs = [{"lora_init_seed": init_seed, "rewards": list(rewards), "seconds": round(time.time() - start, 1)}]
    if Path(OUT).exists():
        kept = json.load(open(OUT))
        runs = _runs(kept["summary"]) + runs
        fresh = {(init_seed, w) for w in rewards}
        rows = [r for r in kept["rows"] if (r["lora_init_seed"], r["reward"]) not in fresh] + rows
    with open(OUT, "w") as f:
        json.dump({"summary": summarise(rows, rows_c, lr, runs), "rows": rows}, f, indent=1)


def _runs(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The processes behind the file's rows (earlier layouts: one per draw, both rewards)."""
    if "runs" in summary:
        return summary["runs"]
    seconds = summary.get("seconds_per_draw") or {summary["lora_init_seed"]: summary["seconds"]}
    return [{"lora_init_seed": int(k), "rewards": list(REWARDS), "seconds": v} for k, v in seconds.items()]


def summarise(rows: list[dict], rows_c: list[dict], lr: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each reward's held-out quantities per draw and pooled over the committed draw and every draw in ``rows``."""
    draws = sorted({r["lora_init_seed"] for r in rows})
    summary: dict[str, Any] = {"runs": runs,
                               "grpo": {**GRPO, "lr": lr}, "lora_init_seeds": draws,
                               "pooled": "the committed draw and every draw here: the mean 'after' per category over "
                                         "the draws against the shared 'before'; pooled_ci bootstraps categories "
                                         "only, pooled_ci_draws categories and, within each resample, the draws"}
    pooled_after: dict[str, np.ndarray] = {}
    draws_after: dict[str, np.ndarray] = {}
    for reward in [w for w in REWARDS + CONTROLS if any(r["reward"] == w for r in rows)]:
        theirs = [r for r in rows_c if r["reward"] == reward]
        out: dict[str, Any] = {}
        for k in ("collapsed", "distinct", "items", "ended", "tokens"):
            b = np.array([r[f"{k}_before"] for r in theirs])
            after = {"committed": np.array([r[f"{k}_after"] for r in theirs])}
            for d in sorted({r["lora_init_seed"] for r in rows if r["reward"] == reward}):
                mine = [r for r in rows if r["reward"] == reward and r["lora_init_seed"] == d]
                if [r["category"] for r in mine] != [r["category"] for r in theirs]:
                    raise RuntimeError(f"draw {d} of {reward!r} does not cover the committed held-out categories")
                after[str(d)] = np.array([r[f"{k}_after"] for r in mine])
            pooled = np.mean(list(after.values()), axis=0)
            if k == "collapsed":
                pooled_collapsed, draws_collapsed = pooled, np.stack(list(after.values()))
            out[k] = {"before": float(b.mean()),
                      "draws": {d: {"after": float(a.mean()), "diff": float((a - b).mean()), "ci": _ci(a, b)}
                                for d, a in after.items()},
                      "pooled_diff": float((pooled - b).mean()), "pooled_ci": _ci(pooled, b),
                      "pooled_ci_draws": _ci_draws(np.stack(list(after.values())), b[None]),
                      "n_draws": len(after)}
            print(f"{reward} {k}: {out[k]}", flush=True)
        summary[reward] = out
        pooled_after[reward], draws_after[reward] = pooled_collapsed, draws_collapsed
    # SR-GRPO against each other reward on the collapsed rate, per category, each pooled over the draws it has
    sr = pooled_after.get("stable_rank")
    summary["stable_rank_minus"] = {w: {"diff": float((sr - a).mean()), "ci": _ci(sr, a),
                                        "ci_draws": _ci_draws(draws_after["stable_rank"], draws_after[w])}
                                    for w, a in pooled_after.items() if sr is not None and w != "stable_rank"}
    return summary


def resummarise() -> None:
    """Rewrite the summary from the rows already in the file (no run)."""
    kept = json.load(open(OUT))
    rows_c = [r for r in json.load(open(COMMITTED))["rows"] if r["section"] == "sr_grpo"]
    with open(OUT, "w") as f:
        json.dump({"summary": summarise(kept["rows"], rows_c, kept["summary"]["grpo"]["lr"], _runs(kept["summary"])),
                   "rows": kept["rows"]}, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-seed", type=int, default=1, help="torch seed before the LoRA factors are drawn")
    parser.add_argument("--rewards", nargs="+", default=list(REWARDS), choices=REWARDS + CONTROLS,
                        help="the GRPO rewards to run with this draw")
    parser.add_argument("--summarise-only", action="store_true", help="rewrite the summary from the file's rows")
    args = parser.parse_args()
    if args.summarise_only:
        resummarise()
    else:
        main(args.init_seed, tuple(args.rewards))
