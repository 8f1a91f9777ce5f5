"""LoRA variants side by side: LoRA, DoRA, LoKr (PEFT) and the project's SDS-LoRA, SaMA and PoLAR.

Four sections, every method injected with :func:`~lit_lowrank.adapters.inject_adapters` (a method that is not
registered when the benchmark runs is skipped and named in ``notes["skipped"]``):

1. ``condition`` (SDS-LoRA, METHODS.md §15): fit ``½‖B A − M‖²`` (64×64, rank 8, ``M = U Vᵀ`` with orthonormal
   ``U, V``) by plain SGD from factors whose singular values are spread geometrically over a condition number
   ``κ`` (``B = U_B diag(σ)``, ``A = diag(σ) V_Aᵀ``, ``σ`` from 1 to 1/κ), with LoRA's factor gradients and with
   SDS-LoRA's (:func:`~lit_lowrank.ops.sds_lora.sds_factor_grads`, the same closed form the layer's backward
   computes), learning rate 0.05, 100 steps. Rows: loss at step 0 and at the last step per ``κ``.
2. ``rank_budget`` (SaMA, §10): rank of the update a parameter budget buys on a 256×256 layer, SaMA
   (:func:`~lit_lowrank.ops.sama.sama_rank_report`, engineer B's) vs LoRA (the same budget spent on rank
   ``budget / (m + n)``), both from random factors; the claim is the log–log slope of effective rank vs budget.
3. ``fit`` (matched parameters): one 64×64 ``nn.Linear`` with a frozen random ``W₀``; each method (rank 4, so
   LoRA has 512 parameters; SaMA's default spends the same budget; DoRA/LoKr/PoLAR report their own counts) is
   trained with Adam to reach ``W₀ + ΔW*`` on the identity input, for a full-rank Gaussian ``ΔW*`` (flat spectrum)
   and a decaying one (``σ_i = 1/i``). Rows: relative error ``‖ΔW − ΔW*‖_F / ‖ΔW*‖_F``, effective rank (Roy &
   Vetterli) and stable rank of the learned ``ΔW``.
4. ``finetune``: the offline pretrained all-MiniLM-L6-v2 (quick: its first transformer layer, 24 steps of 16
   tweets of 24 tokens; full: all 6 layers, 300 steps of 32 × 64)
   fine-tuned on the embedded sentiment tweets (3 classes) with adapters on every attention query/value, a new
   linear head trained in full, AdamW, the same seeds / batches for every method, plus full fine-tuning (every
   parameter). Rows: mean training loss over the run (loss-curve area per step), final validation loss and
   accuracy, gap to full fine-tuning (validation loss), effective rank of the adapter gradients and the cosine
   between the update the optimizer step made to ΔW and the full fine-tuning gradient ``−∂L/∂W`` (means over
   the measured steps: :mod:`lit_lowrank.adapters.diagnostics`), stable rank of the final ΔW, PoLAR's
   orthogonality error, and the median train-step time as a ratio to LoRA's (methods interleaved A B A B).

Claims (computed from the rows): SDS-LoRA reaches a lower loss than LoRA (condition sweep) and its final loss
does not grow with κ while LoRA's does; SaMA's effective rank grows ~quadratically with the budget (slope ≥ 1.5)
and LoRA's ~linearly (slope ≤ 1.2), and SaMA fits the full-rank ΔW* better than LoRA at equal parameters;
PoLAR's fine-tuned ΔW has a higher stable rank than LoRA's; SDS-LoRA's adapter gradients have a higher effective
rank and its updates a higher cosine with the full gradient than LoRA's; step time within 5% of LoRA's (DoRA and
SDS-LoRA inherently cost more per step: their ratio is reported, not claimed).

.. code-block:: bash

    lit-lowrank bench lora_variants --quick --json lora_variants.json
"""

from __future__ import annotations

import copy
import math
import statistics
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.adapters import available_variants, inject_adapters
from lit_lowrank.adapters.diagnostics import (
    FullGradientCapture,
    adapter_gradient_eranks,
    delta_weights,
    update_cosine,
)
from lit_lowrank.benchmarks._timing import interleaved_medians
from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.ops.lowrank import effective_rank_of, stable_rank_of
from lit_lowrank.ops.sds_lora import lora_factor_grads, sds_factor_grads

METHODS: tuple[str, ...] = ("lora", "dora", "lokr", "sds_lora", "sama", "polar")
#: methods whose step inherently does more work than LoRA's (DoRA: the column norm of W + ΔW; SDS: two thin QRs)
INHERENTLY_COSTLIER: tuple[str, ...] = ("dora", "sds_lora")
FT_TARGETS = r"attention\.self\.(query|value)$"


def _methods() -> tuple[list[str], list[str]]:
    registered = set(available_variants()) | {"lora", "dora", "lokr"}
    return [m for m in METHODS if m in registered], [m for m in METHODS if m not in registered]


# ---------------------------------------------------------------- 1. condition-number sweep


def _condition_run(kind: str, kappa: float, lr: float, steps: int, seed: int, m: int = 64, n: int = 64,
                   r: int = 8) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64

    def orth(rows: int) -> Tensor:
        return torch.linalg.qr(torch.randn(rows, r, generator=gen, dtype=dt))[0]

    target = orth(m) @ orth(n).t()
    sigma = torch.logspace(0.0, -math.log10(kappa), r, dtype=dt)
    b, a = orth(m) * sigma, (orth(n) * sigma).t()
    first = last = 0.0
    for t in range(steps + 1):
        g = b @ a - target
        last = 0.5 * float((g * g).sum())
        if t == 0:
            first = last
        if t == steps or not math.isfinite(last) or last > 1e12:
            break
        grad_a, grad_b = sds_factor_grads(g, a, b) if kind == "sds_lora" else lora_factor_grads(g, a, b)
        a, b = a - lr * grad_a, b - lr * grad_b
    return first, last if math.isfinite(last) else float("inf")


def _condition_rows(kappas: list[float], lrs: list[float], steps: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for lr in lrs:
        for kappa in kappas:
            for kind in ("lora", "sds_lora"):
                first, last = _condition_run(kind, kappa, lr, steps, seed)
                rows.append({"section": "condition", "method": kind, "kappa": kappa, "lr": lr, "steps": steps,
                             "loss_step0": round(first, 4), "loss_final": last,
                             "diverged": not math.isfinite(last) or last > first})
    return rows


# ---------------------------------------------------------------- 2. rank vs budget


def _rank_rows(lora_ranks: list[int], size: int, seed: int, have_sama: bool) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for k in lora_ranks:
        budget = k * 2 * size
        lora_delta = torch.randn(size, k, generator=gen, dtype=torch.float64) @ torch.randn(
            k, size, generator=gen, dtype=torch.float64)
        rows.append({"section": "rank_budget", "method": "lora", "budget": budget, "parameters": budget,
                     "rank": k, "effective_rank": float(effective_rank_of(lora_delta))})
        if have_sama:
            from lit_lowrank.ops.sama import sama_rank_report

            report = sama_rank_report(size, size, budget=budget, seed=seed)
            rows.append({"section": "rank_budget", "method": "sama", "budget": budget,
                         "parameters": report["parameters"], "rank": report["rank"],
                         "effective_rank": report["effective_rank"]})
    return rows


def _loglog_slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


# ---------------------------------------------------------------- 3. matched-parameter fit of ΔW*


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _landing(model: nn.Module, method: str) -> None:
    if method == "polar":  # PoLAR's X, Y stay near the Stiefel manifold through the landing field (engineer C's)
        from lit_lowrank.adapters.polar_landing import apply_landing_

        apply_landing_(model)


def _fit_rows(methods: list[str], steps: int, seed: int, size: int = 64, rank: int = 4) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(size, size, generator=gen) / math.sqrt(size)
    u, _ = torch.linalg.qr(torch.randn(size, size, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(size, size, generator=gen))
    targets = {
        "full_rank": torch.randn(size, size, generator=gen) / math.sqrt(size),
        "decaying": (u * (1.0 / torch.arange(1, size + 1).float())) @ v.t(),
    }
    eye = torch.eye(size)
    rows = []
    for tname, delta_star in targets.items():
        scale = float(delta_star.norm())
        for method in methods:
            torch.manual_seed(seed)
            layer = nn.Sequential(nn.Linear(size, size, bias=False))
            with torch.no_grad():
                layer[0].weight.copy_(base)
            inject_adapters(layer, method=method, target_modules=["0"], rank=rank, alpha=rank)
            opt = torch.optim.Adam(_trainable(layer), lr=1e-2)
            want = eye @ (base + delta_star).t()
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                loss = (layer(eye) - want).pow(2).sum() / scale**2
                loss.backward()
                _landing(layer, method)
                opt.step()
            delta = delta_weights(layer)["0"]
            rows.append({"section": "fit", "target": tname, "method": method, "steps": steps,
                         "parameters": sum(p.numel() for p in _trainable(layer)),
                         "rel_error": float((delta - delta_star).norm() / scale),
                         "effective_rank": float(effective_rank_of(delta)), "stable_rank": float(stable_rank_of(delta))})
    return rows


# ---------------------------------------------------------------- 4. fine-tuning the pretrained MiniLM


class _SentenceClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.backbone = encoder
        self.head = nn.Linear(encoder.num_features, num_classes)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.backbone(ids))


def _tweet_batches(max_samples: int, max_length: int, batch_size: int, steps: int, val_size: int,
                   seed: int) -> tuple[list[tuple[Tensor, Tensor]], tuple[Tensor, Tensor]]:
    from lit_lowrank.datamodules import TextClassificationDataModule

    dm = TextClassificationDataModule(source="tweets", tokenizer="minilm", max_length=max_length,
                                      batch_size=batch_size, max_samples=max_samples, seed=seed)
    dm.setup("fit")
    train, val = dm.train_set, dm.val_set
    gen = torch.Generator().manual_seed(seed)
    batches = []
    n = len(train)
    order = torch.randperm(n, generator=gen)
    for step in range(steps):
        idx = order[(torch.arange(batch_size) + step * batch_size) % n]
        items = [train[int(i)] for i in idx]
        batches.append((torch.stack([it["x"] for it in items]), torch.stack([it["y"] for it in items])))
    vitems = [val[i] for i in range(min(val_size, len(val)))]
    return batches, (torch.stack([it["x"] for it in vitems]), torch.stack([it["y"] for it in vitems]))


def _evaluate(model: nn.Module, val: tuple[Tensor, Tensor], chunk: int = 128) -> tuple[float, float]:
    model.eval()
    losses, correct = [], 0
    with torch.no_grad():
        for i in range(0, len(val[1]), chunk):
            logits = model(val[0][i:i + chunk])
            losses.append(F.cross_entropy(logits, val[1][i:i + chunk], reduction="sum"))
            correct += int((logits.argmax(-1) == val[1][i:i + chunk]).sum())
    model.train()
    return float(torch.stack(losses).sum()) / len(val[1]), correct / len(val[1])


def _finetune_rows(methods: list[str], layers: int | None, steps: int, batches: list[tuple[Tensor, Tensor]],
                   val: tuple[Tensor, Tensor], seed: int, rank: int, measure_every: int,
                   timing_repeats: int) -> list[dict[str, Any]]:
    from lit_lowrank.models.sentence_encoder import MiniLMEncoder

    torch.manual_seed(seed)
    pretrained = _SentenceClassifier(MiniLMEncoder(num_layers=layers), num_classes=3)
    rows, models, optimizers = [], {}, {}
    for method in ["full", *methods]:
        model = copy.deepcopy(pretrained)
        torch.manual_seed(seed)
        if method == "full":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
        else:
            inject_adapters(model, method=method, target_modules=FT_TARGETS, rank=rank, alpha=2 * rank,
                            modules_to_save=["head"])
            opt = torch.optim.AdamW(_trainable(model), lr=2e-3, weight_decay=0.0)
        torch.manual_seed(seed)  # the same dropout masks for every method
        losses, granks, cosines = [], [], []
        for step, (x, y) in enumerate(batches):
            measure = method != "full" and (step + 1) % measure_every == 0
            opt.zero_grad(set_to_none=True)
            if measure:
                with FullGradientCapture(model) as cap:
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
            else:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            _landing(model, method)
            if measure:
                granks += adapter_gradient_eranks(model)
                before = delta_weights(model)
            opt.step()
            if measure:
                cosines.append(update_cosine(before, delta_weights(model), cap.grads).mean)
            losses.append(float(loss.detach()))
        val_loss, val_acc = _evaluate(model, val)
        row: dict[str, Any] = {"section": "finetune", "method": method, "steps": steps,
                               "trainable": sum(p.numel() for p in _trainable(model)),
                               "loss_auc": statistics.fmean(losses), "val_loss": val_loss, "val_acc": val_acc}
        if method != "full":
            deltas = delta_weights(model)
            row["grad_erank"] = statistics.fmean(granks) if granks else float("nan")
            row["update_cosine"] = statistics.fmean(cosines) if cosines else float("nan")
            row["delta_stable_rank"] = statistics.fmean(float(stable_rank_of(d)) for d in deltas.values())
            row["delta_erank"] = statistics.fmean(float(effective_rank_of(d)) for d in deltas.values())
        if method == "polar":
            from lit_lowrank.adapters.polar_landing import polar_diagnostics

            row["orthogonality_error"] = polar_diagnostics(model).get("orthogonality_error_x_max", float("nan"))
        rows.append(row)
        models[method], optimizers[method] = model, opt
    full_loss = rows[0]["val_loss"]
    for row in rows:
        row["gap_to_full"] = row["val_loss"] - full_loss

    x, y = batches[0]

    def step_fn(method: str):
        model, opt = models[method], optimizers[method]

        def run() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            _landing(model, method)
            opt.step()
        return run

    times = interleaved_medians({m: step_fn(m) for m in ["full", *methods]}, repeats=timing_repeats, warmup=1)
    for row in rows:
        row["step_time_ratio"] = times[row["method"]] / times["lora"]
    return rows


# ---------------------------------------------------------------- run


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    raise KeyError(match)


def run(quick: bool, seed: int) -> BenchmarkResult:
    # one thread for the whole run: these are small ops, and on a shared 2-core machine two threads per op
    # contend with every other process (measured: the condition sweep 0.15 s on one thread, 27 s on two)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick, seed)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, seed: int) -> BenchmarkResult:
    methods, skipped = _methods()
    kappas = [1.0, 10.0, 100.0, 1000.0]
    cond = _condition_rows(kappas, [0.05], steps=100, seed=seed)
    ranks = _rank_rows([1, 2, 4, 8] if quick else [1, 2, 4, 8, 16], size=256, seed=seed, have_sama="sama" in methods)
    fit = _fit_rows(methods, steps=150 if quick else 600, seed=seed)
    ft_steps = 24 if quick else 300
    batches, val = _tweet_batches(max_samples=2000 if quick else 38158, max_length=24 if quick else 64,
                                  batch_size=16 if quick else 32, steps=ft_steps, val_size=192 if quick else 3000,
                                  seed=seed)
    ft = _finetune_rows(methods, layers=1 if quick else None, steps=ft_steps, batches=batches, val=val, seed=seed,
                        rank=8, measure_every=8 if quick else 25, timing_repeats=7 if quick else 15)
    rows = cond + ranks + fit + ft

    claims = []
    c = {(r["method"], r["kappa"]): r["loss_final"] for r in cond if r["lr"] == 0.05}
    claims.append(legacy_claim("SDS-LoRA: lower loss than LoRA after 100 SGD steps at κ=100 (LoRA/SDS loss ratio)",
                        c[("lora", 100.0)] / max(c[("sds_lora", 100.0)], 1e-12), 1.0, ">"))
    claims.append(legacy_claim("SDS-LoRA: convergence does not degrade with κ (loss at κ=1000 / loss at κ=1)",
                        c[("sds_lora", 1000.0)] / max(c[("sds_lora", 1.0)], 1e-12), 2.0, "<="))
    claims.append(legacy_claim("LoRA: convergence degrades with κ (loss at κ=1000 / loss at κ=1)",
                        c[("lora", 1000.0)] / max(c[("lora", 1.0)], 1e-12), 2.0, ">"))
    lora_ft = _row(ft, method="lora")
    if "sds_lora" in methods:
        sds_ft = _row(ft, method="sds_lora")
        claims.append(legacy_claim("SDS-LoRA: higher adapter-gradient effective rank than LoRA (fine-tuning, ratio)",
                            sds_ft["grad_erank"] / lora_ft["grad_erank"], 1.0, ">"))
        claims.append(legacy_claim("SDS-LoRA: update better aligned with the full gradient than LoRA's (cosine difference)",
                            sds_ft["update_cosine"] - lora_ft["update_cosine"], 0.0, ">"))
        claims.append(legacy_claim("SDS-LoRA: smaller gap to full fine-tuning than LoRA (val-loss gap difference)",
                            lora_ft["gap_to_full"] - sds_ft["gap_to_full"], 0.0, ">"))
    if "sama" in methods:
        lora_r = [r for r in ranks if r["method"] == "lora"]
        sama_r = [r for r in ranks if r["method"] == "sama"]
        claims.append(legacy_claim("SaMA: effective rank grows ~quadratically with the budget (log-log slope)",
                            _loglog_slope([r["budget"] for r in sama_r], [r["effective_rank"] for r in sama_r]),
                            1.5, ">="))
        claims.append(legacy_claim("LoRA: effective rank grows ~linearly with the budget (log-log slope)",
                            _loglog_slope([r["budget"] for r in lora_r], [r["effective_rank"] for r in lora_r]),
                            1.2, "<="))
        claims.append(legacy_claim("SaMA: fits a full-rank ΔW* better than LoRA at equal parameters (LoRA/SaMA rel. error)",
                            _row(fit, method="lora", target="full_rank")["rel_error"]
                            / _row(fit, method="sama", target="full_rank")["rel_error"], 1.0, ">"))
    if "polar" in methods:
        claims.append(legacy_claim("PoLAR: fine-tuned ΔW has a higher stable rank than LoRA's (ratio)",
                            _row(ft, method="polar")["delta_stable_rank"] / lora_ft["delta_stable_rank"], 1.0, ">"))
    for method in methods:
        if method != "lora" and method not in INHERENTLY_COSTLIER:
            claims.append(legacy_claim(f"{method}: train-step time within 5% of LoRA's (ratio)",
                                _row(ft, method=method)["step_time_ratio"], 1.05, "<="))
    notes: dict[str, Any] = {"skipped": skipped, "finetune_model": "all-MiniLM-L6-v2"
                             + (" (first layer only)" if quick else ""), "fit_rank": 4, "finetune_rank": 8}
    return BenchmarkResult(rows, claims, notes)
