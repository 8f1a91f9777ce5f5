"""Issue #29 finding 2: unknown adapter arguments and re-injection with other settings raise; same settings are
idempotent."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_lowrank.adapters import AdapterInjector, inject_adapters
from lit_lowrank.adapters.injector import method_kwarg_names


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))


@pytest.mark.parametrize("method, kwargs, accepted", [
    ("sds_lora", {"basiss": "qr"}, "basis"),
    ("sama", {"budgett": 100}, "budget"),
    ("polar", {"lam": 5.0}, "PoLARLanding"),
    ("lora", {"rankk": 3}, "use_rslora"),
])
def test_unknown_kwargs_raise_with_the_accepted_names(method, kwargs, accepted):
    key = next(iter(kwargs))
    with pytest.raises(TypeError, match=rf"Unknown argument\(s\) \['{key}'\].*{accepted}"):
        inject_adapters(_mlp(), method=method, target_modules=["0"], rank=2, **kwargs)
    with pytest.raises(TypeError, match=key):
        AdapterInjector(method=method, target_modules=["0"], rank=2, **kwargs)


def test_known_kwargs_are_listed_and_accepted():
    assert method_kwarg_names("sds_lora") == ["basis", "rank_tol"]
    assert {"budget", "num_blocks", "block_cols"} <= set(method_kwarg_names("sama"))
    assert method_kwarg_names("polar") == []
    model = inject_adapters(_mlp(), method="sds_lora", target_modules=["0"], rank=2, basis="polar")
    assert model[0].sds_basis == "polar"


@pytest.mark.parametrize("first, second", [
    ({"method": "sds_lora", "rank": 2}, {"method": "sds_lora", "rank": 4}),
    ({"method": "sds_lora", "rank": 2}, {"method": "polar", "rank": 2}),
    ({"method": "sds_lora", "rank": 2, "basis": "qr"}, {"method": "sds_lora", "rank": 2, "basis": "polar"}),
    ({"method": "lora", "rank": 2, "alpha": 4}, {"method": "lora", "rank": 2, "alpha": 8}),
])
def test_reinjection_with_other_settings_raises(first, second):
    model = inject_adapters(_mlp(), target_modules=["0"], **first)
    with pytest.raises(ValueError, match=r"'0' already carries adapter 'default' injected with .*cannot re-inject"):
        inject_adapters(model, target_modules=["0"], **second)


def test_reinjection_with_same_settings_is_idempotent():
    model = inject_adapters(_mlp(), method="sama", target_modules=["0"], rank=2, budget=64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inject_adapters(model, method="sama", target_modules=["0"], rank=2, budget=64)
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
