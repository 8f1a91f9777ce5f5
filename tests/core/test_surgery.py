"""Surgery helpers: matching with clear errors, idempotent replacement, checkpoint rebuild."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_lowrank.core import (
    find_modules,
    is_replaced,
    mark_replaced,
    rebuild_surgery,
    record_surgery,
    replace_module,
    save_surgery,
    surgery_records,
)


class Scaled(nn.Module):
    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.inner = inner
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.inner(x) * self.scale


def apply_scaled(model: nn.Module, target: str) -> nn.Module:
    """A functional surgery form: wrap every matching Linear once."""
    for name, module in find_modules(model, target, (nn.Linear, Scaled)):
        if not is_replaced(module, "scaled"):
            replace_module(model, name, mark_replaced(Scaled(module), "scaled"))
    record_surgery(model, "scaled", apply_scaled, {"target": target})
    return model


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))


def test_find_modules_regex_names_and_types():
    net = _net()
    assert [n for n, _ in find_modules(net, r"^2\.", nn.Linear)] == ["2.0", "2.1"]
    assert [n for n, _ in find_modules(net, ["1"])] == ["1", "2.1"]  # exact or dotted suffix
    assert [n for n, _ in find_modules(net, ["0"], nn.Linear)] == ["0", "2.0"]  # suffix match
    assert len(find_modules(net, None, nn.Linear)) == 3


def test_find_modules_error_names_parameter_value_and_candidates():
    with pytest.raises(ValueError) as err:
        find_modules(_net(), "q_proj", nn.Linear, param="target_modules")
    msg = str(err.value)
    assert "`target_modules`='q_proj'" in msg and "Linear" in msg and "'2.0'" in msg


def test_invalid_regex_is_reported():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        find_modules(_net(), "(")


def test_surgery_is_idempotent():
    once = apply_scaled(_net(), r"^2\.\d$")
    twice = apply_scaled(apply_scaled(_net(), r"^2\.\d$"), r"^2\.\d$")
    assert [n for n, _ in once.named_parameters()] == [n for n, _ in twice.named_parameters()]
    assert len(surgery_records(twice)) == 1
    x = torch.randn(3, 4)
    torch.testing.assert_close(once(x), twice(x))


def test_checkpoint_rebuilds_surgery():
    model = apply_scaled(_net(), r"^2\.\d$")
    with torch.no_grad():
        model[2][0].scale.fill_(3.0)
    checkpoint = {"state_dict": model.state_dict()}
    save_surgery(model, checkpoint)
    fresh = _net()
    assert rebuild_surgery(fresh, checkpoint) == ["scaled"]
    fresh.load_state_dict(checkpoint["state_dict"])
    x = torch.randn(3, 4)
    torch.testing.assert_close(fresh(x), model(x))


def test_modules_inside_a_replacement_are_not_matched_again():
    """A broad pattern that also matches the wrapped original must not wrap it twice."""
    model = apply_scaled(_net(), r"2")  # matches "2.0" and, after wrapping, "2.0.inner"
    model = apply_scaled(model, r"2")
    assert sum(isinstance(m, Scaled) for m in model.modules()) == 2
