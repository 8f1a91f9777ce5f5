"""STAC-R benchmark: the total training peak, measured, with gradient cosine and validation loss beside it.

**Models** (:mod:`lit_lowrank.benchmarks._stac_r_models`): pretrained SmolLM2-135M (Llama,
SwiGLU) fine-tuned as a causal LM on packed Lee-corpus windows (quick: 1 × 128 tokens, the
predictor only; full: 4 × 256 per step), every ``*_proj`` of its 30 blocks compressed; pretrained
all-MiniLM-L6-v2 fine-tuned on the embedded sentiment tweets (quick 16 × 64 tokens, full 32 × 64), every Linear
of its 6 blocks compressed. AdamW (lr 1e-5 / 5e-5, no weight decay), fp32, CPU threads 2.

**Memory** is the paper's quantity: the total training peak — parameters, gradients,
optimizer state, activations and every transient — measured per variant in a
:class:`~lit_lowrank.ops.peak_memory.PeakMemory` session that opens before the variant's
copy of the model is built (CPU: the profiler's allocator events; CUDA:
``max_memory_allocated``, reset per segment), one fresh variant at a time. Each variant
runs a first step (STAC-R's calibration: exact, bases from its SVD), then measured steps on
the same batches for every variant: the paired units of the memory claims. Each step is
measured in two phases, forward + backward and the optimizer step (parameters + gradients +
optimizer state, no activation alive), so a row says which one sets the peak.

**Gradient cosine** (unit: batch): per compressed layer ``cos(GᵀX̂, GᵀX)`` on diagnosed steps
after the measured ones (the exact inputs are kept aside; STAC-R leaves ``G`` exact), the
mean over layers. **Validation loss** beside it, after the same steps (quick mode trains
too few steps to separate methods by it: a column, not a claim; the full run trains
``val_steps`` more steps per variant and claims it).

**Controls**: a rank-``d`` basis with fp32 coefficients (no compression) must not show the
reduction; an iso-byte random projection (CompAct-style) must not reach the cosine; the
Turbo timing test against an identical copy of STAC-R must not pass; a predictor blind to
shared inputs must not match the measured per-projection savings.

**The predictor** (SSP, :mod:`lit_lowrank.ops.saved_surface`): recorded once on the exact
run's first measured step, priced for every choice of layers: per projection type
(``q/k/v/o/gate/up/down``) its predicted saved-activation reduction against the measured one
(forward-only ablations on the same batch), and the total peak it predicts
(:func:`~lit_lowrank.ops.saved_surface.predict_total_peak_timeline`) against the measured.
**SwiGLU regime**: the MLP's gate/up (one input read by two projections) and down at
higher ranks with fp32 coefficients, predicted and measured. **Turbo** (quick on MiniLM,
full on SmolLM2): STAC-R without the residual, its basis refreshed every 8 steps, with
GaLoreAdamW on the compressed Linears, against full STAC-R: peak memory and interleaved
step-time rounds. Baselines beside the rows: transformers' activation checkpointing and
GaLore alone (full mode only).

Quick (≲ 300 CPU-s on 2 cores): memory, cosine and Turbo on MiniLM (16 × 64 tokens); SmolLM2 only for the
predictor and SwiGLU claims (one recorded exact step on 1 × 128 tokens, forward-only ablations), see
:func:`_setting`. Full: everything on both models (≈ 1 hour or more on an idle 2-core CPU, minutes on a GPU).
"""

from __future__ import annotations

import gc
import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lit_lowrank.benchmarks._stac_r_models import (
    Spec,
    Task,
    Variant,
    forward_saved_bytes,
    mean,
    minilm_task,
    set_code,
    smollm2_task,
    to_device,
)
from lit_lowrank.benchmarks._timing import interleaved_samples
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, paired, per_unit, statistic_claim
from lit_lowrank.ops.peak_memory import PeakMemory
from lit_lowrank.ops.saved_surface import SurfaceRecorder, predict_total_peak, predict_total_peak_timeline
from lit_lowrank.ops.saved_tensors import MIB
from lit_lowrank.ops.stac_r import compressed_nbytes

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
    """Quick (≲ 300 CPU-seconds on 2 cores): memory, cosine, Turbo on MiniLM; SmolLM2 for the predictor only.

    Measured on the loaded 2-core machine: a SmolLM2-135M training step costs 13-19 CPU-s exact and
    29-41 CPU-s with STAC-R whatever the tokens (2x128 or 2x256: AdamW over 135M parameters and 210
    compressed Linears set it), so quick cannot afford its memory sessions (3 variants x 3 steps)
    and cosine steps; it keeps one recorded exact step (1x128 tokens) and the forward-only ablations.
    """
    if quick:
        return dict(smol=dict(seq=128, batch=1, mem_steps=1, methods=[], cosine=[], val=[]),
                    minilm=dict(batch=16, max_length=64, methods=["rank_d"]), rank=32, density=0.01,
                    mem_steps=2, diag_steps=2, n_val=1, minilm_val=4, val_steps=0, turbo_task="minilm",
                    turbo_rounds=5, galore_rank=128, sweep_ranks=(128, 288),
                    lr={"smollm2": 1e-5, "minilm": 5e-5})
    return dict(smol=dict(seq=256, batch=4, mem_steps=3, methods=["stac_r", "rank_d", "checkpoint", "galore"],
                          cosine=["stac_r", "random", "untracked", "svd"], val=["exact", "stac_r", "random"]),
                minilm=dict(batch=32, max_length=64, methods=["rank_d", "checkpoint", "galore"]), rank=32,
                density=0.01, mem_steps=3, diag_steps=5, n_val=8, minilm_val=16, val_steps=40, turbo_task="smollm2",
                turbo_rounds=7, galore_rank=128, sweep_ranks=(64, 128, 288, 448),
                lr={"smollm2": 1e-5, "minilm": 5e-5})


def _specs(cfg: dict[str, Any]) -> dict[str, Spec]:
    r, rho = cfg["rank"], cfg["density"]
    return {
        "exact": Spec("exact"),
        "stac_r": Spec("stac_r", "tracked", r, rho),
        "rank_d": Spec("rank_d", "tracked", 0, rho, coef_dtype="float32"),  # full rank per layer
        "random": Spec("random", "random", r, rho),
        "untracked": Spec("untracked", "untracked", r, rho),
        "svd": Spec("svd", "svd", r, rho),
        "checkpoint": Spec("checkpoint", checkpoint=True),
        "galore": Spec("galore", galore_rank=cfg["galore_rank"]),
        "turbo": Spec("turbo", "tracked", r, 0.0, update_every=8, galore_rank=cfg["galore_rank"]),
        "stac_r_copy": Spec("stac_r_copy", "tracked", r, rho),
    }


# -- memory ---------------------------------------------------------------------------------------------------------
def _step_peaks(meter: PeakMemory) -> list[tuple[int, int]]:
    """``(forward+backward peak, optimizer peak)`` per measured step."""
    fb = [s.peak for s in meter.segments if s.name == "forward_backward"]
    opt = [s.peak for s in meter.segments if s.name == "optimizer"]
    return list(zip(fb, opt))


def _measure(task: Task, spec: Spec, cfg: dict[str, Any], device: str, record: bool = False,
             mem_steps: int | None = None) -> tuple[list[dict[str, Any]], Variant, PeakMemory, SurfaceRecorder | None]:
    """A fresh variant in its own session: one calibration step, then ``mem_steps`` measured steps (a row each).

    ``record``: the predictor's recording of the first measured step (every target Linear tagged).
    """
    gc.collect()
    rows, seconds, recorder = [], [], None
    with PeakMemory(device) as meter:
        variant = Variant(task, spec, cfg["lr"][task.name], meter)
        if record:
            recorder = SurfaceRecorder(variant.model, {n: m for n, m in variant.model.named_modules()
                                                       if isinstance(m, torch.nn.Linear) and re.search(task.target, n)})
        variant.step(task.train[0])
        for k in range(1, (mem_steps or cfg["mem_steps"]) + 1):
            seconds.append(variant.step(task.train[k], meter=meter, counter=recorder if k == 1 else None)["seconds"])
    for k, ((fb, opt), sec) in enumerate(zip(_step_peaks(meter), seconds), start=1):
        rows.append({"kind": "memory", "model": task.name, "method": spec.name, "step": k,
                     "peak_total_mib": max(fb, opt) / MIB,
                     "activation_phase_mib": fb / MIB, "optimizer_phase_mib": opt / MIB,
                     "peak_set_by": "optimizer" if opt >= fb else "forward/backward", "seconds": sec})
    return rows, variant, meter, recorder


def _diagnose(variant: Variant, task: Task, first: int, steps: int) -> list[dict[str, Any]]:
    rows = []
    for k in range(first, first + steps):
        out = variant.step(task.train[k], diagnose=True)
        rows.append({"kind": "cosine", "model": task.name, "method": variant.spec.name, "batch": k,
                     "grad_cosine": out["cosine"],
                     "grad_cosine_min": out["cosine_min"], "layers": out["cosine_layers"]})
    return rows


def _price(spec: Spec, rank: int | None = None, dtype: str | None = None) -> Callable[[str, int, int], int]:
    coef = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype or spec.coef_dtype]

    def price(name: str, n: int, d: int) -> int:
        return compressed_nbytes(n, d, min(rank or spec.rank or d, d), spec.density, coef)

    return price


def _predicted_total(recorder: SurfaceRecorder, meter: PeakMemory, spec: Spec) -> dict[str, float]:
    """The predictor's numbers for ``spec`` from the exact run's recorded first measured step."""
    report = recorder.report(_price(spec))
    fb = next(s for s in meter.segments if s.name == "forward_backward")
    opt = next(s for s in meter.segments if s.name == "optimizer")
    exact_peak = max(fb.peak, opt.peak)
    if meter.events:  # CPU: the measured memory timeline minus the saving of what is alive at each instant
        predicted = predict_total_peak_timeline(meter.events, fb.start, fb.t0, fb.t1, recorder.saving_timeline(),
                                                opt.peak)
    else:  # CUDA: the saving at the saved peak off the forward/backward phase's peak
        predicted = predict_total_peak(fb.peak, opt.peak, report.saving_bytes)
    return {"ssp": report.compressible_bytes / exact_peak, "ssp_saved": report.ssp,
            "predicted_saved_reduction": report.predicted_reduction,
            "predicted_total_reduction": 1 - predicted / exact_peak, "increasing_layers": len(report.increasing)}


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
        report = recorder.report(_price(spec, rank, dtype), subset=chosen)
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
def _study(task: Task, cfg: dict[str, Any], device: str, methods: list[str], cosine_methods: list[str],
           val_methods: list[str], predictor: bool, keep_stac: bool,
           mem_steps: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Variant | None]:
    """Memory (per variant, sequentially), cosine, validation loss and (SmolLM2) the predictor on one task."""
    specs = _specs(cfg)
    rows: list[dict[str, Any]] = []
    summary: dict[str, dict[str, Any]] = {}
    recorder, exact_meter, kept = None, None, None
    mem_steps = mem_steps or cfg["mem_steps"]
    extra = 1 + mem_steps + cfg["diag_steps"]
    for name in dict.fromkeys(methods + cosine_methods):
        if name in methods:
            record = predictor and name == "exact"
            mem_rows, variant, meter, rec = _measure(task, specs[name], cfg, device, record=record,
                                                   mem_steps=mem_steps)
            rows += mem_rows
            if rec is not None:
                recorder, exact_meter = rec, meter
            summary[name] = {"model": task.name, "method": name,
                             "peak_total_mib": mean([r["peak_total_mib"] for r in mem_rows]),
                             "activation_phase_mib": mean([r["activation_phase_mib"] for r in mem_rows]),
                             "optimizer_phase_mib": mean([r["optimizer_phase_mib"] for r in mem_rows]),
                             "peak_set_by": mem_rows[-1]["peak_set_by"]}
        else:  # cosine only: calibrated on the same first batch (one forward; a per-step basis needs none), then
            gc.collect()  # the same diagnosed batches: a frozen or per-step basis does not depend on the batches in
            variant = Variant(task, specs[name], cfg["lr"][task.name])  # between, and at this lr the weights
            if specs[name].basis in ("tracked", "untracked"):  # barely move in two steps
                variant.calibrate_forward(task.train[0])
            else:
                variant.steps = 1
            summary[name] = {"model": task.name, "method": name}
        if name in cosine_methods:
            cos_rows = _diagnose(variant, task, 1 + mem_steps, cfg["diag_steps"])
            rows += cos_rows
            summary[name]["grad_cosine"] = mean([r["grad_cosine"] for r in cos_rows])
        if name in val_methods:
            for k in range(cfg["val_steps"]):
                variant.step(task.train[extra + k % (len(task.train) - extra)])
            losses = variant.val_losses()
            summary[name]["val_loss"] = mean(losses)
            rows += [{"kind": "val", "model": task.name, "method": name, "val_batch": i, "val_loss": v,
                      "train_steps": variant.steps} for i, v in enumerate(losses)]
        if name == "stac_r" and keep_stac:
            kept = variant
        del variant
    exact = summary["exact"]
    for s in summary.values():
        if "peak_total_mib" in s:
            s["total_reduction"] = 1 - s["peak_total_mib"] / exact["peak_total_mib"]
        if s["method"] in ("exact", "checkpoint"):
            s["grad_cosine"] = 1.0
        if recorder is not None and exact_meter is not None and specs[s["method"]].basis is not None \
                and s["method"] in methods:
            s.update(_predicted_total(recorder, exact_meter, specs[s["method"]]))
    if predictor and recorder is not None:
        rows += _ablations(task, recorder, cfg, specs["stac_r"], task.train[1])  # the recorded step's batch
    return rows, list(summary.values()), kept


def run(quick: bool, seed: int) -> BenchmarkResult:
    torch.set_num_threads(2)
    cfg = _setting(quick)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # PeakMemory measures where the run allocates
    start = time.perf_counter()
    n_train = 1 + cfg["mem_steps"] + cfg["diag_steps"] + max(cfg["val_steps"], cfg["turbo_rounds"] + 1, 1)
    smol_cfg, mini_cfg = cfg["smol"], cfg["minilm"]
    smol = to_device(smollm2_task(smol_cfg["seq"], smol_cfg["batch"], n_train, cfg["n_val"], seed), device)
    smol_rows, smol_summary, smol_stac = _study(
        smol, cfg, device, ["exact"] + smol_cfg["methods"], smol_cfg["cosine"], smol_cfg["val"], predictor=True,
        keep_stac=cfg["turbo_task"] == "smollm2", mem_steps=smol_cfg["mem_steps"])
    if cfg["turbo_task"] != "smollm2":  # the pretrained copy (every variant was a deepcopy of it) is done
        smol.model = None  # type: ignore[assignment]
        gc.collect()
    seconds_smol = time.perf_counter() - start
    minilm = to_device(minilm_task(mini_cfg["batch"], mini_cfg["max_length"], n_train, cfg["minilm_val"], seed),
                       device)
    mini_rows, mini_summary, mini_stac = _study(
        minilm, cfg, device, ["exact", "stac_r"] + mini_cfg["methods"], ["stac_r", "random", "untracked"],
        ["exact", "stac_r"] + (["random"] if cfg["val_steps"] else []), predictor=False,
        keep_stac=cfg["turbo_task"] == "minilm")
    turbo_task, stac = (smol, smol_stac) if cfg["turbo_task"] == "smollm2" else (minilm, mini_stac)
    assert stac is not None
    turbo_rows = _turbo(turbo_task, _specs(cfg), cfg, device, stac)
    del smol_stac, mini_stac, stac
    rows = smol_rows + mini_rows + turbo_rows
    summary = smol_summary + mini_summary + _turbo_summary(turbo_rows, rows, turbo_task.name)
    claims, controls = _claims(rows, turbo_task.name, cfg)
    notes = {"settings": {k: v for k, v in cfg.items() if k != "lr"}, "lr": cfg["lr"],
             "threads": torch.get_num_threads(),
             "tokens_per_step": {"smollm2": smol.tokens_per_step, "minilm": minilm.tokens_per_step},
             "memory": "total training peak per variant: a PeakMemory session opened before the variant's copy of the "
                       "model is built (CPU: the profiler's allocator events; CUDA: max_memory_allocated); phases: "
                       "forward+backward and the optimizer step",
             "turbo": "STAC-R without residual, basis updated every 8 steps, GaLoreAdamW rank 128 on the compressed "
                      "Linears (update_proj_gap 200, scale 1), against full STAC-R with AdamW",
             "seconds_smollm2": round(seconds_smol, 1), "seconds": round(time.perf_counter() - start, 1)}
    return BenchmarkResult(rows, claims, controls, notes, summary)


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
def _claims(rows: list[dict[str, Any]], turbo_model: str,
            cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def pair(metric: str, kind: str, model: str, a: str, b: str, unit: str) -> tuple[list[float], list[float], list]:
        return paired(rows, metric, {"kind": kind, "model": model, "method": a}, {"kind": kind, "model": model,
                                                                                 "method": b}, unit=unit)

    def peak(model: str, method: str, text: str, paper: str) -> dict[str, Any]:
        ours, base, units = pair("peak_total_mib", "memory", model, method, "exact", "step")
        return claim(text, paper=paper, quantity="total training peak (measured) of the method / of exact "
                     "fine-tuning, per measured step (same batch), geometric mean; <= 0.93 means >= 7% less",
                     values=ours, baseline=base, compare="ratio", unit="step", units=units, target=0.93, op="<=")

    def cosine(model: str, method: str, text: str) -> dict[str, Any]:
        values = per_unit(rows, "grad_cosine", "batch", kind="cosine", model=model, method=method)
        return claim(text, paper=PAPER_COS, quantity="weight-gradient cosine to the exact gradient of the same step, "
                     "mean over the compressed layers, per batch", values=list(values.values()), unit="batch",
                     units=list(values), target=0.98, op=">=")

    def has(kind: str, model: str, method: str) -> bool:
        return any(r.get("kind") == kind and r.get("model") == model and r.get("method") == method for r in rows)

    claims: list[dict[str, Any]] = []
    controls: list[dict[str, Any]] = []
    for model, label, paper in (("smollm2", "SmolLM2-135M", PAPER_PEAK), ("minilm", "all-MiniLM-L6-v2", PAPER_BERT)):
        # each claim where its rows were measured (quick: memory and cosine on MiniLM only, see _setting)
        if has("memory", model, "stac_r"):
            claims.append(peak(model, "stac_r", f"{label} fine-tuning: total training peak >= 7% below exact", paper))
        if has("cosine", model, "stac_r"):
            claims.append(cosine(model, "stac_r", f"{label}: mean weight-gradient cosine >= 0.98"))
        for other, text in (("untracked", "the untracked (frozen at calibration) one"), ("svd", "the iso-byte per-step "
                                                                                          "SVD")):
            if has("cosine", model, "stac_r") and has("cosine", model, other):
                ours, base, units = pair("grad_cosine", "cosine", model, "stac_r", other, "batch")
                claims.append(claim(f"{label}: gradient cosine of the tracked basis above {text}", paper=PAPER_CONTROLS,
                                    quantity=f"cosine(STAC-R) - cosine({other}), per batch", values=ours,
                                    baseline=base, unit="batch", units=units, target=0.0, op=">"))
        if has("memory", model, "rank_d"):
            controls.append(peak(model, "rank_d", f"control: a rank-d basis with fp32 coefficients (no compression) "
                                 f"shows the same {label} reduction", paper))
        if has("cosine", model, "random"):
            controls.append(cosine(model, "random", f"control: an iso-byte random projection (CompAct-style) reaches "
                                   f"the {label} cosine"))
    # Turbo: memory at most 0.005 GiB above full STAC-R's, and 0.67x its step time
    ours, base, units = pair("peak_total_mib", "memory", turbo_model, "turbo", "stac_r", "step")
    claims.append(claim(f"Turbo (STAC-R lite + GaLore) on {turbo_model}: total peak at most 0.005 GiB above full "
                        "STAC-R's", paper=PAPER_TURBO, quantity="peak total(Turbo) - peak total(STAC-R), GiB, per "
                        "measured step", values=[v / 1024 for v in ours], baseline=[v / 1024 for v in base],
                        unit="step", units=units, target=0.005, op="<="))
    time_q = "step time(method) / step time(full STAC-R), interleaved rounds, geometric mean"
    ours, base, units = pair("step_seconds", "timing", turbo_model, "turbo", "stac_r", "round")
    claims.append(claim(f"Turbo on {turbo_model}: step time <= 0.67x full STAC-R's", paper=PAPER_TURBO,
                        quantity=time_q, values=ours, baseline=base, compare="ratio", unit="round", units=units,
                        target=0.67, op="<="))
    ours, base, units = pair("step_seconds", "timing", turbo_model, "stac_r_copy", "stac_r", "round")
    controls.append(claim("control: an identical copy of full STAC-R passes the same 0.67x test", paper=PAPER_TURBO,
                          quantity=time_q, values=ours, baseline=base, compare="ratio", unit="round", units=units,
                          target=0.67, op="<="))
    # the predictor per projection type, and the SwiGLU regime on the MLP projections
    per_type = [r for r in rows if r.get("kind") == "ablation" and r["projections"] in PROJECTIONS]
    types = [r["projections"] for r in per_type]
    for key, text, where in (("predicted_saved_reduction", "SmolLM2-135M: the predictor's saved-activation reduction "
                              "per projection type within 1 point of the measured one", claims),
                             ("naive_saved_reduction", "control: a predictor blind to shared inputs (every input "
                              "counted as freed) within 1 point per projection type", controls)):
        err = np.array([r[key] - r["measured_saved_reduction"] for r in per_type])
        where.append(statistic_claim(text, paper=PAPER_SSP, quantity="mean over projection types of |predicted - "
                                     "measured| saved-activation reduction (forward-only ablations, same batch)",
                                     n_units=len(err), statistic=lambda idx, e=err: float(np.abs(e[idx]).mean()),
                                     unit="projection type", units=types, target=0.01, op="<="))
    mlp = [r for r in rows if r.get("kind") == "ablation" and r["mlp"]]
    cells = [f"{r['projections']}@{r['rank']}/{r['coef_dtype']}" for r in mlp]
    measured = np.array([r["measured_saved_reduction"] > 0 for r in mlp])
    increasing = int((~measured).sum())
    for key, text, where in (("predicted_saved_reduction", f"SmolLM2-135M SwiGLU MLP: the predictor names the "
                              f"memory-increasing cells ({increasing} of {len(mlp)} measured increasing)", claims),
                             ("naive_saved_reduction", "control: the sharing-blind predictor names them", controls)):
        agree = np.array([(r[key] > 0) == m for r, m in zip(mlp, measured)], dtype=float)
        where.append(statistic_claim(text, paper=PAPER_SWIGLU, quantity="fraction of MLP (projections, rank, coef "
                                     "dtype) cells where the predicted and the measured sign of the saved-activation "
                                     "saving agree", n_units=len(agree), statistic=lambda idx, a=agree:
                                     float(a[idx].mean()), unit="cell", units=cells, target=0.95, op=">="))
    if cfg["val_steps"]:
        for model in ("smollm2", "minilm"):
            for method, where, text in (("stac_r", claims, f"{model}: validation loss within 1.5% of exact after "
                                         f"{cfg['val_steps']} more steps"),
                                        ("random", controls, f"control: {model} random projection within 1.5%")):
                ours, base, units = pair("val_loss", "val", model, method, "exact", "val_batch")
                where.append(claim(text, paper=PAPER_PPL, quantity="validation loss(method) / loss(exact) per "
                                   "validation batch, geometric mean", values=ours, baseline=base, compare="ratio",
                                   unit="val batch", units=units, target=1.015, op="<="))
    return claims, controls
