"""A user's own LightningModule with SpecDrop branches (not one of our task modules): the
functional form in ``__init__``, the category context in ``training_step``, the router
aux loss (zero lines for SpecDrop itself). Used by the contract suite and the mixin tests."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from lit_lowrank.core import apply_loss_hooks
from lit_lowrank.mixins import apply_specdrop, specdrop_aux_loss, specdrop_category


class PlainSpecDropClassifier(pl.LightningModule):
    def __init__(self, in_features: int = 64, num_classes: int = 10, hidden: int = 32, num_branches: int = 3,
                 merge: str = "specdrop") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(
            nn.Flatten(),
            nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()),
        )
        self.head = nn.Linear(hidden, num_classes)
        apply_specdrop(self, target=r"body\.1$", num_branches=num_branches, merge=merge, in_features=in_features)

    def forward(self, x: torch.Tensor, category: torch.Tensor | None = None) -> torch.Tensor:
        with specdrop_category(self, category):
            return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        with specdrop_category(self, batch["category"]):
            features = self.body(batch["x"])
        logits = self.head(features)
        loss = F.cross_entropy(logits, batch["y"])
        aux = specdrop_aux_loss(self)
        if aux is not None:
            loss = loss + aux
        outputs = {"logits": logits, "features": features, "category": batch["category"]}
        loss = apply_loss_hooks(self, batch, outputs, loss)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
