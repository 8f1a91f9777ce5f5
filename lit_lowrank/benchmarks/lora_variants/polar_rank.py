"""PoLAR's stable-rank claim over paired seeds: stable rank of the learned ΔW, PoLAR vs LoRA at the same rank.

A section of ``lora_variants`` (:func:`polar_rank_rows`, :func:`polar_rank_claims`); run alone with
``python -m lit_lowrank.benchmarks.lora_variants.polar_rank [--quick] [--seed 0]``.

Setting (embedded data, CPU, seconds): an MLP ``64-128-128-10`` is pre-trained in full on the sklearn 8x8 digits
(train split, one network per seed); the fine-tuning task is the same digits *transposed* (a domain shift that
breaks the pre-trained first layers). Rank-8 adapters on both hidden Linear layers, the head trained in full,
AdamW, batches of 64. Each method's learning rate comes from one grid, chosen by validation accuracy on a
validation part of the transposed training digits (first seed), then every seed runs at it. Per run: mean over
layers of the stable rank ‖ΔW‖²_F/‖ΔW‖²₂ of the learned update after ``early`` (300) steps and at the end, test
accuracy on the transposed test split, and (PoLAR) the orthogonality error of X and Y. ``polar_no_landing`` is
the same parameterisation trained with plain gradients (X, Y drift off the manifold), at PoLAR's lr;
``lora_rank1`` (rank-1 LoRA at LoRA's lr) is the control: its ΔW has stable rank 1 by construction, so "higher
stable rank than rank-8 LoRA" must fail on it.

.. code-block:: python

    from lit_lowrank.benchmarks.lora_variants.polar_rank import polar_rank_claims, polar_rank_rows

    rows, notes = polar_rank_rows(seeds=[0, 1, 2], steps=600)
    claims, controls = polar_rank_claims(rows)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lit_lowrank.adapters.polar import polar_delta_stable_rank, polar_layers
from lit_lowrank.adapters.polar_landing import apply_landing_, polar_diagnostics
from lit_lowrank.benchmarks.harness import claim, paired
from lit_lowrank.ops.lowrank import stable_rank_of

METHODS = ("lora", "polar", "polar_no_landing", "lora_rank1")
LR_GRID: tuple[float, ...] = (3e-3, 1e-2, 3e-2)
LANDING = 1.0  # the library default λ (card: why not the paper's 5e-3 under Adam)
PAPER = ("PoLAR (arXiv 2506.03133, in the PoLAR-VBLL abstract): \"existing low-rank adapters (LoRA) for PEFT have "
         "limited expressiveness due to rank collapse\"; PoLAR keeps a higher stable rank of ΔW than LoRA")


def _digits() -> dict[str, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    a, b = int(0.65 * len(x)), int(0.8 * len(x))
    return {"x": x[:a], "y": y[:a], "val_x": x[a:b], "val_y": y[a:b], "test_x": x[b:], "test_y": y[b:]}


def _transposed(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1, 8, 8).transpose(1, 2).reshape(-1, 64)


def _net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float, seed: int,
           landing: float | None = None, probe_at: int | None = None, probe=None) -> Any:
    """AdamW on random batches of 64; ``probe(model)`` after step ``probe_at``."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    probed = None
    for step in range(1, steps + 1):
        idx = torch.randint(len(x), (64,), generator=gen)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        if landing is not None:
            apply_landing_(model, landing)
        opt.step()
        if step == probe_at:
            probed = probe(model)
    return probed


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


_PRETRAINED: dict[tuple[int, int], dict[str, torch.Tensor]] = {}


def _pretrained(seed: int, data: dict[str, torch.Tensor], steps: int = 400) -> nn.Sequential:
    if (seed, steps) not in _PRETRAINED:  # one pre-trained network per seed, shared by every method (paired)
        torch.manual_seed(seed)
        net = _net()
        _train(net, data["x"], data["y"], steps, 3e-3, seed)
        _PRETRAINED[seed, steps] = {k: v.clone() for k, v in net.state_dict().items()}
    net = _net()
    net.load_state_dict(_PRETRAINED[seed, steps])
    return net


def finetune_once(method: str, seed: int, steps: int, lr: float = 1e-2, rank: int = 8, early: int = 300,
                  pretrain_steps: int = 400) -> dict[str, Any]:
    """Inject ``method`` into the seed's pre-trained MLP, fine-tune on transposed digits; one row."""
    from lit_lowrank.adapters.injector import inject_adapters

    if method not in METHODS:
        raise ValueError(f"`method`={method!r}: expected one of {METHODS}.")
    data = _digits()
    model = _pretrained(seed, data, pretrain_steps)
    kind = "polar" if method.startswith("polar") else "lora"
    r = 1 if method == "lora_rank1" else rank
    torch.manual_seed(seed)
    model = inject_adapters(model, method=kind, target_modules=["0", "2"], rank=r, alpha=r, modules_to_save=["4"])
    early_rank = _train(model, _transposed(data["x"]), data["y"], steps, lr, seed + 1,
                        landing=LANDING if method == "polar" else None, probe_at=early,
                        probe=lambda m: statistics.mean(_delta_stable_ranks(m, method)))
    row: dict[str, Any] = {"section": "polar_rank", "method": method, "seed": seed, "lr": lr, "rank": r,
                           "steps": steps, "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                           "val_acc": _accuracy(model, _transposed(data["val_x"]), data["val_y"]),
                           "acc_after": _accuracy(model, _transposed(data["test_x"]), data["test_y"]),
                           "stable_rank_dW_early": early_rank,
                           "stable_rank_dW": statistics.mean(_delta_stable_ranks(model, method))}
    if method.startswith("polar"):
        diag = polar_diagnostics(model)
        row["orth_err_max"] = max(diag["orthogonality_error_x_max"], diag["orthogonality_error_y_max"])
    return row


def polar_rank_rows(seeds: Sequence[int], steps: int = 600, early: int = 300,
                    grid: Sequence[float] = LR_GRID) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of every run; LoRA's and PoLAR's lrs tuned on validation accuracy (first seed), ``selected`` marked."""
    if steps < early:
        raise ValueError(f"`steps`={steps} must be at least `early`={early}.")
    rows: list[dict[str, Any]] = []
    chosen: dict[str, float] = {}
    for method in ("lora", "polar"):
        tuning = [finetune_once(method, seeds[0], steps, lr, early=early) for lr in grid]
        best = max(tuning, key=lambda r: r["val_acc"])
        chosen[method] = best["lr"]
        for r in tuning:
            r["selected"] = r is best
        rows += tuning
        rows += [{**finetune_once(method, s, steps, chosen[method], early=early), "selected": True}
                 for s in seeds[1:]]
    chosen["polar_no_landing"], chosen["lora_rank1"] = chosen["polar"], chosen["lora"]
    for method in ("polar_no_landing", "lora_rank1"):
        rows += [{**finetune_once(method, s, steps, chosen[method], early=early), "selected": True} for s in seeds]
    return rows, {"polar_rank_lr": chosen, "polar_rank_steps": steps, "polar_rank_landing": LANDING}


def polar_rank_claims(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """PoLAR / LoRA stable rank at the end of training (claim) and rank-1 LoRA / LoRA (control)."""
    sel = [r for r in rows if r.get("section") == "polar_rank" and r.get("selected")]
    quantity = "stable rank of the learned ΔW (mean over the 2 layers) after {steps} steps, {a} / LoRA r=8, ratio"
    steps = sel[0]["steps"]
    polar, lora, units = paired(sel, "stable_rank_dW", {"method": "polar"}, {"method": "lora"})
    one, lora1, units1 = paired(sel, "stable_rank_dW", {"method": "lora_rank1"}, {"method": "lora"})
    claims = [claim(f"digits MLP: PoLAR's ΔW has a higher stable rank than LoRA's after {steps} steps", paper=PAPER,
                    quantity=quantity.format(steps=steps, a="PoLAR"), values=polar, baseline=lora, units=units,
                    compare="ratio", target=1.0, op=">")]
    controls = [claim("digits MLP: rank-1 LoRA's ΔW has a higher stable rank than rank-8 LoRA's",
                      paper="(control: must not hold) " + PAPER, quantity=quantity.format(steps=steps, a="LoRA r=1"),
                      values=one, baseline=lora1, units=units1, compare="ratio", target=1.0, op=">")]
    return claims, controls


def main() -> None:  # pragma: no cover - a command-line entry
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = [args.seed + i for i in range(3 if args.quick else 5)]
    rows, notes = polar_rank_rows(seeds, steps=600 if args.quick else 2000)
    claims, controls = polar_rank_claims(rows)
    print(json.dumps({"rows": rows, "notes": notes, "claims": claims, "controls": controls}, indent=1))


if __name__ == "__main__":  # pragma: no cover
    main()
