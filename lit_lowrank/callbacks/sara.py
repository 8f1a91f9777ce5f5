"""SARA: step-adaptive SVD rank control for diffusion inference (SARA-DP and SARA-Online)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor, nn
from typing_extensions import override

from lit_lowrank.callbacks.sara_controller import DEFAULT_LEVELS, SARAController
from lit_lowrank.core.loss_hooks import MethodCallback

SARAMode = Literal["dp", "online", "uniform", "static", "full"]
_MODES = ("dp", "online", "uniform", "static", "full")


class SARA(MethodCallback):
    """Training-free inference acceleration: the denoiser's Linear layers (optionally 1×1 convs) run
    SVD-factored, with the rank chosen per denoising step (and per block in DP mode).

    - ``mode="dp"`` (SARA-DP): before inference, sample ``calibration_samples`` warm-up labels at full
      rank with ``num_inference_steps`` steps; at every step each block is truncated to each rank level
      in an extra teacher-forced forward and its relative output error measured; the schedule minimising
      the summed error with factored-layer MACs ``≤ budget`` × full is solved by DP (globally optimal
      for this additive model, :func:`~lit_lowrank.ops.sara.solve_rank_dp`).
    - ``mode="online"`` (SARA-Online): no calibration; before step ``t`` the closed-form spectrum LRAE
      of the previous denoiser output (each sample's output as a matrix) gives the smallest rank
      fraction ``ρ_t`` that represents that output to relative error ``threshold``, and every factored
      layer runs at ``⌈ρ_t · min(m, n)⌉`` (the first step at full rank;
      :func:`~lit_lowrank.ops.sara.online_rank_fraction`).
    - baselines: ``"uniform"`` (rank fraction ``budget`` everywhere), ``"static"`` (static SVD
      compression keeping energy ``budget``), ``"full"``.

    SARA acts during ``trainer.test`` / ``trainer.predict`` (factored on start, original layers back
    on end), inside :meth:`activate` (``with sara.activate(module): module.sample(...)``), and at the
    end of each validation epoch of ``fit`` when ``eval_samples > 0``: it samples ``eval_samples``
    images at full rank and with SARA from the same noise and logs ``method/sara/macs_ratio`` and
    ``method/sara/sample_rel_error``. The original layers are always restored afterwards.

    Requirements on the LightningModule: the denoiser at attribute ``denoiser_attr`` (an
    ``nn.Module`` called with the timestep as its second argument or ``timestep=``); for calibration
    and the validation diagnostic, ``sample(num_samples, class_labels=None, num_inference_steps=...,
    noise=...)`` and ``sample_shape`` ``(C, H, W)`` like :class:`~lit_lowrank.tasks.DiffusionModule` (class
    labels are drawn when the module has ``num_classes``). A ``current_step_index`` attribute, when present, gives
    the exact step. For diffusers pipelines use :func:`~lit_lowrank.callbacks.sara_controller.apply_sara`.

    Args:
        mode: ``"dp"``, ``"online"``, ``"uniform"``, ``"static"`` or ``"full"``.
        budget: DP: factored-layer MACs fraction; uniform: rank fraction; static: energy kept.
        threshold: SARA-Online's tolerated relative LRAE ``τ`` of the denoiser output.
        levels: rank fractions of ``min(m, n)`` the DP chooses among.
        target: regex / names of the layers to factor (default all Linear layers).
        exclude: regex of layers never factored, e.g.
            :data:`~lit_lowrank.callbacks.sara_controller.CONDITIONING_LAYERS` (timestep / class embedders,
            adaLN modulation: little of the MACs, but they reach every token).
        include_conv1x1: also factor pointwise convolutions.
        include_conv: also factor ``k×k`` convolutions (as ``C_out × C_in·k·k``; UNets).
        blocks: ``"auto"`` or a list of block regexes (DP granularity).
        denoiser_attr: attribute of the module holding the denoiser.
        num_inference_steps: solver steps of calibration and of the validation diagnostic.
        calibration_samples: warm-up samples for SARA-DP.
        eval_samples: samples of the validation diagnostic (0 = off).
        seed: seed of the warm-up / diagnostic noise and labels.

    .. code-block:: python

        sara = SARA(mode="dp", budget=0.6, num_inference_steps=20)
        module = DiffusionModule.load_from_checkpoint("ddpm.ckpt")
        with sara.activate(module):
            images = module.sample(64, class_labels=labels, num_inference_steps=20)
        print(sara.controller_macs_ratio)
    """

    method_name = "sara"

    def __init__(self, mode: SARAMode = "dp", budget: float = 0.6, threshold: float = 0.7,
                 levels: Sequence[float] = DEFAULT_LEVELS, target: str | Sequence[str] | None = None,
                 include_conv1x1: bool = False, blocks: str | Sequence[str] = "auto", denoiser_attr: str = "model",
                 num_inference_steps: int = 20, calibration_samples: int = 8, eval_samples: int = 8,
                 seed: int = 0, include_conv: bool = False, exclude: str | None = None) -> None:
        if mode not in _MODES:
            raise ValueError(f"`mode`={mode!r}, expected one of {_MODES}.")
        if not 0 < budget <= 1:
            raise ValueError(f"`budget`={budget!r}, expected a fraction in (0, 1].")
        if threshold < 0:
            raise ValueError(f"`threshold`={threshold!r}, expected >= 0.")
        if num_inference_steps < 1 or calibration_samples < 1 or eval_samples < 0:
            raise ValueError("`num_inference_steps` and `calibration_samples` must be >= 1 and `eval_samples` >= 0; "
                             f"got {num_inference_steps}, {calibration_samples}, {eval_samples}.")
        self.mode, self.budget, self.threshold = mode, float(budget), float(threshold)
        self.controller_kwargs = {"target": target, "include_conv1x1": include_conv1x1, "blocks": blocks,
                                  "include_conv": include_conv, "exclude": exclude,
                                  "levels": tuple(levels)}
        self.denoiser_attr = denoiser_attr
        self.num_inference_steps, self.calibration_samples = num_inference_steps, calibration_samples
        self.eval_samples, self.seed = eval_samples, seed
        self.controller: SARAController | None = None
        self.controller_macs_ratio = float("nan")

    # -- requirements ------------------------------------------------------------------------
    def _denoiser(self, pl_module: nn.Module) -> nn.Module:
        denoiser = getattr(pl_module, self.denoiser_attr, None)
        if not isinstance(denoiser, nn.Module):
            raise ValueError(f"SARA: `denoiser_attr`={self.denoiser_attr!r} is not an nn.Module attribute of "
                             f"{type(pl_module).__name__}; set it to the attribute holding the diffusion network.")
        return denoiser

    def _require_sample(self, pl_module: nn.Module, why: str) -> None:
        if not callable(getattr(pl_module, "sample", None)):
            raise ValueError(f"SARA {why} needs `{type(pl_module).__name__}.sample(num_samples, class_labels=..., "
                             "num_inference_steps=..., noise=...)` (see DiffusionModule); the module has none.")

    def _labels(self, pl_module: nn.Module, n: int, generator: torch.Generator) -> Tensor | None:
        num_classes = getattr(pl_module, "num_classes", None)
        if num_classes is None:
            return None
        return torch.randint(0, int(num_classes), (n,), generator=generator).to(pl_module.device)

    def _sample(self, pl_module: Any, n: int, noise: Tensor, labels: Tensor | None) -> Tensor:
        return pl_module.sample(n, class_labels=labels, num_inference_steps=self.num_inference_steps, noise=noise)

    def _noise(self, pl_module: Any, n: int, offset: int) -> tuple[Tensor, Tensor | None]:
        generator = torch.Generator().manual_seed(self.seed + offset)
        labels = self._labels(pl_module, n, generator)
        shape = getattr(pl_module, "sample_shape", None)
        if shape is None and hasattr(pl_module, "_sample_shape"):  # DiffusionModule
            shape = pl_module._sample_shape()
        if shape is None:
            raise ValueError(f"SARA draws its noise with shape `{type(pl_module).__name__}.sample_shape` = (C, H, W); "
                             "the module has none.")
        return torch.randn((n, *shape), generator=generator).to(pl_module.device), labels

    # -- activation ------------------------------------------------------------------------------
    def attach(self, pl_module: Any) -> SARAController:
        """Factor the module's denoiser and install the policy (calibrating SARA-DP); see :meth:`activate`."""
        if self.controller is not None:
            return self.controller
        step_source = (lambda: pl_module.current_step_index) if hasattr(pl_module, "current_step_index") else None
        controller = SARAController(self._denoiser(pl_module), step_source=step_source,
                                    **self.controller_kwargs).attach()
        self.controller = controller
        try:
            if self.mode == "uniform":
                controller.set_uniform(self.budget)
            elif self.mode == "static":
                controller.set_static_energy(self.budget)
            elif self.mode == "online":
                controller.set_online(self.threshold)
            elif self.mode == "dp":
                self._require_sample(pl_module, "mode='dp' calibration")
                n = self.calibration_samples
                noise, labels = self._noise(pl_module, n, offset=10_000)
                controller.calibrate(lambda: self._sample(pl_module, n, noise, labels), self.budget)
        except Exception:
            self.detach()
            raise
        controller.reset_macs()
        return controller

    def detach(self) -> None:
        """Restore the original layers."""
        if self.controller is not None:
            self.controller_macs_ratio = self.controller.macs_ratio()
            self.controller.detach()
            self.controller = None

    @contextlib.contextmanager
    def activate(self, pl_module: Any) -> Iterator[SARAController]:
        """``with sara.activate(module): module.sample(...)`` — factored inside, original layers after."""
        controller = self.attach(pl_module)
        try:
            yield controller
        finally:
            self.detach()

    # -- Lightning hooks -----------------------------------------------------------------------
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._denoiser(pl_module)  # fail early with a clear message
        if self.eval_samples > 0 and stage == "fit":
            self._require_sample(pl_module, "validation diagnostic (eval_samples > 0)")

    @override
    def on_test_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.attach(pl_module)

    @override
    def on_test_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.detach()

    @override
    def on_predict_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.attach(pl_module)

    @override
    def on_predict_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.detach()

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self.detach()  # an exception inside test/predict must not leave the model factored

    @override
    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.eval_samples == 0 or trainer.sanity_checking or self.controller is not None:
            return
        macs_ratio, error = self.evaluate(pl_module)
        self.log_method(pl_module, "macs_ratio", macs_ratio, on_step=False, on_epoch=True)
        self.log_method(pl_module, "sample_rel_error", error, on_step=False, on_epoch=True)
        self._log_schedule(pl_module)

    def evaluate(self, pl_module: Any) -> tuple[float, float]:
        """Sample ``eval_samples`` at full rank and with SARA from the same noise and labels;
        returns ``(factored-layer MACs ratio, ‖x_sara − x_full‖ / ‖x_full‖)``."""
        self._require_sample(pl_module, "evaluate()")
        n = self.eval_samples
        noise, labels = self._noise(pl_module, n, offset=0)
        reference = self._sample(pl_module, n, noise, labels)
        with self.activate(pl_module) as controller:
            fast = self._sample(pl_module, n, noise, labels)
            ratio = controller.macs_ratio()
            self._last_schedule = controller.schedule
            self._last_samples = (reference[:8].detach().cpu(), fast[:8].detach().cpu())  # the dashboard's grid
        error = float((fast - reference).double().norm() / reference.double().norm().clamp_min(1e-12))
        return ratio, error

    def _log_schedule(self, pl_module: "pl.LightningModule") -> None:
        schedule = getattr(self, "_last_schedule", None)
        if schedule is not None:
            levels = np.asarray(self.controller_kwargs["levels"])[schedule]
            self.log_method(pl_module, "mean_rank_fraction", float(levels.mean()), on_step=False, on_epoch=True)
        self._log_figures(pl_module.trainer)

    def _log_figures(self, trainer: "pl.Trainer") -> None:
        """Dashboard: the rank schedule (rank fraction per step and block) and full-rank vs SARA samples."""
        from lit_lowrank.core.figures import figure_due, heatmap, image_grid, log_figure, new_figure

        if not figure_due(trainer, 1):
            return
        schedule = getattr(self, "_last_schedule", None)
        if schedule is not None:
            levels = np.atleast_2d(np.asarray(self.controller_kwargs["levels"])[np.asarray(schedule)])
            fig, ax = new_figure(1.5 + 0.5 * levels.shape[1], 1.2 + 0.25 * levels.shape[0])
            heatmap(ax, levels, [str(t) for t in range(levels.shape[0])], [str(b) for b in range(levels.shape[1])],
                    xlabel="block", ylabel="sampling step", title=f"SARA-{self.mode} rank schedule",
                    colorbar_label="rank fraction kept", fmt="{:.2f}")
            log_figure(trainer, "method/sara/rank_schedule", fig)
        samples = getattr(self, "_last_samples", None)
        if samples is not None:
            reference, fast = samples
            titles = ["full rank"] * len(reference) + ["SARA"] * len(fast)
            log_figure(trainer, "method/sara/samples", image_grid(torch.cat([reference, fast]), titles,
                                                                  ncols=len(reference),
                                                                  title="same noise: full rank (top) vs SARA (bottom)"))
