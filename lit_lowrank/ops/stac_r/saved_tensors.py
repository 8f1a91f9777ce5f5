"""The saved-activation byte counter (METHODS.md, "Shared definitions": Memory).

Memory is the peak number of bytes of activations that autograd keeps for the backward
pass. :class:`SavedTensorCounter` measures it with
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves passes through
its pack hook, which adds the bytes of the tensor's storage; when autograd drops the
saved object (after the node's backward, or when the graph is freed) a
``weakref.finalize`` subtracts them again. A storage saved by several nodes (one input
used by three Linear layers) is counted once, as it is stored once. Parameters (and
views of them) are not activations and are skipped by default.

A *codec* can replace what is stored (``pack(t) -> tuple | None``, ``unpack(obj) ->
Tensor``): the counter then counts the tensors of the packed tuple instead, so a
compressor's real footprint is what is measured (only the innermost
``saved_tensors_hooks`` pair is active, so counting and compressing must share one pair).

.. code-block:: python

    from lit_lowrank.ops.stac_r.saved_tensors import SavedTensorCounter

    with SavedTensorCounter() as counter:
        loss = model(x).square().mean()
        loss.backward()
    print(counter.peak_bytes / 2**20, "MiB of saved activations at the peak")
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

__all__ = ["MIB", "SavedTensorCodec", "SavedTensorCounter", "SavedTensorEvent", "is_parameter_like", "measure_saved_bytes",
           "optimizer_state_bytes", "storage_key", "tensor_bytes", "training_state_bytes"]

#: MiB = 2**20 bytes (METHODS.md).
MIB = float(2**20)

#: Attribute that marks a tensor a codec must store unchanged (e.g. already-compressed factors).
NO_CODEC_ATTR = "_lit_lowrank_no_codec"


class SavedTensorCodec(Protocol):
    """What a compressor plugged into :class:`SavedTensorCounter` provides."""

    def pack(self, tensor: Tensor) -> tuple[Any, ...] | None:
        """A tuple holding the compressed form, or ``None`` to store ``tensor`` unchanged."""

    def unpack(self, packed: tuple[Any, ...]) -> Tensor:
        """The (approximate) tensor rebuilt from ``pack``'s tuple."""


@dataclass
class SavedTensorEvent:
    """One entry of the recorded timeline: a storage starts or stops being held."""

    kind: str            # "pack" or "free"
    key: tuple[Any, ...]  # storage identity
    nbytes: int
    tag: str | None      # who saved it (set through SavedTensorCounter.tag), None if untagged
    current: int         # bytes held right after the event
    time_ns: int = 0     # time.time_ns() of the event (the clock of the profiler's events)


def storage_key(tensor: Tensor) -> tuple[Any, ...]:
    """Identity of the memory behind ``tensor``: ``(device, storage pointer)`` (or the tensor id without storage)."""
    try:
        storage = tensor.untyped_storage()
        return (str(tensor.device), storage.data_ptr())
    except (RuntimeError, NotImplementedError):  # sparse / nested / wrapper tensors have no plain storage
        return ("id", id(tensor))


def tensor_bytes(tensor: Tensor) -> int:
    """Bytes of the storage behind ``tensor`` (what holding it costs), or ``numel * itemsize`` without one."""
    try:
        return int(tensor.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return int(tensor.numel() * tensor.element_size())


def is_parameter_like(tensor: Tensor) -> bool:
    """A parameter or a view of one (``weight.t()`` saved by ``addmm``): model state, not an activation."""
    return isinstance(tensor, nn.Parameter) or isinstance(getattr(tensor, "_base", None), nn.Parameter)


class _Held:
    """What autograd keeps for one saved tensor; its finalizer releases the counted bytes."""

    __slots__ = ("payload", "packed", "__weakref__")

    def __init__(self, payload: Any, packed: bool) -> None:
        self.payload, self.packed = payload, packed


@dataclass
class SavedTensorCounter:
    """Count the bytes of saved activations alive at any time and their peak.

    Args:
        codec: optional compressor applied in the same pack hook (its packed tensors are
            counted instead of the original).
        skip_parameters: do not count parameters and their views (they are model state).
        record: keep the event timeline (``events``) and, at the peak, the live storages
            with the tags of their holders (``peak_live``), for the Saved-Surface Predictor.

    Attributes:
        current_bytes: bytes held now. ``peak_bytes``: the running maximum.
        packed_count / skipped_count: tensors seen and tensors left uncounted.

    Use as a context manager around forward *and* backward (the frees happen during
    backward). :meth:`reset_peak` restarts the maximum from the current level.
    """

    codec: SavedTensorCodec | None = None
    skip_parameters: bool = True
    record: bool = False
    current_bytes: int = 0
    peak_bytes: int = 0
    packed_count: int = 0
    skipped_count: int = 0
    events: list[SavedTensorEvent] = field(default_factory=list)
    peak_live: dict[tuple[Any, ...], tuple[int, list[str | None]]] = field(default_factory=dict)
    tag: str | None = None
    _live: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict, repr=False)
    _hooks: Any = field(default=None, repr=False)

    # -- context manager -------------------------------------------------------------------------------------------
    def __enter__(self) -> "SavedTensorCounter":
        if self._hooks is not None:
            raise RuntimeError("SavedTensorCounter is already active; use a new counter for a nested region.")
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(*exc)

    @property
    def active(self) -> bool:
        return self._hooks is not None

    def reset_peak(self) -> None:
        """Start a new maximum from the bytes held now (e.g. at the start of each training step)."""
        self.peak_bytes = self.current_bytes

    # -- accounting ------------------------------------------------------------------------------------------------
    def _add(self, tensors: list[Tensor], tag: str | None) -> list[tuple[Any, ...]]:
        keys = []
        for t in tensors:
            key = storage_key(t)
            entry = self._live.get(key)
            if entry is None:
                nbytes = tensor_bytes(t)
                self._live[key] = [1, nbytes, [tag]]
                self.current_bytes += nbytes
            else:
                entry[0] += 1
                entry[2].append(tag)
                nbytes = 0
            keys.append(key)
            if self.record:
                self.events.append(SavedTensorEvent("pack", key, nbytes, tag, self.current_bytes, time.time_ns()))
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            if self.record:
                self.peak_live = {k: (v[1], list(v[2])) for k, v in self._live.items()}
        return keys

    def _release(self, keys: list[tuple[Any, ...]], tag: str | None) -> None:
        for key in keys:
            entry = self._live.get(key)
            if entry is None:
                continue
            entry[0] -= 1
            if tag in entry[2]:
                entry[2].remove(tag)
            freed = 0
            if entry[0] == 0:
                del self._live[key]
                self.current_bytes -= entry[1]
                freed = entry[1]
            if self.record:
                self.events.append(SavedTensorEvent("free", key, freed, tag, self.current_bytes, time.time_ns()))

    # -- hooks -----------------------------------------------------------------------------------------------------
    def _pack(self, tensor: Tensor) -> Any:
        if self.skip_parameters and is_parameter_like(tensor):
            self.skipped_count += 1
            return tensor
        packed = None
        if self.codec is not None and not getattr(tensor, NO_CODEC_ATTR, False):
            packed = self.codec.pack(tensor)
        if packed is None:
            held, tensors = _Held(tensor, False), [tensor]
        else:
            held, tensors = _Held(packed, True), [p for p in packed if isinstance(p, Tensor)]
        self.packed_count += 1
        keys = self._add(tensors, self.tag)
        weakref.finalize(held, self._release, keys, self.tag)
        return held

    def _unpack(self, held: Any) -> Tensor:
        if not isinstance(held, _Held):
            return held
        if held.packed:
            assert self.codec is not None
            return self.codec.unpack(held.payload)
        return held.payload


def measure_saved_bytes(fn: Callable[[], Any], codec: SavedTensorCodec | None = None) -> int:
    """Peak saved-activation bytes while running ``fn`` (which should run forward and backward).

    .. code-block:: python

        peak = measure_saved_bytes(lambda: model(x).sum().backward())
    """
    with SavedTensorCounter(codec=codec) as counter:
        fn()
    return counter.peak_bytes


def _state_tensors(value: Any, depth: int = 0) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if depth > 3:
        return []
    if isinstance(value, dict):
        return [t for v in value.values() for t in _state_tensors(v, depth + 1)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _state_tensors(v, depth + 1)]
    if hasattr(value, "__dict__"):  # e.g. GaLore's projector object holding its (r, n) basis
        return [t for v in vars(value).values() for t in _state_tensors(v, depth + 1)]
    return []


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer keeps in ``optimizer.state`` (moments, projectors; scalars included).

    Counted by storage, once each, so it measures what the optimizer really holds (a
    GaLore moment is ``(r, n)``, not the weight's ``(m, n)``).

    .. code-block:: python

        opt.step(); print(optimizer_state_bytes(opt) / MIB, "MiB of optimizer state")
    """
    seen: dict[tuple[Any, ...], int] = {}
    for state in optimizer.state.values():
        for t in _state_tensors(state):
            seen.setdefault(storage_key(t), tensor_bytes(t))
    return sum(seen.values())


def training_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                         extra: list[Tensor] | None = None) -> int:
    """Bytes of the persistent training state: parameters + their ``.grad`` + optimizer state (+ ``extra``).

    Added to the saved-activation peak of :class:`SavedTensorCounter` this is the peak
    *total* memory by accounting on CPU (the gradients are counted as alive throughout, an
    upper bound during backward), for comparing methods where ``torch.cuda.max_memory_allocated``
    does not exist.

    .. code-block:: python

        total = counter.peak_bytes + training_state_bytes(model, opt)
    """
    params = [p for p in module.parameters()]
    total = sum(tensor_bytes(p) for p in params) + sum(tensor_bytes(p.grad) for p in params if p.grad is not None)
    total += sum(tensor_bytes(t) for t in (extra or []))
    return total + (optimizer_state_bytes(optimizer) if optimizer is not None else 0)
