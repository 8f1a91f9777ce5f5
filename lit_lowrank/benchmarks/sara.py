"""SARA benchmark: step-adaptive SVD rank vs uniform rank, static SVD and fewer steps at equal MACs.

Workload: a small class-conditional DiT (diffusers ``DiTTransformer2DModel``, hidden 64,
4 blocks, patch 2; ~all MACs in Linear layers) trained as an ε-prediction DDPM on the
embedded 8×8 digits inside the benchmark (a few hundred AdamW steps; cached under
``$LIT_LOWRANK_CACHE`` or the temp dir, keyed by the training config and seed), sampled
with deterministic DDIM from fixed noise and labels (rows ``model="dit_eps"``). Two more sections
use ``DiffusionModule``'s own diffusers ``UNet2DModel`` (``TINY_UNET``: 32/64 channels, one
attention level, class embedding), trained the same way (fewer steps, batch 32, cached) as an
ε-prediction (``unet_eps``) and a v-prediction (``unet_v``) model: there the 3×3 convs hold ~93%
of the MACs, so every ungrouped conv is factored too (``include_conv=True``: ``C_out × C_in·k·k``),
and ``macs_linear`` means all factored layers. They run fewer samples and steps and are not timed
(quick-mode CPU budget); their claims carry a ``UNet ε:`` / ``UNet v:`` prefix.

Quality is the **error against the full-rank sampler from the same noise and labels**
(``rel_error`` = ‖x − x_full‖_F / ‖x_full‖_F over all samples; ``max_abs`` for exactness) and
**classifier agreement**: a logistic-regression digit classifier (trained on the real
digits) labels each sample; agreement = fraction of samples whose label equals the label of
its full-rank twin. MACs are exact counts (``ops/macs.py``): ``macs_linear`` = factored-layer
MACs / their full-rank MACs, ``macs_total`` = whole-network ratio (the patch-embedding conv
is never factored). ``wall_ratio`` = sampling time / full-rank sampling time (interleaved
medians, one thread; at this tiny scale Python overhead dominates, so wall clock is reported,
not claimed).

Rows per budget (fraction of factored-layer MACs): ``uniform`` (one rank fraction, bisected to
the budget), ``static`` (per-layer energy-kept SVD, bisected), ``sara_dp`` (calibrated on 8
warm-up labels with other noise), ``sara_online`` (its scale τ bisected until its realised MACs
meet the budget — a MACs match, no quality calibration; ``met_budget`` says whether the rule
can reach the budget at all: it keeps two full-rank warm-up steps and the full-rank steps its
cap inserts after each truncated one), ``fewer_steps`` (full rank, ⌈budget·T⌉
DDIM steps) and the pair ``sara_dp+fewer_steps``.

Claims (computed from the rows): full rank reproduces the original samples exactly; at equal
MACs SARA-DP's error < uniform's < static's; SARA-Online within 1.5× of SARA-DP (at the largest budget the online rule reaches); SARA-DP +
fewer steps has a larger MACs speedup than either alone, with error no more than the sum of
theirs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_lowrank.benchmarks._timing import interleaved_medians
from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.callbacks.sara_controller import SARAController
from lit_lowrank.ops.macs import count_macs
from lit_lowrank.ops.sara import factored_macs
from lit_lowrank.tasks.diffusion import TINY_UNET, DiffusionModule

DIT_CONFIG: dict[str, Any] = {"num_attention_heads": 2, "attention_head_dim": 32, "in_channels": 1, "out_channels": 1,
                              "num_layers": 4, "sample_size": 8, "patch_size": 2, "num_embeds_ada_norm": 10,
                              "norm_num_groups": 1}


def _digits() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0  # pixels 0..16 -> [-1, 1]
    return x, torch.tensor(data.target)


def _cache_dir() -> Path:
    root = Path(os.environ.get("LIT_LOWRANK_CACHE", Path(tempfile.gettempdir()) / "lit_lowrank_cache"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _train_cached(module: DiffusionModule, config: dict[str, Any], prefix: str, steps: int,
                  seed: int) -> DiffusionModule:
    """Train ``module`` on the digits with AdamW + one-cycle (``config``: batch, lr) or load it from the cache."""
    key = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    path = _cache_dir() / f"{prefix}_{key}.pt"
    if path.is_file():
        module.model.load_state_dict(torch.load(path, weights_only=True))
        return module.eval()
    x, y = _digits()
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(module.parameters(), lr=config["lr"])
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config["lr"], total_steps=steps, pct_start=0.1)
    module.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (config["batch"],), generator=generator)
        loss = module.step({"x": x[idx], "y": y[idx]}, generator=generator)["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    torch.save(module.model.state_dict(), path)
    return module.eval()


def train_digits_dit(steps: int, seed: int, prediction_type: str = "epsilon") -> DiffusionModule:
    """The benchmark's DiT: trained once per (config, steps, seed) and cached as a state dict."""
    from diffusers import DiTTransformer2DModel

    config = {"dit": DIT_CONFIG, "steps": steps, "seed": seed, "prediction_type": prediction_type,
              "batch": 64, "lr": 2e-3, "version": 1}
    torch.manual_seed(seed)
    module = DiffusionModule(model=DiTTransformer2DModel(**DIT_CONFIG), num_classes=10,
                             prediction_type=prediction_type)
    return _train_cached(module, config, "sara_dit", steps, seed)


def train_digits_unet(steps: int, seed: int, prediction_type: str = "epsilon") -> DiffusionModule:
    """The benchmark's UNet: ``DiffusionModule``'s default ``UNet2DModel`` (:data:`TINY_UNET`, class
    embedding), trained once per (config, steps, seed, parameterisation) and cached."""
    config = {"unet": {k: list(v) if isinstance(v, tuple) else v for k, v in TINY_UNET.items()}, "steps": steps,
              "seed": seed, "prediction_type": prediction_type, "batch": 32, "lr": 2e-3, "version": 1}
    torch.manual_seed(seed)
    module = DiffusionModule(num_classes=10, prediction_type=prediction_type)
    return _train_cached(module, config, "sara_unet", steps, seed)


class _Sampler:
    """Fixed noise / labels; samples with a controller policy and scores against the full-rank samples."""

    def __init__(self, module: DiffusionModule, n: int, steps: int, seed: int, include_conv: bool = False) -> None:
        self.module, self.n, self.steps, self.include_conv = module, n, steps, include_conv
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.arange(n) % 10
        self.noise = torch.randn((n, 1, 8, 8), generator=g)
        g_cal = torch.Generator().manual_seed(seed + 1)
        self.cal_labels = torch.arange(8) % 10
        self.cal_noise = torch.randn((8, 1, 8, 8), generator=g_cal)

    def sample(self, steps: int | None = None) -> Tensor:
        return self.module.sample(self.n, class_labels=self.labels, num_inference_steps=steps or self.steps,
                                  noise=self.noise)

    def calibration_run(self, steps: int):
        return lambda: self.module.sample(8, class_labels=self.cal_labels, num_inference_steps=steps,
                                          noise=self.cal_noise)

    def controller(self) -> SARAController:
        return SARAController(self.module.model, step_source=lambda: self.module.current_step_index,
                              include_conv=self.include_conv).attach()


def _static_ratio(controller: SARAController, rows: dict[str, int], ranks: dict[str, int | None]) -> float:
    used = sum(factored_macs(rows[n], m.out_features, m.in_features, None if m.runs_dense(ranks[n]) else ranks[n])
               for n, m in controller.layers.items())
    dense = sum(factored_macs(rows[n], m.out_features, m.in_features, None) for n, m in controller.layers.items())
    return used / dense


def _bisect(ratio_of, budget: float, lo: float, hi: float, increasing: bool, iters: int = 30) -> float:
    """The parameter whose MACs ratio is the largest one ≤ budget (ratio monotone in the parameter)."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        ok = ratio_of(mid) <= budget
        if ok == increasing:
            lo = mid
        else:
            hi = mid
    return lo if increasing else hi


def _evaluate(module: DiffusionModule, model: str, n: int, steps: int, budgets: tuple[float, ...], classifier: Any,
              seed: int, quick: bool, include_conv: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any],
                                                                           _Sampler]:
    """Every row of one model (full, uniform, static, SARA-DP, SARA-Online, fewer steps, the pair) per budget;
    returns the rows, the policies (for the timing pass) and the sampler."""
    sampler = _Sampler(module, n, steps, seed, include_conv=include_conv)
    reference = sampler.sample()
    ref_labels = classifier.predict(reference.flatten(1).clamp(-1, 1).numpy())

    # MACs bookkeeping: per-forward rows of each factored layer and the never-factored rest
    controller = sampler.controller()
    sampler.module.sample(n, class_labels=sampler.labels, num_inference_steps=1, noise=sampler.noise)
    rows = {name: layer.rows_seen for name, layer in controller.layers.items()}
    linear_dense = sum(factored_macs(rows[k], m.out_features, m.in_features, None) for k, m in controller.layers.items())
    controller.detach()
    total, _ = count_macs(module.model, sampler.noise, torch.full((n,), 500), class_labels=sampler.labels)
    other = total - linear_dense

    def score(method: str, budget: float, samples: Tensor, linear_ratio: float, step_fraction: float,
              **extra: Any) -> dict[str, Any]:
        labels = classifier.predict(samples.flatten(1).clamp(-1, 1).numpy())
        err = float((samples - reference).double().norm() / reference.double().norm())
        macs_total = step_fraction * (other + linear_ratio * linear_dense) / total
        return {"model": model, "method": method, "budget": budget, "macs_linear": round(linear_ratio * step_fraction, 4),
                "macs_total": round(macs_total, 4), "rel_error": round(err, 5),
                "max_abs": float((samples - reference).abs().max()),
                "agreement": round(float((labels == ref_labels).mean()), 4), **extra}

    rows_out: list[dict[str, Any]] = []
    policies: dict[str, Any] = {}  # method@budget -> (policy setter, steps) for the timing pass
    with sampler.controller() as c:
        samples = sampler.sample()
        rows_out.append(score("full", 1.0, samples, c.macs_ratio(), 1.0))
    for budget in budgets:
        with sampler.controller() as c:
            f = _bisect(lambda v: _static_ratio(c, rows, {k: max(1, round(v * m.full_rank)) for k, m in c.layers.items()}),
                        budget, 1e-3, 1.0, increasing=True)
            c.set_uniform(f)
            c.reset_macs()
            rows_out.append(score("uniform", budget, sampler.sample(), c.macs_ratio(), 1.0, param=round(f, 4)))
            policies[f"uniform@{budget}"] = (lambda c, f=f: c.set_uniform(f), steps)

            from lit_lowrank.ops.lowrank import rank_for_energy

            e = _bisect(lambda v: _static_ratio(c, rows, {k: int(rank_for_energy(m.singular, v))
                                                          for k, m in c.layers.items()}),
                        budget, 1e-3, 1.0, increasing=True)
            c.set_static_energy(e)
            c.reset_macs()
            rows_out.append(score("static", budget, sampler.sample(), c.macs_ratio(), 1.0, param=round(e, 4)))
            policies[f"static@{budget}"] = (lambda c, e=e: c.set_static_energy(e), steps)

            schedule = c.calibrate(sampler.calibration_run(steps), budget)
            rows_out.append(score("sara_dp", budget, sampler.sample(), c.macs_ratio(), 1.0,
                                  param=round(float(np.asarray(c.levels)[schedule].mean()), 4)))
            policies[f"sara_dp@{budget}"] = (lambda c, s=schedule: c.set_schedule(s), steps)

            def online_ratio(tau: float, c: SARAController = c) -> float:
                c.set_online(tau)
                c.reset_macs()
                sampler.module.sample(8, class_labels=sampler.labels[:8], num_inference_steps=steps,
                                      noise=sampler.noise[:8])
                return c.macs_ratio()

            tau = _bisect(online_ratio, budget, 0.0, 4.0, increasing=False, iters=10 if quick else 14)
            c.set_online(tau)
            c.reset_macs()
            samples = sampler.sample()
            ratio = c.macs_ratio()
            # the rule cannot go below a floor (two full-rank warm-up steps, full-rank steps after each
            # truncated one); say so rather than compare at unequal MACs
            rows_out.append(score("sara_online", budget, samples, ratio, 1.0, param=round(tau, 4),
                                  met_budget=bool(ratio <= budget + 0.01)))
            policies[f"sara_online@{budget}"] = (lambda c, t=tau: c.set_online(t), steps)

        k = max(1, math.ceil(budget * steps))
        with sampler.controller() as c:
            rows_out.append(score("fewer_steps", budget, sampler.sample(k), 1.0, k / steps, param=k))
            policies[f"fewer_steps@{budget}"] = (lambda c: c.set_full(), k)
            # the pair: SARA-DP at this budget on the shorter trajectory (calibrated for k steps)
            schedule = c.calibrate(sampler.calibration_run(k), budget)
            rows_out.append(score("sara_dp+fewer_steps", budget, sampler.sample(k), c.macs_ratio(), k / steps,
                                  param=k))
            policies[f"sara_dp+fewer_steps@{budget}"] = (lambda c, s=schedule: c.set_schedule(s), k)

    return rows_out, policies, sampler


def run(quick: bool, seed: int) -> BenchmarkResult:
    from sklearn.linear_model import LogisticRegression

    torch.set_num_threads(1)  # the machine is shared: one thread keeps timings comparable
    train_steps, n, steps = (400, 64, 20) if quick else (3000, 256, 50)
    budgets = (0.5, 0.7) if quick else (0.4, 0.5, 0.6, 0.7, 0.8)
    x, y = _digits()
    classifier = LogisticRegression(max_iter=2000).fit(x.flatten(1).numpy(), y.numpy())
    module = train_digits_dit(train_steps, seed)
    rows_out, policies, sampler = _evaluate(module, "dit_eps", n, steps, budgets, classifier, seed, quick)

    # wall clock: interleaved medians of sampling with each policy (controller attached outside the timing)
    timed = ["full@1.0"] + [f"{m}@{budgets[0]}" for m in ("uniform", "static", "sara_dp", "sara_online",
                                                           "fewer_steps", "sara_dp+fewer_steps")]
    policies["full@1.0"] = (lambda c: c.set_full(), steps)

    def timer(key: str):
        def fn() -> float:
            import time

            setter, k = policies[key]
            with sampler.controller() as c:
                setter(c)
                start = time.perf_counter()
                sampler.sample(k)
                return time.perf_counter() - start
        return fn

    medians = interleaved_medians({key: timer(key) for key in timed}, repeats=3 if quick else 7)
    for row in rows_out:
        key = f"{row['method']}@{row['budget']}"
        if key in medians:
            row["wall_ratio"] = round(medians[key] / medians["full@1.0"], 3)
    claims = _claims(rows_out, budgets)

    # the UNet (3x3 convs hold ~93% of its MACs, so they are factored too) under ε and v parameterisations;
    # fewer samples/steps than the DiT and not timed, to keep quick mode within its CPU budget
    unet_steps, n_u, steps_u = (150, 32, 10) if quick else (3000, 256, 50)
    budgets_u = (0.5,) if quick else (0.5, 0.7)
    for prediction_type, tag, label in (("epsilon", "unet_eps", "UNet ε"), ("v_prediction", "unet_v", "UNet v")):
        unet = train_digits_unet(unet_steps, seed, prediction_type)
        unet_rows, _, _ = _evaluate(unet, tag, n_u, steps_u, budgets_u, classifier, seed, quick, include_conv=True)
        rows_out += unet_rows
        claims += _claims(unet_rows, budgets_u, prefix=f"{label}: ")
    return BenchmarkResult(rows_out, claims, notes={
        "model": f"dit_eps: DiT hidden 64 x 4 blocks, {train_steps} training steps, eps-prediction, DDIM {steps} "
                 f"steps, {n} samples; unet_eps / unet_v: UNet2DModel (32, 64) channels, {unet_steps} training steps, "
                 f"eps / v-prediction, Linear + all convs factored, DDIM {steps_u} steps, {n_u} samples",
        "quality": "rel. error and classifier agreement vs full-rank samples from the same noise"})


def _claims(rows: list[dict[str, Any]], budgets: tuple[float, ...], prefix: str = "") -> list[dict[str, Any]]:
    def get(method: str, budget: float) -> dict[str, Any]:
        return next(r for r in rows if r["method"] == method and r["budget"] == budget)

    b = budgets[0]
    full = get("full", 1.0)
    dp, uni, sta = (get(m, b)["rel_error"] for m in ("sara_dp", "uniform", "static"))
    pair_b = budgets[-1]
    # Online vs DP at the largest budget the online rule reaches (inf when it reaches none)
    reached = [x for x in budgets if get("sara_online", x)["met_budget"]]
    b_online = max(reached) if reached else pair_b
    online_vs_dp = (get("sara_online", b_online)["rel_error"] / get("sara_dp", b_online)["rel_error"]
                    if reached else math.inf)
    pair, dp_p, fewer_p = get("sara_dp+fewer_steps", pair_b), get("sara_dp", pair_b), get("fewer_steps", pair_b)
    claims = [
        legacy_claim("full rank reproduces the original samples exactly (max |diff|)", full["max_abs"], 0.0, "<="),
        legacy_claim(f"SARA-DP error / uniform-rank error at {b:.0%} MACs", dp / uni, 1.0, "<"),
        legacy_claim(f"uniform-rank error / static-SVD error at {b:.0%} MACs", uni / sta, 1.0, "<"),
        legacy_claim(f"SARA-Online error / SARA-DP error at {b_online:.0%} MACs (no calibration)", online_vs_dp, 1.5, "<="),
        legacy_claim(f"SARA-DP + fewer steps: MACs speedup / best single speedup at {pair_b:.0%} each",
              min(dp_p["macs_total"], fewer_p["macs_total"]) / pair["macs_total"], 1.0, ">"),
        legacy_claim("SARA-DP + fewer steps: error / (SARA-DP error + fewer-steps error)",
              pair["rel_error"] / (dp_p["rel_error"] + fewer_p["rel_error"]), 1.0, "<="),
    ]
    for c in claims:
        c["claim"] = prefix + c["claim"]
    return claims
