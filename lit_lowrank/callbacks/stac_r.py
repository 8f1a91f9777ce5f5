"""STAC-R: subspace-tracked activation compression with residuals, as a Lightning callback.

:func:`apply_stac_r` (the functional form) swaps the selected ``nn.Linear`` layers for
:class:`STACRLinear`: the same parameters (same ``state_dict`` keys, so checkpoints load
into the plain model too), a forward that saves the activation code of its input
(:mod:`lit_lowrank.ops.stac_r`) and a backward that contracts the weight gradient from
it. :class:`STACR` applies it in ``setup``, calibrates on the first training batch (an
exact, instrumented step: the Saved-Surface Predictor on saved-activation bytes, the
weight-gradient cosine, memory-increasing layers named in a warning, bases from that
batch's SVD), then measures the *total* training peak of one exact and one compressed
step (:class:`~lit_lowrank.ops.peak_memory.PeakMemory`) and warns when the predicted saving
is not delivered, then compresses every step, counting its saved-activation bytes.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.core.loss_hooks import MethodCallback
from lit_lowrank.core.surgery import find_modules, mark_replaced, record_surgery, replace_module
from lit_lowrank.ops.peak_memory import PeakMemory
from lit_lowrank.ops.saved_surface import (SurfaceRecorder, SurfaceReport, predict_total_peak,
                                           predict_total_peak_timeline)
from lit_lowrank.ops.saved_tensors import MIB, SavedTensorCounter, optimizer_state_bytes, training_state_bytes
from lit_lowrank.ops.stac_r import (
    TrackedSavedTensorCodec,
    compress_activation,
    compressed_nbytes,
    decompress_activation,
    init_basis,
    iso_byte_rank,
    oja_update,
    random_projection,
    random_projection_rank,
    stac_r_linear,
    subspace_iteration,
)

BasisMode = Literal["tracked", "untracked", "svd", "random"]
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"`coef_dtype`={name!r}, expected one of {sorted(_DTYPES)}.")
    return _DTYPES[name]


class STACRLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters) whose saved input is a tracked low-rank code plus a sparse residual.

    ``mode``: ``"off"`` (plain Linear), ``"calibrate"`` (exact, saves the input; initialises
    the basis), ``"compress"``. ``basis_mode``: ``"tracked"`` (one subspace-iteration / Oja
    update per step), ``"untracked"`` (frozen after the first step) or ``"svd"`` (a fresh
    per-step SVD basis, stored with the coefficients at the iso-byte rank) or ``"random"``
    (CompAct-style: a fresh Gaussian projection every step, regenerable from a seed so
    nothing but the coefficients is stored, no residual, its width chosen so the code's
    bytes match the tracked code's, :func:`~lit_lowrank.ops.stac_r.random_projection_rank`).
    Outside training or without grad it is exactly ``F.linear``.

    .. code-block:: python

        layer = STACRLinear(nn.Linear(256, 256), rank=16, residual_density=0.01)
        layer.mode = "compress"
    """

    def __init__(self, base: nn.Linear, rank: int = 16, residual_density: float = 0.01, residual_bits: int = 8,
                 basis_mode: BasisMode = "tracked", update: Literal["subspace", "oja"] = "subspace",
                 oja_lr: float = 0.5, coef_dtype: str = "bfloat16", update_every: int = 1) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight  # shared Parameters: keys, optimizer groups and tying stay as they were
        self.bias = base.bias
        if not 1 <= rank <= self.in_features:  # rank = in_features is the no-compression control
            raise ValueError(f"`rank`={rank} must be in [1, in_features={self.in_features}].")
        if not isinstance(update_every, int) or update_every < 1:
            raise ValueError(f"`update_every`={update_every!r}, expected a positive integer (steps per basis update).")
        if basis_mode not in ("tracked", "untracked", "svd", "random"):
            raise ValueError(f"`basis`={basis_mode!r}, expected 'tracked', 'untracked', 'svd' or 'random'.")
        if update not in ("subspace", "oja"):
            raise ValueError(f"`update`={update!r}, expected 'subspace' or 'oja'.")
        self.rank, self.residual_density, self.residual_bits = rank, residual_density, residual_bits
        self.basis_mode, self.update, self.oja_lr, self.coef_dtype = basis_mode, update, oja_lr, _dtype(coef_dtype)
        self.update_every = update_every
        self.compress_calls = 0  # compressed forwards so far: the tracked basis moves every `update_every`-th
        self.register_buffer("stac_r_basis", None, persistent=False)  # in the callback's state, not the model's
        self.mode = "compress"
        self.diagnose = False
        self.diagnostics: dict[str, Any] = {}
        # the random control's seed: drawn once from the global RNG (reproducible under manual_seed), then
        # one fresh projection per compressed step from (seed, step) without touching the global stream
        self.projection_seed = int(torch.randint(0, 2**31 - 1, ()).item()) if basis_mode == "random" else 0
        self.projection_step = 0

    def _rank_for(self, n: int) -> int:
        if self.basis_mode == "svd":
            return iso_byte_rank(n, self.in_features, self.rank, self.coef_dtype)
        if self.basis_mode == "random":
            return random_projection_rank(n, self.in_features, self.rank, self.residual_density, self.coef_dtype)
        return self.rank

    def _density(self) -> float:
        return 0.0 if self.basis_mode == "random" else self.residual_density

    def code_nbytes(self, n: int) -> int:
        """Bytes saved for an input of ``n`` rows."""
        return compressed_nbytes(n, self.in_features, self._rank_for(n), self._density(), self.coef_dtype,
                                 basis_stored=self.basis_mode == "svd")

    def forward(self, x: Tensor) -> Tensor:
        # a frozen weight (e.g. an adapter's base layer) needs no saved input at all: F.linear saves none
        if self.mode == "off" or not self.training or not torch.is_grad_enabled() or not self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        x2d = x.detach().reshape(-1, self.in_features)
        basis = self.stac_r_basis
        if self.basis_mode == "random":
            self.projection_step += 1
            basis = random_projection(self.in_features, self._rank_for(x2d.shape[0]),
                                      self.projection_seed + 7919 * self.projection_step, x2d.device)
        elif self.basis_mode == "svd":
            basis = init_basis(x2d, self._rank_for(x2d.shape[0]), exact=True)
        elif basis is None:
            basis = init_basis(x2d, self.rank)
        elif self.basis_mode == "tracked" and self.mode == "compress":
            if self.compress_calls % self.update_every == 0:
                basis = subspace_iteration(basis, x2d) if self.update == "subspace" else \
                    oja_update(basis, x2d, self.oja_lr)
            self.compress_calls += 1
        if self.basis_mode not in ("svd", "random"):
            self.stac_r_basis = basis  # a new tensor each update: graphs of earlier steps keep theirs
        return stac_r_linear(x, self.weight, self.bias, basis, self._density(), self.residual_bits,
                             self.coef_dtype, store_basis=self.basis_mode == "svd", exact=self.mode == "calibrate",
                             diagnostics=self.diagnostics if self.diagnose else None)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, rank={self.rank}, residual_density={self.residual_density}, "
                f"basis={self.basis_mode}, update_every={self.update_every}")


def _linear_targets(model: nn.Module, target: str | Sequence[str] | None) -> list[tuple[str, str, nn.Linear]]:
    """``(name, where to replace, Linear)`` for the Linear layers ``target`` selects.

    A PEFT adapter layer (LoRA, DoRA, LoKr, SDS-LoRA, SaMA, PoLAR: a wrapper with ``base_layer``) counts as its
    Linear: STAC-R goes on its ``base_layer``, under the wrapper's name, so adapter-then-STAC-R and
    STAC-R-then-adapter build the same model and a checkpoint rebuilds either (issue #29).
    """
    if target is None:
        matches = [(n, m) for n, m in find_modules(model, None) if isinstance(m, nn.Linear) or _adapter_base(m)]
    else:
        matches = find_modules(model, target, (nn.Linear, *_adapter_wrapper_types()))
    found = []
    for name, module in matches:
        base = _adapter_base(module)
        if base is not None:
            found.append((name, f"{name}.base_layer", base))
        elif isinstance(module, nn.Linear):
            found.append((name, name, module))
    return found


def _adapter_wrapper_types() -> tuple[type, ...]:
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return ()
    return (BaseTunerLayer,)


def _adapter_base(module: nn.Module) -> nn.Linear | None:
    """The Linear a PEFT adapter layer wraps directly (``None`` for anything else)."""
    base = getattr(module, "base_layer", None) if isinstance(module, _adapter_wrapper_types()) else None
    return base if isinstance(base, nn.Linear) else None


def apply_stac_r(model: nn.Module, target: str | Sequence[str] | None = None, rank: int = 16,
                 residual_density: float = 0.01, residual_bits: int = 8, basis: BasisMode = "tracked",
                 update: Literal["subspace", "oja"] = "subspace", oja_lr: float = 0.5,
                 coef_dtype: str = "bfloat16", update_every: int = 1) -> dict[str, STACRLinear]:
    """Functional form: replace the selected Linear layers by :class:`STACRLinear` (idempotent).

    ``target``: regex / list of names / ``None`` (every Linear with more than ``rank``
    input features; an explicitly targeted layer that is too narrow is an error).
    ``update_every``: steps between two updates of a tracked basis (1 = every step).
    Returns the STAC-R layers by name.

    .. code-block:: python

        layers = apply_stac_r(model, target=r"mlp|attn", rank=16, residual_density=0.01)
    """
    kwargs = dict(rank=rank, residual_density=residual_density, residual_bits=residual_bits, basis_mode=basis,
                  update=update, oja_lr=oja_lr, coef_dtype=coef_dtype, update_every=update_every)
    layers: dict[str, STACRLinear] = {}
    for name, where, module in _linear_targets(model, target):
        if isinstance(module, STACRLinear):
            layers[name] = module
            continue
        if module.in_features < rank or (target is None and module.in_features == rank):
            if target is None:
                continue  # "every Linear": layers no wider than the code are left alone
            raise ValueError(f"`rank`={rank} exceeds in_features={module.in_features} of target layer {name!r}.")
        layer = mark_replaced(STACRLinear(module, **kwargs), "stac_r")
        replace_module(model, where, layer)
        layers[name] = layer
    if not layers:
        raise ValueError(f"`target`={target!r} leaves no Linear layer with in_features >= rank={rank}.")
    record_surgery(model, "stac_r", apply_stac_r, {"target": target if target is None or isinstance(target, str)
                                                   else list(target), **{k: v for k, v in kwargs.items()
                                                                         if k != "basis_mode"}, "basis": basis})
    return layers


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
        rank: basis rank ``r`` per layer.
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
                 warn_below: float = 0.5) -> None:
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
        _dtype(coef_dtype)
        self.surgery = dict(target=target, rank=rank, residual_density=residual_density, residual_bits=residual_bits,
                            basis=basis, update=update, oja_lr=oja_lr, coef_dtype=coef_dtype, update_every=update_every)
        self.skip_increasing, self.bridge_every, self.sync_bases = skip_increasing, bridge_every, sync_bases
        self.measure_total, self.warn_below = measure_total, warn_below
        self.codec = None if saved_tensor_min_numel is None else TrackedSavedTensorCodec(
            rank, residual_density, residual_bits, _dtype(coef_dtype), saved_tensor_min_numel)
        self.layers: dict[str, STACRLinear] = {}
        self.calibrated = False
        self.report: dict[str, Any] = {}
        self.total: dict[str, Any] = {}
        self.peak_saved_bytes = 0
        self._pending_bases: dict[str, Tensor] = {}
        self._region: SurfaceRecorder | SavedTensorCounter | None = None
        self._meter: PeakMemory | None = None
        self._saving_timeline: list[tuple[int, int]] | None = None
        self._phase = "train"
        self._diagnosing = False

    # -- structure --------------------------------------------------------------------------------------------------
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self.layers = apply_stac_r(pl_module, **self.surgery)
        self._restore_bases()

    def _restore_bases(self) -> None:
        for name, basis in list(self._pending_bases.items()):
            if name in self.layers:
                layer = self.layers[name]
                layer.stac_r_basis = basis.to(layer.weight.device)
                del self._pending_bases[name]

    # -- per step ---------------------------------------------------------------------------------------------------
    def _next_phase(self) -> str:
        if not self.calibrated:
            return "calibrate"
        if self.measure_total and "measured" not in self.total:
            if "reference" in self.total and self._meter is None:  # resumed between the two: measure both again
                self.total.pop("reference")
            return "measure" if "reference" in self.total else "reference"
        return "train"

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        self._restore_bases()
        self._phase = phase = self._next_phase()
        self._diagnosing = phase == "calibrate" or (phase == "train" and self.bridge_every > 0
                                                     and trainer.global_step % self.bridge_every == 0)
        for layer in self.layers.values():
            if layer.mode != "off":  # "off": skipped as memory-increasing
                layer.mode = "calibrate" if phase in ("calibrate", "reference") else "compress"
            layer.diagnose = self._diagnosing
            layer.diagnostics.clear()
        if self.codec is not None:
            self.codec.start_step()
        if self.measure_total and phase != "train" and self._meter is None:
            self._open_meter(pl_module, trainer)
        if self._meter is not None and phase in ("reference", "measure"):
            self._meter.start_segment(f"{phase}:forward_backward")
        # the reference step is recorded too: its saving timeline meets the measured memory timeline
        if phase == "calibrate":
            self._region = SurfaceRecorder(pl_module, dict(self.layers))
        elif phase == "reference":  # skipped layers keep their inputs: they are not targets
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

    def on_before_optimizer_step(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                                 optimizer: torch.optim.Optimizer) -> None:
        meter = self._meter
        if meter is not None and (meter.open_segment or "").endswith(":forward_backward"):
            meter.end_segment()  # forward + backward done: the optimizer step is a phase of its own
            meter.start_segment(f"{self._phase}:optimizer")

    def _close_region(self) -> None:
        if self._region is not None:
            region, self._region = self._region, None
            region.__exit__(None, None, None)

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        region = self._region
        self._close_region()
        if self._meter is not None:
            if self._meter.open_segment is not None:
                self._meter.end_segment()
            if self._phase == "reference":
                self.total["reference"] = {}
            elif self._phase == "measure":
                meter, self._meter = self._meter, None
                meter.__exit__(None, None, None)
                self._finish_total(pl_module, meter)
        if isinstance(region, SurfaceRecorder) and self._phase == "calibrate":
            self._finish_calibration(pl_module, region)
        elif isinstance(region, SurfaceRecorder):  # the reference step: when would the codes save what
            region.report(self._price)
            self._saving_timeline = region.saving_timeline()
        elif isinstance(region, SavedTensorCounter) and not self._diagnosing and self._phase != "reference":
            self.peak_saved_bytes = max(self.peak_saved_bytes, region.peak_bytes)
            self.log_method(pl_module, "saved_mib", region.peak_bytes / MIB)
            self.log_method(pl_module, "peak_saved_mib", self.peak_saved_bytes / MIB)
        if self._diagnosing:
            self._log_bridge(pl_module)
        if self.sync_bases and trainer.world_size > 1 and torch.distributed.is_available() \
                and torch.distributed.is_initialized():
            for layer in self.layers.values():
                if layer.stac_r_basis is not None:
                    basis = layer.stac_r_basis.contiguous().clone()
                    torch.distributed.broadcast(basis, src=0)
                    layer.stac_r_basis = basis

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Dashboard: the Saved-Surface Predictor's peak (exact, predicted with STAC-R) beside the
        measured compressed peak, and each layer's input vs code bytes."""
        from lit_lowrank.core.figures import figure_due, log_figure, new_figure

        report = getattr(self, "report", None)
        if not isinstance(report, dict) or "peak_bytes" not in report or \
                not figure_due(trainer, getattr(self, "figure_every_n_epochs", 1)):
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
        log_figure(trainer, "method/stac_r/ssp", fig)

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._close_session()

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._close_session()  # a fit that ends between the exact and the measured step

    def _close_session(self) -> None:
        self._close_region()  # never leave the saved-tensor hooks installed
        meter, self._meter = self._meter, None
        if meter is not None:  # nor the profiler (an open session at interpreter exit crashes it)
            meter.__exit__(None, None, None)
            self.total.pop("reference", None)  # unfinished: measured again if training resumes

    def _price(self, name: str, n: int, d: int) -> int:
        return self.layers[name].code_nbytes(n)

    def _finish_calibration(self, pl_module: "pl.LightningModule", recorder: SurfaceRecorder) -> None:
        report: SurfaceReport = recorder.report(lambda name, n, d: self.layers[name].code_nbytes(n))
        self.calibrated = True
        self.report = {**report.as_dict(), "saving_bytes": report.saving_bytes,
                       "layers": {n: {"input_bytes": s.input_bytes, "code_bytes": s.code_bytes,
                                      "saving_bytes": s.saving_bytes, "shared_with": list(s.shared_with)}
                                  for n, s in report.layers.items()}}
        self.log_method(pl_module, "ssp_saved", report.ssp)
        self.log_method(pl_module, "predicted_saved_reduction", report.predicted_reduction)
        self.log_method(pl_module, "exact_peak_saved_mib", report.peak_bytes / MIB)
        self.log_method(pl_module, "predicted_peak_saved_mib", report.predicted_peak_bytes / MIB)
        self.log_method(pl_module, "increasing_layers", float(len(report.increasing)))
        if report.increasing:
            action = "left uncompressed (skip_increasing=True)" if self.skip_increasing else \
                "compressed anyway (set skip_increasing=True to leave them out)"
            warnings.warn(f"STAC-R: compressing {report.increasing} increases saved memory (their input is shared "
                          f"with other savers or their codes outweigh it); {action}.", stacklevel=2)
            if self.skip_increasing:
                for name in report.increasing:
                    self.layers[name].mode = "off"

    def _finish_total(self, pl_module: "pl.LightningModule", meter: PeakMemory) -> None:
        phases = {s.name: s.peak for s in meter.segments}

        def step(name: str) -> dict[str, int]:
            activation, optimizer = phases.get(f"{name}:forward_backward", 0), phases.get(f"{name}:optimizer", 0)
            return {"activation_peak": activation, "optimizer_peak": optimizer, "peak": max(activation, optimizer)}

        ref, measured = step("reference"), step("measure")
        fb = next((s for s in meter.segments if s.name == "reference:forward_backward"), None)
        timeline = getattr(self, "_saving_timeline", None)
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
        self.log_method(pl_module, "exact_peak_total_mib", peak / MIB)
        self.log_method(pl_module, "exact_optimizer_peak_mib", ref["optimizer_peak"] / MIB)
        self.log_method(pl_module, "predicted_peak_total_mib", ref["predicted_peak"] / MIB)
        self.log_method(pl_module, "predicted_total_reduction", predicted_reduction)
        self.log_method(pl_module, "ssp", self.report.get("compressible_bytes", 0) / peak if peak else 0.0)
        self.log_method(pl_module, "peak_total_mib", measured["peak"] / MIB)
        self.log_method(pl_module, "total_reduction", measured["reduction"])
        message = total_memory_warning(ref, measured, self.warn_below)
        if message:
            warnings.warn(message, stacklevel=2)

    def _log_bridge(self, pl_module: "pl.LightningModule") -> None:
        cosines = []
        for name, layer in self.layers.items():
            stats = layer.diagnostics.pop("bridge", None)
            if stats is None:
                continue
            cosines.append(stats.cosine)
            self.log_method(pl_module, f"bridge/{name}/cosine", stats.cosine)
            self.log_method(pl_module, f"bridge/{name}/rel_error", stats.rel_error)
        if cosines:
            self.log_method(pl_module, "grad_cosine_mean", sum(cosines) / len(cosines))
            self.log_method(pl_module, "grad_cosine_min", min(cosines))

    # -- state ------------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        bases = {n: layer.stac_r_basis.detach().cpu().clone() for n, layer in self.layers.items()
                 if layer.stac_r_basis is not None}
        bases.update({n: b.clone() for n, b in self._pending_bases.items() if n not in bases})
        hook_bases = {} if self.codec is None else {k: b.detach().cpu().clone() for k, b in self.codec.bases.items()}
        return {"bases": bases, "hook_bases": hook_bases, "calibrated": self.calibrated, "report": self.report,
                "total": self.total, "peak_saved_bytes": self.peak_saved_bytes,
                "skipped": sorted(n for n, layer in self.layers.items() if layer.mode == "off")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending_bases = dict(state_dict["bases"])
        self.calibrated = bool(state_dict["calibrated"])
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


def apply_checkpointing(model: nn.Module, target: str | Sequence[str]) -> list[str]:
    """Activation-checkpointing baseline: recompute the selected modules (e.g. transformer blocks) in backward.

    Each matched module's ``forward`` is wrapped in the *reentrant*
    :func:`torch.utils.checkpoint.checkpoint`: only the block inputs are saved (through the
    ordinary saved-tensor hooks, so :class:`~lit_lowrank.ops.saved_tensors.SavedTensorCounter`
    sees them), and the block's own saved tensors are created again during backward, inside
    the same hooks, so the counter measures the real peak (boundaries + one recomputed block).
    The non-reentrant variant keeps its inputs and recomputed tensors outside the hooks and
    would be under-counted. Keyword arguments (masks, rotary tables) are bound by
    ``functools.partial`` (they need no gradient). A call whose tensor inputs need no
    gradient, and every call outside training / without grad, runs the block plainly
    (reentrant checkpointing would drop its parameter gradients). Parameters and
    ``state_dict`` keys are unchanged; set ``module.stac_r_checkpoint = False`` to switch a block off.
    Returns the names of the wrapped modules (idempotent).

    .. code-block:: python

        names = apply_checkpointing(lm, target=r"layers\\.\\d+$")   # every GPT-NeoX block
    """
    names = []
    for name, module in find_modules(model, target):
        names.append(name)
        if getattr(module, "stac_r_checkpoint", None) is not None:
            continue
        module.stac_r_checkpoint = True
        module.forward = functools.partial(_checkpointed_forward, module, module.forward)
    return names


def _checkpointed_forward(module: nn.Module, forward: Any, *args: Any, **kwargs: Any) -> Any:
    needs_grad = any(isinstance(a, Tensor) and a.requires_grad for a in args)
    if not (module.stac_r_checkpoint and module.training and torch.is_grad_enabled() and needs_grad):
        return forward(*args, **kwargs)
    from torch.utils.checkpoint import checkpoint

    # a recomputed layer must not write a KV cache a second time in backward (HF layers take it as a kwarg)
    kwargs = {k: (None if k in _CACHE_KWARGS else v) for k, v in kwargs.items()}
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    return checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=True)


_CACHE_KWARGS = frozenset({"past_key_values", "past_key_value", "layer_past", "cache"})


def galore_param_groups(model: nn.Module, target: str | Sequence[str] | None = None, rank: int = 16,
                        update_proj_gap: int = 50, scale: float = 1.0, proj_type: str = "std") -> list[dict[str, Any]]:
    """Parameter groups for ``galore_torch.GaLoreAdamW``: the weights of the selected Linear layers are GaLore's.

    The "Turbo" composition of METHODS.md §11: STAC-R compresses what those layers *save*,
    GaLore what the optimizer *keeps* for them (its Adam moments live in a rank-``rank``
    projection of the gradient, ``(rank, n)`` instead of ``(m, n)``). Every other parameter
    (embeddings, norms, biases, the head) is an ordinary AdamW group.

    .. code-block:: python

        from galore_torch import GaLoreAdamW

        layers = apply_stac_r(lm, target=r"layers\\.", rank=16)
        opt = GaLoreAdamW(galore_param_groups(lm, target=r"layers\\.", rank=16), lr=2e-3)
    """
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"`rank`={rank!r}, expected a positive integer.")
    chosen = {id(m.weight) for _, m in find_modules(model, target, nn.Linear) if min(m.weight.shape) > rank}
    low = [p for p in model.parameters() if id(p) in chosen and p.requires_grad]
    rest = [p for p in model.parameters() if id(p) not in chosen and p.requires_grad]
    if not low:
        raise ValueError(f"`target`={target!r} leaves no Linear weight with both dimensions above rank={rank}.")
    return [{"params": rest}, {"params": low, "rank": rank, "update_proj_gap": update_proj_gap, "scale": scale,
                               "proj_type": proj_type}]
