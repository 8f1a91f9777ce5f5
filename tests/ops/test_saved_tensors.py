"""The shared saved-activation counter and the Saved-Surface Predictor on hand-built graphs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_lowrank.ops.stac_r.compress import compressed_nbytes
from lit_lowrank.ops.stac_r.saved_surface import saved_surface, select_linear
from lit_lowrank.ops.stac_r.saved_tensors import SavedTensorCounter, measure_saved_bytes


def test_counter_counts_a_known_graph_exactly():
    """x (10,16) -> Linear -> ReLU -> Linear -> square: x, relu(h) (once, though two nodes save it) and y."""
    torch.manual_seed(0)
    first, second = nn.Linear(16, 32), nn.Linear(32, 8)
    x = torch.randn(10, 16, requires_grad=True)
    with SavedTensorCounter(record=True) as counter:
        y = second(torch.relu(first(x)))
        loss = y.square().sum()
        assert counter.current_bytes == 4 * (10 * 16 + 10 * 32 + 10 * 8)
        assert counter.skipped_count == 2  # the two weights (parameters) are model state
        loss.backward()
    assert counter.current_bytes == 0  # every saved tensor freed by backward
    assert counter.peak_bytes == 4 * (10 * 16 + 10 * 32 + 10 * 8)
    packs = [e.nbytes for e in counter.events if e.kind == "pack"]
    assert packs == [640, 1280, 0, 320]  # relu's output is saved by ReLU and by the second Linear: one storage


def test_counter_peak_follows_frees_and_reset():
    x = torch.randn(100, requires_grad=True)
    with SavedTensorCounter() as counter:
        a = (x * 2).exp()  # exp saves its output (400 bytes)
        a.sum().backward()
        assert counter.current_bytes == 0 and counter.peak_bytes == 400
        counter.reset_peak()
        (x.sin()).sum().backward()  # sin saves its input x (400 bytes)
    assert counter.peak_bytes == 400
    assert measure_saved_bytes(lambda: (x * x).sum().backward()) == 400  # x saved twice, one storage


def test_codec_bytes_replace_the_original():
    class Halve:
        def pack(self, t):
            return (t.to(torch.float16),) if t.numel() >= 50 else None

        def unpack(self, packed):
            return packed[0].float()

    x = torch.randn(100, requires_grad=True)
    with SavedTensorCounter(codec=Halve()) as counter:
        y = x.exp()
        assert counter.current_bytes == 200
        y.sum().backward()
    torch.testing.assert_close(x.grad, x.detach().exp(), rtol=1e-3, atol=1e-3)


class _Shared(nn.Module):
    """``relu(h)`` feeds the target ``lonely`` and is also saved by ReLU (a non-target holder); ``g`` is saved
    by the target ``shared`` only."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 64)
        self.lonely = nn.Linear(64, 64)
        self.shared = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        u = self.lonely(h.relu())  # ReLU saves its output, which `lonely` saves too
        g = u * u.sigmoid()  # non-target ops save u
        return self.shared(g) + (g * 2).sum(-1, keepdim=True)


def test_predictor_bound_and_memory_increasing_layers():
    torch.manual_seed(0)
    model = _Shared()
    x = torch.randn(256, 8)
    report = saved_surface(model, x, lambda m, b: m(b).square().mean(), target=["lonely", "shared"], rank=4,
                           residual_density=0.01)
    assert report.peak_bytes > 0 and 0 < report.ssp < 1
    # lonely's input relu(h) is also held by ReLU (not a target): compressing it cannot free it
    assert "lonely" in report.increasing
    assert report.layers["lonely"].shared_with
    code = compressed_nbytes(256, 64, 4, 0.01)
    assert report.layers["shared"].code_bytes == code
    assert report.layers["shared"].saving_bytes == 256 * 64 * 4 - code  # g is saved by `shared` only
    assert report.predicted_reduction <= report.ssp
    assert model.inp.weight.grad is None  # the observation step leaves gradients as they were


def test_select_linear_errors_name_target():
    with pytest.raises(ValueError, match="target"):
        select_linear(_Shared(), "nothing_matches")
    assert list(select_linear(_Shared(), r"^(lonely|shared)$")) == ["lonely", "shared"]


def test_counter_agrees_with_torch_profiler():
    """Cross-check: after a forward whose intermediates only the graph keeps, the profiler's net CPU
    allocation in the region is the saved bytes plus the scalar loss."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    with SavedTensorCounter() as counter:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = model(torch.randn(64, 16)).square().sum()
        held = counter.current_bytes
        loss.backward()
    net = sum(e.cpu_memory_usage for e in prof.events() if e.cpu_parent is None)
    assert held == net - loss.numel() * loss.element_size() == 4 * 64 * (16 + 32 + 32 + 8)


def test_report_prices_any_subset_and_the_saving_timeline_adds_up():
    from lit_lowrank.ops.stac_r.saved_surface import SurfaceRecorder, predict_total_peak_timeline

    torch.manual_seed(0)
    model = _Shared()
    x = torch.randn(256, 8)
    targets = {n: getattr(model, n) for n in ("inp", "lonely", "shared")}
    with SurfaceRecorder(model, targets) as recorder:
        model(x).square().mean().backward()

    def price(name, n, d):
        return compressed_nbytes(n, d, 4, 0.01)

    both = recorder.report(price, subset=["lonely", "shared"])
    assert both.layers["shared"].saving_bytes == 256 * 64 * 4 - compressed_nbytes(256, 64, 4, 0.01)
    only_inp = recorder.report(price, subset=["inp"])
    assert set(only_inp.layers) == {"inp"}  # the others now hold their inputs like any other op
    timeline = recorder.saving_timeline()  # of the last report: inp's input (x) saved, then freed in backward
    assert sum(d for _, d in timeline) == 0 and max(d for _, d in timeline) == only_inp.layers["inp"].saving_bytes
    # memory that rises while the saving is on and falls after it: the prediction subtracts the saving there
    (t_on, saving), (t_off, _) = sorted(timeline)
    memory = [(t_on + 1, 10 * saving), (t_off - 1, -10 * saving)]
    assert predict_total_peak_timeline(memory, 0, t_on - 5, t_off + 5, timeline) == 9 * saving
    assert predict_total_peak_timeline(memory, 0, t_on - 5, t_off + 5, timeline, optimizer_peak=10 * saving) \
        == 10 * saving  # the optimizer step's floor
    assert predict_total_peak_timeline(memory, 0, t_on - 5, t_off + 5, []) == 10 * saving
