"""MoE quantization: MXFP4 QAT with limited routing replay and load-aware low-rank compensation, W4A8 as served.

**Target** (:mod:`~lit_lowrank.benchmarks.moe_quant.target`): a tiny Qwen3-MoE with **12 MoE layers** (16 experts,
top-2, hidden 64, expert width 64, byte vocabulary) trained in full precision on the Lee news corpus + the text8
excerpt, cached on disk. Deep enough that upstream quantization error flips routes downstream (the 4-layer target
of the first runs flipped 1.9% of top-2 slots under RTN: nothing for replay to repair). Every expert
(``gate_up_proj`` and ``down_proj``) is MXFP4 and, as served (W4A8), both expert GEMMs read **FP8 E4M3 per-token
activations** (:func:`~lit_lowrank.ops.mx_extras.fp8_act_fake_quant`); attention, routers and embeddings stay
float32. The FP row is the float model (no activation quantization).

**Rows** (per seed and held-out text chunk; every method of a seed starts from the same FP weights):

- ``fp``; ``rtn``: RTN-MXFP4 (W4A8), nothing else; ``rtn_fp_routes``: the same model evaluated with the FP
  model's routes forced (the oracle of the premise: what route consistency alone could repair).
- ``gptq_mxfp4``: the prior-method baseline — GPTQ onto the MXFP4 grid per expert matrix with the Hessian of its
  own routed inputs (:mod:`~lit_lowrank.quant.moe_baselines`), 4.25 bits/weight.
- ``mixed_fp8``: the **equal-bits competitor** — no compensators; the bits the method's compensators take are
  spent on keeping the expert matrices with the largest load-weighted error reduction per bit in MXFP8.
- ``svd_uniform`` / ``svd_load``: + compensators from the SVD of ``W - Q(W)``, no training, ranks uniform
  (``AVG_RANK`` each) or load-aware (greedy, same total rank); ``svd_random`` (control): the load-aware ranks on
  random subspaces.
- ``qat_*``: those compensators trained (only they train; Adam, lr 3e-3) on ``KL(p_FP || p_Q)`` alone through the
  real callbacks (:class:`MoEQuantQAT` with ``act_quant=True``, :class:`RoutingReplay`; without replay its replay
  probability is 0, so the same FP pass and KL run and only the replay differs): ``qat_noreplay_load``,
  ``qat_replay_load`` (the method: replay annealed linearly 1 -> 0, routers frozen) and ``qat_replay_shuffled``
  (control: the FP routes permuted across tokens). Full mode adds ``qat_replay_uniform`` and ``qat_noreplay_uniform``.

Columns: ``ppl`` of each held-out chunk with the model's own routing, ``flip_rate`` = ``1 -`` mean top-k agreement
``|S_Q ∩ S_FP| / k`` with the FP model's routes on the same tokens, ``bits_per_weight`` of the experts counting
**every stored parameter** (MXFP4 codes + E8M0 scales + MXFP8 upgrades + BF16 compensator factors),
``weighted_residual`` = ``Σ p_e ‖W_e - Q(W_e) - B_e A_e‖² / Σ p_e ‖W_e - Q(W_e)‖²``.

**Premises**: RTN leaves a perplexity gap to FP; forcing the FP routes into the RTN model lowers its perplexity
(route flips cost something replay could repair). **Claims** (paired over held-out chunks; quick: one FP model,
full: three): the method below RTN and below GPTQ-MXFP4 (competitor: ``mixed_fp8`` at equal bits), below QAT
without replay (replay's share) with higher routing agreement, training-free load-aware ranks below uniform.
**Controls**: shuffled-route replay in place of the method, random-subspace compensators in place of the SVD ones.
"""

from __future__ import annotations

import copy
import math
import statistics
from typing import Any

import torch

from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, paired, premise
from lit_lowrank.benchmarks.moe_quant.target import FP_RECIPE, MODEL_CONFIG, target_data, target_model

AVG_RANK = 2
LR_QAT = 3e-3
#: QAT distils the FP model only (KL, no task loss): task training would change the perplexity for
#: reasons unrelated to quantization.
CE_WEIGHT = 0.0
#: W4A8 as served: FP8 activations at every quantized expert GEMM.
ACT_QUANT = True
PAPER = ("experiments on the MXFP4 quantization of Mixtral, DeepSeek, and Qwen3 MoE models show that our "
         "method improves perplexity and downstream accuracy over prior methods")
PAPER_REPLAY = ("limited routing replay, which replays BF16 routes during quantization-aware fine-tuning (QAT), "
                "freezes router parameters, and updates only expert-side adapter parameters")
PAPER_LOAD = ("load-aware low-rank compensation that assigns larger compensation rank to heavily loaded experts "
              "[...] under a fixed rank budget")


def _settings(quick: bool) -> dict[str, Any]:
    return {"seeds": 1 if quick else 3, "qat_steps": 60 if quick else 300, "chunks": 16 if quick else 32,
            "batches_per_chunk": 2 if quick else 4, "calib_batches": 4 if quick else 16}


def _chunks(dm: Any, n: int, per: int) -> list[list[dict[str, Any]]]:
    """``n`` chunks of ``per`` consecutive val batches, spread evenly over the val split (both sources)."""
    vals = list(dm.val_dataloader())
    starts = torch.linspace(0, len(vals) - per, n).round().long().tolist()
    return [vals[s:s + per] for s in starts]


@torch.no_grad()
def _evaluate(module: Any, chunks: list[list[dict[str, Any]]], fp_routes: bool = False) -> list[dict[str, Any]]:
    """Per chunk: token-weighted perplexity (own routing, or the FP routes forced with ``fp_routes``), the
    top-k flip rate against the FP routes (overall and per layer)."""
    from lit_lowrank.quant.moe import fp_reference
    from lit_lowrank.quant.moe_routing import RouteController

    module.eval()
    ctl = RouteController(module)
    out = []
    try:
        for chunk in chunks:
            nll, tokens, layers = 0.0, 0, []
            for batch in chunk:
                with fp_reference(module), ctl.mode("record"):
                    module.step(batch)
                with ctl.mode("replay" if fp_routes else "observe"):
                    loss = float(module.step(batch)["loss"])
                layers.append(ctl.agreement_per_layer())
                n = int((batch["labels"] != -100).sum())
                nll, tokens = nll + loss * n, tokens + n
            per_layer = [1 - statistics.mean(a[i] for a in layers) for i in sorted(layers[0])]
            out.append({"ppl": math.exp(nll / tokens), "flip_rate": statistics.mean(per_layer),
                        "agreement": 1 - statistics.mean(per_layer), "flip_rate_per_layer": per_layer,
                        "tokens": tokens})
    finally:
        ctl.remove()
    return out


def _qat(fp: Any, dm: Any, allocation: str, route_source: str | None, steps: int, calib: int, seed: int) -> Any:
    """Compensator QAT through the callbacks; ``route_source=None`` is QAT without replay."""
    import lightning.pytorch as pl

    from lit_lowrank.callbacks.moe_quant import MoEQuantQAT, RoutingReplay

    torch.manual_seed(seed)
    module = copy.deepcopy(fp).train()
    module.optimizer_factory = lambda params: torch.optim.Adam(params, lr=LR_QAT)
    callbacks = [MoEQuantQAT(avg_rank=AVG_RANK, allocation=allocation, calibration_batches=calib,
                             act_quant=ACT_QUANT),
                 RoutingReplay(replay_start=0.0 if route_source is None else 1.0, replay_end=0.0, schedule="linear",
                               kl_weight=1.0, ce_weight=CE_WEIGHT, val_agreement=False, seed=seed,
                               route_source=route_source or "fp")]
    trainer = pl.Trainer(max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         num_sanity_val_steps=0, accelerator="cpu", devices=1)
    trainer.fit(module, datamodule=dm)
    return module


def _seed_rows(dm: Any, seed: int, cfg: dict[str, Any], chunks: list) -> list[dict[str, Any]]:
    from lit_lowrank.quant.moe import (
        allocate_expert_ranks,
        apply_moe_quant,
        expert_loads,
        expert_residual_spectra,
        load_weighted_error,
        moe_experts,
    )
    from lit_lowrank.quant.moe_baselines import allocate_fp8_experts, apply_gptq_mxfp4, expert_hessians
    from lit_lowrank.quant.ptq import default_forward

    fp = target_model(dm, seed)
    calib = [b for _, b in zip(range(cfg["calib_batches"]), dm.train_dataloader())]
    loads = expert_loads(fp, calib, default_forward)
    spectra = expert_residual_spectra(fp)
    rows: list[dict[str, Any]] = []

    def finish(name: str, module: Any, fp_routes: bool = False) -> None:
        experts = moe_experts(module)
        storage = [e.storage() for e in experts.values()]
        extra = {"weighted_residual": load_weighted_error(module, loads) if experts else 0.0,
                 "compensator_params": sum(e.trainable_parameters() for e in experts.values()),
                 "bits_per_weight": (sum(s.payload_bits + s.scale_bits for s in storage)
                                     / sum(s.num_weights for s in storage)) if storage else 32.0}
        for i, chunk in enumerate(_evaluate(module, chunks, fp_routes)):
            rows.append({"method": name, "seed": seed, "chunk": i, "unit": f"s{seed}-c{i}", **chunk, **extra})

    finish("fp", fp)
    rtn = apply_moe_quant(copy.deepcopy(fp), act_quant=ACT_QUANT)
    finish("rtn", rtn)
    finish("rtn_fp_routes", rtn, fp_routes=True)
    finish("gptq_mxfp4", apply_gptq_mxfp4(copy.deepcopy(fp), expert_hessians(fp, calib, default_forward),
                                          act_quant=ACT_QUANT))
    ranks = {a: allocate_expert_ranks(spectra, loads, AVG_RANK, allocation=a) for a in ("uniform", "load")}
    svd_load = apply_moe_quant(copy.deepcopy(fp), ranks=ranks["load"], act_quant=ACT_QUANT)
    comp_bits = sum(e.storage().payload_bits - e.storage(compensator_bits=None).payload_bits
                    for e in moe_experts(svd_load).values())
    finish("mixed_fp8", apply_moe_quant(copy.deepcopy(fp), act_quant=ACT_QUANT,
                                        fp8_experts=allocate_fp8_experts(fp, loads, comp_bits)))
    finish("svd_uniform", apply_moe_quant(copy.deepcopy(fp), ranks=ranks["uniform"], act_quant=ACT_QUANT))
    finish("svd_load", svd_load)
    finish("svd_random", apply_moe_quant(copy.deepcopy(fp), ranks=ranks["load"], init="random", seed=seed,
                                         act_quant=ACT_QUANT))
    runs = [("qat_noreplay_load", "load", None), ("qat_replay_load", "load", "fp"),
            ("qat_replay_shuffled", "load", "shuffled")]
    if cfg["seeds"] > 1:  # full mode: the allocation's share under QAT and the spec's fourth baseline too
        runs += [("qat_replay_uniform", "uniform", "fp"), ("qat_noreplay_uniform", "uniform", None)]
    for name, allocation, source in runs:
        finish(name, _qat(fp, dm, allocation, source, cfg["qat_steps"], cfg["calib_batches"], seed))
    return rows


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    mean = {m: statistics.mean(math.log(r["ppl"]) for r in rows if r["method"] == m) for m in methods}
    out = []
    for m in methods:
        sub = [r for r in rows if r["method"] == m]
        gap_rtn, gap = math.exp(mean["rtn"]) - math.exp(mean["fp"]), math.exp(mean[m]) - math.exp(mean["fp"])
        out.append({"method": m, "ppl": math.exp(mean[m]), "ppl_gap": gap,
                    "rtn_gap_repaired": 1 - gap / gap_rtn if gap_rtn > 0 else float("nan"),
                    "flip_rate": statistics.mean(r["flip_rate"] for r in sub),
                    "weighted_residual": statistics.mean(r["weighted_residual"] for r in sub),
                    "compensator_params": sub[0]["compensator_params"],
                    "bits_per_weight": sub[0]["bits_per_weight"]})
    return out


def _ratio_fields(rows: list[dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    va, vb, units = paired(rows, "ppl", {"method": a}, {"method": b}, unit="unit")
    return {"quantity": f"ppl({a}) / ppl({b}) per text chunk, geometric mean", "values": va, "baseline": vb,
            "compare": "ratio", "unit": "(seed, chunk)", "units": units, "target": 1.0, "op": "<"}


def claims_and_controls(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """Claims, controls, premises and competitors from the rows (paired over ``unit`` = (seed, chunk))."""
    methods = {r["method"] for r in rows}

    def ratio(text: str, a: str, b: str, paper: str, **kw: Any) -> dict[str, Any]:
        return claim(text, paper=paper, **_ratio_fields(rows, a, b), **kw)

    def agreement(text: str, a: str, b: str, **kw: Any) -> dict[str, Any]:
        va, vb, units = paired(rows, "agreement", {"method": a}, {"method": b}, unit="unit")
        return claim(text, paper=PAPER_REPLAY + "; a routing-consistency bound under router-margin conditions",
                     quantity=f"top-k agreement with FP routes, {a} - {b}, fraction", values=va, baseline=vb,
                     unit="(seed, chunk)", units=units, target=0.0, op=">", **kw)

    premises = [
        premise("rtn_gap", "RTN-MXFP4 (W4A8) leaves a perplexity gap to the FP model",
                needs="something for compensators / QAT to repair",
                **{**_ratio_fields(rows, "rtn", "fp"), "op": ">"}),
        premise("flips_cost", "forcing the FP routes into the RTN model lowers its perplexity (route flips cost "
                "perplexity)", needs="route flips under quantization that cost perplexity, so replaying FP routes "
                "has something to repair (the oracle of route consistency)",
                **_ratio_fields(rows, "rtn_fp_routes", "rtn")),
    ]
    claims = [
        ratio("replay-QAT + load-aware compensation (W4A8): perplexity below RTN-MXFP4", "qat_replay_load", "rtn",
              PAPER, name="below_rtn", requires="rtn_gap"),
        ratio("replay-QAT + load-aware compensation: perplexity below GPTQ-MXFP4 (prior method)", "qat_replay_load",
              "gptq_mxfp4", PAPER, name="below_gptq", requires="rtn_gap"),
        ratio("routing replay's share: perplexity below QAT without replay (same load-aware ranks)",
              "qat_replay_load", "qat_noreplay_load", PAPER_REPLAY, requires="flips_cost"),
        agreement("routing agreement with the FP model above QAT without replay's", "qat_replay_load",
                  "qat_noreplay_load", requires="flips_cost"),
        ratio("training-free: load-aware SVD compensators give lower perplexity than uniform ones",
              "svd_load", "svd_uniform", PAPER_LOAD, requires="rtn_gap"),
    ]
    if "qat_replay_uniform" in methods:
        claims.append(ratio("load-aware ranks' share: perplexity below replay-QAT with uniform ranks (same total "
                            "rank)", "qat_replay_load", "qat_replay_uniform", PAPER_LOAD, requires="rtn_gap"))
    equal_bits = "mixed MXFP4/MXFP8 at the method's bits/weight (no compensators)"
    competitors = [
        competitor("below_rtn", "equal bits: MXFP8 for the most loaded experts below RTN", competitor=equal_bits,
                   **_ratio_fields(rows, "mixed_fp8", "rtn")),
        competitor("below_gptq", "equal bits: MXFP8 for the most loaded experts below GPTQ-MXFP4",
                   competitor=equal_bits, **_ratio_fields(rows, "mixed_fp8", "gptq_mxfp4")),
    ]
    controls = [
        ratio("replay of shuffled routes (same loads, wrong tokens) beats QAT without replay",
              "qat_replay_shuffled", "qat_noreplay_load", PAPER_REPLAY),
        agreement("replay of shuffled routes raises routing agreement over QAT without replay",
                  "qat_replay_shuffled", "qat_noreplay_load"),
        ratio("random-subspace compensators (load-aware ranks, same bits) beat uniform SVD compensators",
              "svd_random", "svd_uniform", PAPER_LOAD),
    ]
    return claims, controls, premises, competitors


def run(quick: bool = True, seed: int = 0) -> BenchmarkResult:
    """Rows per (method, seed, chunk); claims and controls computed from them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is the fastest and steady on a shared machine
    try:
        cfg = _settings(quick)
        dm = target_data()
        chunks = _chunks(dm, cfg["chunks"], cfg["batches_per_chunk"])
        rows: list[dict[str, Any]] = []
        for s in range(seed, seed + cfg["seeds"]):
            rows += _seed_rows(dm, s, cfg, chunks)
    finally:
        torch.set_num_threads(threads)

    claims, controls, premises, competitors = claims_and_controls(rows)
    rtn_layers = [r["flip_rate_per_layer"] for r in rows if r["method"] == "rtn"]
    notes = {"target": f"Qwen3-MoE {MODEL_CONFIG['num_hidden_layers']} layers x 16 experts top-2, hidden 64, expert "
                       "width 64, byte vocab, Lee + text8 (cached per seed); W4A8: MXFP4 experts, FP8 E4M3 per-token "
                       "activations at the expert GEMMs", "model_config": MODEL_CONFIG, "fp_recipe": FP_RECIPE,
             "settings": cfg, "avg_rank": AVG_RANK, "lr_qat": LR_QAT, "threads": 1, "act_quant": ACT_QUANT,
             "rtn_flip_rate_per_layer": [statistics.mean(col) for col in zip(*rtn_layers)],
             "bits": "experts only: MXFP4 codes (4) + E8M0 scales (8/32) + MXFP8 upgrades (+4 each) + compensator "
                     "factors in BF16 (16 each)"}
    for r in rows:
        r.pop("flip_rate_per_layer", None)
    return BenchmarkResult(rows, claims, controls, notes=notes, summary=_summary(rows), premises=premises,
                           competitors=competitors)
