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

    def on_fit_start(self) -> None:
        from lit_lowrank.core.method_entry import log_method_entry

        log_method_entry(self._trainer, self)  # the run's `method` entry, also when no method callback wrote it

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

    # -- dashboards (core/figures.py) ---------------------------------------------------------
    #: log this task's figures every n validation epochs (0: never); tasks expose it as an init arg
    figure_every_n_epochs: int = 1

    def figures_due(self) -> bool:
        """Whether this epoch's validation draws the task's figures (a real logger, not sanity check)."""
        from lit_lowrank.core.figures import figure_due

        return figure_due(self._trainer, self.figure_every_n_epochs)

    def update_confusion(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Accumulate the validation confusion matrix (rows: true class, columns: predicted) when due."""
        if not self.figures_due():
            return
        c = logits.shape[-1]
        counts = torch.bincount(targets.long() * c + logits.argmax(-1), minlength=c * c).reshape(c, c)
        previous = getattr(self, "_confusion", None)
        self._confusion = counts.cpu() if previous is None or previous.shape != counts.shape else previous + counts.cpu()

    def log_confusion(self, key: str = "val/confusion") -> None:
        """Log the accumulated confusion matrix as a labelled heatmap (row-normalised, values in cells)."""
        counts = getattr(self, "_confusion", None)
        self._confusion = None
        if counts is None or not self.figures_due():
            return
        from lit_lowrank.core.figures import heatmap, log_figure, new_figure

        counts = self.trainer.strategy.reduce(counts.to(self.device).float(), reduce_op="sum").cpu()
        rates = counts / counts.sum(1, keepdim=True).clamp_min(1)
        labels = [str(i) for i in range(counts.shape[0])]
        fig, ax = new_figure(max(3.6, 1.0 + 0.45 * len(labels)), max(2.8, 0.6 + 0.4 * len(labels)))
        heatmap(ax, rates.numpy(), labels, labels, xlabel="predicted", ylabel="true",
                title=f"validation confusion, epoch {self.current_epoch}", colorbar_label="fraction of the row")
        log_figure(self.trainer, key, fig)
