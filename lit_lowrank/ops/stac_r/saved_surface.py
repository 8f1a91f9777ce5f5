"""The Saved-Surface Predictor (STAC-R): which saved tensors drive the peak, and what compressing them can gain.

One instrumented training step records every saved tensor (through
:class:`~lit_lowrank.ops.saved_tensors.SavedTensorCounter`), tagged with the module
whose forward saved it. At the peak ``P`` (bytes of saved activations), a storage is
*compressible* when every holder is a target Linear layer; replacing it by one code
per holder saves ``bytes − Σ code bytes``. ``A_C⁺`` is the bytes of the compressible
storages with a positive saving, and

- ``SSP = A_C⁺ / P`` upper-bounds the peak reduction (each replaced storage still costs
  ≥ 0, and nothing else shrinks);
- the predicted new peak is ``P − Σ saving`` at the same instant (``P − A_C⁺(1 − 1/κ)``
  for a single holder per storage and compression ratio ``κ``);
- a target layer whose input is also held by a non-target op (nothing is freed) or is
  shared by so many compressed holders that their codes outweigh it is in the
  *memory-increasing regime* and is reported in ``increasing``.

These are statements about *saved-activation* bytes. The total training peak (parameters,
gradients, optimizer state, activations, transients) falls by at most the same bytes, and
by nothing when it is set where no compressible activation is alive (the optimizer step,
which holds parameters + gradients + optimizer state): :func:`predict_total_peak` combines
the saving with the two measured phases of an exact step
(:class:`~lit_lowrank.ops.peak_memory.PeakMemory`), and ``A_C⁺ / P_total`` bounds the
reduction of the total peak.

.. code-block:: python

    from lit_lowrank.ops.stac_r.saved_surface import saved_surface

    report = saved_surface(model, batch, target=r"mlp|attn", rank=16, residual_density=0.01)
    report.ssp, report.predicted_reduction, report.drivers[:3], report.increasing
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.ops.stac_r.compress import compressed_nbytes
from lit_lowrank.ops.stac_r.saved_tensors import SavedTensorCounter

__all__ = ["LayerSurface", "SurfaceRecorder", "SurfaceReport", "default_loss", "predict_total_peak",
           "predict_total_peak_timeline", "saved_surface", "select_linear"]

#: Tag prefix of tensors saved inside a module that is not compressed.
OTHER = "other:"


def select_linear(model: nn.Module, target: str | Sequence[str] | None = None, min_features: int = 1,
                  types: tuple[type, ...] = (nn.Linear,)) -> dict[str, nn.Module]:
    """Linear layers of ``model`` selected by ``target`` (regex, list of names/suffixes, or ``None`` = all).

    Raises:
        ValueError: when nothing is selected (naming ``target`` and a few Linear names).
    """
    found = {}
    for name, module in model.named_modules():
        if not name or not isinstance(module, types) or getattr(module, "in_features", 0) < min_features:
            continue
        if target is None:
            ok = True
        elif isinstance(target, str):
            ok = re.search(target, name) is not None
        else:
            ok = any(name == t or name.endswith("." + t) for t in target)
        if ok:
            found[name] = module
    if not found:
        names = [n for n, m in model.named_modules() if isinstance(m, types)]
        raise ValueError(f"`target`={target!r} (min_features={min_features}) selects no Linear layer; Linear layers: "
                         f"{names[:8]}{' ...' if len(names) > 8 else ''}.")
    return found


@dataclass(frozen=True)
class LayerSurface:
    """One target layer at the peak: its input's bytes, its code's bytes, the other holders of that input
    and the layer's share of the saving (negative: memory-increasing)."""

    name: str
    input_bytes: int
    code_bytes: int
    shared_with: tuple[str, ...]
    saving_bytes: int


@dataclass
class SurfaceReport:
    """What the predictor says before training (bytes unless noted)."""

    peak_bytes: int
    compressible_bytes: int
    ssp: float
    predicted_peak_bytes: int
    predicted_reduction: float
    drivers: list[tuple[str, int]]
    layers: dict[str, LayerSurface] = field(default_factory=dict)
    increasing: list[str] = field(default_factory=list)

    @property
    def saving_bytes(self) -> int:
        """Bytes the codes free at the saved-activation peak (negative: they add bytes)."""
        return self.peak_bytes - self.predicted_peak_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "compressible_bytes": self.compressible_bytes, "ssp": self.ssp,
                "predicted_peak_bytes": self.predicted_peak_bytes, "predicted_reduction": self.predicted_reduction,
                "drivers": [list(d) for d in self.drivers], "increasing": list(self.increasing)}


class SurfaceRecorder:
    """Context manager: record the saved-tensor timeline of a step, tagged by module.

    Tags: the name of the innermost target module running, else ``"other:<innermost module>"``.
    ``layer_shapes[name] = (N, d)`` of each target's last input.
    """

    def __init__(self, model: nn.Module, targets: dict[str, nn.Module]) -> None:
        self.model, self.targets = model, targets
        self.counter = SavedTensorCounter(record=True)
        self.layer_shapes: dict[str, tuple[int, int]] = {}
        self._stack: list[str] = []
        self._handles: list[Any] = []

    def _tag(self) -> str | None:
        for name in reversed(self._stack):
            if name in self.targets:
                return name
        return OTHER + (self._stack[-1] if self._stack else "")

    def __enter__(self) -> "SurfaceRecorder":
        names = {id(m): n for n, m in self.model.named_modules()}

        def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
            name = names.get(id(module), "?")
            self._stack.append(name)
            if name in self.targets and args and isinstance(args[0], Tensor):
                x = args[0]
                self.layer_shapes[name] = (x.numel() // max(1, x.shape[-1]), x.shape[-1])
            self.counter.tag = self._tag()

        def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self._stack:
                self._stack.pop()
            self.counter.tag = self._tag()

        for module in self.model.modules():
            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post))
        self.counter.tag = self._tag()
        self.counter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.counter.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def report(self, code_bytes: Callable[[str, int, int], int], top: int = 8,
               subset: Sequence[str] | None = None) -> SurfaceReport:
        """Turn the recorded peak into a :class:`SurfaceReport`; ``code_bytes(layer, N, d)`` prices one code.

        ``subset``: compress only these targets (the others keep their inputs like any
        other op), so one recorded step prices every choice of layers.
        """
        peak = self.counter.peak_bytes
        chosen = set(self.targets) if subset is None else set(subset) & set(self.targets)
        drivers: list[tuple[str, int]] = []
        layers: dict[str, LayerSurface] = {}
        a_plus, total_saving = 0, 0
        self.key_saving = {}
        for key, (nbytes, holders) in self.counter.peak_live.items():
            tags = [t or OTHER for t in holders]
            targets = [t for t in tags if t in chosen]
            others = sorted({t for t in tags if t not in chosen})
            drivers.append((" + ".join(sorted(set(tags))), nbytes))
            if not targets:
                continue
            codes = {t: code_bytes(t, *self.layer_shapes.get(t, (0, 0))) for t in targets}
            saving = (nbytes if not others else 0) - sum(codes.values())
            self.key_saving[key] = saving
            total_saving += saving
            if saving > 0:
                a_plus += nbytes
            for t in targets:
                # each holder's share of the group's saving, so the layers of a shared input add up
                layers[t] = LayerSurface(t, nbytes, codes[t], tuple(sorted(set(targets) - {t})) + tuple(others),
                                         saving // len(targets))
        drivers.sort(key=lambda d: -d[1])
        predicted = peak - total_saving
        return SurfaceReport(
            peak_bytes=peak, compressible_bytes=a_plus, ssp=a_plus / peak if peak else 0.0,
            predicted_peak_bytes=predicted, predicted_reduction=1.0 - predicted / peak if peak else 0.0,
            drivers=drivers[:top], layers=layers,
            increasing=sorted(n for n, layer in layers.items() if layer.saving_bytes <= 0),
        )


    def saving_timeline(self) -> list[tuple[int, int]]:
        """``(time_ns, Δ saving bytes)``: when each compressible storage starts and stops being held.

        Call after :meth:`report` (which prices the storages). The running sum is the saving
        STAC-R would make at that instant: what :func:`predict_total_peak_timeline` subtracts
        from the measured total memory.
        """
        saving = getattr(self, "key_saving", None)
        if saving is None:
            raise RuntimeError("call report() first: it prices the storages the timeline adds up.")
        out = []
        for event in self.counter.events:
            delta = saving.get(event.key, 0)
            if delta and event.nbytes:  # first pack of a storage / its last free
                out.append((event.time_ns, delta if event.kind == "pack" else -delta))
        return out


def predict_total_peak_timeline(memory_events: Sequence[tuple[int, int]], level: int, t0: int, t1: int,
                                saving_events: Sequence[tuple[int, int]], optimizer_peak: int = 0) -> int:
    """The total peak STAC-R would reach, from the measured timeline of one exact step.

    Args:
        memory_events: the allocator's ``(time_ns, signed bytes)`` events
            (:attr:`~lit_lowrank.ops.peak_memory.PeakMemory.events`).
        level: bytes allocated at ``t0``. t0 / t1: the forward + backward phase.
        saving_events: ``(time_ns, Δ saving)`` from :meth:`SurfaceRecorder.saving_timeline`
            recorded during the same phase.
        optimizer_peak: the measured peak of the optimizer step (no activation alive).

    Returns ``max(max_t (M(t) − s(t)), optimizer_peak)`` over the phase: the memory ``M`` at
    every allocator event minus the saving ``s`` of the compressible storages alive then.
    The transients of compression itself (the residual's fp32 copy, the top-k) are not in
    it, so the measured peak can only be higher.
    """
    merged = sorted([(t, 0, b) for t, b in memory_events if t0 <= t <= t1]
                    + [(t, 1, d) for t, d in saving_events], key=lambda e: (e[0], e[1]))
    level_now, saving_now, best = level, 0, level
    for _, kind, value in merged:
        if kind == 0:
            level_now += value
        else:
            saving_now += value
        best = max(best, level_now - saving_now)
    return max(best, optimizer_peak)


def default_loss(model: nn.Module, batch: Any) -> Tensor:
    """The loss of one step: ``model.training_step(batch, 0)`` when the module has one (a LightningModule),
    else the model's output (``.loss`` if present, a scalar as is, otherwise the mean square)."""
    if hasattr(model, "training_step"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # self.log outside a Trainer
            out = model.training_step(batch, 0)
        return out["loss"] if isinstance(out, dict) else out
    out = model(**batch) if isinstance(batch, dict) else model(batch)
    if hasattr(out, "loss") and out.loss is not None:
        return out.loss
    if isinstance(out, Tensor) and out.dim() == 0:
        return out
    logits = out.logits if hasattr(out, "logits") else out
    return logits.float().pow(2).mean()


def saved_surface(model: nn.Module, batch: Any, loss_fn: Callable[[nn.Module, Any], Tensor] | None = None, *,
                  target: str | Sequence[str] | None = None, rank: int = 16, residual_density: float = 0.01,
                  coef_dtype: torch.dtype = torch.bfloat16, basis_stored: bool = False, min_features: int = 1,
                  ) -> SurfaceReport:
    """Run one instrumented forward/backward step of ``model`` on ``batch`` and predict STAC-R's effect.

    The model's gradients are restored afterwards (the step is an observation, not an update).

    Args:
        model: any module (a LightningModule's ``training_step`` is used when present).
        batch: its input.
        loss_fn: ``loss_fn(model, batch) -> scalar``; default :func:`default_loss`.
        target: which Linear layers STAC-R would compress (regex / names / ``None`` = all).
        rank / residual_density / coef_dtype / basis_stored: the code's parameters (its byte price).
        min_features: skip Linear layers with fewer input features.
    """
    targets = select_linear(model, target, min_features)
    loss_fn = loss_fn or default_loss
    saved_grads = {p: p.grad for p in model.parameters()}
    try:
        with SurfaceRecorder(model, targets) as recorder:
            loss = loss_fn(model, batch)
            loss.backward()
    finally:
        for p, g in saved_grads.items():
            p.grad = g

    def price(name: str, n: int, d: int) -> int:
        return compressed_nbytes(n, d, min(rank, d), residual_density, coef_dtype, basis_stored)

    return recorder.report(price)


def predict_total_peak(activation_peak: int, optimizer_peak: int, saving: int) -> int:
    """The total training peak STAC-R can reach, from an exact step measured in two phases.

    Args:
        activation_peak: bytes at the peak of forward + backward (parameters, optimizer state,
            saved activations, gradients as they appear, transients).
        optimizer_peak: bytes at the peak of the optimizer step (no activation is alive then;
            0 when the step has no separate optimizer phase).
        saving: bytes the codes free at the saved-activation peak (:attr:`SurfaceReport.saving_bytes`).

    Returns ``max(activation_peak − saving, optimizer_peak)``: the saving can only lower the
    phase whose peak holds the activations, and at most by ``saving`` (an optimistic
    estimate when that peak falls in backward, after some activations are freed). A run
    whose exact peak is the optimizer step gains nothing; a negative saving (codes that
    outweigh what they free) raises the activation phase.

    .. code-block:: python

        predicted = predict_total_peak(a_peak, opt_peak, report.saving_bytes)
        predicted_reduction = 1 - predicted / max(a_peak, opt_peak)
    """
    if min(activation_peak, optimizer_peak) < 0:
        raise ValueError(f"peaks must be >= 0, got activation_peak={activation_peak}, optimizer_peak={optimizer_peak}.")
    return max(activation_peak - saving, optimizer_peak)  # a negative saving (codes outweigh inputs) raises it
