"""Side measurement (issue #41 item 5): LoKr, MoRA and DoRA in the full fine-tune section, beside its committed run.

Run from the repository root: ``.venv/bin/python docs/measurements/lora_variants_more_baselines.py`` (~30 min alone
on 2 CPU cores). The full mode of ``lit-lowrank bench lora_variants`` runs full fine-tuning, LoRA, ScaledGD,
SDS-LoRA, SaMA, PoLAR and PiSSA; the runner also takes LoKr (parameter-matched), MoRA and DoRA. This script runs
those three at exactly the full mode's settings (all 6 MiniLM layers, 300 steps of 16 tweets, the 4-point adapter
grid on seed 0's validation loss, then seeds 1–4 at the selected lr) and pairs them per seed with the committed
rows of ``docs/results/lora_variants.full.json`` (the runs are deterministic: LoRA at its selected lr on seed 0 is
re-run first and must reproduce its committed row). Writes ``docs/measurements/lora_variants_more_baselines.json``;
the card ``docs/methods/lora_variants.md`` quotes the result. No claim: the benchmark's claims stay in its JSON.
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch
from torch import nn

from lit_lowrank.benchmarks._claims import t_interval
from lit_lowrank.benchmarks.harness import torch_threads
from lit_lowrank.benchmarks.lora_variants import ADAPTER_LRS_FULL, FULL_MAX_LENGTH
from lit_lowrank.benchmarks.lora_variants.finetune import (
    FinetuneConfig,
    PretrainedTrunk,
    finetune_run,
    lokr_matched_kwargs,
    select_lr,
    tweet_splits,
)

COMMITTED = "docs/results/lora_variants.full.json"
METHODS = ("lokr", "mora", "dora")
REFERENCE = ("lora", "sama", "full")


def main() -> None:
    committed = json.load(open(COMMITTED))
    rows = [r for r in committed["rows"] if r.get("section") == "finetune_minilm"]
    seeds = sorted({r["seed"] for r in rows if r["method"] == "lora" and r["selected"]})
    config = FinetuneConfig(steps=300, batch_size=16, measure_every=25)  # the full mode's (benchmark run())
    start = time.time()
    with torch_threads(2):
        trunk = PretrainedTrunk.minilm()
        data = trunk.prepare(tweet_splits("minilm", FULL_MAX_LENGTH, (4800, 500, 1000)))
        shapes = [(m.out_features, m.in_features) for n, m in trunk.named_modules()
                  if isinstance(m, nn.Linear) and __import__("re").search(config.target, n)]
        lokr = lokr_matched_kwargs(shapes, config.rank)
        ref = next(r for r in rows if r["method"] == "lora" and r["selected"] and r["seed"] == seeds[0])
        again = finetune_run(trunk, "lora", ref["lr"], seeds[0], data, config, lokr)
        if abs(again["test_loss"] - ref["test_loss"]) > 1e-4:
            raise RuntimeError(f"LoRA seed {seeds[0]} gives test loss {again['test_loss']:.6f}, the committed run "
                               f"{ref['test_loss']:.6f}: this checkout does not reproduce {COMMITTED}.")
        new: list[dict] = []
        selected = {}
        for method in METHODS:
            for lr in ADAPTER_LRS_FULL:
                new.append(finetune_run(trunk, method, lr, seeds[0], data, config, lokr))
                print(f"{method} lr {lr:g}: val {new[-1]['val_loss']:.4f} ({time.time() - start:.0f} s)", flush=True)
            selected[method] = select_lr(new, method, seeds[:1])
            new += [finetune_run(trunk, method, selected[method], s, data, config, lokr) for s in seeds[1:]]
    for r in new:
        r["selected"] = r["lr"] == selected[r["method"]]
    pool = [r for r in rows if r["selected"]] + [r for r in new if r["selected"]]

    def at(method: str, key: str) -> np.ndarray:
        by_seed = {r["seed"]: r[key] for r in pool if r["method"] == method}
        return np.array([by_seed[s] for s in seeds], dtype=float)

    summary = {"selected_lr": selected, "lokr": lokr, "seeds": seeds, "seconds": round(time.time() - start, 1),
               "trainable": {m: next(r["trainable"] for r in pool if r["method"] == m) for m in (*METHODS, "lora",
                                                                                                  "sama")},
               "means": {m: {k: float(at(m, k).mean()) for k in ("test_loss", "test_acc")}
                         for m in (*METHODS, *REFERENCE)},
               "vs": {}}
    for m in (*METHODS, "sama"):
        for base in ("lora",) if m != "sama" else ("lokr", "mora"):
            for k in ("test_loss", "test_acc"):
                d = at(m, k) - at(base, k)
                summary["vs"][f"{m}-{base}:{k}"] = {"mean": float(d.mean()), "ci": list(t_interval(d))}
    for name, v in summary["vs"].items():
        print(f"{name}: {v['mean']:+.4f} [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]")
    print(json.dumps(summary["means"], indent=1), summary["selected_lr"], f"{summary['seconds']} s")
    with open("docs/measurements/lora_variants_more_baselines.json", "w") as f:
        json.dump({"summary": summary, "rows": new}, f, indent=1)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
