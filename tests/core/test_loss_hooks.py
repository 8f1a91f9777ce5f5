"""The loss-hook protocol: every MethodCallback sees the loss, in order, and may change it."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

from lit_lowrank.core import MethodCallback, apply_loss_hooks


class AddConstant(MethodCallback):
    method_name = "add"

    def __init__(self, value: float) -> None:
        self.value = value
        self.seen: list[float] = []

    def on_loss(self, trainer, pl_module, batch, outputs, loss):
        assert "logits" in outputs
        self.seen.append(float(loss))
        return loss + self.value


class Double(MethodCallback):
    def on_loss(self, trainer, pl_module, batch, outputs, loss):
        return loss * 2


class UserModule(pl.LightningModule):
    """A plain user module: the only lit_lowrank line is apply_loss_hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 3)
        self.returned: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = apply_loss_hooks(self, batch, {"logits": logits}, F.cross_entropy(logits, y))
        self.returned.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _loader():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def _fit(module, callbacks):
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    trainer.fit(module, _loader())


def test_hooks_run_in_callback_order_and_compose():
    module, add = UserModule(), AddConstant(1.0)
    _fit(module, [add, Double()])
    # lr=0: the task loss is the same each step; returned = (task + 1) * 2
    assert len(add.seen) == 2
    for task_loss, returned in zip(add.seen, module.returned):
        assert returned == pytest.approx((task_loss + 1.0) * 2.0)


def test_hooks_change_the_gradient():
    """The modified loss is what gets differentiated: doubling doubles the gradient."""
    module = UserModule()
    x, y = next(iter(_loader()))
    logits = module.net(x)
    base = F.cross_entropy(logits, y)
    (g_base,) = torch.autograd.grad(base, module.net.weight)

    class FakeTrainer:
        callbacks = [Double()]

    module._trainer = FakeTrainer()
    logits = module.net(x)
    doubled = apply_loss_hooks(module, (x, y), {"logits": logits}, F.cross_entropy(logits, y))
    (g_doubled,) = torch.autograd.grad(doubled, module.net.weight)
    torch.testing.assert_close(g_doubled, 2 * g_base)


def test_without_trainer_loss_is_unchanged():
    module = UserModule()
    loss = torch.tensor(1.5)
    assert apply_loss_hooks(module, None, {}, loss) is loss


def test_non_scalar_loss_is_rejected():
    with pytest.raises(ValueError, match="scalar Tensor"):
        apply_loss_hooks(UserModule(), None, {}, torch.ones(3))


def test_callback_returning_non_tensor_is_named():
    class Bad(MethodCallback):
        def on_loss(self, trainer, pl_module, batch, outputs, loss):
            return 1.0

    class FakeTrainer:
        callbacks = [Bad()]

    module = UserModule()
    module._trainer = FakeTrainer()
    with pytest.raises(TypeError, match="Bad.on_loss"):
        apply_loss_hooks(module, None, {}, torch.tensor(1.0))
