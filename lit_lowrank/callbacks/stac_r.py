"""STAC-R: subspace-tracked activation compression with residuals, as a Lightning callback.

:func:`~lit_lowrank.callbacks.stac_r_layer.apply_stac_r` (the functional form) swaps the
selected ``nn.Linear`` / GPT-2 ``Conv1D`` layers for :class:`~lit_lowrank.callbacks.stac_r_layer.STACRLinear`.
:class:`STACR` applies it in ``setup`` and runs an explicit sequence of stages
(:class:`Stage`): ``calibrate`` on the first training batch (an exact, instrumented step:
with ``target_cosine`` each layer's rank is chosen there for the paper's fidelity condition
(:func:`~lit_lowrank.ops.stac_r_rank.select_rank`); then the Saved-Surface Predictor prices
those ranks — the predicted saving is logged *before* any compressed step — memory-increasing
layers are named in a warning, bases come from that batch's SVD); ``reference`` and
``measure``: the *total* training peak of one exact and one compressed step
(:class:`~lit_lowrank.ops.peak_memory.PeakMemory`), with a warning when the predicted saving
is not delivered; then ``train``: every step compressed, its saved-activation bytes counted.
One-off diagnostics go to the loggers once (not re-emitted every step).
"""

from __future__ import annotations

import enum
import warnings
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch import Tensor
from typing_extensions import override

from lit_lowrank.callbacks.stac_r_baselines import apply_checkpointing, galore_param_groups
from lit_lowrank.callbacks.stac_r_layer import BasisMode, STACRLinear, _dtype, apply_stac_r
from lit_lowrank.core.logging import method_key
from lit_lowrank.core.loss_hooks import MethodCallback
from lit_lowrank.ops.stac_r.compress import TrackedSavedTensorCodec, compress_activation, decompress_activation
from lit_lowrank.ops.stac_r.peak_memory import PeakMemory
from lit_lowrank.ops.stac_r.saved_surface import (
    SurfaceRecorder,
    SurfaceReport,
    predict_total_peak,
    predict_total_peak_timeline,
)
from lit_lowrank.ops.stac_r.saved_tensors import MIB, SavedTensorCounter, optimizer_state_bytes, training_state_bytes

__all__ = ["STACR", "STACRLinear", "Stage", "apply_checkpointing", "apply_stac_r", "galore_param_groups",
           "reconstruction_error", "total_memory_warning"]


class Stage(str, enum.Enum):
    """Where :class:`STACR` stands: what its next training step is."""

    CALIBRATE = "calibrate"  # exact, instrumented: ranks (for a target), predictor, bases
    REFERENCE = "reference"  # exact, total peak measured
    MEASURE = "measure"      # compressed, total peak measured
    TRAIN = "train"          # compressed


class STACR(MethodCallback):
    """Compress the saved activations of a module's Linear layers (STAC-R, METHODS.md §11).

    Step 0 is the calibration step: exact, instrumented with the
    :class:`~lit_lowrank.ops.saved_surface.SurfaceRecorder`; it logs the Saved-Surface
    Predictor on saved-activation bytes (``ssp_saved``, ``predicted_saved_reduction``,
    ``exact_peak_saved_mib``), the per-layer weight-gradient cosine, and warns (naming them)
    about layers in the memory-increasing regime. With ``measure_total`` (default) step 1
    runs exact once more and step 2 compressed, both with the **total** training peak
    measured (:class:`~lit_lowrank.ops.peak_memory.PeakMemory`, in two phases: forward +
    backward, optimizer step). After step 1 the predicted total peak
    (:func:`~lit_lowrank.ops.saved_surface.predict_total_peak`) and ``ssp`` (compressible
    bytes over the total peak: an upper bound on its reduction) are logged; after step 2 the
    measured ``total_reduction``. When the delivered reduction is at most 0 or below
    ``warn_below`` × the predicted one, a warning gives the measured numbers and the phase
    that sets the peak. No total saving is logged that was not measured. Every compressed
    step's saved-activation peak is measured with the pack-hook counter (``saved_mib``);
    every ``bridge_every`` steps the gradient cosine is measured again (that step keeps the
    exact inputs aside, so it is left out of the memory statistics).

    Args:
        rank: basis rank ``r`` per layer (with ``target_cosine``: the calibration forward's only, then replaced).
        target_cosine: choose each layer's rank at calibration as the smallest multiple of
            ``rank_multiple`` whose weight-gradient cosine (``rank_criterion="grad_cosine"``, from the
            step's exact ``X`` and ``G``) or input energy cosine (``"energy"``) reaches
            ``target_cosine + rank_margin`` (:func:`~lit_lowrank.ops.stac_r_rank.select_rank`);
            ``None``: ``rank`` everywhere.
        rank_criterion / rank_margin / rank_multiple: see ``target_cosine``.
        residual_density: kept fraction of residual entries (0 = no residual).
        residual_bits: bit width of the residual values (≤ 8, stored as int8).
        target: Linear layers to compress (regex / names / ``None`` = every wide-enough Linear).
        basis: ``"tracked"`` (STAC-R), ``"untracked"`` (frozen after step 0), ``"svd"``
            (iso-byte per-step SVD) or ``"random"`` (iso-byte fresh Gaussian projection per
            step, CompAct-style): the controls live in the same code. The activation-checkpointing
            baseline is :func:`apply_checkpointing`; the "Turbo" composition is this callback
            with a GaLore optimizer (:func:`galore_param_groups`).
        update: ``"subspace"`` iteration or ``"oja"`` (with ``oja_lr``).
        update_every: steps between two updates of a tracked basis (1 = every step).
        coef_dtype: coefficient storage dtype.
        skip_increasing: leave uncompressed the layers the predictor flags (default: warn only).
        bridge_every: gradient-cosine measurement period in steps (0 = only at calibration).
        sync_bases: under DDP, broadcast rank 0's bases after each step (identical replicas
            and checkpoints).
        saved_tensor_min_numel: also code every *other* saved floating tensor with at least
            this many elements through the generic ``saved_tensors_hooks`` path
            (:class:`~lit_lowrank.ops.stac_r.TrackedSavedTensorCodec`, decompressed on unpack);
            ``None`` (default): Linear inputs only.
        measure_total: measure the total training peak of one exact and one compressed step
            (on CPU through the PyTorch profiler's allocator events; on CUDA it resets the
            allocator's peak statistics during those two steps).
        warn_below: warn when the measured total reduction is below this fraction of the predicted one.
        figure_every_n_epochs: the dashboard figure (``method/stac_r/ssp_figure``) every n epochs (0 = never).

    .. code-block:: python

        trainer = L.Trainer(max_steps=200, callbacks=[STACR(rank=16, residual_density=0.01, residual_bits=8)])
        model = CausalLMModule(model_config={"model_type": "gpt_neox", "hidden_size": 128, "num_hidden_layers": 2,
                                             "num_attention_heads": 4, "intermediate_size": 512})
        trainer.fit(model, datamodule=PackedTextDataModule(corpus="lee"))
    """

    method_name = "stac_r"

    def __init__(self, rank: int = 16, residual_density: float = 0.01, residual_bits: int = 8,
                 target: str | list[str] | None = None, basis: BasisMode = "tracked",
                 update: Literal["subspace", "oja"] = "subspace", oja_lr: float = 0.5, coef_dtype: str = "bfloat16",
                 skip_increasing: bool = False, bridge_every: int = 50, sync_bases: bool = True,
                 saved_tensor_min_numel: int | None = None, update_every: int = 1, measure_total: bool = True,
                 warn_below: float = 0.5, target_cosine: float | None = None,
                 rank_criterion: Literal["grad_cosine", "energy"] = "grad_cosine", rank_margin: float = 0.005,
                 rank_multiple: int = 8, figure_every_n_epochs: int = 1) -> None:
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"`rank`={rank!r}, expected a positive integer.")
        if not 0.0 <= residual_density <= 1.0:
            raise ValueError(f"`residual_density`={residual_density!r}, expected a fraction in [0, 1].")
        if not 2 <= residual_bits <= 8:
            raise ValueError(f"`residual_bits`={residual_bits!r}, expected an integer in [2, 8].")
        if bridge_every < 0:
            raise ValueError(f"`bridge_every`={bridge_every!r}, expected >= 0.")
        if not isinstance(update_every, int) or update_every < 1:
            raise ValueError(f"`update_every`={update_every!r}, expected a positive integer.")
        if not 0.0 <= warn_below <= 1.0:
            raise ValueError(f"`warn_below`={warn_below!r}, expected a fraction in [0, 1].")
        if target_cosine is not None and not 0.0 < target_cosine <= 1.0:
            raise ValueError(f"`target_cosine`={target_cosine!r}, expected a cosine in (0, 1] or None.")
        if rank_criterion not in ("grad_cosine", "energy"):
            raise ValueError(f"`rank_criterion`={rank_criterion!r}, expected 'grad_cosine' or 'energy'.")
        if rank_margin < 0 or not isinstance(rank_multiple, int) or rank_multiple < 1:
            raise ValueError(f"`rank_margin`={rank_margin!r} must be >= 0 and `rank_multiple`={rank_multiple!r} a "
                             "positive integer.")
        if not isinstance(figure_every_n_epochs, int) or figure_every_n_epochs < 0:
            raise ValueError(f"`figure_every_n_epochs`={figure_every_n_epochs!r}, expected an integer >= 0.")
        _dtype(coef_dtype)
        self.rank_select = None if target_cosine is None else dict(
            target=target_cosine, criterion=rank_criterion, margin=rank_margin, multiple=rank_multiple)
        self.figure_every_n_epochs = figure_every_n_epochs
        self.surgery = dict(target=target, rank=rank, residual_density=residual_density, residual_bits=residual_bits,
                            basis=basis, update=update, oja_lr=oja_lr, coef_dtype=coef_dtype, update_every=update_every)
        self.skip_increasing, self.bridge_every, self.sync_bases = skip_increasing, bridge_every, sync_bases
        self.measure_total, self.warn_below = measure_total, warn_below
        self.codec = None if saved_tensor_min_numel is None else TrackedSavedTensorCodec(
            rank, residual_density, residual_bits, _dtype(coef_dtype), saved_tensor_min_numel)
        self.layers: dict[str, STACRLinear] = {}
        self.stage = Stage.CALIBRATE
        self.ranks: dict[str, int] = {}  # chosen per layer for target_cosine (state: a reload rebuilds them)
        self.report: dict[str, Any] = {}
        self.total: dict[str, Any] = {}
        self.peak_saved_bytes = 0
        self._pending_bases: dict[str, Tensor] = {}
        self._region: SurfaceRecorder | SavedTensorCounter | None = None
        self._meter: PeakMemory | None = None
        self._saving_timeline: list[tuple[int, int]] | None = None
        self._phase = Stage.TRAIN  # the stage of the step in flight
        self._diagnosing = False

    @property
    def calibrated(self) -> bool:
        return self.stage != Stage.CALIBRATE

    # -- structure --------------------------------------------------------------------------------------------------
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self.layers = apply_stac_r(pl_module, **self.surgery)
        self._restore_bases()

    def _restore_bases(self) -> None:
        for name, rank in self.ranks.items():
            if name in self.layers:
                self.layers[name].rank = rank
        for name, basis in list(self._pending_bases.items()):
            if name in self.layers:
                layer = self.layers[name]
                layer.stac_r_basis = basis.to(layer.weight.device)
                del self._pending_bases[name]

    # -- per step ---------------------------------------------------------------------------------------------------
    @override
    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        self._restore_bases()
        if self.stage in (Stage.REFERENCE, Stage.MEASURE) and not self.measure_total:
            self.stage = Stage.TRAIN  # switched off (a profiler the user runs already)
        self._phase = phase = self.stage
        self._diagnosing = phase == Stage.CALIBRATE or (phase == Stage.TRAIN and self.bridge_every > 0
                                                         and trainer.global_step % self.bridge_every == 0)
        for layer in self.layers.values():
            if layer.mode != "off":  # "off": skipped as memory-increasing
                layer.mode = "calibrate" if phase in (Stage.CALIBRATE, Stage.REFERENCE) else "compress"
            layer.diagnose = self._diagnosing
            layer.diagnostics.clear()
            layer.rank_select = self.rank_select if phase == Stage.CALIBRATE else None
        if self.codec is not None:
            self.codec.start_step()
        if self.measure_total and phase != Stage.TRAIN and self._meter is None:
            self._open_meter(pl_module, trainer)
        if self._meter is not None and phase in (Stage.REFERENCE, Stage.MEASURE):
            self._meter.start_segment(f"{phase.value}:forward_backward")
        # the reference step is recorded too: its saving timeline meets the measured memory timeline
        if phase == Stage.CALIBRATE:
            self._region = SurfaceRecorder(pl_module, dict(self.layers))
        elif phase == Stage.REFERENCE:  # skipped layers keep their inputs: they are not targets
            self._region = SurfaceRecorder(pl_module, {n: m for n, m in self.layers.items() if m.mode != "off"})
        else:
            self._region = SavedTensorCounter(codec=self.codec)
        self._region.__enter__()

    def _open_meter(self, pl_module: "pl.LightningModule", trainer: "pl.Trainer") -> None:
        """One measuring session from the first step that starts without gradients to the end of the measured step
        (on CPU the profiler misses frees of blocks allocated before its session)."""
        device = pl_module.device
        if device.type == "cuda":
            level = torch.cuda.memory_allocated(device)
        else:  # what the run holds already: parameters, gradients, optimizer state (the allocator events add the rest)
            level = training_state_bytes(pl_module) + sum(optimizer_state_bytes(o) for o in trainer.optimizers)
        meter = PeakMemory(device if device.type == "cuda" else "cpu", level)
        try:
            meter.__enter__()
        except RuntimeError as err:  # e.g. a profiler the user runs already
            self.measure_total = False
            warnings.warn(f"STAC-R: cannot measure the total training peak ({err}); measure_total switched off, "
                          "only saved-activation bytes are reported.", stacklevel=2)
            return
        self._meter = meter

    @override
    def on_before_optimizer_step(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                                 optimizer: torch.optim.Optimizer) -> None:
        meter = self._meter
        if meter is not None and (meter.open_segment or "").endswith(":forward_backward"):
            meter.end_segment()  # forward + backward done: the optimizer step is a phase of its own
            meter.start_segment(f"{self._phase.value}:optimizer")

    def _close_region(self) -> None:
        if self._region is not None:
            region, self._region = self._region, None
            region.__exit__(None, None, None)

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        region = self._region
        self._close_region()
        phase = self._phase
        if self._meter is not None:
            if self._meter.open_segment is not None:
                self._meter.end_segment()
            if phase == Stage.MEASURE:
                meter, self._meter = self._meter, None
                meter.__exit__(None, None, None)
                self._finish_total(trainer, meter)
        if isinstance(region, SurfaceRecorder) and phase == Stage.CALIBRATE:
            self._choose_ranks(trainer)
            self._finish_calibration(trainer, region)
        elif isinstance(region, SurfaceRecorder):  # the reference step: when would the codes save what
            region.report(self._price)
            self._saving_timeline = region.saving_timeline()
        elif isinstance(region, SavedTensorCounter) and not self._diagnosing and phase != Stage.REFERENCE:
            self.peak_saved_bytes = max(self.peak_saved_bytes, region.peak_bytes)
            self.log_method(pl_module, "saved_mib", region.peak_bytes / MIB)
            self.log_method(pl_module, "peak_saved_mib", self.peak_saved_bytes / MIB)
        if self._diagnosing:
            self._log_bridge(trainer)
        self.stage = _next_stage(phase, self.measure_total)
        if self.sync_bases and trainer.world_size > 1 and torch.distributed.is_available() \
                and torch.distributed.is_initialized():
            for layer in self.layers.values():
                if layer.stac_r_basis is not None:
                    basis = layer.stac_r_basis.contiguous().clone()
                    torch.distributed.broadcast(basis, src=0)
                    layer.stac_r_basis = basis

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Dashboard: the Saved-Surface Predictor's peak (exact, predicted with STAC-R) beside the
        measured compressed peak, and each layer's input vs code bytes."""
        from lit_lowrank.core.figures import figure_due, log_figure, new_figure

        report = self.report  # empty until calibration measured the exact step
        if "peak_bytes" not in report or not self.figure_every_n_epochs or \
                not figure_due(trainer, self.figure_every_n_epochs):
            return
        fig, (left, right) = new_figure(10.0, 3.6, ncols=2)
        names = ["exact (step 0)", "predicted (SSP)", "measured (STAC-R)"]
        values = [report["peak_bytes"] / MIB, report["predicted_peak_bytes"] / MIB, self.peak_saved_bytes / MIB]
        bars = left.bar(names, values, color=["tab:gray", "tab:blue", "tab:orange"])
        left.bar_label(bars, labels=[f"{v:.2f}" for v in values])
        left.set(ylabel="peak saved activations (MiB)", title=f"STAC-R: SSP {report['ssp']:.2f}, predicted "
                 f"reduction {report['predicted_reduction']:.2f}")
        layers = report.get("layers", {})
        if layers:
            import numpy as np

            x = np.arange(len(layers))
            right.bar(x - 0.2, [v["input_bytes"] / MIB for v in layers.values()], 0.4, label="input (exact)")
            right.bar(x + 0.2, [v["code_bytes"] / MIB for v in layers.values()], 0.4, label="code (STAC-R)")
            right.set_xticks(x, labels=[n.rsplit(".", 2)[-2] + "." + n.rsplit(".", 1)[-1] if n.count(".") > 1 else n
                                        for n in layers], rotation=60, ha="right", fontsize=7)
            right.set(ylabel="MiB per layer", title="saved bytes per compressed layer")
            right.legend(fontsize=8)
        log_figure(trainer, method_key(self.method_name, "ssp_figure"), fig)  # not "ssp": that key is a scalar

    @override
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._close_session()

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._close_session()  # a fit that ends between the exact and the measured step

    def _close_session(self) -> None:
        self._close_region()  # never leave the saved-tensor hooks installed
        meter, self._meter = self._meter, None
        if meter is not None:  # nor the profiler (an open session at interpreter exit crashes it)
            meter.__exit__(None, None, None)
            self.total.pop("reference", None)  # unfinished: measured again if training resumes
            if self.stage == Stage.MEASURE:
                self.stage = Stage.REFERENCE

    def _price(self, name: str, n: int, d: int) -> int:
        return self.layers[name].code_nbytes(n)

    def _emit(self, trainer: "pl.Trainer", values: dict[str, float]) -> None:
        """One-off diagnostics: written to every logger once, at this step (``self.log`` from a batch-end hook would
        re-emit them on every later step), and put in ``trainer.callback_metrics``."""
        metrics = {method_key(self.method_name, k): float(v) for k, v in values.items()}
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def _choose_ranks(self, trainer: "pl.Trainer") -> None:
        """Set each layer's rank and basis from its calibration :class:`~lit_lowrank.ops.stac_r_rank.RankChoice`."""
        chosen: dict[str, float] = {}
        for name, layer in self.layers.items():
            layer.diagnostics.pop("select", None)
            layer.rank_select = None
            choice = layer.diagnostics.pop("choice", None)
            if choice is None:
                continue
            layer.rank, layer.stac_r_basis = choice.rank, choice.basis.to(layer.weight.device)
            self.ranks[name] = choice.rank
            chosen[f"rank/{name}"] = choice.rank
            chosen[f"selected_cosine/{name}"] = choice.cosine
        if chosen:
            ranks = [v for k, v in chosen.items() if k.startswith("rank/")]
            cosines = [v for k, v in chosen.items() if k.startswith("selected_cosine/")]
            self._emit(trainer, {**chosen, "rank_mean": sum(ranks) / len(ranks),
                                 "selected_cosine_mean": sum(cosines) / len(cosines),
                                 "selected_cosine_min": min(cosines)})

    def _finish_calibration(self, trainer: "pl.Trainer", recorder: SurfaceRecorder) -> None:
        report: SurfaceReport = recorder.report(lambda name, n, d: self.layers[name].code_nbytes(n))
        self.report = {**report.as_dict(), "saving_bytes": report.saving_bytes,
                       "ranks": {n: layer.rank for n, layer in self.layers.items()},
                       "layers": {n: {"input_bytes": s.input_bytes, "code_bytes": s.code_bytes,
                                      "saving_bytes": s.saving_bytes, "shared_with": list(s.shared_with)}
                                  for n, s in report.layers.items()}}
        # the predicted saving, before any compressed step
        self._emit(trainer, {"ssp_saved": report.ssp, "predicted_saved_reduction": report.predicted_reduction,
                             "exact_peak_saved_mib": report.peak_bytes / MIB,
                             "predicted_peak_saved_mib": report.predicted_peak_bytes / MIB,
                             "increasing_layers": float(len(report.increasing))})
        if report.increasing:
            action = "left uncompressed (skip_increasing=True)" if self.skip_increasing else \
                "compressed anyway (set skip_increasing=True to leave them out)"
            warnings.warn(f"STAC-R: compressing {report.increasing} increases saved memory (their input is shared "
                          f"with other savers or their codes outweigh it); {action}.", stacklevel=2)
            if self.skip_increasing:
                for name in report.increasing:
                    self.layers[name].mode = "off"

    def _finish_total(self, trainer: "pl.Trainer", meter: PeakMemory) -> None:
        phases = {s.name: s.peak for s in meter.segments}

        def step(name: str) -> dict[str, int]:
            activation, optimizer = phases.get(f"{name}:forward_backward", 0), phases.get(f"{name}:optimizer", 0)
            return {"activation_peak": activation, "optimizer_peak": optimizer, "peak": max(activation, optimizer)}

        ref, measured = step("reference"), step("measure")
        fb = next((s for s in meter.segments if s.name == "reference:forward_backward"), None)
        timeline = self._saving_timeline
        if meter.events and fb is not None and timeline is not None:  # CPU: the two measured timelines
            ref["predicted_peak"] = predict_total_peak_timeline(meter.events, fb.start, fb.t0, fb.t1, timeline,
                                                                ref["optimizer_peak"])
        else:  # CUDA: the saving at the saved-activation peak off the forward/backward phase's peak
            saving = int(self.report.get("saving_bytes", 0))
            if any(layer.mode == "off" for layer in self.layers.values()):  # skipped layers keep their inputs
                saving = sum(max(0, layer["saving_bytes"]) for name, layer in self.report.get("layers", {}).items()
                             if name in self.layers and self.layers[name].mode != "off")
            ref["predicted_peak"] = predict_total_peak(ref["activation_peak"], ref["optimizer_peak"], saving)
        self._saving_timeline = None
        peak = ref["peak"]
        predicted_reduction = 1 - ref["predicted_peak"] / peak if peak else 0.0
        measured["reduction"] = 1 - measured["peak"] / peak if peak else 0.0
        measured["predicted_reduction"] = predicted_reduction
        self.total = {"reference": ref, "measured": measured}
        self._emit(trainer, {"exact_peak_total_mib": peak / MIB, "exact_optimizer_peak_mib": ref["optimizer_peak"] / MIB,
                             "predicted_peak_total_mib": ref["predicted_peak"] / MIB,
                             "predicted_total_reduction": predicted_reduction,
                             "ssp": self.report.get("compressible_bytes", 0) / peak if peak else 0.0,
                             "peak_total_mib": measured["peak"] / MIB, "total_reduction": measured["reduction"]})
        message = total_memory_warning(ref, measured, self.warn_below)
        if message:
            warnings.warn(message, stacklevel=2)

    def _log_bridge(self, trainer: "pl.Trainer") -> None:
        values: dict[str, float] = {}
        for name, layer in self.layers.items():
            stats = layer.diagnostics.pop("bridge", None)
            if stats is not None:
                values[f"bridge/{name}/cosine"] = stats.cosine
                values[f"bridge/{name}/rel_error"] = stats.rel_error
        cosines = [v for k, v in values.items() if k.endswith("/cosine")]
        if cosines:
            values.update(grad_cosine_mean=sum(cosines) / len(cosines), grad_cosine_min=min(cosines))
            self._emit(trainer, values)  # measured every bridge_every steps: logged at those steps only

    # -- state ------------------------------------------------------------------------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        bases = {n: layer.stac_r_basis.detach().cpu().clone() for n, layer in self.layers.items()
                 if layer.stac_r_basis is not None}
        bases.update({n: b.clone() for n, b in self._pending_bases.items() if n not in bases})
        hook_bases = {} if self.codec is None else {k: b.detach().cpu().clone() for k, b in self.codec.bases.items()}
        return {"bases": bases, "hook_bases": hook_bases, "stage": self.stage.value, "ranks": dict(self.ranks),
                "calibrated": self.calibrated, "report": self.report,
                "total": self.total, "peak_saved_bytes": self.peak_saved_bytes,
                "skipped": sorted(n for n, layer in self.layers.items() if layer.mode == "off")}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending_bases = dict(state_dict["bases"])
        stage = state_dict.get("stage", Stage.TRAIN.value if state_dict.get("calibrated") else Stage.CALIBRATE.value)
        # the total-peak session is not resumable: from between its two steps, measure both again
        self.stage = Stage.REFERENCE if stage == Stage.MEASURE.value else Stage(stage)
        self.ranks = dict(state_dict.get("ranks", {}))
        if self.codec is not None:
            self.codec.bases = dict(state_dict.get("hook_bases", {}))
        self.report = state_dict["report"]
        self.total = dict(state_dict.get("total", {}))
        self.peak_saved_bytes = int(state_dict["peak_saved_bytes"])
        self._restore_bases()
        for name in state_dict.get("skipped", []):
            if name in self.layers:
                self.layers[name].mode = "off"


def total_memory_warning(reference: dict[str, Any], measured: dict[str, Any], warn_below: float = 0.5) -> str | None:
    """The warning for a delivered total-peak saving of at most 0 or below ``warn_below`` × the predicted one.

    ``reference`` / ``measured``: the exact and the compressed step's phases (bytes:
    ``activation_peak``, ``optimizer_peak``, ``peak``; ``reference`` also ``predicted_peak``).
    Returns ``None`` when the saving is delivered. The text gives the measured numbers and
    which phase sets the compressed peak.
    """
    peak, ref_peak = measured["peak"], reference["peak"]
    if ref_peak <= 0:
        return None
    reduction = 1 - peak / ref_peak
    predicted = 1 - reference["predicted_peak"] / ref_peak
    if reduction > 0 and reduction >= warn_below * predicted:
        return None
    if measured["optimizer_peak"] >= measured["activation_peak"]:
        cause = (f"the peak is the optimizer step ({measured['optimizer_peak'] / MIB:.1f} MiB: parameters, gradients "
                 "and optimizer state, when no activation is alive), which compression cannot lower")
    else:
        cause = (f"the forward/backward phase still peaks at {measured['activation_peak'] / MIB:.1f} MiB "
                 f"(exact {reference['activation_peak'] / MIB:.1f} MiB): the peak falls where the compressible "
                 "activations are already freed, or the codes and their transients outweigh what they free")
    return (f"STAC-R: measured total training peak {peak / MIB:.1f} MiB vs {ref_peak / MIB:.1f} MiB exact "
            f"({reduction:+.1%} reduction; predicted {predicted:+.1%}): {cause}.")


def reconstruction_error(layer: STACRLinear, x: Tensor) -> float:
    """Relative error ``‖X − X̂‖_F / ‖X‖_F`` of ``layer``'s current code on ``x`` (a diagnostic)."""
    x2d = x.detach().reshape(-1, layer.in_features).float()
    if layer.stac_r_basis is None:
        raise ValueError("reconstruction_error: the layer has no basis yet (run a training step first).")
    code = compress_activation(x2d, layer.stac_r_basis, layer.residual_density, layer.residual_bits, layer.coef_dtype)
    return float((x2d - decompress_activation(code)).norm() / x2d.norm().clamp_min(1e-30))


def _next_stage(stage: Stage, measure_total: bool) -> Stage:
    """The stage after a step of ``stage``: calibrate → (reference → measure →) train."""
    if stage == Stage.CALIBRATE:
        return Stage.REFERENCE if measure_total else Stage.TRAIN
    if stage == Stage.REFERENCE:
        return Stage.MEASURE
    return Stage.TRAIN
