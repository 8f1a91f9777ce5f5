"""SARA benchmark: step-adaptive SVD rank vs uniform rank, static SVD and fewer steps at equal MACs.

Workload: a small class-conditional DiT (diffusers ``DiTTransformer2DModel``, hidden 64, 4 blocks,
patch 2) trained as an ε-prediction DDPM on the embedded 8×8 digits **until its layer spectra
decay** (``TRAIN_STEPS`` AdamW steps with weight decay; trained once and cached under the cache
root ``$LIT_LOWRANK_CACHE`` or ``~/.cache/lit_lowrank``, with its training time), sampled with
deterministic DDIM from fixed noise and labels. The factored layers are the per-token Linear
layers of the transformer blocks (attention q/k/v/out and the MLP, ~90% of the MACs); the
per-sample conditioning layers (timestep embedder, adaLN modulation), the patch embedding and the
output projections stay dense **for every method**, so no baseline is a strawman that truncates them.
The same DiT is trained a second time under **v-prediction** (``dit_v``): an ε output is noise-like at
every step, so its effective rank barely moves (measured: ``dit_eps_output_rank_varies``), while a v
output goes from −x̂₀-like (coarse, low rank) at high noise to ε-like at low noise — the room the
abstract's premise needs, on a transformer, with SARA-Online reading the raw output as the abstract says.
The UNet section (``unet_v``) is a second architecture under v-prediction.

Units are **noise draws**: one sample per draw (noise + label), the same draws for every method.
Quality is the per-sample error against the full-rank sampler from the same draw
(``‖x − x_full‖ / ‖x_full‖``) and whether a logistic-regression digit classifier gives the sample
the label of its full-rank twin. MACs are exact counts: ``macs_linear`` = factored-layer MACs over
their full-rank MACs, ``macs_total`` = whole-network ratio (steps included).

Methods at a budget b (fraction of the factored layers' MACs): ``uniform`` (one rank fraction,
bisected to b), ``static`` (per-layer energy-kept SVD, bisected), ``sara_dp`` (calibrated on
``CAL`` draws of *calibration* noise), ``sara_online`` (the rank fraction of each step read from
the spectrum of the previous step's signal — the raw output on the v-UNet, the x̂₀ implied by the
ε output on the DiT, :func:`~lit_lowrank.callbacks.sara_controller.clean_sample_signal`; its
tolerance τ bisected on the calibration noise to meet b, then run on the fresh evaluation noise;
the first step, with no previous output, dense), ``sara_online_first`` (the same with the first
step at the uniform baseline's rank fraction: what the dense first step costs; each online row
records its first step's share of the MACs), ``fewer_steps`` (full rank, b·T DDIM steps) and
``sara_dp+fewer_steps`` at the same *total* MACs as fewer steps.

**Premises**: the layer spectra of the trained model decay (vs its initialisation), and the
effective rank of the tensor SARA-Online reads varies across steps by ≥ 25% (the abstract's
premise; the raw ε output's is measured too). **Competitors** in the method's place: the DP's
levels at shuffled steps (vs uniform and static), the online fractions at shuffled steps (vs
uniform), and uniform rank on the DP + fewer-steps trajectory. Controls: ``sara_dp_shuffled``
must not beat the DP (which optimises the allocation) and a second untrained model's spectra
must not "decay". ``online_shuffled`` vs ``sara_online`` is a *claim*: the online rule is a
heuristic, and whether its allocation beats a random one is what the abstract's premise predicts.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_lowrank.benchmarks._timing import interleaved_samples
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, paired, premise
from lit_lowrank.callbacks.sara_controller import CONDITIONING_LAYERS, SARAController, clean_sample_signal
from lit_lowrank.ops.lowrank import rank_for_energy
from lit_lowrank.ops.macs import count_macs
from lit_lowrank.ops.sara.rank import factored_macs, output_effective_rank
from lit_lowrank.tasks.diffusion import TINY_UNET, DiffusionModule

DIT_CONFIG: dict[str, Any] = {"num_attention_heads": 2, "attention_head_dim": 32, "in_channels": 1, "out_channels": 1,
                              "num_layers": 4, "sample_size": 8, "patch_size": 2, "num_embeds_ada_norm": 10,
                              "norm_num_groups": 1}
#: the per-token Linear layers of the DiT blocks: what every method factors
DIT_TARGET = r"^transformer_blocks\.\d+\.(attn1\.(to_q|to_k|to_v|to_out\.0)|ff\.net\.(0\.proj|2))$"
#: AdamW recipe of the benchmark DiT (weight decay lets the random initialisation's flat spectrum decay)
TRAIN = {"steps": 4000, "batch": 128, "lr": 2e-3, "weight_decay": 0.1}
TRAIN_UNET = {"steps": 3000, "batch": 64, "lr": 2e-3, "weight_decay": 0.1}
BUDGET, COMBO_BUDGET = 0.5, 0.7  # factored-MACs budget; SARA-DP's budget in the pair with fewer steps
CAL = 8  # calibration draws (SARA-DP warm-up, SARA-Online's τ)
PAPER_DP = ("SARA-DP measures LRAE on a few warmup prompts and solves the globally optimal rank assignment under a "
            "MACs budget by dynamic programming")
PAPER_ONLINE = ("SARA-Online computes a closed-form, spectrum-based LRAE from the model output at inference time, "
                "requiring no calibration and no trajectory lookahead")
PAPER_PREMISE = "We observe that the effective rank of the denoiser output varies sharply across timesteps"
PAPER_COMPOUND = "SARA combines with existing solver- and cache-axis acceleration to yield compounded wall-clock speedups"
PAPER_SPECTRA = "treats the SVD rank of pretrained linear layers as an inference-time control variable"


def _digits() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0  # pixels 0..16 -> [-1, 1]
    return x, torch.tensor(data.target)


def _cache_dir() -> Path:
    root = Path(os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank")
    path = root / "sara"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _train_cached(module: DiffusionModule, name: str, config: dict[str, Any], recipe: dict[str, Any], seed: int,
                  ) -> tuple[DiffusionModule, dict[str, Any]]:
    """Train ``module`` on the digits with AdamW + one-cycle (``recipe``) or load it from the cache.

    The cache file (atomic write) is keyed by the model config, recipe and seed, and stores the
    training time. Returns the module (eval mode) and ``{"train_cpu_s", "train_wall_s", "final_loss",
    "steps", "cached"}``.
    """
    key = hashlib.sha1(json.dumps({**config, **recipe, "seed": seed}, sort_keys=True).encode()).hexdigest()[:12]
    path = _cache_dir() / f"{name}_{key}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        module.model.load_state_dict(saved["state_dict"])
        return module.eval(), {**saved["info"], "cached": True}
    x, y = _digits()
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(module.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=recipe["lr"], total_steps=recipe["steps"],
                                                   pct_start=0.05)
    module.train()
    wall, cpu = time.perf_counter(), time.process_time()
    losses = []
    for _ in range(recipe["steps"]):
        idx = torch.randint(0, len(x), (recipe["batch"],), generator=generator)
        loss = module.step({"x": x[idx], "y": y[idx]}, generator=generator)["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    info = {"train_cpu_s": round(time.process_time() - cpu, 1), "train_wall_s": round(time.perf_counter() - wall, 1),
            "final_loss": round(float(np.mean(losses[-200:])), 5), "steps": recipe["steps"]}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"state_dict": module.model.state_dict(), "info": info}, tmp)
    os.replace(tmp, path)
    return module.eval(), {**info, "cached": False}


def train_digits_dit(seed: int = 0, prediction_type: str = "epsilon") -> tuple[DiffusionModule, dict[str, Any]]:
    """The benchmark's DiT (:data:`DIT_CONFIG`, recipe :data:`TRAIN`), trained once and cached."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(seed)
    module = DiffusionModule(model=DiTTransformer2DModel(**DIT_CONFIG), num_classes=10,
                             prediction_type=prediction_type)
    config = {"dit": DIT_CONFIG, "prediction_type": prediction_type, "version": 2}
    return _train_cached(module, f"dit_{prediction_type}", config, TRAIN, seed)


def train_digits_unet(seed: int = 0, prediction_type: str = "v_prediction") -> tuple[DiffusionModule, dict[str, Any]]:
    """``DiffusionModule``'s own UNet (:data:`~lit_lowrank.tasks.diffusion.TINY_UNET`, class embedding),
    recipe :data:`TRAIN_UNET`, trained once and cached."""
    torch.manual_seed(seed)
    module = DiffusionModule(num_classes=10, prediction_type=prediction_type)
    config = {"unet": {k: list(v) if isinstance(v, tuple) else v for k, v in TINY_UNET.items()},
              "prediction_type": prediction_type, "version": 2}
    return _train_cached(module, f"unet_{prediction_type}", config, TRAIN_UNET, seed)


def energy_at(singular: Tensor, fraction: float) -> float:
    """Fraction of ``Σ σ²`` in the leading ``⌈fraction · k⌉`` singular values."""
    power = singular.double().pow(2)
    k = max(1, math.ceil(fraction * power.numel()))
    return float(power[:k].sum() / power.sum())


def per_sample_error(samples: Tensor, reference: Tensor) -> np.ndarray:
    """``‖x_i − ref_i‖ / ‖ref_i‖`` per sample, ``(N,)``."""
    diff = (samples - reference).flatten(1).double().norm(dim=1)
    return (diff / reference.flatten(1).double().norm(dim=1).clamp_min(1e-12)).numpy()


class _Bench:
    """One model's evaluation: fixed draws, a controller factory, MACs bookkeeping and scoring."""

    def __init__(self, module: DiffusionModule, name: str, n: int, steps: int, seed: int, target: str | None,
                 classifier: Any, include_conv: bool = False, signal: Any = None) -> None:
        self.module, self.name, self.n, self.steps, self.target = module, name, n, steps, target
        self.signal = signal  # SARA-Online's signal (None: the raw denoiser output)
        self.include_conv, self.classifier = include_conv, classifier
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.arange(n) % 10
        self.noise = torch.randn((n, 1, 8, 8), generator=g)
        g_cal = torch.Generator().manual_seed(seed + 10_000)  # calibration noise: never evaluated on
        self.cal_labels = torch.arange(CAL) % 10
        self.cal_noise = torch.randn((CAL, 1, 8, 8), generator=g_cal)
        self.reference = self.sample()
        self.ref_labels = classifier.predict(self.reference.flatten(1).clamp(-1, 1).numpy())
        c = self.controller()
        self.module.sample(n, class_labels=self.labels, num_inference_steps=1, noise=self.noise)
        self.rows_of = {k: layer.rows_seen for k, layer in c.layers.items()}
        self.linear_dense = sum(factored_macs(self.rows_of[k], m.out_features, m.in_features, None)
                                for k, m in c.layers.items())
        c.detach()
        total, _ = count_macs(module.model, self.noise, torch.full((n,), 500), class_labels=self.labels)
        self.total, self.other = total, total - self.linear_dense

    def sample(self, steps: int | None = None) -> Tensor:
        return self.module.sample(self.n, class_labels=self.labels, num_inference_steps=steps or self.steps,
                                  noise=self.noise)

    def calibration_sample(self, steps: int | None = None) -> Tensor:
        return self.module.sample(CAL, class_labels=self.cal_labels, num_inference_steps=steps or self.steps,
                                  noise=self.cal_noise)

    def controller(self) -> SARAController:
        return SARAController(self.module.model, target=self.target, include_conv=self.include_conv,
                              exclude=CONDITIONING_LAYERS, signal=self.signal,
                              step_source=lambda: self.module.current_step_index).attach()

    def first_step_share(self, c: SARAController) -> float:
        """Share of the last run's factored-layer MACs spent at its first step."""
        costs = [self.static_ratio(c, ranks) for ranks in c.step_ranks]
        return costs[0] / sum(costs)

    def static_ratio(self, c: SARAController, ranks: dict[str, int | None]) -> float:
        used = sum(factored_macs(self.rows_of[k], m.out_features, m.in_features,
                                 None if m.runs_dense(ranks[k]) else ranks[k]) for k, m in c.layers.items())
        return used / self.linear_dense

    def rows(self, method: str, budget: float, samples: Tensor, linear_ratio: float, step_fraction: float,
             **extra: Any) -> list[dict[str, Any]]:
        """One row per noise draw."""
        errors = per_sample_error(samples, self.reference)
        labels = self.classifier.predict(samples.flatten(1).clamp(-1, 1).numpy())
        macs_total = step_fraction * (self.other + linear_ratio * self.linear_dense) / self.total
        common = {"model": self.name, "method": method, "budget": budget,
                  "macs_linear": round(linear_ratio * step_fraction, 4), "macs_total": round(macs_total, 4), **extra}
        return [{**common, "draw": i, "rel_error": round(float(e), 6), "agree": int(a == b)}
                for i, (e, a, b) in enumerate(zip(errors, labels, self.ref_labels))]


def _bisect(ratio_of: Any, budget: float, lo: float, hi: float, increasing: bool, iters: int = 30) -> float:
    """The parameter whose MACs ratio is the largest one ≤ budget (ratio monotone in the parameter)."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (ratio_of(mid) <= budget) == increasing:
            lo = mid
        else:
            hi = mid
    return lo if increasing else hi


def dp_additivity(bench: _Bench, c: SARAController, schedule: np.ndarray, dp_samples: Tensor) -> dict[str, Any]:
    """SARA-DP's error model against what sampling measures: the summed one-at-a-time errors the DP
    minimises (``predicted``) and the mean per-draw error (``realised``), for its schedule and for every
    level run at every (step, block); ``realised / predicted`` shows how additive the errors are."""
    errors = c.calibration_errors
    steps, blocks, _ = errors.shape

    def predicted(s: np.ndarray) -> float:
        return float(errors[np.arange(steps)[:, None], np.arange(blocks)[None, :], s].sum())

    def entry(s: np.ndarray, samples: Tensor) -> dict[str, float]:
        p, r = predicted(s), float(per_sample_error(samples, bench.reference).mean())
        return {"predicted": round(p, 4), "realised": round(r, 4), "ratio": round(r / p, 3) if p > 0 else None}

    out = {"dp": entry(schedule, dp_samples)}
    for j, level in enumerate(c.levels[:-1]):
        uniform = np.full_like(schedule, j)
        c.set_schedule(uniform)
        out[f"level_{level:g}"] = entry(uniform, bench.sample())
    return out


def evaluate_model(bench: _Bench, budget: float, combo_budget: float, quick: bool, seed: int,
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of every method at ``budget`` (and the DP + fewer-steps pair at ``combo_budget``); the
    policies for the timing pass."""
    steps = bench.steps
    rows: list[dict[str, Any]] = []
    policies: dict[str, Any] = {"full": (lambda c: c.set_full(), steps)}
    rng = np.random.default_rng(seed)
    with bench.controller() as c:
        rows += bench.rows("full", 1.0, bench.sample(), c.macs_ratio(), 1.0)

        f = _bisect(lambda v: bench.static_ratio(c, {k: max(1, round(v * m.full_rank)) for k, m in c.layers.items()}),
                    budget, 1e-3, 1.0, increasing=True)
        c.set_uniform(f)
        c.reset_macs()
        rows += bench.rows("uniform", budget, bench.sample(), c.macs_ratio(), 1.0, param=round(f, 4))

        e = _bisect(lambda v: bench.static_ratio(c, {k: int(rank_for_energy(m.singular, v))
                                                     for k, m in c.layers.items()}),
                    budget, 1e-3, 1.0, increasing=True)
        c.set_static_energy(e)
        c.reset_macs()
        rows += bench.rows("static", budget, bench.sample(), c.macs_ratio(), 1.0, param=round(e, 4))

        schedule = c.calibrate(bench.calibration_sample, budget, propagate=False)
        rows += bench.rows("sara_dp_output", budget, bench.sample(), c.macs_ratio(), 1.0,
                           param=round(float(np.asarray(c.levels)[schedule].mean()), 4))
        schedule = c.calibrate(bench.calibration_sample, budget)
        gains = c.step_gains
        dp_samples = bench.sample()
        rows += bench.rows("sara_dp", budget, dp_samples, c.macs_ratio(), 1.0,
                           param=round(float(np.asarray(c.levels)[schedule].mean()), 4))
        additivity = dp_additivity(bench, c, schedule, dp_samples)
        c.set_schedule(schedule)
        policies["sara_dp"] = (lambda c, s=schedule: c.set_schedule(s), steps)
        shuffled = schedule[rng.permutation(len(schedule))]
        c.set_schedule(shuffled)
        c.reset_macs()
        rows += bench.rows("sara_dp_shuffled", budget, bench.sample(), c.macs_ratio(), 1.0)

        def online_ratio(tau: float, first: float) -> float:  # on the calibration draws only
            c.set_online(tau, first_fraction=first)
            c.reset_macs()
            bench.calibration_sample()
            return c.macs_ratio()

        online: dict[str, dict[str, Any]] = {}
        # the rule as shipped (first step dense: no previous output to read), and the first step at the
        # uniform baseline's rank fraction (what the dense first step costs the claim)
        for method, first in (("sara_online", 1.0), ("sara_online_first", f)):
            tau = _bisect(lambda t, first=first: online_ratio(t, first), budget, 0.0, 1.0, increasing=False,
                          iters=12 if quick else 16)
            c.set_online(tau, first_fraction=first)
            c.reset_macs()
            samples = bench.sample()
            share = bench.first_step_share(c)
            online[method] = {"tau": tau, "first_fraction": round(first, 4),
                              "fractions": [round(x, 3) for x in c.step_fractions],
                              "first_step_macs_share": round(share, 4)}
            rows += bench.rows(method, budget, samples, c.macs_ratio(), 1.0, param=round(tau, 4),
                               first_step_share=round(share, 4))
        tau = online["sara_online"]["tau"]
        fractions = online["sara_online"]["fractions"]
        policies["sara_online"] = (lambda c, t=tau: c.set_online(t), steps)
        c.set_fractions([fractions[i] for i in rng.permutation(len(fractions))])
        c.reset_macs()
        rows += bench.rows("online_shuffled", budget, bench.sample(), c.macs_ratio(), 1.0)

        # fewer steps alone, and SARA-DP at combo_budget on a longer trajectory with the same total MACs
        k = max(1, round(budget * steps))
        c.set_full()
        c.reset_macs()
        rows += bench.rows("fewer_steps", budget, bench.sample(k), 1.0, k / steps, param=k)
        policies["fewer_steps"] = (lambda c: c.set_full(), k)
        k_combo = max(1, math.floor(budget * steps / combo_budget))
        schedule = c.calibrate(lambda: bench.calibration_sample(k_combo), combo_budget)
        rows += bench.rows("sara_dp+fewer_steps", budget, bench.sample(k_combo), c.macs_ratio(), k_combo / steps,
                           param=f"{k_combo} steps at {combo_budget:.0%}")
        # the competitor in the DP's place: uniform rank at the same budget on the same longer trajectory
        f_combo = _bisect(lambda v: bench.static_ratio(c, {k: max(1, round(v * m.full_rank))
                                                           for k, m in c.layers.items()}),
                          combo_budget, 1e-3, 1.0, increasing=True)
        c.set_uniform(f_combo)
        c.reset_macs()
        rows += bench.rows("uniform+fewer_steps", budget, bench.sample(k_combo), c.macs_ratio(), k_combo / steps,
                           param=f"{k_combo} steps at {combo_budget:.0%}")
        policies["sara_dp+fewer_steps"] = (lambda c, s=schedule: c.set_schedule(s), k_combo)
        extras = {"online": online, "dp_schedule": schedule.tolist(), "step_gains": [round(float(g), 3) for g in gains],
                  "additivity": additivity}
    return rows, {"policies": policies, **extras}


def premise_rows(bench: _Bench) -> list[dict[str, Any]]:
    """Per noise draw and step, the effective rank (fraction of full) of the denoiser output at full rank
    (``output_erank``) and of SARA-Online's signal when it is another tensor (``signal_erank``)."""
    out: list[dict[str, Any]] = []

    def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        tensor = (output.sample if hasattr(output, "sample") else output).detach()
        step = bench.module.current_step_index
        signals = {"output_erank": tensor}
        if bench.signal is not None:
            signals["signal_erank"] = bench.signal(tensor, args, kwargs)
        for method, value in signals.items():
            for i, e in enumerate(output_effective_rank(value).tolist()):
                out.append({"model": bench.name, "method": method, "draw": i, "step": step, "erank": e})

    handle = bench.module.model.register_forward_hook(hook, with_kwargs=True)
    try:
        bench.sample()
    finally:
        handle.remove()
    return out


def spectrum_rows(models: dict[str, DiffusionModule], name: str, target: str | None, include_conv: bool,
                  ) -> list[dict[str, Any]]:
    """Energy in the leading 25% of singular values of every factored layer, per model (trained, inits)."""
    rows = []
    for label, model in models.items():
        with SARAController(model.model, target=target, include_conv=include_conv, exclude=CONDITIONING_LAYERS) as c:
            rows += [{"model": name, "method": f"spectrum_{label}", "layer": layer,
                      "energy_25": round(energy_at(m.singular, 0.25), 5)} for layer, m in c.layers.items()]
    return rows


def _section(module: DiffusionModule, untrained: list[DiffusionModule], name: str, n: int, steps: int, seed: int,
             target: str | None, include_conv: bool, classifier: Any, quick: bool, signal: Any = None,
             ) -> tuple[list[dict[str, Any]], dict[str, Any], _Bench]:
    rows = spectrum_rows({"trained": module, **{f"init_{i}": m for i, m in enumerate(untrained)}}, name, target,
                         include_conv)
    bench = _Bench(module, name, n, steps, seed, target, classifier, include_conv=include_conv, signal=signal)
    rows += premise_rows(bench)
    method_rows, extras = evaluate_model(bench, BUDGET, COMBO_BUDGET, quick, seed)
    return rows + method_rows, extras, bench


def run(quick: bool, seed: int) -> BenchmarkResult:
    from diffusers import DiTTransformer2DModel
    from sklearn.linear_model import LogisticRegression

    torch.set_num_threads(1)  # tiny matrices: a second thread only adds synchronisation (and noise to timings)
    n, steps = (64, 20) if quick else (256, 50)
    n_u, steps_u = (32, 10) if quick else (256, 50)
    x, y = _digits()
    classifier = LogisticRegression(max_iter=2000).fit(x.flatten(1).numpy(), y.numpy())

    dit, dit_info = train_digits_dit(seed=0)
    inits = []
    for s in (0, 1):
        torch.manual_seed(s)
        inits.append(DiffusionModule(model=DiTTransformer2DModel(**DIT_CONFIG), num_classes=10))
    # an ε output is noise-like at every step (its rank barely moves: measured, `output_erank`); SARA-Online
    # reads the clean sample x̂₀ it implies, whose rank does move from the coarse early steps to the last
    x0 = clean_sample_signal(dit.noise_scheduler.alphas_cumprod, "epsilon")
    rows, dit_extras, bench = _section(dit, inits, "dit_eps", n, steps, seed, DIT_TARGET, False, classifier, quick,
                                       signal=x0)

    # wall clock (DiT only): paired interleaved rounds, controller attached outside the timed call
    def timer(key: str) -> Any:
        setter, k = dit_extras["policies"][key]

        def fn() -> float:
            with bench.controller() as c:
                setter(c)
                start = time.perf_counter()
                bench.sample(k)
                return time.perf_counter() - start
        return fn

    rounds = 6 if quick else 15
    timed = interleaved_samples({k: timer(k) for k in ("full", "sara_dp", "fewer_steps", "sara_dp+fewer_steps")},
                                repeats=rounds, warmup=1)
    rows += [{"model": "dit_eps", "method": f"time_{k}", "round": i, "seconds": round(t, 5)}
             for k, ts in timed.items() for i, t in enumerate(ts)]

    # the same DiT trained under v-prediction: its raw output moves from -x̂₀-like (coarse, low rank) at
    # high noise to ε-like at low noise, so the abstract's rule (read the raw output) has rank to follow
    dit_v, dit_v_info = train_digits_dit(seed=0, prediction_type="v_prediction")
    v_rows, dit_v_extras, _ = _section(dit_v, inits, "dit_v", n, steps, seed, DIT_TARGET, False, classifier, quick)
    rows += v_rows

    # the UNet (its 3x3 convs hold most of the MACs, so every conv is factored too) under v-prediction
    unet, unet_info = train_digits_unet(seed=0)
    inits = []
    for s in (0, 1):
        torch.manual_seed(s)
        inits.append(DiffusionModule(num_classes=10, prediction_type="v_prediction"))
    unet_rows, unet_extras, _ = _section(unet, inits, "unet_v", n_u, steps_u, seed, None, True, classifier, quick)
    rows += unet_rows

    claims, controls, premises, competitors = _claims(rows, "dit_eps", "DiT ε: ", timing=True, signal=True)
    for model, prefix in (("dit_v", "DiT v: "), ("unet_v", "UNet v: ")):
        for part, more in zip((claims, controls, premises, competitors),
                              _claims(rows, model, prefix, timing=False, signal=False)):
            part += more

    def trained(info: dict[str, Any], recipe: dict[str, Any]) -> str:
        return (f"{recipe['steps']} AdamW steps (batch {recipe['batch']}, lr {recipe['lr']}, weight decay "
                f"{recipe['weight_decay']}, one-cycle), final training loss {info['final_loss']}; training took "
                f"{info['train_cpu_s']} s CPU ({info['train_wall_s']} s wall on the shared machine) once, cached"
                + (" (loaded from the cache in this run)" if info["cached"] else ""))

    notes = {
        "dit_eps": f"DiT hidden 64 x 4 blocks, patch 2, eps-prediction, {trained(dit_info, TRAIN)}; DDIM {steps} "
                   f"steps, {n} evaluation draws; factored: the per-token Linear layers of the transformer blocks",
        "dit_v": f"the same DiT architecture under v-prediction, {trained(dit_v_info, TRAIN)}; DDIM {steps} steps, "
                 f"{n} evaluation draws, the same factored layers",
        "unet_v": f"UNet2DModel (32, 64) channels + attention, v-prediction, {trained(unet_info, TRAIN_UNET)}; DDIM "
                  f"{steps_u} steps, {n_u} evaluation draws; factored: every Linear and conv but the conditioning "
                  "layers",
        "calibration": f"{CAL} draws of other noise (SARA-DP warm-up, SARA-Online's tau); evaluation noise unseen",
        "dense_for_every_method": "conditioning layers (timestep / class embedders, adaLN modulation, time_emb_proj)",
        "online": {m: e["online"] for m, e in (("dit_eps", dit_extras), ("dit_v", dit_v_extras),
                                               ("unet_v", unet_extras))},
        "online_signal": {"dit_eps": "x0 implied by the eps output (clean_sample_signal)",
                          "dit_v": "the raw v output (the abstract's rule)",
                          "unet_v": "the raw v output (the abstract's rule)"},
        "dp_step_gains": {m: e["step_gains"] for m, e in (("dit_eps", dit_extras), ("dit_v", dit_v_extras),
                                                          ("unet_v", unet_extras))},
        "dp_additivity": {m: e["additivity"] for m, e in (("dit_eps", dit_extras), ("dit_v", dit_v_extras),
                                                          ("unet_v", unet_extras))},
        "timing": f"DiT only, {rounds} interleaved rounds, {torch.get_num_threads()} thread",
    }
    return BenchmarkResult(rows, claims, controls, notes=notes, summary=_summary(rows), premises=premises,
                           competitors=competitors)


def _claims(rows: list[dict[str, Any]], model: str, prefix: str, timing: bool, signal: bool,
            ) -> tuple[list[dict[str, Any]], ...]:
    """Claims, controls, premises and competitors of one model's section."""
    def err(method: str, other: str) -> dict[str, Any]:
        values, baseline, units = paired(rows, "rel_error", {"model": model, "method": method},
                                         {"model": model, "method": other}, unit="draw")
        return {"values": values, "baseline": baseline, "units": units, "unit": "draw"}

    b = f"{BUDGET:.0%}"
    q_err = "per-draw relative error vs the full-rank sample, {} - {}"
    trained, init0, layers = paired(rows, "energy_25", {"model": model, "method": "spectrum_trained"},
                                    {"model": model, "method": "spectrum_init_0"}, unit="layer")
    init1, init0b, _ = paired(rows, "energy_25", {"model": model, "method": "spectrum_init_1"},
                              {"model": model, "method": "spectrum_init_0"}, unit="layer")

    def spread(method: str) -> tuple[list[float], list[Any]]:
        """Per draw, (max - min) / mean over the steps of the effective rank of ``method``'s tensor."""
        by_draw: dict[int, list[float]] = {}
        for r in rows:
            if r.get("method") == method and r["model"] == model:
                by_draw.setdefault(r["draw"], []).append(r["erank"])
        return [(max(v) - min(v)) / float(np.mean(v)) for _, v in sorted(by_draw.items())], sorted(by_draw)

    q_spec = "energy in the leading 25% of singular values, per factored layer, {} - {}"
    q_spread = ("(max - min) / mean over steps of the effective rank (Roy-Vetterli, fraction of full) of the {}, "
                "per draw")
    raw, draws = spread("output_erank")
    spectra, varies = f"{model}_spectra_decay", f"{model}_rank_varies"
    premises = [
        premise(spectra, f"{prefix}the benchmark model's layer spectra decay (trained vs its initialisation)",
                needs="layers whose truncated SVD keeps most of the map (rank to cut)",
                quantity=q_spec.format("trained", "init"), values=trained, baseline=init0, units=layers,
                unit="layer", target=0.0, op=">"),
        premise(f"{model}_output_rank_varies" if signal else varies, f"{prefix}the effective rank of the raw denoiser output varies across "
                "steps by >= 25% of its mean", needs=PAPER_PREMISE, quantity=q_spread.format("denoiser output"),
                values=raw, units=draws, unit="draw", target=0.25, op=">="),
    ]
    if signal:  # SARA-Online reads another tensor (x̂₀): its own rank must vary
        values, units = spread("signal_erank")
        premises.append(premise(varies, f"{prefix}the effective rank of SARA-Online's signal (x̂₀ implied by the "
                                "ε output) varies across steps by >= 25% of its mean", needs=PAPER_PREMISE,
                                quantity=q_spread.format("x0 implied by the output"), values=values, units=units,
                                unit="draw", target=0.25, op=">="))
    name = f"{model}_".__add__
    claims = [
        claim(f"{prefix}SARA-DP error below uniform rank at {b} of the factored MACs", paper=PAPER_DP,
              quantity=q_err.format("sara_dp", "uniform"), target=0.0, op="<", name=name("dp_uniform"),
              requires=spectra, **err("sara_dp", "uniform")),
        claim(f"{prefix}SARA-DP error below static SVD (energy-kept ranks) at {b} MACs", paper=PAPER_DP,
              quantity=q_err.format("sara_dp", "static"), target=0.0, op="<", name=name("dp_static"),
              requires=spectra, **err("sara_dp", "static")),
        claim(f"{prefix}SARA-Online error below uniform rank at {b} MACs (both calibration-free)", paper=PAPER_ONLINE,
              quantity=q_err.format("sara_online", "uniform"), target=0.0, op="<", name=name("online_uniform"),
              requires=[spectra, varies], **err("sara_online", "uniform")),
        claim(f"{prefix}SARA-Online with its first step at the uniform fraction (not dense) below uniform rank at "
              f"{b} MACs", paper=PAPER_ONLINE, quantity=q_err.format("sara_online_first", "uniform"), target=0.0,
              op="<", name=name("online_first_uniform"), requires=[spectra, varies],
              **err("sara_online_first", "uniform")),
        # not a control: a heuristic's step allocation can lose to a random one (the DP's cannot on its
        # objective, so its shuffle is the control); whether the output's rank steers rank well is the claim
        claim(f"{prefix}SARA-Online's per-step fractions beat the same fractions shuffled across steps (same MACs)",
              paper=PAPER_ONLINE, quantity=q_err.format("sara_online", "online_shuffled"), target=0.0, op="<",
              name=name("online_shuffled"), requires=varies, **err("sara_online", "online_shuffled")),
        claim(f"{prefix}SARA-DP ({COMBO_BUDGET:.0%}) + fewer steps beats fewer steps alone at equal total MACs ({b})",
              paper=PAPER_COMPOUND, quantity=q_err.format("sara_dp+fewer_steps", "fewer_steps"), target=0.0, op="<",
              name=name("compound"), requires=spectra, **err("sara_dp+fewer_steps", "fewer_steps")),
    ]
    if timing:
        t_dp, t_full, t_units = paired(rows, "seconds", {"model": model, "method": "time_sara_dp"},
                                       {"model": model, "method": "time_full"}, unit="round")
        claims.insert(5, claim(f"{prefix}SARA-DP at {b} MACs samples faster than full rank (wall clock)",
                               paper=PAPER_COMPOUND,
                               quantity="sampling wall time(sara_dp) / wall time(full), geometric mean over paired "
                               "rounds", values=t_dp, baseline=t_full, compare="ratio", units=t_units, unit="round",
                               target=1.0, op="<", requires=spectra))
    shuffled_dp = "SARA-DP's levels at randomly permuted steps (same MACs)"
    competitors = [
        competitor(name("dp_uniform"), f"{prefix}the DP schedule with its steps shuffled below uniform rank",
                   competitor=shuffled_dp, quantity=q_err.format("sara_dp_shuffled", "uniform"), target=0.0, op="<",
                   **err("sara_dp_shuffled", "uniform")),
        competitor(name("dp_static"), f"{prefix}the DP schedule with its steps shuffled below static SVD",
                   competitor=shuffled_dp, quantity=q_err.format("sara_dp_shuffled", "static"), target=0.0, op="<",
                   **err("sara_dp_shuffled", "static")),
        competitor(name("online_uniform"), f"{prefix}the online fractions shuffled across steps below uniform rank",
                   competitor="SARA-Online's fractions at randomly permuted steps (same MACs)",
                   quantity=q_err.format("online_shuffled", "uniform"), target=0.0, op="<",
                   **err("online_shuffled", "uniform")),
        competitor(name("compound"), f"{prefix}uniform rank ({COMBO_BUDGET:.0%}) + fewer steps beats fewer steps "
                   "alone at equal total MACs", competitor="uniform rank in SARA-DP's place on the same trajectory",
                   quantity=q_err.format("uniform+fewer_steps", "fewer_steps"), target=0.0, op="<",
                   **err("uniform+fewer_steps", "fewer_steps")),
    ]
    controls = [
        claim(f"{prefix}SARA-DP's schedule with its steps shuffled (same MACs) beats SARA-DP at {b}", paper=PAPER_DP,
              quantity=q_err.format("sara_dp_shuffled", "sara_dp"), target=0.0, op="<",
              **err("sara_dp_shuffled", "sara_dp")),
        claim(f"{prefix}an untrained model's layer spectra 'decay' (a second random init vs the first)",
              paper=PAPER_SPECTRA, quantity=q_spec.format("init_1", "init_0"), values=init1, baseline=init0b,
              units=layers, unit="layer", target=0.0, op=">"),
    ]
    return claims, controls, premises, competitors


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if "rel_error" in r:
            seen.setdefault((r["model"], r["method"]), []).append(r)
    times: dict[tuple[str, str], list[float]] = {}  # (model, method): timed on that model only
    for r in rows:
        if r.get("method", "").startswith("time_"):
            times.setdefault((r["model"], r["method"][5:]), []).append(r["seconds"])
    for (model, method), sel in seen.items():
        first = sel[0]
        row = {"model": model, "method": method, "budget": first["budget"], "macs_linear": first["macs_linear"],
               "macs_total": first["macs_total"], "rel_error": round(float(np.mean([r["rel_error"] for r in sel])), 4),
               "agreement": round(float(np.mean([r["agree"] for r in sel])), 3)}
        if (model, method) in times and (model, "full") in times:
            row["wall_ratio"] = round(float(np.median(times[model, method]) / np.median(times[model, "full"])), 3)
        out.append(row)
    return out
