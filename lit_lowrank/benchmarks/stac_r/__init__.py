"""STAC-R benchmark: the total training peak at the paper's fidelity condition, measured, with its frontier.

**Models** (:mod:`lit_lowrank.benchmarks.stac_r.models`): pretrained all-MiniLM-L6-v2 fine-tuned on
the embedded sentiment tweets (quick 16 × 64 tokens, full 32 × 64; the BERT/SST-2 analogue), every
Linear of its 6 blocks compressed; full mode adds pretrained SmolLM2-135M (Llama, SwiGLU) as a causal
LM on packed Lee-corpus windows (4 × 256), every ``*_proj`` of its 30 blocks compressed. AdamW (lr
5e-5 / 1e-5, no weight decay), fp32, CPU threads 2.

**Ranks**: per layer, chosen in STAC-R's calibration step for the paper's fidelity condition (mean
weight-gradient cosine ≥ 0.98): the smallest multiple of 8 whose closed-form cosine on that step's
exact ``(X, G)`` reaches 0.98 + 0.005 (:func:`~lit_lowrank.ops.stac_r_rank.select_rank`). The
predictor prices those ranks on the exact run's recorded steps (SSP and the predicted total peak)
before any compressed step; the **frontier** rows price the ranks other targets (0.9 … 0.99) and
the old fixed rank 32 would take, from the same calibration curves.

**Memory** is the paper's quantity: the total training peak — parameters, gradients, optimizer
state, activations and every transient — measured per variant in a
:class:`~lit_lowrank.ops.peak_memory.PeakMemory` session that opens before the variant's copy of the
model is built (CPU: the profiler's allocator events; CUDA: ``max_memory_allocated``), one fresh
variant at a time: a calibration step, then 3 measured steps on distinct batches (the units), in two
phases each (forward + backward, optimizer step).

**Gradient cosine** (unit: batch): STAC-R then trains 50 more steps and is diagnosed on 8 distinct
batches (each a real compressed training step whose exact inputs are kept aside): per compressed
layer ``cos(GᵀX̂, GᵀX)``, mean over layers. On each step's own exact ``(X, G)`` and at STAC-R's
per-layer ranks, the controls are scored too: the untracked basis (frozen at calibration), the
iso-byte per-step SVD, the iso-byte random projection (CompAct-style) and the oracle (the batch's own
top-``r`` SVD at STAC-R's rank: the premise of the cosine claim).

**Premises**: compressible saved activations alive at the exact peak ≥ 7% of the total peak (SSP)
for the peak claim; the oracle basis reaches 0.98 for the cosine claim. **Predictor claims** compare
two instruments: SSP (pack-hook counter, exact run) must upper-bound the reduction measured by the
allocator on the STAC-R run, and the predicted total-peak reduction must be within 2 points of it.
(The per-projection predictor and SwiGLU cells of the full run compare the counter with itself: rows
and tests, not claims.) **Controls**: a rank-``d`` fp32 basis must not show the reduction; the random
projection must not reach the cosine; an identical copy of STAC-R must not pass the Turbo timing
test. **Competitors**: activation checkpointing for the peak claim; the iso-byte SVD for "tracked
above untracked". **Turbo** (MiniLM): STAC-R without the residual at the same target ranks, its basis
refreshed every 8 steps, with GaLoreAdamW on the compressed Linears, against full STAC-R: peak memory
and interleaved step-time rounds. Full mode adds GaLore alone and validation loss after equal steps.
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lit_lowrank.benchmarks._timing import interleaved_samples
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, paired, per_unit, premise
from lit_lowrank.benchmarks.stac_r.models import (
    Spec,
    Task,
    Variant,
    control_cosines,
    forward_saved_bytes,
    mean,
    minilm_task,
    ranks_for_target,
    set_code,
    smollm2_task,
    to_device,
)
from lit_lowrank.ops.stac_r.compress import compressed_nbytes
from lit_lowrank.ops.stac_r.peak_memory import PeakMemory
from lit_lowrank.ops.stac_r.saved_surface import SurfaceRecorder, predict_total_peak, predict_total_peak_timeline
from lit_lowrank.ops.stac_r.saved_tensors import MIB

GIB = float(2**30)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PAPER_PEAK = ("Evaluations across GPT-2 (Medium/Large) and Pythia-1.4B pre-training show STAC-R reduces peak memory "
              "by 7.2-12.4%")
PAPER_BERT = "On BERT fine-tuning (SST-2), STAC-R achieves 12.45% memory reduction with a 0.15pp accuracy decrease"
PAPER_COS = "with mean gradient cosine >= 0.98 ... Mechanistic benchmarks yield a mean gradient cosine of 0.9813"
PAPER_CONTROLS = "outperforming iso-byte SVD (0.9236) and untracked-subspace (0.6949) controls"
PAPER_TURBO = ('Composed with GaLore, a "Turbo-fast" variant matches full STAC-R\'s memory footprint within 0.005 GiB '
               "while reaching 0.67x wall time")
PAPER_SSP = "the Saved-Surface Predictor (SSP = A_C^+ / P), a statistic that upper-bounds peak memory reduction"
PAPER_SWIGLU = "our analysis identifies memory-increasing regimes in SwiGLU architectures (Qwen-2.5/Llama-3.2)"
PAPER_PPL = "keeping long-horizon validation perplexity within 1.5% of baseline (Pythia-1.4B 10k steps: +1.14%)"


def _setting(quick: bool) -> dict[str, Any]:
    """Quick (≲ 300 CPU-seconds on 2 idle cores): MiniLM only; full: MiniLM and SmolLM2, validation loss too.

    Measured on the loaded 2-core machine: a SmolLM2-135M training step costs 13-19 CPU-s exact and
    29-41 CPU-s with STAC-R whatever the tokens (AdamW over 135M parameters and 210 compressed
    Linears set it), so quick cannot afford its memory sessions, 50 training steps and 8 diagnosed
    ones: SmolLM2 is the full run's.
    """
    common = dict(target=0.98, margin=0.005, density=0.01, mem_steps=3, diag_steps=8, train_steps=50,
                  turbo_rounds=5, galore_rank=128, lr={"smollm2": 1e-5, "minilm": 5e-5})
    if quick:
        return dict(common, models=["minilm"], minilm=dict(batch=16, max_length=64), n_val=4, val_steps=0,
                    memory_methods=["exact", "stac_r", "rank_d", "checkpoint"], sweep_ranks=(128, 288))
    return dict(common, models=["minilm", "smollm2"], minilm=dict(batch=32, max_length=64),
                smol=dict(seq=256, batch=4), n_val=8, val_steps=1, turbo_rounds=7,
                memory_methods=["exact", "stac_r", "rank_d", "checkpoint", "galore"], sweep_ranks=(64, 128, 288, 448))


def _specs(cfg: dict[str, Any]) -> dict[str, Spec]:
    target, margin, rho = cfg["target"], cfg["margin"], cfg["density"]
    return {
        "exact": Spec("exact"),
        "stac_r": Spec("stac_r", "tracked", 32, rho, target=target, margin=margin),
        "rank_d": Spec("rank_d", "tracked", 0, rho, coef_dtype="float32"),  # full rank per layer
        "checkpoint": Spec("checkpoint", checkpoint=True),
        "galore": Spec("galore", galore_rank=cfg["galore_rank"]),
        "turbo": Spec("turbo", "tracked", 32, 0.0, update_every=8, galore_rank=cfg["galore_rank"], target=target,
                      margin=margin),
        "stac_r_copy": Spec("stac_r_copy", "tracked", 32, rho, target=target, margin=margin),
    }


# -- memory ---------------------------------------------------------------------------------------------------------
def _phases(meter: PeakMemory) -> list[tuple[Any, Any]]:
    """``(forward+backward segment, optimizer segment)`` per measured step."""
    fb = [s for s in meter.segments if s.name == "forward_backward"]
    opt = [s for s in meter.segments if s.name == "optimizer"]
    return list(zip(fb, opt))


def _measure(task: Task, spec: Spec, cfg: dict[str, Any], device: str, record: bool = False,
             mem_steps: int | None = None) -> tuple[list[dict[str, Any]], Variant, PeakMemory, list[SurfaceRecorder]]:
    """A fresh variant in its own session: one calibration step, then ``mem_steps`` measured steps (a row each,
    on distinct batches). ``record``: the predictor's recording of every measured step (every target Linear)."""
    gc.collect()
    rows, seconds, recorders = [], [], []
    with PeakMemory(device) as meter:
        variant = Variant(task, spec, cfg["lr"][task.name], meter)
        variant.step(task.train[0])
        for k in range(1, (mem_steps or cfg["mem_steps"]) + 1):
            recorder = SurfaceRecorder(variant.model, {n: m for n, m in variant.model.named_modules()
                                                       if isinstance(m, torch.nn.Linear)
                                                       and re.search(task.target, n)}) if record else None
            recorders += [recorder] if recorder is not None else []
            seconds.append(variant.step(task.train[k], meter=meter, counter=recorder)["seconds"])
    for k, ((fb, opt), sec) in enumerate(zip(_phases(meter), seconds), start=1):
        rows.append({"kind": "memory", "model": task.name, "method": spec.name, "step": k,
                     "peak_total_mib": max(fb.peak, opt.peak) / MIB,
                     "activation_phase_mib": fb.peak / MIB, "optimizer_phase_mib": opt.peak / MIB,
                     "peak_set_by": "optimizer" if opt.peak >= fb.peak else "forward/backward", "seconds": sec})
    return rows, variant, meter, recorders


def _diagnose(variant: Variant, task: Task, first: int, steps: int) -> list[dict[str, Any]]:
    """``steps`` compressed training steps on distinct batches, each diagnosed: STAC-R's cosine and, on the same
    exact ``(X, G)``, the controls' (:func:`~lit_lowrank.benchmarks.stac_r.models.control_cosines`)."""
    rows = []
    for k in range(first, first + steps):
        out = variant.step(task.train[k], diagnose=True)
        others = control_cosines(out.pop("captured"), variant)
        rows.append({"kind": "cosine", "model": task.name, "method": variant.spec.name, "batch": k,
                     "after_calibration": variant.steps - 1, "grad_cosine": out["cosine"],
                     "grad_cosine_min": out["cosine_min"], "layers": out["cosine_layers"]})
        rows += [{"kind": "cosine", "model": task.name, "method": name, "batch": k, "grad_cosine": value}
                 for name, value in others.items()]
    return rows


def _price(ranks: dict[str, int] | int, density: float, dtype: str = "bfloat16") -> Callable[[str, int, int], int]:
    """The code bytes of a layer at its rank (``ranks``: per layer, or one rank for all)."""
    coef = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]

    def price(name: str, n: int, d: int) -> int:
        rank = ranks if isinstance(ranks, int) else ranks[name]
        return compressed_nbytes(n, d, min(rank, d), density, coef)

    return price


def _predicted(recorders: list[SurfaceRecorder], meter: PeakMemory, ranks: dict[str, int],
               density: float) -> list[dict[str, float]]:
    """Per measured step of the exact run: SSP (compressible bytes alive at the saved peak / total peak) and the
    total peak the predictor forecasts for STAC-R at ``ranks`` — before any compressed step ran."""
    out = []
    for recorder, (fb, opt) in zip(recorders, _phases(meter)):
        report = recorder.report(_price(ranks, density))
        exact_peak = max(fb.peak, opt.peak)
        if meter.events:  # CPU: the measured memory timeline minus the saving of what is alive at each instant
            predicted = predict_total_peak_timeline(meter.events, fb.start, fb.t0, fb.t1, recorder.saving_timeline(),
                                                    opt.peak)
        else:  # CUDA: the saving at the saved peak off the forward/backward phase's peak
            predicted = predict_total_peak(fb.peak, opt.peak, report.saving_bytes)
        out.append({"ssp": report.compressible_bytes / exact_peak, "ssp_saved": report.ssp,
                    "predicted_total_reduction": 1 - predicted / exact_peak,
                    "increasing_layers": len(report.increasing)})
    return out


# -- the predictor per projection and the SwiGLU regime -------------------------------------------------------------
def _ablations(task: Task, recorder: SurfaceRecorder, cfg: dict[str, Any], spec: Spec,
               batch: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Predicted vs measured saved-activation reduction for each projection type and the SwiGLU cells."""
    variant = Variant(task, spec, cfg["lr"][task.name])
    layers = variant.layers
    set_code(layers, set(), spec.rank, torch.bfloat16)
    base = forward_saved_bytes(variant.model, task, batch)
    exact_peak = recorder.counter.peak_bytes

    def names(kinds: tuple[str, ...]) -> set[str]:
        return {n for n in layers if n.rsplit(".", 1)[-1] in kinds}

    cells: list[tuple[str, tuple[str, ...], int, str]] = [(p, (p,), spec.rank, "bfloat16") for p in PROJECTIONS]
    for rank in cfg["sweep_ranks"]:
        for group in (("gate_proj", "up_proj"), ("down_proj",)):
            cells.append(("+".join(group), group, rank, "float32"))
    rows = []
    for label, kinds, rank, dtype in cells:
        chosen = names(kinds)
        report = recorder.report(_price(rank, spec.density, dtype), subset=chosen)
        naive = sum(s.input_bytes - s.code_bytes for s in report.layers.values())  # every input counted as freed
        set_code(layers, chosen, rank, getattr(torch, dtype))
        for n in chosen:  # the held bytes depend on the code's shapes only: an orthonormal (d, rank) basis per
            d = layers[n].in_features  # layer without its SVD (60 thin SVDs cost 14 of a cell's 17 CPU-s at N=128)
            layers[n].stac_r_basis = torch.eye(d, device=layers[n].weight.device)[:, :rank].contiguous()
            layers[n].basis_mode = "untracked"  # held fixed (no subspace step): same stored bytes as tracked
        held = forward_saved_bytes(variant.model, task, batch)
        rows.append({"kind": "ablation", "model": task.name, "projections": label, "rank": rank, "coef_dtype": dtype,
                     "mlp": any(k in ("gate_proj", "up_proj", "down_proj") for k in kinds),
                     "predicted_saved_reduction": report.predicted_reduction,
                     "naive_saved_reduction": naive / exact_peak,
                     "measured_saved_reduction": 1 - held / base, "flagged_layers": len(report.increasing)})
    del variant
    return rows


# -- turbo ----------------------------------------------------------------------------------------------------------
def _turbo(task: Task, specs: dict[str, Spec], cfg: dict[str, Any], device: str,
           stac: Variant) -> list[dict[str, Any]]:
    """Turbo's memory (its own session) and interleaved step-time rounds: Turbo, full STAC-R, an identical copy."""
    rows, turbo, _, _ = _measure(task, specs["turbo"], cfg, device)
    copy = Variant(task, specs["stac_r_copy"], cfg["lr"][task.name])
    copy.step(task.train[0])
    batches = task.train[1 + cfg["mem_steps"]:]
    position = {"turbo": 0, "stac_r": 0, "stac_r_copy": 0}

    def timed(name: str, variant: Variant) -> Callable[[], float]:
        def fn() -> float:
            batch = batches[position[name] % len(batches)]
            position[name] += 1
            return variant.step(batch)["seconds"]
        return fn

    samples = interleaved_samples({"turbo": timed("turbo", turbo), "stac_r": timed("stac_r", stac),
                                   "stac_r_copy": timed("stac_r_copy", copy)}, repeats=cfg["turbo_rounds"], warmup=1)
    for name, values in samples.items():
        rows += [{"kind": "timing", "model": task.name, "method": name, "round": i, "step_seconds": t}
                 for i, t in enumerate(values)]
    return rows


# -- the run --------------------------------------------------------------------------------------------------------
def _study(task: Task, cfg: dict[str, Any], device: str,
           predictor_rows: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Variant]:
    """One model: memory per variant (sequentially, each in its own session), then STAC-R trained on and diagnosed
    on ``diag_steps`` distinct batches ``train_steps`` steps after calibration (controls scored on the same steps),
    validation loss after equal steps (full), and the predictor's per-step forecast from the exact run."""
    specs = _specs(cfg)
    rows: list[dict[str, Any]] = []
    summary: dict[str, dict[str, Any]] = {}
    mem_steps = cfg["mem_steps"]
    recorders: list[SurfaceRecorder] = []
    exact_meter: PeakMemory | None = None
    stac: Variant | None = None
    for name in cfg["memory_methods"]:
        mem_rows, variant, meter, recs = _measure(task, specs[name], cfg, device, record=name == "exact")
        rows += mem_rows
        if name == "exact":
            recorders, exact_meter = recs, meter
        summary[name] = {"model": task.name, "method": name,
                         "peak_total_mib": mean([r["peak_total_mib"] for r in mem_rows]),
                         "activation_phase_mib": mean([r["activation_phase_mib"] for r in mem_rows]),
                         "optimizer_phase_mib": mean([r["optimizer_phase_mib"] for r in mem_rows]),
                         "peak_set_by": mem_rows[-1]["peak_set_by"], "grad_cosine": 1.0}
        if name == "stac_r":
            stac = variant
            summary[name]["rank_mean"] = mean([float(r) for r in variant.ranks.values()])
            summary[name]["ranks"] = f"{min(variant.ranks.values())}-{max(variant.ranks.values())}"
        elif name == "exact" and cfg["val_steps"]:
            for k in range(1 + mem_steps, 1 + mem_steps + cfg["train_steps"] + cfg["diag_steps"]):
                variant.step(task.train[k])  # the same batches STAC-R trains on
            rows += _val_rows(variant, task)
        del variant
    assert stac is not None and exact_meter is not None
    rows += [{"kind": "rank", "model": task.name, "layer": n, "rank": r} for n, r in stac.ranks.items()]
    # the predictor, from the exact run's recorded steps, at the ranks STAC-R chose in its calibration step
    for k, forecast in enumerate(_predicted(recorders, exact_meter, stac.ranks, cfg["density"]), start=1):
        rows.append({"kind": "predictor", "model": task.name, "method": "stac_r", "step": k, **forecast})
    # the frontier: the ranks other cosine targets (and the old fixed rank 32) would take, and the total-peak
    # reduction the predictor forecasts for them (checked against the measured run at the chosen target above)
    widths = {n: layer.in_features for n, layer in stac.layers.items()}
    points: list[tuple[str, dict[str, int]]] = [(f"target {t}", ranks_for_target(stac.curves, widths, t,
                                                                                   cfg["margin"]))
                                                for t in (0.9, 0.95, 0.97, 0.98, 0.99)]
    points.append(("fixed rank 32", {n: min(32, w) for n, w in widths.items()}))
    for label, ranks in points:
        forecast = _predicted(recorders[:1], exact_meter, ranks, cfg["density"])[0]
        cos = {n: float(stac.curves[n][min(r, len(stac.curves[n])) - 1]) for n, r in ranks.items()}
        rows.append({"kind": "frontier", "model": task.name, "point": label, "rank_mean": mean(list(map(float,
                     ranks.values()))), "calibration_cosine_mean": mean(list(cos.values())),
                     "calibration_cosine_min": min(cos.values()), **forecast})
    first = 1 + mem_steps
    for k in range(first, first + cfg["train_steps"]):
        stac.step(task.train[k])
    rows += _diagnose(stac, task, first + cfg["train_steps"], cfg["diag_steps"])
    if cfg["val_steps"]:
        rows += _val_rows(stac, task)
    exact_peak = summary["exact"]["peak_total_mib"]
    for s in summary.values():
        s["total_reduction"] = 1 - s["peak_total_mib"] / exact_peak
    for method in ("stac_r", "untracked", "svd", "random", "oracle"):
        values = [r["grad_cosine"] for r in rows if r["kind"] == "cosine" and r["method"] == method]
        summary.setdefault(method, {"model": task.name, "method": method})["grad_cosine"] = mean(values)
    forecasts = [r for r in rows if r["kind"] == "predictor"]
    summary["stac_r"].update(ssp=mean([r["ssp"] for r in forecasts]),
                             predicted_total_reduction=mean([r["predicted_total_reduction"] for r in forecasts]))
    for method in ("exact", "stac_r"):
        losses = [r["val_loss"] for r in rows if r["kind"] == "val" and r["method"] == method]
        if losses:
            summary[method]["val_loss"] = mean(losses)
    if predictor_rows:
        rows += _ablations(task, recorders[0], cfg, Spec("stac_r", "tracked", 32, cfg["density"]), task.train[1])
    return rows, list(summary.values()), stac


def _val_rows(variant: Variant, task: Task) -> list[dict[str, Any]]:
    return [{"kind": "val", "model": task.name, "method": variant.spec.name, "val_batch": i, "val_loss": v,
             "train_steps": variant.steps} for i, v in enumerate(variant.val_losses())]


def run(quick: bool, seed: int) -> BenchmarkResult:
    torch.set_num_threads(2)
    cfg = _setting(quick)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # PeakMemory measures where the run allocates
    start = time.perf_counter()
    n_train = 1 + cfg["mem_steps"] + cfg["train_steps"] + cfg["diag_steps"] + cfg["turbo_rounds"] + 2
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for model in cfg["models"]:
        t0 = time.perf_counter()
        if model == "minilm":
            task = to_device(minilm_task(cfg["minilm"]["batch"], cfg["minilm"]["max_length"], n_train, cfg["n_val"],
                                         seed), device)
        else:
            task = to_device(smollm2_task(cfg["smol"]["seq"], cfg["smol"]["batch"], n_train, cfg["n_val"], seed),
                             device)
        model_rows, model_summary, stac = _study(task, cfg, device, predictor_rows=model == "smollm2")
        rows += model_rows
        summary += model_summary
        if model == "minilm":  # Turbo on the model every mode runs
            turbo_rows = _turbo(task, _specs(cfg), cfg, device, stac)
            rows += turbo_rows
            summary += _turbo_summary(turbo_rows, rows, task.name)
        tokens[model] = task.tokens_per_step
        del stac, task
        gc.collect()
        seconds[model] = round(time.perf_counter() - t0, 1)
    claims, controls, premises, competitors = _claims(rows, cfg)
    notes = {"settings": {k: v for k, v in cfg.items() if k != "lr"}, "lr": cfg["lr"],
             "threads": torch.get_num_threads(), "tokens_per_step": tokens, "seconds_per_model": seconds,
             "memory": "total training peak per variant: a PeakMemory session opened before the variant's copy of the "
                       "model is built (CPU: the profiler's allocator events; CUDA: max_memory_allocated); phases: "
                       "forward+backward and the optimizer step; units: distinct batches of the same shape, so the "
                       "peaks repeat to the byte (the peak is a function of the shapes)",
             "ranks": f"per layer, chosen in the calibration step for weight-gradient cosine >= {cfg['target']} + "
                      f"{cfg['margin']} (select_rank, multiples of 8)",
             "cosine": f"{cfg['diag_steps']} distinct batches, {cfg['train_steps']}+ compressed training steps after "
                       "calibration; controls scored on each step's own exact (X, G) at STAC-R's per-layer ranks",
             "turbo": "STAC-R without residual at the same target ranks, basis updated every 8 steps, GaLoreAdamW "
                      "rank 128 on the compressed Linears (update_proj_gap 200, scale 1), against full STAC-R with AdamW",
             "seconds": round(time.perf_counter() - start, 1)}
    return BenchmarkResult(rows, claims, controls, notes, summary, premises=premises, competitors=competitors)


def _turbo_summary(turbo_rows: list[dict[str, Any]], rows: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    times = {m: [r["step_seconds"] for r in turbo_rows if r.get("method") == m and "step_seconds" in r]
             for m in ("turbo", "stac_r", "stac_r_copy")}
    out = []
    for m, values in times.items():
        peaks = [r["peak_total_mib"] for r in rows if r.get("kind") == "memory" and r.get("model") == model
                 and r.get("method") == m]
        out.append({"model": model, "method": f"timing: {m}", "median_step_s": float(np.median(values)),
                    "time_ratio_to_stac_r": float(np.median(values) / np.median(times["stac_r"])),
                    "peak_total_mib": mean(peaks) if peaks else None})
    return out


# -- claims ---------------------------------------------------------------------------------------------------------
_LABELS = {"smollm2": ("SmolLM2-135M", PAPER_PEAK), "minilm": ("all-MiniLM-L6-v2", PAPER_BERT)}


def _claims(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], ...]:
    """Claims, controls, premises and competitors from the rows (every model the rows hold)."""
    claims: list[dict[str, Any]] = []
    controls: list[dict[str, Any]] = []
    premises: list[dict[str, Any]] = []
    competitors: list[dict[str, Any]] = []

    def pair(metric: str, kind: str, model: str, a: str, b: str, unit: str) -> tuple[list[float], list[float], list]:
        return paired(rows, metric, {"kind": kind, "model": model, "method": a}, {"kind": kind, "model": model,
                                                                                 "method": b}, unit=unit)

    peak_q = ("total training peak (measured) of the method / of exact fine-tuning, per measured step (distinct "
              "batch), geometric mean; <= 0.93 means >= 7% less")
    cos_q = "weight-gradient cosine to the exact gradient of the same step, mean over the compressed layers, per batch"

    def has(kind: str, model: str, method: str) -> bool:
        return any(r.get("kind") == kind and r.get("model") == model and r.get("method") == method for r in rows)

    for model in dict.fromkeys(r["model"] for r in rows if r.get("kind") == "memory"):
        label, paper = _LABELS[model]
        key = model
        forecasts = [r for r in rows if r.get("kind") == "predictor" and r["model"] == model]
        steps = [f"step {r['step']}" for r in forecasts]
        premises.append(premise(f"{key}_compressible_share", f"{label}: the compressible saved activations alive at "
                                "the exact peak are >= 7% of the total training peak (SSP)", needs="a >= 7% total-peak "
                                "reduction needs compressible bytes of at least 7% of the peak at the peak's instant",
                                quantity="SSP = compressible saved-activation bytes alive at the saved peak / exact "
                                "total peak, per measured step", values=[r["ssp"] for r in forecasts], units=steps,
                                unit="step", target=0.07, op=">="))
        ours, base, units = pair("peak_total_mib", "memory", model, "stac_r", "exact", "step")
        claims.append(claim(f"{label} fine-tuning: total training peak >= 7% below exact, at per-layer ranks chosen "
                            f"for gradient cosine >= {cfg['target']}", paper=paper, quantity=peak_q, values=ours,
                            baseline=base, compare="ratio", unit="step", units=units, target=0.93, op="<=",
                            name=f"{key}_peak", requires=f"{key}_compressible_share"))
        if has("memory", model, "checkpoint"):
            ours, base, units = pair("peak_total_mib", "memory", model, "checkpoint", "exact", "step")
            competitors.append(competitor(f"{key}_peak", f"{label}: activation checkpointing of every block reaches "
                                          ">= 7% too (exact gradients, one recomputed forward)", competitor="activation "
                                          "checkpointing (transformers, non-reentrant)", quantity=peak_q, values=ours,
                                          baseline=base, compare="ratio", unit="step", units=units, target=0.93,
                                          op="<="))
        measured = {r["step"]: 1 - r["peak_total_mib"] / b["peak_total_mib"] for r in rows
                    for b in rows if r.get("kind") == b.get("kind") == "memory" and r["model"] == b["model"] == model
                    and r["method"] == "stac_r" and b["method"] == "exact" and r["step"] == b["step"]}
        bound = [(f["ssp"], measured[f["step"]], f"step {f['step']}") for f in forecasts if f["step"] in measured]
        claims.append(claim(f"{label}: SSP upper-bounds the measured total-peak reduction", paper=PAPER_SSP,
                            quantity="SSP (exact run, pack-hook counter) - measured reduction of the total peak "
                            "(STAC-R run, allocator), per step", values=[a - b for a, b, _ in bound],
                            units=[u for *_, u in bound], unit="step", target=0.0, op=">=", name=f"{key}_ssp_bound"))
        pred = [(f["predicted_total_reduction"], measured[f["step"]], f"step {f['step']}") for f in forecasts
                if f["step"] in measured]
        claims.append(claim(f"{label}: the predicted total-peak reduction (before training) is within 2 points of the "
                            "measured one", paper=PAPER_SSP, quantity="|predicted - measured| total-peak reduction, "
                            "per step (prediction: exact run's memory timeline minus the codes' saving)",
                            values=[abs(a - b) for a, b, _ in pred], units=[u for *_, u in pred], unit="step",
                            target=0.02, op="<=", name=f"{key}_predictor"))
        if has("memory", model, "rank_d"):
            ours, base, units = pair("peak_total_mib", "memory", model, "rank_d", "exact", "step")
            controls.append(claim(f"control: a rank-d basis with fp32 coefficients (no compression) shows the same "
                                  f"{label} reduction", paper=paper, quantity=peak_q, values=ours, baseline=base,
                                  compare="ratio", unit="step", units=units, target=0.93, op="<="))
        # the cosine, >= train_steps after calibration, on distinct batches; the controls on the same (X, G)
        oracle = per_unit(rows, "grad_cosine", "batch", kind="cosine", model=model, method="oracle")
        premises.append(premise(f"{key}_oracle_cosine", f"{label}: the batch's own top-r SVD basis at STAC-R's ranks "
                                f"reaches cosine >= 0.98", needs="a rank-r principal basis can keep the weight gradient "
                                "at these ranks (a tracked basis can at best match it)", quantity=f"oracle {cos_q}",
                                values=list(oracle.values()), units=list(oracle), unit="batch", target=0.98, op=">="))
        values = per_unit(rows, "grad_cosine", "batch", kind="cosine", model=model, method="stac_r")
        claims.append(claim(f"{label}: mean weight-gradient cosine >= 0.98, {cfg['train_steps']}+ steps after "
                            "calibration", paper=PAPER_COS, quantity=cos_q, values=list(values.values()), unit="batch",
                            units=list(values), target=0.98, op=">=", name=f"{key}_cosine",
                            requires=f"{key}_oracle_cosine"))
        for other, text in (("untracked", "the untracked (frozen at calibration) basis"),
                            ("svd", "the iso-byte per-step SVD")):
            ours, base, units = pair("grad_cosine", "cosine", model, "stac_r", other, "batch")
            claims.append(claim(f"{label}: gradient cosine of the tracked basis above {text}", paper=PAPER_CONTROLS,
                                quantity=f"cosine(STAC-R) - cosine({other}), per batch", values=ours, baseline=base,
                                unit="batch", units=units, target=0.0, op=">", name=f"{key}_above_{other}"))
        ours, base, units = pair("grad_cosine", "cosine", model, "svd", "untracked", "batch")
        competitors.append(competitor(f"{key}_above_untracked", f"{label}: the iso-byte per-step SVD is above the "
                                      "untracked basis too", competitor="a per-step SVD stored with its basis at equal "
                                      "bytes", quantity="cosine(svd) - cosine(untracked), per batch", values=ours,
                                      baseline=base, unit="batch", units=units, target=0.0, op=">"))
        values = per_unit(rows, "grad_cosine", "batch", kind="cosine", model=model, method="random")
        controls.append(claim(f"control: an iso-byte random projection (CompAct-style) reaches the {label} cosine",
                              paper=PAPER_COS, quantity=cos_q, values=list(values.values()), unit="batch",
                              units=list(values), target=0.98, op=">="))
        if cfg["val_steps"] and has("val", model, "stac_r"):
            ours, base, units = pair("val_loss", "val", model, "stac_r", "exact", "val_batch")
            claims.append(claim(f"{label}: validation loss within 1.5% of exact after equal steps", paper=PAPER_PPL,
                                quantity="validation loss(STAC-R) / loss(exact) per validation batch, geometric mean",
                                values=ours, baseline=base, compare="ratio", unit="val batch", units=units,
                                target=1.015, op="<="))
    _turbo_claims(rows, claims, controls)
    return claims, controls, premises, competitors


def _turbo_claims(rows: list[dict[str, Any]], claims: list[dict[str, Any]], controls: list[dict[str, Any]]) -> None:
    """Turbo: memory at most 0.005 GiB above full STAC-R's, and 0.67x its step time (an identical copy must fail)."""
    def pair(metric: str, kind: str, a: str, b: str, unit: str) -> tuple[list[float], list[float], list]:
        return paired(rows, metric, {"kind": kind, "model": "minilm", "method": a},
                      {"kind": kind, "model": "minilm", "method": b}, unit=unit)

    ours, base, units = pair("peak_total_mib", "memory", "turbo", "stac_r", "step")
    claims.append(claim("Turbo (STAC-R lite + GaLore) on minilm: total peak at most 0.005 GiB above full STAC-R's",
                        paper=PAPER_TURBO, quantity="peak total(Turbo) - peak total(STAC-R), GiB, per measured step",
                        values=[v / 1024 for v in ours], baseline=[v / 1024 for v in base], unit="step", units=units,
                        target=0.005, op="<="))
    time_q = "step time(method) / step time(full STAC-R), interleaved rounds, geometric mean"
    ours, base, units = pair("step_seconds", "timing", "turbo", "stac_r", "round")
    claims.append(claim("Turbo on minilm: step time <= 0.67x full STAC-R's", paper=PAPER_TURBO, quantity=time_q,
                        values=ours, baseline=base, compare="ratio", unit="round", units=units, target=0.67, op="<="))
    ours, base, units = pair("step_seconds", "timing", "stac_r_copy", "stac_r", "round")
    controls.append(claim("control: an identical copy of full STAC-R passes the same 0.67x test", paper=PAPER_TURBO,
                          quantity=time_q, values=ours, baseline=base, compare="ratio", unit="round", units=units,
                          target=0.67, op="<="))
