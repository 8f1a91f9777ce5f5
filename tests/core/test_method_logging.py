"""Issue #40 findings 2 and 3 at the shared layer: the `method` entry without the CLI, `once=True`, image keys."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger

from lit_lowrank.core import MethodCallback, apply_loss_hooks
from lit_lowrank.core.figures import log_figure, new_figure
from lit_lowrank.core.logging import image_key
from tests.methods.plain import PlainUserClassifier


class OneOff(MethodCallback):
    """A method that measures something once and re-logs it every step (`once` keeps the first), plus a scalar."""

    method_name = "one_off"

    def __init__(self, gain: float = 2.0) -> None:
        self.gain = gain

    def setup(self, trainer, pl_module, stage):  # overrides setup without super(): still writes the entry
        self.measured = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.measured += 1.0
        self.log_method(pl_module, "measured", self.measured, once=True)
        self.log_method(pl_module, "every_step", self.measured)


def _fit(tmp_path, callbacks, steps=3):
    logger = CSVLogger(tmp_path)
    trainer = pl.Trainer(max_steps=steps, logger=logger, callbacks=callbacks, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                         accelerator="cpu", devices=1, default_root_dir=tmp_path, limit_val_batches=0)
    from lit_lowrank.datamodules import DigitsDataModule

    trainer.fit(PlainUserClassifier(), datamodule=DigitsDataModule(batch_size=16))
    return trainer, logger


def test_method_entry_written_without_the_cli_and_once_logs_once(tmp_path):
    trainer, logger = _fit(tmp_path, [OneOff(gain=3.0), pl.callbacks.LearningRateMonitor()])
    hparams = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").read_text())
    assert hparams["method"] == {"one_off": {"class": "tests.core.test_method_logging.OneOff", "gain": 3.0}}
    rows = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    measured = [r.split(",")[header.index("method/one_off/measured")] for r in rows[1:]]
    every = [r.split(",")[header.index("method/one_off/every_step")] for r in rows[1:]]
    assert [v for v in measured if v] == ["1.0"]  # logged at its own step only
    assert [v for v in every if v] == ["1.0", "2.0", "3.0"]


def test_image_key_of_a_scalar_key_gets_its_own_name(tmp_path):
    class ScalarThenFigure(MethodCallback):
        method_name = "twin"

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.log_method(pl_module, "ssp", 0.5)

        def on_train_epoch_end(self, trainer, pl_module):
            fig, ax = new_figure()
            ax.plot([0, 1])
            self.written = log_figure(trainer, "method/twin/ssp", fig)
            fig2, _ = new_figure()
            self.other = log_figure(trainer, "method/twin/layers", fig2)

    callback = ScalarThenFigure()
    _fit(tmp_path, [callback], steps=2)
    assert callback.written and all("method_twin_ssp_figure" in w for w in callback.written), callback.written
    assert all("method_twin_layers_step" in w for w in callback.other)


def test_image_key_is_decided_once_per_key():
    class T:
        callback_metrics: dict = {}

    trainer = T()
    assert image_key(trainer, "method/x/a") == "method/x/a"
    trainer.callback_metrics = {"method/x/a": torch.tensor(1.0)}
    assert image_key(trainer, "method/x/a") == "method/x/a"  # the same series keeps its name
    assert image_key(trainer, "method/x/b") == "method/x/b"


def test_a_mixin_module_without_callbacks_gets_its_entry_from_apply_loss_hooks(tmp_path):
    """A module with SpecDrop branches (a mixin) and no method callback: the first apply_loss_hooks writes it."""
    from lit_lowrank.datamodules import DigitsDataModule
    from tests.mixins.plain import PlainSpecDropClassifier

    assert apply_loss_hooks  # the module calls it in training_step
    logger = CSVLogger(tmp_path)
    trainer = pl.Trainer(max_steps=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=tmp_path,
                         limit_val_batches=0)
    trainer.fit(PlainSpecDropClassifier(), datamodule=DigitsDataModule(batch_size=16, source="sklearn"))
    hparams = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").read_text())
    assert list(hparams["method"]) == ["specdrop"]
