"""Measured peak memory of a training run: every allocation, not a model of the saved tensors.

:class:`PeakMemory` follows the bytes a run allocates — parameters, gradients, optimizer
state, saved activations and every transient an op creates and frees (the fp32 residual
STAC-R builds in forward, the logits' gradient, GaLore's projections) — and reports their
maximum, the *total training peak* (what ``torch.cuda.max_memory_allocated`` reports on a
GPU). It is a context manager around the whole run (a *session*); inside it, *segments*
(building the model, each training step, a step's optimizer phase) get their own start
level, peak and end level. Levels are relative to the session's start plus ``level`` (the
bytes the run already held), so a copy of the model held elsewhere in the process is not
charged to the run being measured.

- CUDA: ``torch.cuda.memory_allocated`` / ``max_memory_allocated``, the peak statistics
  reset at each segment start (the session peak keeps the maximum across resets).
- CPU: the PyTorch profiler's allocator events (``profile_memory=True``), one profiler
  session for the whole run: each allocation and free is an event with its signed byte
  count, summed in time order; segments are ``record_function`` ranges on the same clock.
  These are the bytes the CUDA caching allocator would count as allocated, without the
  process's runtime (interpreter, libraries) or the C allocator's slack, so both devices
  report the same quantity. The profiler does not see the free of a block allocated
  before the session started (it warns "Memory block of unknown size..."): start the
  session before the run allocates what it later frees (before building the model, or
  at a step that begins without gradients), or such frees are missed and the level is
  over-stated.

.. code-block:: python

    from lit_lowrank.ops.stac_r.peak_memory import PeakMemory

    with PeakMemory("cpu") as meter:
        with meter.segment("build"):
            model = copy.deepcopy(base); opt = torch.optim.AdamW(model.parameters())
        for batch in batches:
            with meter.segment("step"):
                opt.zero_grad(set_to_none=True); model(**batch).loss.backward(); opt.step()
    print(meter.peak_bytes / 2**20, "MiB at the peak;", [s.peak for s in meter.segments])
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["PeakMemory", "Segment", "allocator_levels"]

_MARK = "lit_lowrank.peak_memory:"


#: Lines the profiler's C++ backend (Kineto) writes straight to the process's stderr when a CPU session starts and
#: ends: ``USDT: ... profiler_start``, ``STAGE: ... Completed Stage``, and on a machine without a GPU
#: ``ERROR: ... DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35`` — none of them about the run.
_KINETO_LINE = re.compile(r"^(USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def _kineto_lines_dropped() -> Iterator[None]:
    """Drop Kineto's own status lines (:data:`_KINETO_LINE`) written to file descriptor 2 inside the block.

    Kineto prints from C++ (no Python logger or warning to filter), so the block's stderr goes to a temporary file
    and every other line is written back to stderr afterwards, in order.
    """
    fd = 2  # Kineto writes to the process's stderr descriptor, whatever Python's sys.stderr is (pytest, notebooks)
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), fd)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (AttributeError, OSError, ValueError):
                pass
            _flush_c_streams()  # Kineto's lines may still sit in the C library's buffer
            os.dup2(saved, fd)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not _KINETO_LINE.match(line)]
            if kept:
                os.write(fd, "".join(kept).encode())


def _flush_c_streams() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - a libc without fflush: the lines only come later
        pass


@dataclass(frozen=True)
class Segment:
    """One measured region: bytes allocated by the run at its start, at its peak and at its end."""

    name: str
    start: int
    peak: int
    end: int
    t0: int = 0  # time.time_ns() at its start and end (CPU sessions; 0 on CUDA)
    t1: int = 0


def allocator_levels(events: list[tuple[int, int]], ranges: list[tuple[int, int]],
                     level: int = 0) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Running level ``level + Σ bytes`` over ``(time, signed bytes)`` events.

    Returns ``(peak, end, per_range)``: the maximum over all events, the final level, and
    for each ``(start, end)`` time range its ``(start level, peak, end level)`` (an event at
    time ``t`` belongs to a range when ``start <= t <= end``).
    """
    events = sorted(events, key=lambda e: e[0])
    out = []
    for lo, hi in ranges:
        before = level + sum(b for t, b in events if t < lo)
        cur = peak = before
        for t, b in events:
            if lo <= t <= hi:
                cur += b
                peak = max(peak, cur)
        out.append((before, peak, cur))
    cur = peak = level
    for _, b in events:
        cur += b
        peak = max(peak, cur)
    return peak, cur, out


@dataclass
class PeakMemory:
    """Total training peak of a run, measured (see the module docstring).

    Args:
        device: where the run allocates (``"cpu"`` or a CUDA device).
        level: bytes the run already holds when the session starts (its parameters and
            optimizer state, when a meter opens mid-training); 0 = count what is allocated
            from the session's start.

    Attributes:
        segments: the measured :class:`Segment` s in order (on CPU filled when the session
            ends). ``peak_bytes``: the session's peak (between segments too).
        events: on CPU, the allocator's ``(time_ns, signed bytes)`` events in time order (the
            timeline :func:`~lit_lowrank.ops.saved_surface.predict_total_peak_timeline` reads).
    """

    device: torch.device | str = "cpu"
    level: int = 0
    segments: list[Segment] = field(default_factory=list)
    peak_bytes: int = 0
    events: list[tuple[int, int]] = field(default_factory=list)
    _origin: int = 0
    _prof: Any = None
    _names: list[str] = field(default_factory=list)
    _open: Any = None
    _cuda_start: int = 0

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"`device`={self.device!s}, expected 'cpu' or a CUDA device.")
        if self.level < 0:
            raise ValueError(f"`level`={self.level}, expected bytes >= 0.")

    # -- session ---------------------------------------------------------------------------------------------------
    def __enter__(self) -> "PeakMemory":
        self.segments, self._names, self.peak_bytes = [], [], int(self.level)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._origin = torch.cuda.memory_allocated(self.device) - int(self.level)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with _kineto_lines_dropped():
                self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._open is not None:
            self.end_segment()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device) - self._origin)
            return
        prof, self._prof = self._prof, None
        with _kineto_lines_dropped():
            prof.__exit__(*exc)
            results = prof.profiler.kineto_results.events()
        events, marks = [], {}
        for e in results:
            name = e.name()
            if name == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU:
                events.append((e.start_ns(), int(e.nbytes())))
            elif name.startswith(_MARK):
                marks[int(name[len(_MARK):].split(":", 1)[0])] = (e.start_ns(), e.start_ns() + e.duration_ns())
        ranges = [marks[i] for i in range(len(self._names))]
        peak, _, levels = allocator_levels(events, ranges, int(self.level))
        self.peak_bytes = int(peak)
        self.events = sorted(events)
        self.segments = [Segment(n, int(a), int(p), int(b), r[0], r[1])
                         for n, (a, p, b), r in zip(self._names, levels, ranges)]

    @property
    def open_segment(self) -> str | None:
        """Name of the segment open now, or ``None``."""
        return self._names[-1] if self._open is not None else None

    # -- segments --------------------------------------------------------------------------------------------------
    def start_segment(self, name: str = "step") -> None:
        """Open a segment (for code that cannot use :meth:`segment`, e.g. between two Lightning hooks)."""
        if self._open is not None:
            raise RuntimeError(f"segment {self._names[-1]!r} is still open; end it before starting {name!r}.")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device) - self._origin)
            self._cuda_start = torch.cuda.memory_allocated(self.device) - self._origin
            torch.cuda.reset_peak_memory_stats(self.device)
            self._open = name
        else:
            if self._prof is None:
                raise RuntimeError("PeakMemory: open the session (`with PeakMemory(...) as meter:`) before a segment.")
            from torch.profiler import record_function

            self._open = record_function(f"{_MARK}{len(self._names)}:{name}")
            self._open.__enter__()
        self._names.append(name)

    def end_segment(self) -> None:
        """Close the open segment."""
        if self._open is None:
            raise RuntimeError("no segment is open.")
        opened, self._open = self._open, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - self._origin
            end = torch.cuda.memory_allocated(self.device) - self._origin
            self.peak_bytes = max(self.peak_bytes, peak)
            self.segments.append(Segment(self._names[-1], int(self._cuda_start), int(peak), int(end)))
        else:
            opened.__exit__(None, None, None)

    @contextlib.contextmanager
    def segment(self, name: str = "step") -> Iterator[None]:
        """Measure the block as a segment (its start level, peak and end level join :attr:`segments`)."""
        self.start_segment(name)
        try:
            yield
        finally:
            self.end_segment()
