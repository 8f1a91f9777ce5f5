"""ClassificationModule: learns, passes outputs to methods, reloads, rejects bad input."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from lit_lowrank.core import MethodCallback
from lit_lowrank.datamodules import DigitsDataModule
from lit_lowrank.tasks import ClassificationModule


def _trainer(tmp_path, **kwargs):
    defaults = dict(default_root_dir=tmp_path, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, accelerator="cpu", devices=1)
    return pl.Trainer(**{**defaults, **kwargs})


def test_learns_digits_and_logs_split_metrics(tmp_path):
    pl.seed_everything(0)
    model = ClassificationModule("cnn_small", num_classes=10, in_chans=1,
                                 optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3))
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=64))
    metrics = trainer.callback_metrics
    assert metrics["val/acc"] > 0.85
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "val/ece"} <= set(metrics)
    trainer.test(model, datamodule=DigitsDataModule(batch_size=64), verbose=False)
    assert trainer.callback_metrics["test/acc"] > 0.85


def test_outputs_reach_method_callbacks(tmp_path):
    seen = {}

    class Spy(MethodCallback):
        def on_loss(self, trainer, pl_module, batch, outputs, loss):
            seen.update({k: v for k, v in outputs.items()})
            return loss

    model = ClassificationModule("mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64})
    _trainer(tmp_path, max_steps=1, limit_val_batches=0, callbacks=[Spy()]).fit(
        model, datamodule=DigitsDataModule(batch_size=16))
    assert seen["logits"].shape == (16, 10)
    assert seen["features"].shape == (16, model.backbone.num_features)
    assert seen["category"].shape == (16,) and seen["category"].max() < 3


def test_optimizer_and_scheduler_callables_are_used():
    model = ClassificationModule(
        "mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64},
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1),
    )
    config = model.configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.SGD)
    assert config["optimizer"].param_groups[0]["momentum"] == 0.9
    assert isinstance(config["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.StepLR)


def test_frozen_parameters_are_not_optimised():
    model = ClassificationModule("mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64})
    model.backbone.requires_grad_(False)
    optimizer = model.configure_optimizers()
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == sum(
        p.numel() for p in model.head.parameters())


def test_checkpoint_round_trip(tmp_path):
    model = ClassificationModule("resnet20_cifar", num_classes=10, in_chans=1)
    trainer = _trainer(tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=16))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    reloaded = ClassificationModule.load_from_checkpoint(tmp_path / "m.ckpt").eval()
    x = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(reloaded(x), model.eval()(x))


def test_module_backbone_needs_num_features():
    with pytest.raises(ValueError, match="num_features"):
        ClassificationModule(nn.Linear(4, 4), num_classes=3)


def test_unknown_backbone_names_the_parameter():
    with pytest.raises(ValueError, match="backbone='not_a_net'"):
        ClassificationModule("not_a_net", num_classes=3)


def test_missing_pretrained_file_names_the_parameter(tmp_path):
    with pytest.raises(FileNotFoundError, match="pretrained_path"):
        ClassificationModule("resnet20_cifar", num_classes=3, pretrained_path=str(tmp_path / "none.pt"))


def test_bad_batch_and_num_classes():
    model = ClassificationModule("mlp", num_classes=3, in_chans=1, backbone_kwargs={"in_features": 64})
    with pytest.raises(ValueError, match="keys 'x' and 'y'"):
        model.step((torch.randn(2, 64), torch.zeros(2, dtype=torch.long)))
    with pytest.raises(ValueError, match="num_classes"):
        ClassificationModule("mlp", num_classes=1, backbone_kwargs={"in_features": 64})


def test_weights_path_loads_a_checkpoint_and_names_bad_input(tmp_path):
    source = ClassificationModule("mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64})
    torch.save({"state_dict": source.state_dict()}, tmp_path / "source.ckpt")
    target = ClassificationModule("mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64},
                                  weights_path=str(tmp_path / "source.ckpt"), supervised=False)
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(target(x), source(x))
    with pytest.raises(FileNotFoundError, match="weights_path"):
        ClassificationModule("mlp", num_classes=10, backbone_kwargs={"in_features": 64},
                             weights_path=str(tmp_path / "missing.ckpt"))
    with pytest.raises(RuntimeError, match="does not fit"):
        ClassificationModule("mlp", num_classes=5, backbone_kwargs={"in_features": 64, "hidden_sizes": [8]},
                             weights_path=str(tmp_path / "source.ckpt"))
