"""What every task module shares: optimizer callables, surgery persistence, step outputs.

Task modules take ``optimizer: OptimizerCallable`` and ``lr_scheduler:
LRSchedulerCallable`` (LightningCLI runs with ``auto_configure_optimizers=False``)
so the optimizer is built *after* method callbacks changed the model in ``setup``.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_lowrank.core.surgery import rebuild_surgery, save_surgery


class TaskModule(pl.LightningModule):
    """Base of the shared task modules (not meant to be used directly).

    Args:
        optimizer: a callable ``params -> Optimizer`` (LightningCLI builds it from
            ``optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.1}}``).
        lr_scheduler: optional callable ``optimizer -> LRScheduler``; stepped per epoch
            unless ``lr_scheduler_interval="step"``.
        lr_scheduler_interval: ``"epoch"`` or ``"step"``.
    """

    def __init__(
        self,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "epoch",
    ) -> None:
        super().__init__()
        if lr_scheduler_interval not in ("epoch", "step"):
            raise ValueError(f"`lr_scheduler_interval`={lr_scheduler_interval!r}, expected 'epoch' or 'step'.")
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.lr_scheduler_interval = lr_scheduler_interval

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            raise RuntimeError(f"{type(self).__name__}: no trainable parameters (every parameter has requires_grad=False).")
        optimizer = self.optimizer_factory(params)
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        config = {"scheduler": scheduler, "interval": self.lr_scheduler_interval}
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            config["monitor"] = "val/loss"
        return {"optimizer": optimizer, "lr_scheduler": config}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        save_surgery(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Runs before load_state_dict in load_from_checkpoint: rebuild the structure first.
        rebuild_surgery(self, checkpoint)

    def log_split(self, split: str, values: dict[str, Any], batch_size: int | None = None, **kwargs: Any) -> None:
        """Log ``values`` as ``<split>/<name>`` (``train/``, ``val/``, ``test/``)."""
        on_step = split == "train"
        for name, value in values.items():
            self.log(
                f"{split}/{name}", value, on_step=on_step, on_epoch=not on_step or kwargs.get("on_epoch", False),
                batch_size=batch_size, prog_bar=name in ("loss", "acc", "ppl"),
                sync_dist=split != "train",
            )
