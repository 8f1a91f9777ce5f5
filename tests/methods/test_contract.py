"""The generic method contract, parametrised over the registry (Composer-style).

(a) each method's configs run (via tests/test_configs.py, which runs every config);
(b) a callback method works on a plain user LightningModule;
(c) stateful callbacks round-trip ``state_dict`` through a checkpoint and resume;
(d) structural methods: applying twice equals applying once, and
    ``load_from_checkpoint`` rebuilds them;
(e) every method runs under 2-process CPU DDP and FSDP2 or refuses at setup: tests/methods/test_distributed.py
    (``make test-dist``).

The reference method in ``reference_method.py`` is always a parameter, so the suite is
exercised before any real method lands.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.core import MethodCallback, implemented_methods
from tests.methods.cases import CASES, ContractCase

REPO = Path(__file__).resolve().parents[2]
IMPLEMENTED = implemented_methods()
CASE_NAMES = sorted(CASES)


def _case(name: str) -> ContractCase:
    return CASES[name]()


def _trainer(tmp_path: Path, callbacks: list[pl.Callback], max_steps: int = 3, **kwargs: Any) -> pl.Trainer:
    defaults = dict(max_steps=max_steps, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                    accelerator="cpu", devices=1)
    return pl.Trainer(callbacks=callbacks, **{**defaults, **kwargs})


def _assert_state_equal(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_state_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_state_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("spec", IMPLEMENTED, ids=lambda s: s.name)
def test_implemented_method_is_complete(spec):
    """(a) and the checklist: config, baseline config, benchmark, card and (inside-fit kinds) a case."""
    from lit_lowrank.benchmarks.harness import available_benchmarks
    from lit_lowrank.core import import_object

    import_object(spec.component)
    for cfg in (spec.config, spec.baseline_config):
        assert cfg and (REPO / cfg).is_file(), f"{spec.name}: config {cfg!r} missing"
    assert spec.benchmark in available_benchmarks()
    assert (REPO / "docs" / "methods" / f"{spec.name}.md").is_file()
    if spec.kind in ("callback", "mixin", "adapter"):
        assert spec.name in CASES, f"{spec.name}: add a ContractCase to tests/methods/cases.py"


@pytest.mark.parametrize("name", CASE_NAMES)
def test_plain_user_module(name, tmp_path):
    """(b) the method runs on a module that is not ours; its loss hook is called."""
    case = _case(name)
    callbacks = case.make_callbacks()
    calls = {"n": 0}
    for cb in callbacks:
        if isinstance(cb, MethodCallback) and type(cb).on_loss is not MethodCallback.on_loss:
            original = cb.on_loss

            def spy(*args, _original=original):
                calls["n"] += 1
                return _original(*args)

            cb.on_loss = spy  # type: ignore[method-assign]
    module = case.make_module()
    trainer = _trainer(tmp_path, callbacks, **case.trainer_kwargs)
    trainer.fit(module, datamodule=case.make_data())
    assert trainer.global_step == 3
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    if any(isinstance(cb, MethodCallback) and type(cb).on_loss is not MethodCallback.on_loss for cb in callbacks):
        assert calls["n"] == 3


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if _case(n).stateful])
def test_state_round_trip_and_resume(name, tmp_path):
    """(c) callback state is written into the checkpoint and restored on resume."""
    case = _case(name)
    callbacks = case.make_callbacks()
    trainer = _trainer(tmp_path, callbacks, max_steps=2, **case.trainer_kwargs)
    trainer.fit(case.make_module(), datamodule=case.make_data())
    path = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(path)
    # deep copies: state_dict() may hand out live tensors (optimizer steps) that training mutates
    saved = copy.deepcopy({cb.state_key: cb.state_dict() for cb in callbacks})
    checkpoint = torch.load(path, weights_only=False)
    for key, state in saved.items():
        if state:
            _assert_state_equal(checkpoint["callbacks"][key], state, key)

    restored: dict[str, Any] = {}

    class Probe(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            restored.update(copy.deepcopy({cb.state_key: cb.state_dict() for cb in new_callbacks}))

    new_callbacks = case.make_callbacks()
    resumed = _trainer(tmp_path, [*new_callbacks, Probe()], max_steps=3, **case.trainer_kwargs)
    resumed.fit(case.make_module(), datamodule=case.make_data(), ckpt_path=path)
    _assert_state_equal(restored, saved)
    assert resumed.global_step == 3


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if _case(n).structural])
def test_surgery_idempotent(name):
    """(d) applying the functional form twice equals applying it once."""
    case = _case(name)
    torch.manual_seed(0)
    once = case.apply(case.make_module())
    torch.manual_seed(0)
    twice = case.apply(case.apply(case.make_module()))
    assert list(once.state_dict()) == list(twice.state_dict())
    for (k, a), b in zip(once.state_dict().items(), twice.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if _case(n).structural])
def test_load_from_checkpoint_rebuilds(name, tmp_path):
    """(d) a checkpoint of a task module with the method applied reloads with its structure."""
    case = _case(name)
    assert case.make_task_module is not None, "structural methods need make_task_module"
    module = case.make_task_module()
    trainer = _trainer(tmp_path, case.make_callbacks(), max_steps=2, **case.trainer_kwargs)
    data = case.make_data()
    trainer.fit(module, datamodule=data)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    reloaded = type(module).load_from_checkpoint(path)
    assert list(reloaded.state_dict()) == list(module.state_dict())
    batch = next(iter(data.val_dataloader()))
    module.eval(), reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(batch["x"]), module(batch["x"]))
