"""A plain user LightningModule (not ours) for the contract suite: its only lit_lowrank
line is ``apply_loss_hooks``; dict batches like the lit_lowrank datamodules."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from lit_lowrank.core import apply_loss_hooks


class PlainUserClassifier(pl.LightningModule):
    def __init__(self, in_features: int = 64, num_classes: int = 10, hidden: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        features = self.body(batch["x"])
        logits = self.head(features)
        loss = F.cross_entropy(logits, batch["y"])
        outputs = {"logits": logits, "features": features, "category": batch.get("category")}
        loss = apply_loss_hooks(self, batch, outputs, loss)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
