"""NodeClassificationModule: full-batch node classification with any PyG model."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.core.surgery import import_object
from lit_lowrank.tasks.base import TaskModule


def build_graph_model(name: str, in_channels: int, out_channels: int, **kwargs: Any) -> nn.Module:
    """A node-classification model by name: a ``torch_geometric.nn.models`` class
    (``GCN``, ``GAT``, ``GraphSAGE``, ``GIN``, ``MLP``, ``LINKX``...; PyG's name wins),
    a lower-case name of ``lit_lowrank.models.GRAPH_MODELS`` (``castor``, ``gprgnn``,
    ``bernnet``...), a model class from ``lit_lowrank.models`` or a dotted import path; built with
    ``in_channels``/``out_channels`` plus ``kwargs``.
    """
    import torch_geometric.nn.models as pyg_models

    import lit_lowrank.models as ours

    if hasattr(pyg_models, name):
        cls = getattr(pyg_models, name)
    elif name.lower() in ours.GRAPH_MODELS:  # our graph models by lower-case name ("castor", "gprgnn", ...)
        cls = ours.GRAPH_MODELS[name.lower()]
    elif hasattr(ours, name) and isinstance(getattr(ours, name), type):
        cls = getattr(ours, name)
    elif "." in name:
        cls = import_object(name)
    else:
        known = sorted(n for n in dir(pyg_models) if n[:1].isupper())
        raise ValueError(f"`model`={name!r} is not a PyG model, a lit_lowrank model or a dotted path; PyG has {known}.")
    return cls(in_channels=in_channels, out_channels=out_channels, **kwargs)


class NodeClassificationModule(TaskModule):
    """Node classification on one full-batch graph (train/val/test masks per split).

    Batches are ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y`` and
    masks of shape ``(N,)`` or ``(N, num_splits)`` (see
    :class:`~lit_lowrank.datamodules.GraphDataModule`); ``split`` picks the column.

    Args:
        model: a PyG model name (``"GCN"``, ``"GAT"``, ``"MLP"``...), a dotted path, or
            an ``nn.Module`` taking ``(x, edge_index)`` (or ``(x)`` for MLPs).
        in_channels: node feature width (must match the data).
        num_classes: number of node classes.
        model_kwargs: keyword arguments for a model given by name
            (``hidden_channels``, ``num_layers``, ``dropout``...).
        split: which random split (mask column) to train and evaluate on.

    .. code-block:: python

        model = NodeClassificationModule("GCN", in_channels=100, num_classes=2,
                                         model_kwargs={"hidden_channels": 64, "num_layers": 2})
        L.Trainer(max_epochs=200).fit(model, datamodule=GraphDataModule("csbm", phi=0.5))
    """

    def __init__(
        self,
        model: str | nn.Module = "GCN",
        in_channels: int = 100,
        num_classes: int = 2,
        model_kwargs: dict[str, Any] | None = None,
        split: int = 0,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "epoch",
        figure_every_n_epochs: int = 1,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.figure_every_n_epochs = figure_every_n_epochs  # the validation confusion heatmap (0: never)
        if isinstance(model, str):
            kwargs = {"hidden_channels": 64, "num_layers": 2, **(model_kwargs or {})}
            model = build_graph_model(model, in_channels, num_classes, **kwargs)
        self.model = model
        self.in_channels = in_channels
        self.split = split
        self._uses_edges = "edge_index" in inspect.signature(model.forward).parameters
        metric = lambda: torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)  # noqa: E731
        self.train_acc, self.val_acc, self.test_acc = metric(), metric(), metric()

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Node logits ``(N, num_classes)``."""
        return self.model(x, edge_index) if self._uses_edges else self.model(x)

    def _mask(self, data: Any, split_name: str) -> Tensor:
        mask = getattr(data, f"{split_name}_mask", None)
        if mask is None:
            raise ValueError(f"The graph has no `{split_name}_mask`; GraphDataModule creates (N, num_splits) masks.")
        if mask.dim() == 2:
            if not 0 <= self.split < mask.shape[1]:
                raise ValueError(f"`split`={self.split} but the data has {mask.shape[1]} splits (0..{mask.shape[1] - 1}).")
            mask = mask[:, self.split]
        return mask

    def step(self, data: Any, split_name: str) -> dict[str, Any]:
        """Forward the whole graph; loss on the nodes of ``split_name``'s mask."""
        if data.x.shape[1] != self.in_channels:
            raise ValueError(
                f"`in_channels`={self.in_channels} but the graph's node features have width {data.x.shape[1]}."
            )
        features = self(data.x, data.edge_index)
        mask = self._mask(data, split_name)
        loss = F.cross_entropy(features[mask], data.y[mask])
        return {"loss": loss, "logits": features, "mask": mask, "category": getattr(data, "category", None)}

    def training_step(self, data: Any, batch_idx: int) -> Tensor:
        outputs = self.step(data, "train")
        loss = apply_loss_hooks(self, data, outputs, outputs["loss"])
        mask = outputs["mask"]
        self.train_acc(outputs["logits"][mask].detach(), data.y[mask])
        self.log_split("train", {"loss": loss, "acc": self.train_acc}, batch_size=int(mask.sum()), on_epoch=True)
        return loss

    def validation_step(self, data: Any, batch_idx: int) -> None:
        outputs = self.step(data, "val")
        mask = outputs["mask"]
        self.val_acc(outputs["logits"][mask], data.y[mask])
        self.log_split("val", {"loss": outputs["loss"], "acc": self.val_acc}, batch_size=int(mask.sum()))
        self.update_confusion(outputs["logits"][mask].detach(), data.y[mask])
        if self.figures_due():
            self._homophily_figure_data = (outputs["logits"].detach(), data, mask)

    def test_step(self, data: Any, batch_idx: int) -> None:
        outputs = self.step(data, "test")
        mask = outputs["mask"]
        self.test_acc(outputs["logits"][mask], data.y[mask])
        self.log_split("test", {"loss": outputs["loss"], "acc": self.test_acc}, batch_size=int(mask.sum()))

    def on_validation_epoch_end(self) -> None:
        self.log_confusion()
        pending = getattr(self, "_homophily_figure_data", None)
        self._homophily_figure_data = None
        if pending is not None and self.figures_due():
            self.log_accuracy_by_homophily(*pending)
            self._figure_logged = True

    def on_train_end(self) -> None:
        """A run whose validation never ran (``max_epochs`` below ``check_val_every_n_epoch``) still gets its
        figures: one evaluation of the validation nodes at the end of training."""
        from lit_lowrank.core.figures import has_real_logger

        if getattr(self, "_figure_logged", False) or not self.figure_every_n_epochs or \
                not has_real_logger(self._trainer) or self._trainer.datamodule is None:
            return
        loader = self._trainer.datamodule.val_dataloader()
        data = next(iter(loader)).to(self.device)
        was_training = self.training
        self.eval()
        with torch.no_grad():
            logits = self(data.x, data.edge_index)
        self.train(was_training)
        mask = self._mask(data, "val")
        self.update_confusion(logits[mask], data.y[mask])
        self.log_confusion()
        self.log_accuracy_by_homophily(logits, data, mask)

    def log_accuracy_by_homophily(self, logits: Tensor, data: Any, mask: Tensor,
                                  key: str = "val/accuracy_by_homophily", bins: int = 5) -> None:
        """Validation accuracy of nodes binned by local homophily (the fraction of a node's neighbours sharing its
        label), with the node count on each bar: where a graph filter fails on heterophilous nodes."""
        from lit_lowrank.core.figures import log_figure, new_figure

        local = local_homophily(data.edge_index, data.y, data.num_nodes)[mask].cpu()
        correct = (logits[mask].argmax(-1) == data.y[mask]).float().cpu()
        edges = torch.linspace(0, 1, bins + 1)
        which = torch.bucketize(local, edges[1:-1], right=True)
        acc = [float(correct[which == b].mean()) if (which == b).any() else float("nan") for b in range(bins)]
        count = [int((which == b).sum()) for b in range(bins)]
        fig, ax = new_figure(5.0, 3.2)
        labels = [f"{edges[b]:.1f}-{edges[b + 1]:.1f}" for b in range(bins)]
        bars = ax.bar(labels, [0.0 if a != a else a for a in acc], color="tab:blue")
        ax.bar_label(bars, labels=[f"n={c}" for c in count], fontsize=8)
        ax.set(xlabel="local homophily (same-label neighbours)", ylabel="validation accuracy", ylim=(0, 1.1),
               title=f"accuracy by local homophily, epoch {self.current_epoch}")
        log_figure(self._trainer, key, fig)


def local_homophily(edge_index: Tensor, y: Tensor, num_nodes: int) -> Tensor:
    """Per node, the fraction of its (incoming) neighbours with its label; 0 for a node without neighbours.

    .. code-block:: python

        h = local_homophily(data.edge_index, data.y, data.num_nodes)   # (N,)
    """
    src, dst = edge_index
    same = (y[src] == y[dst]).float()
    degree = torch.zeros(num_nodes, device=y.device).index_add_(0, dst, torch.ones_like(same))
    agree = torch.zeros(num_nodes, device=y.device).index_add_(0, dst, same)
    return agree / degree.clamp_min(1)
