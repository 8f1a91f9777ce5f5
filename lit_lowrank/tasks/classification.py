"""ClassificationModule: image (or token) classification with optional category tags."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.core.module_methods import apply_module_method, log_module_methods, method_aux_loss, method_context
from lit_lowrank.ops.calibration import OODAUROC, MulticlassBrierScore, MulticlassNLL
from lit_lowrank.tasks.base import TaskModule


class ClassificationModule(TaskModule):
    """Backbone → features → linear head, trained with cross-entropy.

    Batches are dicts ``{"x": (B, ...), "y": (B,), "category": (B,) optional}``
    (the lit_lowrank datamodules produce them). ``training_step`` passes the loss
    through :func:`~lit_lowrank.core.apply_loss_hooks` with ``outputs`` carrying
    ``logits``, ``features`` and ``category``.

    Args:
        backbone: a name from :data:`lit_lowrank.models.BACKBONES` (``"mlp"``,
            ``"cnn_small"``, ``"resnet110_cifar"``, ...) or any ``timm`` model name;
            or an ``nn.Module`` with a ``num_features`` attribute that maps inputs to
            ``(B, num_features)``.
        num_classes: number of classes.
        in_chans: input channels (images).
        backbone_kwargs: extra keyword arguments for the backbone builder.
        pretrained_path: local weights file for the backbone (never a hub).
        label_smoothing: cross-entropy label smoothing.
        supervised: ``False`` = target-adaptation mode (source-free domain adaptation):
            ``training_step`` never reads ``y``; the task loss is zero and method
            callbacks (SHOT, SafeCut) supply the loss. Evaluation still uses ``y``.
        weights_path: a Lightning checkpoint or ``state_dict`` file of this module
            (e.g. the source-trained model) loaded strictly at construction.
        branches: options of the branch mixin (:func:`~lit_lowrank.core.apply_module_method` with
            ``"branches"``: SpecDrop and its multi-branch baselines; ``target`` relative to this
            module, e.g. ``r"backbone\\.stages\\.2$"``, ``num_branches``, ``merge``, ...);
            recorded in hparams, so ``load_from_checkpoint`` rebuilds the branches. The
            batch's ``category`` reaches them through ``step``.

    .. code-block:: python

        model = ClassificationModule(backbone="cnn_small", num_classes=10, in_chans=1)
        trainer = L.Trainer(max_epochs=1, callbacks=[MyMethod()])
        trainer.fit(model, datamodule=DigitsDataModule())
    """

    def __init__(
        self,
        backbone: str | nn.Module = "mlp",
        num_classes: int = 10,
        in_chans: int = 3,
        backbone_kwargs: dict[str, Any] | None = None,
        pretrained_path: str | None = None,
        label_smoothing: float = 0.0,
        supervised: bool = True,
        weights_path: str | None = None,
        branches: dict[str, Any] | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "epoch",
        figure_every_n_epochs: int = 1,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.figure_every_n_epochs = figure_every_n_epochs  # the validation confusion heatmap (0: never)
        if num_classes < 2:
            raise ValueError(f"`num_classes`={num_classes}, expected an integer >= 2.")
        if isinstance(backbone, str):
            from lit_lowrank.models import build_backbone

            backbone = build_backbone(backbone, in_chans=in_chans, pretrained_path=pretrained_path, **(backbone_kwargs or {}))
        num_features = getattr(backbone, "num_features", None)
        if not isinstance(num_features, int):
            raise ValueError(
                f"`backbone` ({type(backbone).__name__}) must expose an integer `num_features` "
                "(the width of the features it returns)."
            )
        self.backbone = backbone
        # a backbone may supply its head's initialisation (MultipleChoiceLM: the LM's rows of the option letters)
        make_head = getattr(backbone, "make_head", None)
        self.head = make_head(num_classes) if callable(make_head) else nn.Linear(num_features, num_classes)
        if branches is not None:
            apply_module_method(self, "branches", branches)
        self.label_smoothing = label_smoothing
        self.supervised = supervised
        metric = lambda: torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)  # noqa: E731
        self.train_acc, self.val_acc, self.test_acc = metric(), metric(), metric()
        self.val_ece = torchmetrics.CalibrationError(task="multiclass", num_classes=num_classes, n_bins=15, norm="l1")
        # calibration (NLL, Brier; test ECE) and OOD AUROC (extra val loaders = OOD sets), ops/calibration.py
        self.val_nll, self.val_brier, self.val_ood_auroc = MulticlassNLL(), MulticlassBrierScore(), OODAUROC()
        self.test_ece = torchmetrics.CalibrationError(task="multiclass", num_classes=num_classes, n_bins=15, norm="l1")
        self.test_nll, self.test_brier = MulticlassNLL(), MulticlassBrierScore()
        if weights_path is not None:
            self._load_weights(weights_path)

    def _load_weights(self, path: str) -> None:
        from pathlib import Path

        if not Path(path).is_file():
            raise FileNotFoundError(f"`weights_path`={path!r} does not exist; expected a checkpoint or state_dict file.")
        from lit_lowrank.core.safe_load import load_weights_file

        state = load_weights_file(path, param="weights_path")  # never unpickles code from a user's file
        state = state.get("state_dict", state)
        try:
            missing, unexpected = self.load_state_dict(state, strict=False)
        except RuntimeError as err:  # shape mismatches
            raise RuntimeError(f"`weights_path`={path!r} does not fit this module: {err}") from err
        if missing or unexpected:
            raise RuntimeError(f"`weights_path`={path!r} does not fit this module: missing keys {missing[:5]}, "
                               f"unexpected keys {unexpected[:5]}.")

    def forward(self, x: Tensor, category: Tensor | None = None) -> Tensor:
        """Logits ``(B, num_classes)``; ``category (B,)`` reaches branch mixins when present."""
        with method_context(self, {"category": category}):
            return self.head(self.backbone(x))

    def forward_features(self, x: Tensor) -> Tensor:
        """Backbone features ``(B, num_features)``."""
        return self.backbone(x)

    def step(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Forward a batch; returns the ``outputs`` dict shared with methods."""
        uses_labels = self.supervised or not self.training
        if not isinstance(batch, dict) or "x" not in batch or (uses_labels and "y" not in batch):
            raise ValueError(
                "ClassificationModule expects dict batches with keys 'x' and 'y' ('y' is not read in training "
                f"when supervised=False; 'category' optional); got {type(batch).__name__}"
                + (f" with keys {sorted(batch)}" if isinstance(batch, dict) else "")
            )
        with method_context(self, batch):
            features = self.backbone(batch["x"])
            logits = self.head(features)
        if uses_labels:
            loss = F.cross_entropy(logits, batch["y"], label_smoothing=self.label_smoothing)
        else:  # target adaptation: no label in the training loss; methods add theirs
            loss = logits.sum() * 0.0
        aux = method_aux_loss(self)  # e.g. learned-router baselines' load-balancing loss, else None
        if aux is not None:
            loss = loss + aux
        return {"loss": loss, "logits": logits, "features": features, "category": batch.get("category")}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        outputs = self.step(batch)
        loss = apply_loss_hooks(self, batch, outputs, outputs["loss"])
        log_module_methods(self)
        values: dict[str, Any] = {"loss": loss}
        if "y" in batch:  # in target-adaptation mode: evaluation only, never in the loss
            self.train_acc(outputs["logits"].detach(), batch["y"])
            values["acc"] = self.train_acc
        self.log_split("train", values, batch_size=batch["x"].shape[0])
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        """Validation metrics; with several val loaders, loaders after the first are OOD sets (``val/ood_auroc``)."""
        if dataloader_idx > 0:  # an OOD set: its labels (if any) are not the task's; only the OOD score counts
            probs = self(batch["x"], batch.get("category")).softmax(-1)
            self.val_ood_auroc.update(probs, True)
            self.log("val/ood_auroc", self.val_ood_auroc, on_step=False, on_epoch=True, add_dataloader_idx=False,
                     batch_size=probs.shape[0])
            return
        outputs = self.step(batch)
        probs = outputs["logits"].softmax(-1)
        self.val_acc(outputs["logits"], batch["y"])
        self.val_ece(probs, batch["y"])
        self.val_nll(probs, batch["y"])
        self.val_brier(probs, batch["y"])
        self.update_confusion(outputs["logits"].detach(), batch["y"])
        if self._has_ood_loaders():
            self.val_ood_auroc.update(probs, False)
        self.log_split("val", {"loss": outputs["loss"], "acc": self.val_acc, "ece": self.val_ece,
                               "nll": self.val_nll, "brier": self.val_brier}, batch_size=batch["y"].numel())

    def on_validation_epoch_end(self) -> None:
        self.log_confusion()

    def _has_ood_loaders(self) -> bool:
        loaders = getattr(self._trainer, "val_dataloaders", None) if self._trainer is not None else None
        return isinstance(loaders, (list, tuple)) and len(loaders) > 1

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        outputs = self.step(batch)
        probs = outputs["logits"].softmax(-1)
        self.test_acc(outputs["logits"], batch["y"])
        self.test_ece(probs, batch["y"])
        self.test_nll(probs, batch["y"])
        self.test_brier(probs, batch["y"])
        self.log_split("test", {"loss": outputs["loss"], "acc": self.test_acc, "ece": self.test_ece,
                                "nll": self.test_nll, "brier": self.test_brier}, batch_size=batch["y"].numel())

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self(batch["x"], batch.get("category")).softmax(-1)
