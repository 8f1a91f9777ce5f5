"""PoLAR's stable-rank claim on a small fine-tune: stable rank of ΔW for PoLAR vs LoRA at the same rank.

Not a registered benchmark (PoLAR is one arm of ``lora_variants``): :func:`polar_vs_lora_stable_rank` returns rows
that ``lora_variants`` (or the PoLAR card) uses. Run alone:
``python -m lit_lowrank.benchmarks._polar_rank [--quick] [--seed 0]``.

Setting (embedded data, CPU, seconds): an MLP ``64-128-128-10`` is pre-trained in full on the sklearn 8x8 digits
(train split); the fine-tuning task is the same digits *transposed* (a 90°-flip-like domain shift that breaks the
pre-trained first layers). Rank-8 adapters on both hidden Linear layers, the head trained in full, AdamW at one
learning rate (1e-2) for every method, the same seeds and batches for each (paired), 1,000 steps. Per method: mean
over layers of the stable rank ‖ΔW‖²_F/‖ΔW‖²₂ of the learned update after 300 and 1,000 steps, test accuracy on
the transposed test split, and (PoLAR) the orthogonality error of X and Y. ``polar_no_landing`` is the same
parameterisation trained with plain gradients (X, Y drift off the manifold).

.. code-block:: python

    from lit_lowrank.benchmarks._polar_rank import polar_vs_lora_stable_rank

    rows, claims = polar_vs_lora_stable_rank(quick=True, seed=0)
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
from torch import nn

from lit_lowrank.adapters.polar import polar_delta_stable_rank, polar_layers
from lit_lowrank.adapters.polar_landing import apply_landing_, polar_diagnostics
from lit_lowrank.benchmarks.harness import legacy_claim
from lit_lowrank.ops.lowrank import stable_rank_of

METHODS = ("lora", "polar", "polar_no_landing")


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def _transposed(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1, 8, 8).transpose(1, 2).reshape(-1, 64)


def _net(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float, seed: int,
           landing: float | None = None, probe_at: tuple[int, ...] = (), probe=None) -> dict[int, Any]:
    """AdamW on random batches; ``probe(model)`` is recorded after each step count in ``probe_at``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    probes = {}
    for step in range(1, steps + 1):
        idx = torch.randint(len(x), (64,), generator=gen)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        if landing is not None:
            apply_landing_(model, landing)
        opt.step()
        if step in probe_at:
            probes[step] = probe(model)
    return probes


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(-1) == y).float().mean())


def _delta_stable_ranks(model: nn.Module, method: str) -> list[float]:
    if method.startswith("polar"):
        return [polar_delta_stable_rank(layer) for _, layer in polar_layers(model)]
    from peft.tuners.lora.layer import LoraLayer

    with torch.no_grad():
        return [float(stable_rank_of(m.get_delta_weight("default"))) for m in model.modules()
                if isinstance(m, LoraLayer)]


def finetune_once(method: str, seed: int, steps: int, rank: int = 8, lr: float = 1e-2, lam: float = 1.0,
                  pretrain_steps: int = 400, early: int = 300) -> dict[str, Any]:
    """Pre-train on digits, inject ``method`` adapters, fine-tune on transposed digits; one row.

    The stable rank of ΔW is also probed after ``early`` fine-tuning steps (``stable_rank_dW_early``).
    """
    from lit_lowrank.adapters.injector import inject_adapters

    x_train, y_train, x_test, y_test = _digits()
    model = _net(seed)
    _train(model, x_train, y_train, pretrain_steps, 3e-3, seed)
    before = _accuracy(model, _transposed(x_test), y_test)
    kind = "polar" if method.startswith("polar") else method
    model = inject_adapters(model, method=kind, target_modules=["0", "2"], rank=rank, alpha=rank,
                            modules_to_save=["4"])
    probes = _train(model, _transposed(x_train), y_train, steps, lr, seed + 1,
                    landing=lam if method == "polar" else None, probe_at=(early,),
                    probe=lambda m: statistics.mean(_delta_stable_ranks(m, method)))
    row: dict[str, Any] = {"method": method, "seed": seed, "rank": rank,
                           "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                           "acc_before": round(before, 4),
                           "acc_after": round(_accuracy(model, _transposed(x_test), y_test), 4),
                           "stable_rank_dW_early": round(probes.get(early, float("nan")), 3),
                           "stable_rank_dW": round(statistics.mean(_delta_stable_ranks(model, method)), 3)}
    if method.startswith("polar"):
        diag = polar_diagnostics(model)
        row["orth_err_max"] = round(max(diag["orthogonality_error_x_max"], diag["orthogonality_error_y_max"]), 4)
    return row


def polar_vs_lora_stable_rank(quick: bool = True, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows (per method, mean over seeds) and the claims; quick: 3 seeds, full: 5 seeds (1,000 steps each).

    Rank 8, AdamW lr 1e-2 for every method, landing λ = 1; the stable rank is probed at 300 and 1,000 steps.
    """
    seeds = [seed + i for i in range(3 if quick else 5)]
    steps = 1000
    per_seed = {m: [finetune_once(m, s, steps) for s in seeds] for m in METHODS}
    rows: list[dict[str, Any]] = []
    for method, runs in per_seed.items():
        summary = {"method": method, "seeds": len(runs), "steps": steps, "rank": runs[0]["rank"],
                   "trainable_params": runs[0]["trainable_params"], "acc_before": runs[0]["acc_before"]}
        for key in ("acc_after", "stable_rank_dW_early", "stable_rank_dW", "orth_err_max"):
            if key in runs[0]:
                summary[key] = round(statistics.mean(r[key] for r in runs), 4)
        rows.append(summary)
    paired = [p["stable_rank_dW"] / q["stable_rank_dW"] for p, q in zip(per_seed["polar"], per_seed["lora"])]
    claims = [
        legacy_claim("PoLAR's ΔW has higher stable rank than LoRA's after 1,000 steps (min over paired seeds of the ratio)",
              min(paired), 1.0, ">"),
        legacy_claim("landing keeps X, Y >= 10x closer to orthonormal than plain gradients (ratio of max ‖XᵀX − I‖_F)",
              max(r["orth_err_max"] for r in per_seed["polar_no_landing"])
              / max(r["orth_err_max"] for r in per_seed["polar"]), 10.0, ">="),
    ]
    return rows, claims


def main() -> None:  # pragma: no cover - a command-line entry
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, claims = polar_vs_lora_stable_rank(args.quick, args.seed)
    print(json.dumps({"rows": rows, "claims": claims}, indent=1))


if __name__ == "__main__":  # pragma: no cover
    main()
