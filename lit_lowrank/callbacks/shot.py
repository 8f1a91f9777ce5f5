"""SHOT (Liang et al., ICML 2020) as a loss-hook callback: the source-free adaptation
baseline, and the single-model base of SafeCut."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch.nn.functional as F
from torch import Tensor

from lit_lowrank.core.loss_hooks import MethodCallback, require_outputs
from lit_lowrank.ops.information_maximization import centroid_pseudo_labels, information_maximization_loss


class SHOT(MethodCallback):
    """Information maximisation + centroid pseudo-labels on the unlabelled target batch.

    ``loss += im_weight · (H(p) − H(p̄)) + beta · CE(logits, centroid_pseudo_labels)``.
    Decision: pseudo-labels are computed per batch (SHOT recomputes them over the
    whole target set each epoch); with batches of ~128 the centroids are stable, and
    a callback never reaches into the datamodule. Use with
    ``ClassificationModule(supervised=False)`` (or any module whose ``outputs`` have
    ``logits`` and ``features``).

    .. code-block:: python

        trainer = L.Trainer(callbacks=[SHOT(beta=0.3)])
        trainer.fit(ClassificationModule(..., supervised=False, weights_path="source.ckpt"),
                    datamodule=ShiftedDigitsDataModule(shift="rotate"))
    """

    method_name = "shot"

    def __init__(self, im_weight: float = 1.0, beta: float = 0.3) -> None:
        self.im_weight, self.beta = im_weight, beta

    def on_loss(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                outputs: dict[str, Any], loss: Tensor) -> Tensor:
        require_outputs(outputs, ("logits", "features"), "SHOT")
        logits = outputs["logits"]
        im = information_maximization_loss(logits)
        extra = self.im_weight * im
        if self.beta > 0:
            pseudo = centroid_pseudo_labels(outputs["features"].detach(), logits.detach())
            extra = extra + self.beta * F.cross_entropy(logits, pseudo)
        self.log_method(pl_module, "im_loss", im.detach())
        return loss + extra
