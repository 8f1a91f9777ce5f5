"""The landing step of PoLAR: X and Y gradients replaced by the landing field before every optimizer step.

Choice (the spec allows a callback and/or an optimizer wrapper): a **callback**, plus its functional form
:func:`apply_landing_`. Why: Lightning calls ``on_before_optimizer_step`` exactly where the field must be formed —
after gradient accumulation and AMP unscaling, before clipping and the step — for any optimizer the YAML chooses
(the paper feeds the field to AdamW), in automatic and manual optimization alike; an optimizer wrapper would have to
be threaded through every task module's ``optimizer`` callable and re-implemented per optimizer. Plain-PyTorch and
alternating-optimization users (PoLAR-VBLL) call :func:`apply_landing_` between ``backward`` and ``step``.

.. code-block:: python

    from lit_lowrank.adapters import PoLARLanding

    trainer = L.Trainer(callbacks=[AdapterInjector(method="polar", target_modules=["query", "value"], rank=8),
                                   PoLARLanding(lam=5e-3, safe_radius=0.5)])
"""

from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from typing_extensions import override

from lit_lowrank.adapters.polar import polar_delta_stable_rank, polar_layers
from lit_lowrank.core.logging import log_method
from lit_lowrank.ops.polar import landing_direction, orthogonality_error, shorten_to_safe_region


def stiefel_factors(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The trainable X and Y factors (``(name, parameter)``) of every active PoLAR adapter in ``model``.

    .. code-block:: python

        names = [name for name, _ in stiefel_factors(model)]   # [..."q.lora_X.default", ..."q.lora_Y.default"]
    """
    found = []
    for name, layer in polar_layers(model):
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_X:
                continue
            for kind in ("lora_X", "lora_Y"):
                param = getattr(layer, kind)[adapter]
                if param.requires_grad:
                    found.append((f"{name}.{kind}.{adapter}" if name else f"{kind}.{adapter}", param))
    return found


@torch.no_grad()
def apply_landing_(model: nn.Module, lam: float = 1.0) -> int:
    """In place: replace the gradient of every PoLAR X / Y factor by the landing field; Θ's gradient is untouched.

    Call between ``loss.backward()`` and ``optimizer.step()``. Factors without a gradient are skipped.

    Args:
        model: any module containing :class:`~lit_lowrank.adapters.polar.PoLARLinear` layers.
        lam: the landing attraction ``λ >= 0`` (0 = Riemannian-gradient direction only, no pull back).

    Returns:
        How many factor gradients were replaced.

    .. code-block:: python

        loss.backward()
        apply_landing_(model, lam=5e-3)
        optimizer.step()
    """
    count = 0
    for _, param in stiefel_factors(model):
        if param.grad is None:
            continue
        param.grad.copy_(landing_direction(param, param.grad, lam))
        count += 1
    if count:
        for _, layer in polar_layers(model):  # the layers' "stepped without landing" check reads this
            layer.landing_steps += 1
    return count


def polar_diagnostics(model: nn.Module) -> dict[str, float]:
    """Orthogonality error (max and mean over layers) of X and Y, and the mean stable rank of ΔW.

    Keys: ``orthogonality_error_x_max``, ``orthogonality_error_x_mean``, the same for ``y``, ``stable_rank_mean``
    (of ``ΔW``, exact; 0 while ``ΔW = 0``), ``layers``.

    .. code-block:: python

        polar_diagnostics(model)["orthogonality_error_x_max"]
    """
    errs: dict[str, list[float]] = {"x": [], "y": []}
    ranks = []
    for _, layer in polar_layers(model):
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_X:
                continue
            errs["x"].append(float(orthogonality_error(layer.lora_X[adapter])))
            errs["y"].append(float(orthogonality_error(layer.lora_Y[adapter])))
            ranks.append(polar_delta_stable_rank(layer, adapter))
    out: dict[str, float] = {"layers": float(len(ranks))}
    for kind, values in errs.items():
        if values:
            out[f"orthogonality_error_{kind}_max"] = max(values)
            out[f"orthogonality_error_{kind}_mean"] = sum(values) / len(values)
    if ranks:
        out["stable_rank_mean"] = sum(ranks) / len(ranks)
    return out


class PoLARLanding(Callback):
    """Keep PoLAR's X and Y near the Stiefel manifold with the landing field (no retraction).

    Before each optimizer step the gradient ``G`` of every PoLAR factor X, Y becomes
    ``Λ = (G Xᵀ − X Gᵀ) X + λ X (XᵀX − I)`` (:func:`~lit_lowrank.ops.polar.landing_direction`); the configured
    optimizer (AdamW in the paper, lr ≈ 4e-3, λ ≈ 5e-3 on LLM fine-tuning) then steps along it. Θ keeps its plain
    gradient.

    Default ``lam=1.0`` (Ablin & Peyré's and the PoLAR reference callback's default), not the paper's 5e-3: under
    Adam only the *ratio* of the normal pull ``λ X(XᵀX − I)`` to the tangent part ``∝ G`` matters, and 5e-3 is
    weak wherever gradients are O(1) — on a random regression with Adam (lr 1e-2, 300 steps) λ = 5e-3 ended at
    ``‖XᵀX − I‖_F ≈ 0.9``, λ = 1 at ≈ 0.01, with the same loss. Set λ small only when gradients are small.

    Optional step-size safeguard (``safe_radius=ε``): Ablin & Peyré bound the SGD step so that
    ``‖XᵀX − I‖_F`` never exceeds ε. Under Adam the realised step is not ``−η Λ``, so the callback enforces the same
    invariant on the step actually taken: after ``optimizer.step()`` (a step post-hook) any factor that left the
    ε-region is moved back along its own step to the largest fraction ``t ∈ {1, ½, ¼, …}`` that stays inside
    (:func:`~lit_lowrank.ops.polar.shorten_to_safe_region`) — still no retraction, and a no-op while steps are safe.

    Diagnostics every ``log_every_n_steps`` optimizer steps (default: the Trainer's ``log_every_n_steps``, so they
    appear when the run's other metrics do) under ``method/polar/``: ``orthogonality_error_{x,y}_max``
    / ``_mean``, ``stable_rank_mean`` (of ΔW), and with the safeguard ``safe_step_fraction`` (mean ``t`` over
    factors, 1 = never shortened).

    Args:
        lam: landing attraction ``λ >= 0``.
        safe_radius: ε of the safeguard, or ``None`` (default) for no safeguard.
        log_every_n_steps: diagnostics period in optimizer steps; ``None`` (default): the Trainer's
            ``log_every_n_steps``; 0 = never.

    Raises:
        ValueError: on a negative ``lam``, a non-positive ``safe_radius``, or (at ``on_train_start``) a model
            without PoLAR layers.

    .. code-block:: python

        trainer = L.Trainer(callbacks=[AdapterInjector(method="polar", target_modules=["0", "2"], rank=4),
                                       PoLARLanding(lam=5e-3)])
    """

    method_name = "polar"
    #: its key in the run's ``method`` entry (``polar`` is the adapter injected by ``AdapterInjector``)
    method_entry_name = "polar_landing"

    def __init__(self, lam: float = 1.0, safe_radius: Optional[float] = None,
                 log_every_n_steps: Optional[int] = None) -> None:
        super().__init__()
        if not (isinstance(lam, (int, float)) and 0.0 <= lam < float("inf")):
            raise ValueError(f"`lam`={lam!r}: expected a finite number >= 0 (the landing attraction weight).")
        if safe_radius is not None and not (isinstance(safe_radius, (int, float)) and safe_radius > 0):
            raise ValueError(f"`safe_radius`={safe_radius!r}: expected None or a number > 0 (radius ε of the safe "
                             "region ‖XᵀX − I‖_F <= ε).")
        if log_every_n_steps is not None and (not isinstance(log_every_n_steps, int) or log_every_n_steps < 0):
            raise ValueError(f"`log_every_n_steps`={log_every_n_steps!r}: expected None (the Trainer's) or an "
                             "integer >= 0.")
        self.lam = float(lam)
        self.safe_radius = None if safe_radius is None else float(safe_radius)
        self.log_every_n_steps = log_every_n_steps
        self._snapshots: list[tuple[nn.Parameter, Tensor]] = []
        self._hooks: dict[int, Any] = {}
        self._fractions: list[float] = []

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not stiefel_factors(pl_module):
            raise ValueError("PoLARLanding found no trainable PoLAR factors in the model: inject PoLAR adapters first "
                             "(AdapterInjector(method='polar', ...) or inject_adapters(model, method='polar', ...)).")

    @override
    def on_before_optimizer_step(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", optimizer: torch.optim.Optimizer
    ) -> None:
        apply_landing_(pl_module, self.lam)
        if self.safe_radius is None:
            return
        # snapshot the factors this optimizer owns, so the post-step hook can shorten an unsafe step
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self._snapshots = [(p, p.detach().clone()) for _, p in stiefel_factors(pl_module) if id(p) in owned]
        if id(optimizer) not in self._hooks:
            self._hooks[id(optimizer)] = optimizer.register_step_post_hook(self._after_step)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            for param, before in self._snapshots:
                kept, fraction = shorten_to_safe_region(before, param.detach(), self.safe_radius)
                if fraction < 1.0:
                    param.copy_(kept)
                self._fractions.append(fraction)
        self._snapshots = []

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every = trainer.log_every_n_steps if self.log_every_n_steps is None else self.log_every_n_steps
        if not every or trainer.global_step % every:
            return
        for name, value in polar_diagnostics(pl_module).items():
            if name != "layers":
                log_method(pl_module, self.method_name, name, value)
        if self._fractions:
            log_method(pl_module, self.method_name, "safe_step_fraction", sum(self._fractions) / len(self._fractions))
            self._fractions = []

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._hooks = {}
        self._snapshots = []


__all__ = ["PoLARLanding", "apply_landing_", "polar_diagnostics", "stiefel_factors"]
