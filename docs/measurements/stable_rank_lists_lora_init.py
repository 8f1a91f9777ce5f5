"""Side measurement (issue #41 item 7): how much of the ``stable_rank_lists`` SR-GRPO result is the LoRA draw?

Run from the repository root: ``.venv/bin/python docs/measurements/stable_rank_lists_lora_init.py`` (~25 min alone
on 2 CPU cores). The benchmark's strict-reward run at lr 3e-4 lowered the held-out collapsed rate by 0.094, the side
measurement ``stable_rank_lists_strict_reward.py`` at the same settings by 0.167; the runs differ in the LoRA
factors' random initialisation (the global RNG state when ``_lora_policy`` is called). This script repeats the
benchmark's strict-reward and stable-rank GRPO runs (:func:`~lit_lowrank.benchmarks.stable_rank_lists._grpo_run`,
the committed run's lr, seed 0 for GRPO's sampling and the evaluation draws, the same held-out "before" samples,
checked against the committed run) with the LoRA initialised after ``torch.manual_seed(init_seed)``, and writes
``docs/measurements/stable_rank_lists_lora_init.json``. The card ``docs/methods/stable_rank_lists.md`` quotes it.
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


def _ci(a: np.ndarray, b: np.ndarray) -> list[float] | None:
    ci = bootstrap_interval(len(a), lambda idx: float(a[idx].mean() - b[idx].mean()))
    return list(ci) if ci else None


def main(init_seed: int) -> None:
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
        for reward in REWARDS:
            rows += [{**r, "lora_init_seed": init_seed}
                     for r in _grpo_run(policy, tok, reward, 0, lr, {"held_out": held_out}, before, scorer, path)]
    summary: dict[str, Any] = {"seconds": round(time.time() - start, 1), "grpo": {**GRPO, "lr": lr},
                               "lora_init_seed": init_seed}
    for reward in REWARDS:
        mine = [r for r in rows if r["reward"] == reward]
        theirs = [r for r in rows_c if r["reward"] == reward]
        out: dict[str, Any] = {}
        for k in ("collapsed", "distinct", "items", "ended", "tokens"):
            a, b = np.array([r[f"{k}_after"] for r in mine]), np.array([r[f"{k}_before"] for r in mine])
            c = np.array([r[f"{k}_after"] for r in theirs])
            # the two LoRA draws pooled per category: the mean after over both runs against the shared before
            out[k] = {"before": float(b.mean()), "after": float(a.mean()), "diff": float((a - b).mean()),
                      "ci": _ci(a, b), "committed_diff": float((c - b).mean()),
                      "pooled_diff": float(((a + c) / 2 - b).mean()), "pooled_ci": _ci((a + c) / 2, b)}
            print(f"{reward} {k}: {out[k]}", flush=True)
        summary[reward] = out
    with open("docs/measurements/stable_rank_lists_lora_init.json", "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-seed", type=int, default=1, help="torch seed before the LoRA factors are drawn")
    main(parser.parse_args().init_seed)
