"""PeakMemory: the total peak of a run from the allocator's events (CPU), per segment and for the session."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.ops.stac_r.peak_memory import PeakMemory, allocator_levels
from lit_lowrank.ops.stac_r.saved_surface import predict_total_peak

MB = 1 << 20


def test_allocator_levels_running_sum_per_range():
    events = [(1, 100), (2, 50), (3, -100), (5, 30), (6, -80)]
    peak, end, ranges = allocator_levels(events, [(0, 3), (4, 6)], level=10)
    assert (peak, end) == (160, 10)
    assert ranges == [(10, 160, 60), (60, 90, 10)]


def test_cpu_segments_see_every_allocation_and_free():
    with PeakMemory("cpu", level=5 * MB) as meter:
        with meter.segment("build"):
            a = torch.empty(MB // 4)  # 1 MiB
            b = torch.empty(MB // 2)  # 2 MiB
        with meter.segment("step"):
            c = torch.empty(MB)  # 4 MiB: peak 5 + 7 = 12 MiB
            del a, c
        del b  # outside any segment: the session still sees it
    build, step = meter.segments
    assert (build.name, build.start, build.peak, build.end) == ("build", 5 * MB, 8 * MB, 8 * MB)
    assert (step.start, step.peak, step.end) == (8 * MB, 12 * MB, 7 * MB)
    assert meter.peak_bytes == 12 * MB


def test_transient_inside_an_op_counts():
    x = torch.randn(256, 256)
    with PeakMemory("cpu") as meter:
        with meter.segment("op"):
            y = (x @ x).sum()  # the 256 KiB product lives only inside the expression
    assert meter.segments[0].peak >= 256 * 256 * 4 and meter.segments[0].end <= 64
    del y


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="device"):
        PeakMemory("meta")
    with pytest.raises(ValueError, match="level"):
        PeakMemory("cpu", level=-1)
    meter = PeakMemory("cpu")
    with pytest.raises(RuntimeError, match="session"):
        meter.start_segment("step")
    with PeakMemory("cpu") as meter:
        meter.start_segment("a")
        with pytest.raises(RuntimeError, match="still open"):
            meter.start_segment("b")
        meter.end_segment()


def test_predicted_total_peak_is_floored_by_the_optimizer_phase():
    assert predict_total_peak(1000, 600, 300) == 700  # the activation phase still sets the peak
    assert predict_total_peak(1000, 900, 300) == 900  # the optimizer step does: only 10% can go
    assert predict_total_peak(800, 900, 300) == 900  # it did already: nothing to gain
    assert predict_total_peak(1000, 0, -50) == 1050  # codes that outweigh their inputs raise it
    with pytest.raises(ValueError, match="peaks"):
        predict_total_peak(-1, 0, 0)
