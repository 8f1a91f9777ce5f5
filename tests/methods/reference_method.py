"""A reference method that exercises every contract at once (stateful, structural, loss
hook), so the contract suite is itself tested before any real method lands.

It wraps matching Linear layers with a learnable output gain (structural, recorded for
checkpoint rebuild), counts the steps it has seen (stateful) and adds ``weight *
mean(gain - 1)^2`` to the loss (loss hook).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from lit_lowrank.core import MethodCallback, find_modules, is_replaced, mark_replaced, record_surgery, replace_module
from lit_lowrank.core.surgery import save_surgery


class GainLinear(nn.Module):
    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.gain = nn.Parameter(torch.ones(base.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) * self.gain


def apply_gain(model: nn.Module, target: str = "head") -> nn.Module:
    """Functional form: wrap every Linear matching ``target`` once."""
    for name, module in find_modules(model, target, (nn.Linear, GainLinear)):
        if not is_replaced(module, "reference"):
            replace_module(model, name, mark_replaced(GainLinear(module), "reference"))
    record_surgery(model, "reference", apply_gain, {"target": target})
    return model


class ReferenceMethod(MethodCallback):
    method_name = "reference"

    def __init__(self, target: str = "head", weight: float = 0.1) -> None:
        self.target, self.weight = target, weight
        self.steps_seen = 0

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        apply_gain(pl_module, self.target)

    def on_loss(self, trainer, pl_module, batch, outputs, loss):
        self.steps_seen += 1
        gains = [m.gain for m in pl_module.modules() if isinstance(m, GainLinear)]
        penalty = torch.stack([(g - 1).pow(2).mean() for g in gains]).sum()
        self.log_method(pl_module, "penalty", penalty.detach())
        return loss + self.weight * penalty

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        save_surgery(pl_module, checkpoint)

    def state_dict(self) -> dict[str, Any]:
        return {"steps_seen": self.steps_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_seen = state_dict["steps_seen"]
