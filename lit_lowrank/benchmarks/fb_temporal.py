"""FB with temporal abstraction: the SR spectrum vs k, the rank bottleneck, and FB learned offline over a step sweep.

Two temporal abstractions, by name (:data:`~lit_lowrank.ops.fb.ABSTRACTIONS`): ``options`` (the
chosen action, then ``k − 1`` uniform actions: averaged, ``P_πᵏ``, eigenvalues ``λᵏ``) and ``repeat``
(the action held ``k`` steps: ``Σ_a π_a P_aᵏ``, not a power of ``P_π``).

Environments:

- the **lazy** 10×10 slip gridworld (slip 0.2, ``stay`` 0.5: every eigenvalue of the uniform walk
  is ≥ 0, so ``P_πᵏ`` is a low-pass filter; the classic grid, ``stay`` 0, is nearly bipartite,
  ``λ_min ≈ −0.95``, and is reported beside it). Exact transition tensor: every SR, spectrum and
  value is exact. Spectral units are six lazy grids (size 8/10/12 × slip 0.1/0.2/0.3).
- the **point-mass** task (:class:`~lit_lowrank.datamodules.rl_envs.PointMass`): its transition
  operator estimated on a 12×12 discretisation from 100k random transitions per seed (units:
  seeds), ``k``-step operators estimated from ``k``-step data of each abstraction.

FB (:class:`~lit_lowrank.tasks.fb.FBModule`, **d = 8** — below the SR's effective rank, so the
rank bottleneck binds; hidden 128, 2 F heads, τ = 0.05, Adam 1e-3, batch 256, ``γᵏ`` per macro
step) learns offline from 100k transitions of the uniform macro policy per seed, with a Lightning
``Trainer``, and is **cached** under ``$LIT_LOWRANK_CACHE/fb_temporal/`` at every step of its
sweep (a key naming every setting): ``python -m lit_lowrank.benchmarks.fb_temporal`` trains the
cache (two processes), quick runs then only evaluate.

- ``evaluation`` (``target_policy="uniform"``, options ``k ∈ {1, 4}``, a step sweep
  :data:`EVAL_SWEEP` to convergence): the relative SR error ``‖FᵀBρ − M_k‖_F/‖M_k‖_F`` against the
  exact SR and the value error of one-goal rewards against the paper's bound
  (:func:`~lit_lowrank.ops.fb.repeat_value_bound`);
- ``control`` (full run only: FB proper, ``π_z = argmax F(s, a, z)ᵀz``, repeat ``k ∈ {1, 4}``): the
  zero-shot goal-reaching return of ``π_z`` / the optimal primitive return (exact, 10 goals), with
  ``k = 1`` also at twice the steps (the competitor).

**Premises**: the SR's effective rank exceeds ``d`` (the bottleneck binds) and the rank-``d``
floor falls with ``k`` (Eckart–Young, relative Frobenius); the spectrum of the lazy walk is
non-negative; the best ``k``-repeat policy leaves room above what FB reaches at ``k = 1``.
**Competitors**: ``k = 1`` with more steps (the review found ``k = 1`` at 6,000 steps beating
``k = 4`` at 2,000 — a bootstrapping-speed effect). Claims, premises, competitors and controls
are in :func:`claims_and_controls`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from lit_lowrank.benchmarks._workers import map_jobs
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, premise
from lit_lowrank.datamodules.replay import ReplayDataModule, collect_transitions
from lit_lowrank.datamodules.rl_envs import PointMass, SlipGridWorld
from lit_lowrank.ops.fb import (
    estimate_transition_operator,
    macro_discount,
    macro_transition,
    repeat_value_bound,
    repeat_value_gap,
    successor_measure,
)
from lit_lowrank.ops.lowrank import effective_rank_of, singular_values, stable_rank_of
from lit_lowrank.tasks.fb import FBModule, evaluate_gridworld, evaluate_policy_evaluation, goal_states

GRID = {"size": 10, "slip": 0.2, "stay": 0.5}
SPECTRAL_GRIDS = ((8, 0.1), (8, 0.3), (10, 0.1), (10, 0.2), (10, 0.3), (12, 0.2))   # all lazy (stay 0.5)
CYCLES = (40, 60, 80, 100, 120, 140)
KS = (1, 2, 4, 8)
K_CLAIM = 4           # the k every learned claim is pre-registered at
SEEDS = (0, 1, 2)
EVAL_SWEEP = (375, 750, 1500, 3000)      # evaluation-mode snapshots; the same-budget claims read BUDGET
BUDGET = 750
CONTROL_SWEEP = (750, 1500)              # control mode: k=1 also at 2× the budget (the competitor)
POINTMASS_BINS = 12
FB = {"z_dim": 8, "hidden_size": 128, "tau": 0.05, "lr": 1e-3, "batch_size": 256, "transitions": 100_000}
PAPER_SPECTRUM = ("temporal abstraction acts as a low-pass filter that suppresses high-frequency spectral components. "
                  "This suppression reduces the effective rank of the induced SR")
PAPER_BOUND = "This suppression reduces the effective rank of the induced SR while preserving a formal bound on the " \
              "resulting value function error."
PAPER_STABLE = "this alignment is a key factor for stable FB learning, particularly at high discount factors where " \
               "bootstrapping becomes error-prone."


# ---------------------------------------------------------------------------- spectra (exact, no training)
def _cycle(n: int) -> torch.Tensor:
    """A deterministic cycle as a one-action tabular MDP ``(1, n, n)``: every ``|λ| = 1`` (nothing to filter)."""
    return torch.roll(torch.eye(n, dtype=torch.float64), 1, dims=1)[None]


def _sr_row(M: torch.Tensor, d: int) -> dict[str, float]:
    s = singular_values(M.to(torch.float64))
    floor = float((s[d:] ** 2).sum().sqrt() / (s ** 2).sum().sqrt()) if d < s.numel() else 0.0
    return {"sr_erank": float(effective_rank_of(M)), "sr_srank": float(stable_rank_of(M)), "floor_fro": floor}


def spectrum_rows(gammas: tuple[float, ...] = (0.99, 0.9), grids: tuple[tuple[int, float], ...] = SPECTRAL_GRIDS,
                  cycles: tuple[int, ...] = CYCLES, d: int = FB["z_dim"]) -> list[dict[str, Any]]:
    """Per environment, γ, abstraction and k (γᵏ per macro step): effective / stable rank of the uniform
    macro policy's SR, its relative rank-``d`` floor and the paper's bound ``σ_{d+1}(M_k)``; the lazy
    grids, the classic (bipartite-like) grid, and the deterministic cycles of the control."""
    rows = []
    envs = [(f"lazy{size}-slip{slip}", SlipGridWorld(size, slip, stay=0.5).transition_tensor()) for size, slip in grids]
    envs += [("grid10-slip0.2-stay0", SlipGridWorld(10, 0.2).transition_tensor())]
    envs += [(f"cycle{n}", _cycle(n)) for n in cycles]
    for name, P in envs:
        lam_min = float(torch.linalg.eigvals(P.mean(0)).real.min())
        for gamma in gammas:
            for abstraction in ("options", "repeat"):
                for k in KS:
                    M = successor_measure(macro_transition(P, k, abstraction=abstraction), float(macro_discount(gamma, k)))
                    row = {"table": "spectrum", "env": name, "gamma": gamma, "abstraction": abstraction, "k": k,
                           "lambda_min": lam_min, **_sr_row(M, d)}
                    if not name.startswith("cycle"):
                        e = torch.zeros(P.shape[1], dtype=torch.float64)
                        e[0] = 1.0
                        bound = repeat_value_bound(P, gamma, k, d, e, abstraction=abstraction)
                        row.update(sigma_tail=bound["sigma_tail"], sigma_top=bound["sigma_top"])
                    rows.append(row)
    return rows


def pointmass_rows(seeds: tuple[int, ...], gamma: float = 0.99, d: int = FB["z_dim"]) -> list[dict[str, Any]]:
    """The point-mass SR spectrum from data: operators on a 12×12 discretisation estimated from
    random transitions (``k = 1`` data raised to the k-th power for options; ``k``-step repeat data
    for repeat), per seed."""
    env, rows = PointMass(), []
    S = POINTMASS_BINS ** 2
    for seed in seeds:
        one = collect_transitions(env, FB["transitions"], k=1, seed=seed)
        P1 = estimate_transition_operator(torch.from_numpy(env.cells(one["obs"].numpy(), POINTMASS_BINS)),
                                          torch.from_numpy(env.cells(one["next_obs"].numpy(), POINTMASS_BINS)), S)
        lam_min = float(torch.linalg.eigvals(P1).real.min())
        for abstraction in ("options", "repeat"):
            for k in KS:
                if abstraction == "options" or k == 1:
                    Pk = torch.linalg.matrix_power(P1, k)
                else:
                    data = collect_transitions(env, FB["transitions"], k=k, seed=seed, abstraction="repeat")
                    Pk = estimate_transition_operator(
                        torch.from_numpy(env.cells(data["obs"].numpy(), POINTMASS_BINS)),
                        torch.from_numpy(env.cells(data["next_obs"].numpy(), POINTMASS_BINS)), S)
                M = successor_measure(Pk, float(macro_discount(gamma, k)))
                rows.append({"table": "pointmass_spectrum", "seed": seed, "gamma": gamma, "abstraction": abstraction,
                             "k": k, "lambda_min": lam_min, **_sr_row(M, d)})
    return rows


# ---------------------------------------------------------------------------- FB training, cached over a step sweep
def cache_dir() -> Path:
    return Path(os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank") / "fb_temporal"


def run_key(mode: str, gamma: float, k: int, abstraction: str, sweep: tuple[int, ...], seed: int) -> str:
    """The cache key: every setting that produced the snapshots, readable, plus a hash of the FB settings."""
    spec = json.dumps({"grid": GRID, "fb": FB, "mode": mode, "gamma": gamma, "k": k, "abstraction": abstraction,
                       "sweep": list(sweep), "seed": seed, "version": 2}, sort_keys=True)
    digest = hashlib.sha1(spec.encode()).hexdigest()[:8]
    return (f"lazy10-slip0.2-{mode}-g{gamma}-k{k}-{abstraction}-d{FB['z_dim']}-steps{max(sweep)}-seed{seed}-"
            f"{digest}")


class _Snapshots(pl.Callback):
    """Keeps a copy of the weights at each step of the sweep and the FB loss of every step."""

    def __init__(self, sweep: tuple[int, ...]) -> None:
        self.sweep, self.states, self.losses = set(sweep), {}, []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.losses.append(float(trainer.callback_metrics["method/fb_temporal/fb_loss"]))
        if trainer.global_step in self.sweep:
            self.states[trainer.global_step] = copy.deepcopy(pl_module.state_dict())


def _data(k: int, abstraction: str, seed: int) -> ReplayDataModule:
    data = ReplayDataModule("gridworld", GRID, k=k, num_transitions=FB["transitions"], batch_size=FB["batch_size"],
                            val_fraction=0.0, seed=seed, abstraction=abstraction)
    data.setup("fit")
    return data


def _module(mode: str, gamma: float) -> FBModule:
    lr = FB["lr"]
    return FBModule(obs_dim=GRID["size"] ** 2, num_actions=4, z_dim=FB["z_dim"], hidden_size=FB["hidden_size"],
                    discount=gamma, tau=FB["tau"], target_policy="uniform" if mode == "evaluation" else "greedy",
                    optimizer=lambda p: torch.optim.Adam(p, lr=lr))


def train_or_load(mode: str, gamma: float, k: int, abstraction: str, sweep: tuple[int, ...], seed: int
                  ) -> tuple[dict[int, FBModule], ReplayDataModule, dict]:
    """The FB models of one run at every step of ``sweep``: loaded from the cache, or trained (cached atomically)."""
    data = _data(k, abstraction, seed)
    path = cache_dir() / f"{run_key(mode, gamma, k, abstraction, sweep, seed)}.pt"
    if not path.exists():
        pl.seed_everything(seed, verbose=False)
        model = _module(mode, gamma)
        snaps = _Snapshots(sweep)
        trainer = pl.Trainer(max_steps=max(sweep), logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0,
                             callbacks=[snaps])
        start = time.process_time()
        trainer.fit(model, datamodule=data)
        meta = {"losses": snaps.losses, "cpu_seconds": time.process_time() - start}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"states": snaps.states, "meta": meta}, tmp)
        os.replace(tmp, path)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    models = {}
    for step, state in blob["states"].items():
        models[int(step)] = _module(mode, gamma)
        models[int(step)].load_state_dict(state)
    return models, data, blob["meta"]


def planned_runs(quick: bool) -> list[tuple[str, float, int, str, tuple[int, ...]]]:
    """``(mode, γ, k, abstraction, sweep)`` of every learned run (each for every seed)."""
    # quick: the SR-fit runs the claims read (k = 1 and the pre-registered k, options); the zero-shot
    # control runs (FB proper) and the k sweep are the full run's (2 CPU cores cannot afford them with the sweep)
    runs = [("evaluation", 0.99, k, "options", EVAL_SWEEP) for k in (1, K_CLAIM)]
    if not quick:
        runs += [("control", 0.99, 1, "repeat", CONTROL_SWEEP), ("control", 0.99, K_CLAIM, "repeat", (BUDGET,))]
        runs += [("evaluation", 0.99, k, "repeat", EVAL_SWEEP) for k in (2, K_CLAIM, 8)]
        runs += [("evaluation", 0.99, k, "options", EVAL_SWEEP) for k in (2, 8)]
        runs += [("evaluation", 0.9, k, "options", EVAL_SWEEP) for k in KS]
        runs += [("control", 0.99, k, "repeat", (BUDGET,)) for k in (2, 8)]
    return runs


def _untrained(mode: str, gamma: float, seed: int) -> FBModule:
    torch.manual_seed(seed)
    return _module(mode, gamma)


def _stability(losses: list[float], steps: int) -> dict[str, float]:
    tail = np.asarray(losses[int(0.8 * steps):steps])
    return {"loss_cv_last": float(tail.std() / max(abs(tail.mean()), 1e-12))}


def learned_rows(quick: bool, seeds: tuple[int, ...] = SEEDS) -> list[dict[str, Any]]:
    """One row per (run, seed, snapshot step): SR / value errors (evaluation) or zero-shot returns (control)."""
    env = SlipGridWorld(**GRID)
    P = env.transition_tensor()
    goals = goal_states(env, 10, seed=0)
    unit = torch.eye(P.shape[1], dtype=torch.float64)
    rows: list[dict[str, Any]] = []
    for mode, gamma, k, abstraction, sweep in planned_runs(quick):
        if mode == "evaluation":
            bound = [repeat_value_bound(P, gamma, k, FB["z_dim"], unit[g], abstraction=abstraction)["bound"]
                     for g in goals]
        else:
            gap = float(np.mean([repeat_value_gap(P, g, gamma, k) for g in goals]))
        for seed in seeds:
            models, data, meta = train_or_load(mode, gamma, k, abstraction, sweep, seed)
            for steps, model in sorted(models.items()):
                row = {"table": "fb", "mode": mode, "gamma": gamma, "k": k, "abstraction": abstraction, "seed": seed,
                       "steps": steps, **_stability(meta["losses"], steps), "train_cpu_s": meta["cpu_seconds"]}
                if mode == "evaluation":
                    ev = evaluate_policy_evaluation(model, env, data.data, goals, k, abstraction)
                    ratios = np.asarray(ev["value_errors"]) / np.asarray(bound)
                    row.update(sr_error=ev["sr_error"], value_error=float(np.mean(ev["value_errors"])),
                               value_norm=float(np.mean(ev["value_norms"])), bound=float(np.mean(bound)),
                               error_over_bound=float(np.exp(np.log(ratios).mean())))
                    if steps == max(sweep):
                        untrained = evaluate_policy_evaluation(_untrained(mode, gamma, seed), env, data.data, goals, k,
                                                               abstraction)
                        row["untrained_error_over_bound"] = float(np.exp(np.log(
                            np.asarray(untrained["value_errors"]) / np.asarray(bound)).mean()))
                else:
                    ev = evaluate_gridworld(model, env, data.data, goals, k, horizon=100, abstraction=abstraction)
                    shuffled = evaluate_gridworld(model, env, data.data, goals, k, horizon=100, abstraction=abstraction,
                                                  reward_goals=[goals[(i + 1) % len(goals)] for i in range(len(goals))])
                    row.update(zero_shot_return=ev["normalized_return"], greedy_sr_error=ev["sr_error"],
                               shuffled_reward_return=shuffled["normalized_return"], eps_repeat=gap)
                rows.append(row)
    return rows


def _train_one(mode: str, gamma: float, k: int, abstraction: str, sweep: tuple[int, ...], seed: int) -> str:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    start = time.perf_counter()
    train_or_load(mode, gamma, k, abstraction, sweep, seed)
    return f"{mode} γ={gamma} k={k} {abstraction} seed={seed}: {time.perf_counter() - start:.0f} s"


def build_cache(quick: bool = True, seeds: tuple[int, ...] = SEEDS) -> None:
    """Train every planned run that is not cached yet, in :func:`~lit_lowrank.benchmarks._workers.map_jobs` workers.

    ``python -m lit_lowrank.benchmarks.fb_temporal [--full] [SEED ...]``.
    """
    jobs = [(*run, seed) for run in planned_runs(quick) for seed in seeds]
    # the longest runs first, so two workers finish together
    jobs.sort(key=lambda job: -max(job[4]))
    for line in map_jobs(_train_one, jobs):
        print(line, flush=True)


# ---------------------------------------------------------------------------- claims
def _spectral(rows: list[dict[str, Any]], prefix: str, abstraction: str, k: int, key: str = "sr_erank",
              gamma: float = 0.99, table: str = "spectrum", unit: str = "env") -> tuple[list[float], list[Any]]:
    sel = sorted((r for r in rows if r["table"] == table and str(r.get(unit, "")).startswith(prefix)
                  and r["gamma"] == gamma and r["abstraction"] == abstraction and r["k"] == k), key=lambda r: r[unit])
    return [r[key] for r in sel], [r[unit] for r in sel]


def _spectral_claims(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict], list[dict]]:
    """Exact-spectrum premises and claims (units: lazy grids; point-mass seeds) and the cycle control."""
    d = FB["z_dim"]
    claims, controls, premises = [], [], []
    lam, grids = _spectral(rows, "lazy", "options", 1, key="lambda_min")
    premises.append(premise("nonnegative_spectrum", "the uniform walk's spectrum is non-negative (lazy grid)",
                            needs="P_πᵏ is a low-pass filter only where λ ≥ 0 (λ ≈ −1 survives as λ² ≈ 1)",
                            quantity="λ_min(P_π), per grid", values=lam, unit="grid", units=grids, target=0.0,
                            op=">="))
    er1, _ = _spectral(rows, "lazy", "options", 1)
    premises.append(premise("rank_binds", f"the SR's effective rank at k=1 exceeds d={d}",
                            needs="a rank-d bottleneck that binds (an SR of effective rank ≤ d fits at any k)",
                            quantity=f"erank(M_1) / d, d={d}, ratio over grids", values=[e / d for e in er1],
                            compare="ratio", unit="grid", units=grids, target=1.0, op=">"))
    f1, _ = _spectral(rows, "lazy", "options", 1, key="floor_fro")
    f4, _ = _spectral(rows, "lazy", "options", K_CLAIM, key="floor_fro")
    premises.append(premise("floor_falls", f"the rank-{d} floor of the SR falls from k=1 to k={K_CLAIM} (options)",
                            needs="temporal abstraction must lower the error floor of a rank-d fit for a fit-quality gain",
                            quantity=f"‖M_k − [M_k]_d‖_F/‖M_k‖_F at k={K_CLAIM} / at k=1, ratio over grids",
                            values=f4, baseline=f1, compare="ratio", unit="grid", units=grids, target=1.0, op="<"))
    q_rank = "erank(SR at k) / erank(SR at k=1), uniform macro policy, Roy–Vetterli, γᵏ; ratio over grids"
    for abstraction, label in (("options", "options (P_πᵏ)"), ("repeat", "action repeat (Σ_a π_a P_aᵏ)")):
        for k in (2, K_CLAIM, 8):
            to, _ = _spectral(rows, "lazy", abstraction, k)
            claims.append(claim(f"lazy grid, γ=0.99: SR effective rank falls from k=1 to k={k}, {label}",
                                paper=PAPER_SPECTRUM, quantity=q_rank, values=to, baseline=er1, compare="ratio",
                                unit="grid", units=grids, target=1.0, op="<", requires="nonnegative_spectrum"))
    pm1, seeds = _spectral(rows, "", "options", 1, table="pointmass_spectrum", unit="seed")
    for abstraction in ("options", "repeat") if pm1 else ():
        pm4, _ = _spectral(rows, "", abstraction, K_CLAIM, table="pointmass_spectrum", unit="seed")
        claims.append(claim(f"point mass (12×12 cells), γ=0.99: SR effective rank falls from k=1 to k={K_CLAIM}, "
                            f"{abstraction}", paper=PAPER_SPECTRUM, quantity=q_rank.replace("grids", "data seeds"),
                            values=pm4, baseline=pm1, compare="ratio", unit="seed", units=seeds, target=1.0, op="<"))
    cyc_to, cycles = _spectral(rows, "cycle", "options", 8)
    cyc_1, _ = _spectral(rows, "cycle", "options", 1)
    controls.append(claim("SR effective rank falls from k=1 to k=8 on deterministic cycles (|λ|=1: nothing to filter)",
                          paper=PAPER_SPECTRUM, quantity=q_rank, values=cyc_to, baseline=cyc_1, compare="ratio",
                          unit="cycle", units=cycles, target=1.0, op="<"))
    t4, _ = _spectral(rows, "lazy", "options", K_CLAIM, key="sigma_tail")
    t1, _ = _spectral(rows, "lazy", "options", 1, key="sigma_tail")
    claims.append(claim(f"the paper's bound σ_(d+1)(M_k)·‖r‖₂ shrinks from k=1 to k={K_CLAIM} (options, γ=0.99, d={d})",
                        paper=PAPER_BOUND, quantity="σ_(d+1)(M_k) / σ_(d+1)(M_1), ratio over grids", values=t4,
                        baseline=t1, compare="ratio", unit="grid", units=grids, target=1.0, op="<",
                        requires="rank_binds"))
    return claims, controls, premises


def _learned_claims(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    fb = [r for r in rows if r["table"] == "fb"]
    claims, controls, premises, competitors = [], [], [], []

    def per_seed(mode: str, k: int, key: str, steps: int, abstraction: str) -> tuple[list[float], list[int]]:
        sel = sorted((r for r in fb if (r["mode"], r["gamma"], r["k"], r["abstraction"], r["steps"])
                      == (mode, 0.99, k, abstraction, steps)), key=lambda r: r["seed"])
        return [r[key] for r in sel], [r["seed"] for r in sel]

    last = max(EVAL_SWEEP)
    q_sr = "relative SR error ‖FᵀBρ − M_k‖_F/‖M_k‖_F, k={} vs k=1 (options), {}; ratio over seeds"
    err_k, seeds = per_seed("evaluation", K_CLAIM, "sr_error", BUDGET, "options")
    err_1, _ = per_seed("evaluation", 1, "sr_error", BUDGET, "options")
    claims.append(claim(f"γ=0.99: FB fits the SR better at k={K_CLAIM} than at k=1 after {BUDGET} steps",
                        paper=PAPER_STABLE, quantity=q_sr.format(K_CLAIM, f"both at {BUDGET} steps"), values=err_k,
                        baseline=err_1, compare="ratio", units=seeds, target=1.0, op="<", name="sr_same_budget",
                        requires=["rank_binds", "floor_falls"]))
    err_1_more, _ = per_seed("evaluation", 1, "sr_error", K_CLAIM * BUDGET, "options")
    competitors.append(competitor("sr_same_budget", f"k=1 with {K_CLAIM}× the steps fits the SR better than k=1",
                                  competitor=f"k=1 trained {K_CLAIM * BUDGET} steps",
                                  quantity=q_sr.format(1, f"{K_CLAIM * BUDGET} vs {BUDGET} steps"), values=err_1_more,
                                  baseline=err_1, compare="ratio", units=seeds, target=1.0, op="<"))
    err_k_last, _ = per_seed("evaluation", K_CLAIM, "sr_error", last, "options")
    err_1_last, _ = per_seed("evaluation", 1, "sr_error", last, "options")
    claims.append(claim(f"γ=0.99: at convergence ({last} steps) FB's SR error is lower at k={K_CLAIM} than at k=1",
                        paper=PAPER_STABLE, quantity=q_sr.format(K_CLAIM, f"both at {last} steps"), values=err_k_last,
                        baseline=err_1_last, compare="ratio", units=seeds, target=1.0, op="<", name="sr_converged",
                        requires=["rank_binds", "floor_falls"]))
    q_bound = "‖V̂−V‖₂ / (σ_(d+1)(M_k)‖r‖₂), geometric mean over 10 goals per seed"
    for k in (K_CLAIM, 1):
        vals, seeds = per_seed("evaluation", k, "error_over_bound", last, "options")
        claims.append(claim(f"learned FB (k={k}, γ=0.99, {last} steps) reaches the paper's value bound",
                            paper=PAPER_BOUND, quantity=q_bound, values=vals, units=seeds, compare="ratio", target=1.0,
                            op="<=", requires="rank_binds"))
    vals, seeds = per_seed("evaluation", K_CLAIM, "untrained_error_over_bound", last, "options")
    controls.append(claim(f"an untrained FB (k={K_CLAIM}) reaches the same bound", paper=PAPER_BOUND, quantity=q_bound,
                          values=vals, units=seeds, compare="ratio", target=1.0, op="<="))

    if not any(r["mode"] == "control" for r in fb):
        return claims, controls, premises, competitors
    ret_k, seeds = per_seed("control", K_CLAIM, "zero_shot_return", BUDGET, "repeat")
    ret_1, _ = per_seed("control", 1, "zero_shot_return", BUDGET, "repeat")
    gap_k, _ = per_seed("control", K_CLAIM, "eps_repeat", BUDGET, "repeat")
    premises.append(premise("repeat_headroom", f"the best k={K_CLAIM}-repeat policy scores above FB's k=1 return",
                            needs=f"room above k=1 for a k={K_CLAIM} policy class that loses ε_repeat to coarser actions",
                            quantity=f"(1 − ε_repeat(k={K_CLAIM})) − zero-shot return(k=1), per seed",
                            values=[1 - g for g in gap_k], baseline=ret_1, units=seeds, target=0.0, op=">"))
    q_ret = "zero-shot goal-reaching return / optimal primitive return (10 goals), k minus k=1, per seed"
    claims.append(claim(f"γ=0.99: FB's zero-shot return is higher at k={K_CLAIM} (repeat) than at k=1 after {BUDGET} "
                        "steps", paper=PAPER_STABLE, quantity=q_ret, values=ret_k, baseline=ret_1, units=seeds,
                        target=0.0, op=">", name="return_same_budget", requires="repeat_headroom"))
    more = max(CONTROL_SWEEP)
    ret_1_more, _ = per_seed("control", 1, "zero_shot_return", more, "repeat")
    competitors.append(competitor("return_same_budget", f"k=1 with {more // BUDGET}× the steps beats k=1",
                                  competitor=f"k=1 trained {more} steps", quantity=q_ret.replace("k minus", "k=1 "
                                  f"({more} steps) minus"), values=ret_1_more, baseline=ret_1, units=seeds, target=0.0,
                                  op=">"))
    shuf, _ = per_seed("control", K_CLAIM, "shuffled_reward_return", BUDGET, "repeat")
    controls.append(claim(f"FB k={K_CLAIM} with z inferred from another goal's reward beats k=1", paper=PAPER_STABLE,
                          quantity=q_ret, values=shuf, baseline=ret_1, units=seeds, target=0.0, op=">"))
    return claims, controls, premises, competitors


def claims_and_controls(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """``(claims, controls, premises, competitors)`` from the rows (the spectral part alone when no FB row)."""
    claims, controls, premises = _spectral_claims(rows) if any(r["table"] == "spectrum" for r in rows) else ([], [], [])
    competitors: list[dict] = []
    if any(r["table"] == "fb" for r in rows):
        c, k, p, m = _learned_claims(rows)
        claims, controls, premises, competitors = claims + c, controls + k, premises + p, m
    return claims, controls, premises, competitors


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    fb = [r for r in rows if r["table"] == "fb"]
    for mode, gamma, k, abstraction, steps in sorted({(r["mode"], r["gamma"], r["k"], r["abstraction"], r["steps"])
                                                      for r in fb}):
        sel = [r for r in fb if (r["mode"], r["gamma"], r["k"], r["abstraction"], r["steps"])
               == (mode, gamma, k, abstraction, steps)]
        entry: dict[str, Any] = {"table": f"FB {mode}", "gamma": gamma, "k": k, "abstraction": abstraction,
                                 "steps": steps, "seeds": len(sel)}
        keys = (("sr_error", "error_over_bound", "loss_cv_last") if mode == "evaluation"
                else ("zero_shot_return", "eps_repeat", "shuffled_reward_return"))
        for key in keys:
            entry[key] = round(float(np.mean([r[key] for r in sel])), 4)
        out.append(entry)
    for env in ("lazy10-slip0.2", "grid10-slip0.2-stay0"):
        for abstraction in ("options", "repeat"):
            sel = [r for r in rows if r["table"] == "spectrum" and r["env"] == env and r["gamma"] == 0.99
                   and r["abstraction"] == abstraction]
            entry = {"table": f"SR erank / rank-{FB['z_dim']} floor ({env}, γ=0.99)", "abstraction": abstraction,
                     "lambda_min": round(sel[0]["lambda_min"], 3)}
            entry.update({f"k={r['k']}": f"{r['sr_erank']:.2f} / {r['floor_fro']:.3f}" for r in sel})
            out.append(entry)
    for abstraction in ("options", "repeat"):
        sel = [r for r in rows if r["table"] == "pointmass_spectrum" and r["abstraction"] == abstraction]
        entry = {"table": "SR erank (point mass, 12×12 cells, γ=0.99, mean over seeds)", "abstraction": abstraction}
        entry.update({f"k={k}": round(float(np.mean([r["sr_erank"] for r in sel if r["k"] == k])), 2) for k in KS})
        out.append(entry)
    return out


def run(quick: bool, seed: int) -> BenchmarkResult:
    torch.set_num_threads(1)  # tiny ops: one thread avoids contention on shared cores
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    seeds = tuple(seed + s for s in SEEDS)
    rows = spectrum_rows() + pointmass_rows(seeds) + learned_rows(quick, seeds)
    claims, controls, premises, competitors = claims_and_controls(rows)
    missing = [run for run in planned_runs(quick) for s in seeds
               if not (cache_dir() / f"{run_key(*run, s)}.pt").exists()]
    notes = {"fb": FB, "grid": GRID, "seeds": list(seeds), "k_claim": K_CLAIM, "budget": BUDGET,
             "eval_sweep": list(EVAL_SWEEP), "control_sweep": list(CONTROL_SWEEP), "cache": str(cache_dir()),
             "runs": [list(r) for r in planned_runs(quick)], "uncached_after_run": len(missing),
             "train_cpu_s_total": round(sum({(r["mode"], r["k"], r["abstraction"], r["seed"]): r["train_cpu_s"]
                                             for r in rows if r["table"] == "fb"}.values()), 1)}
    return BenchmarkResult(rows, claims, controls, notes=notes, summary=_summary(rows), premises=premises,
                           competitors=competitors)


if __name__ == "__main__":
    import sys

    args = [a for a in sys.argv[1:] if a != "--full"]
    build_cache(quick="--full" not in sys.argv, seeds=tuple(int(a) for a in args) or SEEDS)
