"""Neural-network tomography (NN + max-sliced W1) vs NN + NLL and fair iMLE baselines on a noisy two-mode cat.

State: ``|α, α⟩ + |−α, −α⟩`` (α = 1.5), simulated at cutoff 16; reconstructions at cutoff 8
per mode (fidelity is to the *pure* cat, so truncation counts against every method). Phases
``kπ/4`` per mode, every pair a setting (16). Noise: η = 0.8, additive noise 0.1, LO drift
0.05 rad per block (full mode adds η = 0.95). Shots 10³, 10⁴, 10⁵. Units: record seeds (each
seed draws new records; every method sees the same records).

Methods, all on the same records:

- ``nn_msw1`` (the method): :class:`~lit_lowrank.tasks.tomography.TomographyModule` with the
  max-sliced W1 whose direction is optimised per setting (dense search + golden-section
  refinement), averaged over settings; restarts kept by the method's **own** loss;
- ``nn_nll``: the same network and budget on the records' likelihood, restarts kept by NLL;
- ``imle``: RρR iMLE without a noise model (the paper's "standard iMLE"), and ``imle_rank1``,
  its leading eigenvector (the pure-state estimate a pure-state model should be compared with);
- ``imle_lc`` / ``imle_lc_rank1``: iMLE with the loss-corrected POVM (known η and additive noise;
  Lvovsky 2004) and its leading eigenvector — the fair baselines;
- control ``nn_msw1_scrambled``: NN + MSW1 fitted to the 10⁵-shot records with the settings'
  phase labels permuted (the records keep their marginals, lose which phase they belong to).

Claims are computed per seed (paired), 95% t intervals over seeds; see :func:`claims_and_controls`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from lit_lowrank.benchmarks.harness import BenchmarkResult, claim
from lit_lowrank.datamodules.homodyne import HomodyneDataModule
from lit_lowrank.ops.homodyne import fidelity_pure, fidelity_to_pure, purity, reduced_density_matrix
from lit_lowrank.ops.imle import imle_reconstruct, leading_eigenvector
from lit_lowrank.tasks.tomography import fit_with_restarts

NOISE = {"high": dict(efficiency=0.8, additive_noise=0.1, phase_drift=0.05),
         "low": dict(efficiency=0.95, additive_noise=0.0, phase_drift=0.0)}
SHOTS = (1_000, 10_000, 100_000)
PAPER_CONTINUOUS = ("On noisy two-mode cat states, our method achieves continuous fidelity improvements, successfully "
                    "bypassing the noise-floor plateaus that limit standard iterative maximum-likelihood estimation.")
PAPER_LOWSHOT = ("By utilizing the max-sliced Wasserstein-1 distance, our loss perfectly maps to the structure of "
                 "homodyne measurements, structurally preventing gradient vanishing in low-shot regimes.")


def fit_nn(batch: dict[str, Any], loss: str, cutoff: int, steps: int, lr: float, seed: int, restarts: int
           ) -> dict[str, float]:
    """Fit with ``restarts`` restarts kept by the method's own criterion; fidelity and reduced purity."""
    module, _ = fit_with_restarts(batch, restarts=restarts, steps=steps, lr=lr, seed=seed, select="loss",
                                  num_modes=2, cutoff=cutoff, loss=loss)
    with torch.no_grad():
        psi = module().to(torch.complex128)
        return {"fidelity": float(fidelity_pure(batch["true_state"].to(torch.complex128), psi)),
                "reduced_purity": float(purity(reduced_density_matrix(psi, 0)))}


def imle_rows(batch: dict[str, Any], cutoff: int, iters: int, bins: int, noise: dict[str, float]
              ) -> dict[str, dict[str, float]]:
    """The four iMLE baselines: plain / loss-corrected, full-rank / leading eigenvector."""
    truth = batch["true_state"].to(torch.complex128)
    out = {}
    for name, kwargs in (("imle", {}), ("imle_lc", {"efficiency": noise["efficiency"],
                                                     "additive_noise": noise["additive_noise"]})):
        start = time.process_time()
        result = imle_reconstruct(batch["theta"], batch["x"], (cutoff, cutoff), batch["mask"], num_bins=bins,
                                  max_iter=iters, **kwargs)
        seconds = time.process_time() - start
        rho1 = torch.einsum("ajbj->ab", result.rho.reshape(cutoff, cutoff, cutoff, cutoff))
        out[name] = {"fidelity": float(fidelity_to_pure(truth, result.rho)), "reduced_purity": float(purity(rho1)),
                     "cpu_s": seconds, "iterations": result.iterations}
        psi = leading_eigenvector(result.rho).reshape(cutoff, cutoff)
        out[f"{name}_rank1"] = {"fidelity": float(fidelity_pure(truth, psi)),
                                "reduced_purity": float(purity(reduced_density_matrix(psi, 0))), "cpu_s": 0.0}
    return out


def scrambled(batch: dict[str, Any], seed: int) -> dict[str, Any]:
    """The same records with the settings' phase labels permuted (a derangement)."""
    n = batch["theta"].shape[0]
    order = np.random.default_rng(seed).permutation(n)
    perm = np.empty(n, dtype=np.int64)
    perm[order] = np.roll(order, -1)  # a random cyclic derangement: no setting keeps its label
    return {**batch, "theta": batch["theta"][torch.as_tensor(perm)]}


def run(quick: bool, seed: int) -> BenchmarkResult:
    torch.set_num_threads(1)  # tiny ops: one thread avoids contention on shared cores
    cutoff, phases = 8, 4
    seeds = tuple(seed + s for s in range(3 if quick else 5))
    # quick: one fit per method (measured ~9 CPU-s per 300-step MSW1 fit; 2 × 300 puts quick over
    # its ~300 CPU-s budget, and 2 × 200 measured no better: restarts kept by MSW1 still landed on the
    # odd-parity cat); both NN methods share steps, lr and restarts in either mode
    steps, lr, restarts = (300, 1.5e-2, 1) if quick else (800, 1e-2, 4)
    noises = ("high",) if quick else ("high", "low")
    imle_iter, imle_bins = (200, 48) if quick else (1000, 64)
    rows: list[dict[str, Any]] = []
    for noise in noises:
        for s in seeds:
            for shots in SHOTS:
                dm = HomodyneDataModule("two_mode_cat", alpha=1.5, num_phases=phases, shots=shots, seed=s,
                                        **NOISE[noise])
                dm.setup()
                batch = dm.batch
                base = {"noise": noise, "shots": shots, "seed": s}
                for loss in ("msw1", "nll") + (() if quick else ("sw1",)):
                    start = time.process_time()
                    out = fit_nn(batch, loss, cutoff, steps, lr, s, restarts)
                    rows.append({"method": f"nn_{loss}", **base, **out, "cpu_s": time.process_time() - start})
                for name, out in imle_rows(batch, cutoff, imle_iter, imle_bins, NOISE[noise]).items():
                    rows.append({"method": name, **base, **out})
                if shots == SHOTS[-1] and noise == "high":
                    start = time.process_time()
                    out = fit_nn(scrambled(batch, s), "msw1", cutoff, steps, lr, s, restarts)
                    rows.append({"method": "nn_msw1_scrambled", **base, **out, "cpu_s": time.process_time() - start})
    claims, controls = claims_and_controls(rows)
    notes = {"cutoff": cutoff, "phases_per_mode": phases, "alpha": 1.5, "steps": steps, "lr": lr,
             "restarts": restarts, "restart_selection": "each fit's own loss (MSW1 for nn_msw1, NLL for nn_nll)",
             "msw1": "max over the continuous direction per setting (32-angle search + 8 golden-section steps), "
                     "mean over the 16 settings", "imle_iterations": imle_iter, "imle_bins": imle_bins,
             "seeds": list(seeds), "noise": {k: NOISE[k] for k in noises}}
    return BenchmarkResult(rows, claims, controls, notes=notes, summary=summary(rows))


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for noise in sorted({r["noise"] for r in rows}):
        for method in dict.fromkeys(r["method"] for r in rows):
            entry: dict[str, Any] = {"noise": noise, "method": method}
            for shots in SHOTS:
                vals = [r["fidelity"] for r in rows if r["method"] == method and r["noise"] == noise
                        and r["shots"] == shots]
                if vals:
                    entry[f"fidelity@{shots}"] = f"{np.mean(vals):.3f} ± {np.std(vals):.3f}"
            if len(entry) > 2:
                out.append(entry)
    return out


def claims_and_controls(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    lo, mid, top = SHOTS

    def fid(method: str, shots: int) -> tuple[list[float], list[Any]]:
        got = {r["seed"]: r["fidelity"] for r in rows if r["method"] == method and r["shots"] == shots
               and r["noise"] == "high"}
        keys = sorted(got)
        return [got[k] for k in keys], keys

    def vs(a: str, b: str, shots_a: int, shots_b: int | None = None) -> tuple[list[float], list[float], list[Any]]:
        va, units = fid(a, shots_a)
        vb, units_b = fid(b, shots_b or shots_a)
        if units != units_b:
            raise ValueError(f"unpaired seeds: {a} {units} vs {b} {units_b}")
        return va, vb, units

    q = "fidelity to the pure two-mode cat, difference per record seed"
    claims = []
    a, b, u = vs("nn_msw1", "nn_msw1", top, lo)
    claims.append(claim(f"NN + MSW1 fidelity improves from {lo} to {top} shots (high noise)", paper=PAPER_CONTINUOUS,
                        quantity=q, values=a, baseline=b, units=u, target=0.0, op=">"))
    a, b, u = vs("nn_msw1", "nn_msw1", top, mid)
    claims.append(claim(f"NN + MSW1 fidelity still improves from {mid} to {top} shots", paper=PAPER_CONTINUOUS,
                        quantity=q, values=a, baseline=b, units=u, target=0.0, op=">"))
    for base, label in (("imle", "standard iMLE (no noise model, full rank)"),
                        ("imle_rank1", "iMLE's leading eigenvector (rank 1)"),
                        ("imle_lc_rank1", "loss-corrected iMLE's leading eigenvector")):
        a, b, u = vs("nn_msw1", base, top)
        claims.append(claim(f"NN + MSW1 above {label} at {top} shots", paper=PAPER_CONTINUOUS, quantity=q, values=a,
                            baseline=b, units=u, target=0.0, op=">"))
    a, b, u = vs("nn_msw1", "nn_nll", lo)
    claims.append(claim(f"NN + MSW1 above NN + NLL at {lo} shots (low-shot regime)", paper=PAPER_LOWSHOT, quantity=q,
                        values=a, baseline=b, units=u, target=0.0, op=">"))
    a, b, u = vs("nn_msw1_scrambled", "imle", top)
    controls = [claim(f"NN + MSW1 on phase-scrambled records above standard iMLE at {top} shots",
                      paper=PAPER_CONTINUOUS, quantity=q, values=a, baseline=b, units=u, target=0.0, op=">")]
    return claims, controls
