"""Side measurement (issue #41 item 7): can this GRPO dose lower SmolLM2's collapsed-list rate when the reward targets it?

Run from the repository root: ``.venv/bin/python docs/measurements/stable_rank_lists_strict_reward.py`` (~16 min alone
on 2 CPU cores). In the ``stable_rank_lists`` full run the checkable list reward, (distinct − repeats) / 15, paid for
length as well as for not repeating, and GRPO on it *raised* the held-out collapsed rate (+0.073), so the premise
``list_reward_teaches`` failed for a reason of the reward, not of the dose. This script repeats that one GRPO run at
the benchmark's exact settings (:func:`~lit_lowrank.benchmarks.stable_rank_lists._grpo_run`, seed 0, the same 24
training and 16 held-out categories, the same sampling seeds, so "before" is the committed run's) with a strict
reward: items / 15 for a list without a repeat, 0 for one with (since then the benchmark's own upper baseline,
:class:`~lit_lowrank.benchmarks.stable_rank_lists.StrictListReward`, run here by name). Writes
``docs/measurements/stable_rank_lists_strict_reward.json``; ``--lr 3e-4`` runs the same at another learning rate
and writes ``..._lr3e-04.json``. The card ``docs/methods/stable_rank.md`` quotes both.
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


def main(lr: float) -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    start = time.time()
    model, tok = load_smollm2()
    model.eval()
    scorer = ResponseScorer(model, tok, chat=True, batch_size=8)
    held_out = list(HELD_OUT)
    before = sample_lists(model, tok, scorer, held_out, 0, score=False)
    committed = [r for r in json.load(open(COMMITTED))["rows"] if r["section"] == "sr_grpo" and r["reward"] == "random"]
    again = [float(np.mean([r["collapsed"] for r in before if r["category"] == c])) for c in held_out]
    if again != [r["collapsed_before"] for r in committed]:
        raise RuntimeError(f"the held-out samples differ from {COMMITTED}'s: this checkout does not reproduce it.")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lists.jsonl"
        lines = [list_prompt(CATEGORIES[c]) for c in range(TRAIN_CATEGORIES)] + [list_prompt("things")]
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines), encoding="utf-8")
        rows = _grpo_run(_lora_policy(model, GRPO["lora_rank"]), tok, "strict_list", 0, lr, {"held_out": held_out},
                         before, scorer, path)
    summary: dict[str, Any] = {"seconds": round(time.time() - start, 1), "grpo": {**GRPO, "lr": lr}}
    for k in ("collapsed", "items", "distinct", "ended", "tokens"):
        a, b = np.array([r[f"{k}_after"] for r in rows]), np.array([r[f"{k}_before"] for r in rows])
        ci = bootstrap_interval(len(rows), lambda idx: float(a[idx].mean() - b[idx].mean()))
        summary[k] = {"before": float(b.mean()), "after": float(a.mean()), "diff": float((a - b).mean()),
                      "ci": list(ci) if ci else None}
        print(f"{k}: {b.mean():.3f} -> {a.mean():.3f} ({(a - b).mean():+.3f}, CI {ci})", flush=True)
    suffix = "" if lr == 1e-4 else f"_lr{lr:.0e}"
    with open(f"docs/measurements/stable_rank_lists_strict_reward{suffix}.json", "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-4, help="the GRPO learning rate (the benchmark's: 1e-4)")
    main(parser.parse_args().lr)
