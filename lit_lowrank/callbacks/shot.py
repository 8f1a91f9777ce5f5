"""SHOT (Liang et al., ICML 2020) as a loss-hook callback: the source-free adaptation
baseline, and the single-model base of SafeCut."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import override

from lit_lowrank.core.loss_hooks import MethodCallback, require_outputs
from lit_lowrank.ops.information_maximization import centroid_pseudo_labels, information_maximization_loss


def freeze_hypothesis(pl_module: nn.Module, head: str | None, method: str) -> None:
    """SHOT's frozen hypothesis: ``requires_grad=False`` on the classifier head ``pl_module.<head>``.

    Called in ``Callback.setup`` (before ``configure_optimizers``); ``head=None`` leaves the module as it is.
    """
    if head is None:
        return
    try:
        module = pl_module.get_submodule(head) if head else None
    except AttributeError:
        module = None
    if not isinstance(module, nn.Module) or not any(True for _ in module.parameters()):
        raise ValueError(f"{method}(freeze_head={head!r}): {type(pl_module).__name__} has no submodule {head!r} with "
                         "parameters (SHOT freezes the classifier head); name the head, or freeze_head=None to "
                         "adapt it too.")
    module.requires_grad_(False)


class SHOT(MethodCallback):
    """Information maximisation + centroid pseudo-labels on the unlabelled target batch.

    ``loss += im_weight · (H(p) − H(p̄)) + beta · CE(logits, centroid_pseudo_labels)``.
    As published, the classifier head (SHOT's "hypothesis") is frozen and only the feature
    extractor adapts (``freeze_head="head"``, the submodule's name; ``None`` adapts it too).
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

    def __init__(self, im_weight: float = 1.0, beta: float = 0.3, freeze_head: str | None = "head") -> None:
        self.im_weight, self.beta, self.freeze_head = im_weight, beta, freeze_head

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        freeze_hypothesis(pl_module, self.freeze_head, "SHOT")

    @override
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
