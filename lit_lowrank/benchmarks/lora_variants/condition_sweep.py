"""SDS-LoRA's convergence claim in its cleanest setting: factorised gradient descent vs the factors' condition number.

Fit ``½‖B A − M‖²_F`` (``m = n = 64``, rank ``r = 8``) by plain gradient descent on the factors. Two ways the
factors become ill-conditioned, with singular values spread geometrically from 1 to ``1/κ``:

- ``setting="init"``: the *initial* factors (``B = U_B diag(σ)``, ``A = diag(σ) V_Aᵀ``), target ``M = U Vᵀ``
  well-conditioned (the factors' conditioning is transient: they end balanced);
- ``setting="target"``: the *solution* (``M = U diag(σ) Vᵀ``), from orthonormal initial factors — every factor pair
  that fits ``M`` has condition number ``≥ √κ``, so the slow directions stay slow to the end.

Four factor-gradient rules (float64):

- ``lora``: ``(Bᵀ G, G Aᵀ)`` — scaled by the factors' singular values;
- ``sds_lora``: SDS-LoRA, the paper's sign-canonical QR bases ``(Q_Bᵀ G, G Q_A)``;
- ``sds_polar``: SDS-LoRA with the polar bases — identical to ``(BᵀB)^{-½} Bᵀ G, G Aᵀ(AAᵀ)^{-½}`` (tested);
- ``scaled_gd``: ScaledGD / Riemannian-preconditioned LoRA ``((BᵀB)⁻¹ Bᵀ G, G Aᵀ(AAᵀ)⁻¹)``, the known κ-free rule.

Every rule gets its learning rate from the same grid, tuned per ``κ`` on tuning seeds that no measured seed uses
(fewest steps to the tolerance, then lowest loss at step 100). Measured per seed: steps until the loss is below
``tol·loss₀`` (capped at ``max_steps``: the *rate*), and the loss after 100 steps (METHODS.md's setting).

.. code-block:: python

    run = condition_run("sds_lora", kappa=1000.0, lr=0.5, max_steps=500, seed=0)
    run.steps, run.loss_at
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lit_lowrank.ops.sds_lora import lora_factor_grads, preconditioned_factor_grads, sds_factor_grads

RULES: tuple[str, ...] = ("lora", "sds_lora", "sds_polar", "scaled_gd")
LR_GRID: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class ConditionRun(NamedTuple):
    """One descent: initial loss, loss after ``check`` steps, steps to ``tol·loss₀`` (capped), divergence."""

    loss0: float
    loss_at: float
    steps: int
    diverged: bool


def _grads(rule: str, g: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    if rule == "lora":
        return lora_factor_grads(g, a, b)
    if rule == "sds_lora":
        return sds_factor_grads(g, a, b, basis="qr")
    if rule == "sds_polar":
        return sds_factor_grads(g, a, b, basis="polar")
    if rule == "scaled_gd":
        return preconditioned_factor_grads(g, a, b, power=1.0, delta=1e-12)
    raise ValueError(f"`rule`={rule!r}: expected one of {RULES}.")


SETTINGS: tuple[str, ...] = ("init", "target")


def condition_run(rule: str, kappa: float, lr: float, max_steps: int, seed: int, setting: str = "init", m: int = 64,
                  n: int = 64, r: int = 8, tol: float = 1e-8, check: int = 100) -> ConditionRun:
    """Gradient descent on the factors with ``rule``'s factor gradients; ``κ`` conditions the initial factors
    (``setting="init"``) or the target (``"target"``)."""
    if kappa < 1:
        raise ValueError(f"`kappa`={kappa!r}: a condition number is >= 1.")
    if setting not in SETTINGS:
        raise ValueError(f"`setting`={setting!r}: expected one of {SETTINGS}.")
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64

    def orth(rows: int) -> Tensor:
        return torch.linalg.qr(torch.randn(rows, r, generator=gen, dtype=dt))[0]

    sigma = torch.logspace(0.0, -math.log10(kappa), r, dtype=dt)
    if setting == "init":
        target = orth(m) @ orth(n).t()
        b, a = orth(m) * sigma, (orth(n) * sigma).t()
    else:
        target = (orth(m) * sigma) @ orth(n).t()
        b, a = orth(m), orth(n).t()
    loss0 = loss_at = math.nan
    steps, diverged = max_steps, False
    for t in range(max(max_steps, check) + 1):
        g = b @ a - target
        loss = 0.5 * float((g * g).sum())
        if t == 0:
            loss0 = loss
        if not math.isfinite(loss) or loss > 1e6 * loss0:  # a diverged run counts as 10⁶ × its initial loss
            diverged, loss = True, 1e6 * loss0
        if t == check or (diverged and t < check):
            loss_at = loss
        if steps == max_steps and t <= max_steps and (diverged or loss <= tol * loss0):
            steps = t if not diverged else max_steps
        if diverged or (t >= check and steps < max_steps):
            break
        grad_a, grad_b = _grads(rule, g, a, b)
        a, b = a - lr * grad_a, b - lr * grad_b
    return ConditionRun(loss0, loss_at, steps, diverged)


def _objective(runs: Sequence[ConditionRun]) -> tuple[float, float]:
    steps = statistics.fmean(math.log(max(r.steps, 1)) for r in runs)
    loss = statistics.fmean(math.log(max(r.loss_at, 1e-300)) for r in runs)
    return steps, loss


def tuned_lr(rule: str, kappa: float, max_steps: int, tuning_seeds: Sequence[int],
             grid: Sequence[float] = LR_GRID, setting: str = "init") -> float:
    """The grid lr with the fewest steps to tolerance (then lowest loss at step 100) on ``tuning_seeds``."""
    return min(grid, key=lambda lr: _objective([condition_run(rule, kappa, lr, max_steps, s, setting)
                                                for s in tuning_seeds]))


def condition_rows(kappas: Sequence[float], seeds: Sequence[int], tuning_seeds: Sequence[int],
                   max_steps: int, rules: Sequence[str] = RULES,
                   settings: Sequence[str] = SETTINGS) -> list[dict[str, Any]]:
    """One row per (setting, rule, κ, seed) at the rule's lr tuned for that setting and κ."""
    rows = []
    for setting in settings:
        for rule in rules:
            for kappa in kappas:
                lr = tuned_lr(rule, kappa, max_steps, tuning_seeds, setting=setting)
                for seed in seeds:
                    run = condition_run(rule, kappa, lr, max_steps, seed, setting)
                    rows.append({"section": "condition", "setting": setting, "method": rule, "kappa": kappa,
                                 "seed": seed, "lr": lr,
                                 "steps_to_tol": run.steps,
                                 "loss_step100": max(run.loss_at, 1e-300),  # float64 can reach exact 0
                                 "loss_step0": run.loss0, "diverged": run.diverged})
    return rows
