"""Issue #29 finding 1: a MethodCallback whose ``on_loss`` is never reached warns (or raises with strict)."""

from __future__ import annotations

import warnings

import pytest
import torch.nn.functional as F

from lit_lowrank.core import LossHookWarning, MethodCallback
from tests.core.test_loss_hooks import AddConstant, UserModule, _fit


class ForgetfulModule(UserModule):
    """A user module that never calls apply_loss_hooks (the silent failure of the issue)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)


class LogsOnly(MethodCallback):
    """Does not override on_loss: nothing to check."""


def test_forgotten_apply_loss_hooks_warns_once_naming_the_fix():
    with pytest.warns(LossHookWarning, match=r"AddConstant.*apply_loss_hooks\(self, batch, outputs, loss\)") as rec:
        _fit(ForgetfulModule(), [AddConstant(1.0)])
    assert sum(issubclass(w.category, LossHookWarning) for w in rec) == 1  # 2 steps, one warning


def test_strict_raises():
    add = AddConstant(1.0)
    add.strict = True
    with pytest.raises(RuntimeError, match="ForgetfulModule.training_step did not call `apply_loss_hooks`"):
        _fit(ForgetfulModule(), [add])


def test_no_warning_when_hooks_are_called_or_on_loss_not_overridden():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LossHookWarning)
        _fit(UserModule(), [AddConstant(1.0)])
        _fit(ForgetfulModule(), [LogsOnly()])


def test_manual_optimization_is_checked_too():
    class Manual(UserModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            x, y = batch
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(F.cross_entropy(self.net(x), y))
            opt.step()

    with pytest.warns(LossHookWarning):
        _fit(Manual(), [AddConstant(1.0)])
