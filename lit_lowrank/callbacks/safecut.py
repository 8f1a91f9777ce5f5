"""SafeCut: cut-statistic gated mutual correction for source-free domain adaptation."""

from __future__ import annotations

import re
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import override

from lit_lowrank.callbacks.shot import freeze_hypothesis
from lit_lowrank.core.loss_hooks import MethodCallback, require_outputs
from lit_lowrank.ops.cut_statistic import CutStatistic, cut_statistic, knn_graph
from lit_lowrank.ops.information_maximization import centroid_pseudo_labels, information_maximization_loss
from lit_lowrank.ops.safecut_gate import GateMode, safecut_gate

GraphFeatures = Literal["both", "own", "first", "second", "frozen"]
GRAPH_FEATURES: tuple[str, ...] = ("both", "own", "first", "second", "frozen")


def _empty_counts() -> dict[str, float]:
    return {"to_first": 0, "to_second": 0, "none": 0, "corrections": 0, "miscorrections": 0,
            "corrections_to_second": 0, "miscorrections_to_second": 0, "correction_weight_first": 0.0,
            "miscorrection_weight_first": 0.0, "correction_weight_second": 0.0, "miscorrection_weight_second": 0.0,
            "seen": 0, "z_right_sum": 0.0, "z_right_n": 0, "z_wrong_sum": 0.0, "z_wrong_n": 0}


class SafeCut(MethodCallback):
    """Two models adapt to an unlabelled target domain and correct each other where a
    label-free reliability test says so.

    Per batch: a kNN graph on the (detached, L2-normalised) features; for each
    model's predicted labels, the local cut edge weight z-score
    (:func:`~lit_lowrank.ops.cut_statistic`) — low z = the label agrees with its
    neighbourhood more than chance. :func:`~lit_lowrank.ops.safecut_gate` turns the
    two z's into per-sample weights: the more reliable model teaches the other
    (cross-entropy to its hard label), with strength growing with the reliability gap;
    when neither model passes ``threshold`` nobody is taught. Each adapting model also
    keeps SHOT's single-model loss: information maximisation (``im_weight``) plus, with
    ``beta > 0``, cross-entropy to its own centroid pseudo-labels — so with no
    confident teacher SafeCut falls back to SHOT.

    The second model (a vision–language zero-shot classifier such as
    :class:`~lit_lowrank.models.ZeroShotCLIP`, or any classifier with different failure
    modes; ``forward(x) -> logits`` and ``forward_features(x) -> (B, D)``, optionally
    ``logits_from_features`` to share one forward) belongs to the callback, not to the
    module: the module's structure and checkpoint stay those of the adapted model, and the
    callback steps the second model with its own AdamW (``second_lr``) after each training
    batch; its weights and optimizer state are in the callback's ``state_dict``
    (resume-safe). Only the second model's parameters the user left trainable
    (``requires_grad``), and among them those ``trainable`` matches, adapt: a frozen CLIP
    with learnable prompts adapts its prompts only. A second model without
    ``forward_features`` is refused unless ``graph_features="frozen"`` (the graph then
    comes from ``graph_encoder``, and so do its centroid pseudo-labels).
    Multi-process strategies are refused while the second model adapts (its gradients
    would not be synchronised).

    Args:
        second_model: the second classifier.
        k: neighbours of the kNN graph (per batch, so use batches of ≳ 64).
        threshold: a teacher's z must be below this (−1 ≈ "clearly better than chance").
        gap_scale: strength = tanh(|z_a − z_b| / gap_scale).
        weight: weight of the cross-supervision loss.
        im_weight: weight of each model's information-maximisation loss.
        beta: weight of each model's SHOT centroid pseudo-label loss (0 = IM only).
        mode: ``"safecut"``; baselines ``"naive"`` (mutual exchange, no gate) and
            ``"one_way"`` (the second model distils into the first, frozen).
        graph_features: the kNN graph each model's labels are scored on:
            ``"own"`` (default: each model's labels on the kNN graph of its *own*
            features), ``"both"`` (one shared graph on the concatenated, L2-normalised
            features of both models), ``"first"`` / ``"second"`` (one shared graph on one
            model's features) or ``"frozen"`` (one shared graph on
            ``graph_encoder(x)``, features no adaptation changes). A model's predicted
            labels are a function of its own features, so on its own graph they look
            reliable whatever their accuracy; ``"first"`` therefore favours the
            adapted model; ``"own"`` gives both models that advantage. The benchmark
            compares the choices (see the card).
        graph_encoder: the frozen feature extractor of ``graph_features="frozen"``
            (``x -> (B, D)``): e.g. a frozen copy of the source backbone, a CLIP image
            tower, or ``nn.Flatten()`` for raw pixels. Never trained.
        adapt_second: train the second model too (forced off for ``one_way``; off, its forward
            runs without gradients).
        trainable: a regular expression over the second model's parameter names
            (``re.search``): of its parameters with ``requires_grad``, only those matching adapt
            (``None``: all of them; e.g. ``"class_embeddings"`` or ``"lora_"``). ``requires_grad``
            is never changed.
        second_lr: learning rate of the second model's AdamW.
        freeze_head: the adapted module's classifier head, frozen as in SHOT (``None``: adapt it).
        input_key: batch key of the second model's input.

    .. code-block:: python

        second = CrossDatasetDigitClassifier(seed=0)     # or ZeroShotCLIP(clip_folder, class_names)
        trainer = L.Trainer(max_epochs=3, callbacks=[SafeCut(second, k=10)])
        trainer.fit(ClassificationModule("cnn_small", in_chans=1, supervised=False, weights_path="source.ckpt"),
                    datamodule=ShiftedDigitsDataModule(shift="rotate"))
    """

    method_name = "safecut"
    figure_every_n_epochs: int = 1  # the gate-decision figure every n epochs

    def __init__(
        self,
        second_model: nn.Module,
        k: int = 10,
        threshold: float = -1.0,
        gap_scale: float = 1.0,
        weight: float = 0.3,
        im_weight: float = 1.0,
        beta: float = 0.3,
        mode: GateMode = "safecut",
        graph_features: GraphFeatures = "own",
        graph_encoder: nn.Module | None = None,
        adapt_second: bool = True,
        trainable: str | None = None,
        second_lr: float = 1e-3,
        freeze_head: str | None = "head",
        input_key: str = "x",
    ) -> None:
        if mode not in ("safecut", "naive", "one_way"):
            raise ValueError(f"`mode`={mode!r}, expected 'safecut', 'naive' or 'one_way'.")
        if graph_features not in GRAPH_FEATURES:
            raise ValueError(f"`graph_features`={graph_features!r}, expected one of {GRAPH_FEATURES}.")
        if graph_features == "frozen" and graph_encoder is None:
            raise ValueError("`graph_features`='frozen' needs `graph_encoder` (a frozen x -> (B, D) feature "
                             "extractor, e.g. a copy of the source backbone or nn.Flatten() for pixels).")
        if not callable(getattr(second_model, "forward_features", None)) and graph_features != "frozen":
            raise TypeError(
                f"SafeCut: the second model {type(second_model).__name__} has no `forward_features(x) -> (B, D)`, "
                f"which graph_features={graph_features!r} builds its kNN graph from. Give it one (a CLIP classifier: "
                "lit_lowrank.models.ZeroShotCLIP), or build the graph on frozen features explicitly: "
                "graph_features='frozen', graph_encoder=<a frozen x -> (B, D) encoder>.")
        self.graph_encoder = graph_encoder
        self.second_model = second_model
        self.trainable, self.freeze_head = trainable, freeze_head
        self.k, self.threshold, self.gap_scale = k, threshold, gap_scale
        self.weight, self.im_weight, self.beta, self.mode = weight, im_weight, beta, mode
        self.graph_features, self.input_key = graph_features, input_key
        self.adapt_second = adapt_second and mode != "one_way"
        self.second_lr = second_lr
        self.second_optimizer: torch.optim.Optimizer | None = None
        self._pending_optimizer_state: dict[str, Any] | None = None
        self.counts = _empty_counts()

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if self.adapt_second and trainer.world_size > 1:
            raise RuntimeError(
                f"SafeCut(adapt_second=True) runs on one process; got world_size={trainer.world_size} "
                f"({type(trainer.strategy).__name__}). Use adapt_second=False or a single device."
            )
        freeze_hypothesis(pl_module, self.freeze_head, "SafeCut")
        self.second_model.to(pl_module.device)
        if self.graph_encoder is not None:
            self.graph_encoder.to(pl_module.device).requires_grad_(False).eval()
        if self.adapt_second and self.second_optimizer is None:
            self.second_optimizer = torch.optim.AdamW(self.adapted_parameters(), lr=self.second_lr)
            if self._pending_optimizer_state is not None:
                self.second_optimizer.load_state_dict(self._pending_optimizer_state)
                self._pending_optimizer_state = None

    def adapted_parameters(self) -> list[nn.Parameter]:
        """The second model's parameters SafeCut adapts: ``requires_grad`` and matching ``trainable``."""
        chosen = [p for n, p in self.second_model.named_parameters()
                  if p.requires_grad and (self.trainable is None or re.search(self.trainable, n))]
        if not chosen:
            trainable = [n for n, p in self.second_model.named_parameters() if p.requires_grad]
            raise ValueError(
                f"SafeCut(adapt_second=True, trainable={self.trainable!r}): no parameter of the second model "
                f"{type(self.second_model).__name__} is left to adapt (parameters with requires_grad: "
                f"{trainable[:5]}{'...' if len(trainable) > 5 else ''}). Unfreeze some, fix `trainable`, or pass "
                "adapt_second=False.")
        return chosen

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        # the module's backward filled the second model's gradients through on_loss
        if self.second_optimizer is not None:
            self.second_optimizer.step()
        # trainable parameters `trainable` left out got gradients too: drop them, never step them
        self.second_model.zero_grad(set_to_none=True)

    def _second_forward(self, batch: Any) -> tuple[Tensor, Tensor | None]:
        model = self.second_model
        if not isinstance(batch, dict) or self.input_key not in batch:
            raise ValueError(f"SafeCut reads the second model's input from batch[{self.input_key!r}] "
                             "(dict batches); set `input_key`.")
        x = batch[self.input_key]
        with torch.enable_grad() if self.adapt_second else torch.no_grad():
            if not callable(getattr(model, "forward_features", None)):  # graph_features="frozen" (checked at init)
                return model(x), None
            features = model.forward_features(x)
            head = getattr(model, "logits_from_features", None)
            logits = head(features) if callable(head) else model(x)
        return logits, features

    @override
    def on_loss(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                outputs: dict[str, Any], loss: Tensor) -> Tensor:
        require_outputs(outputs, ("logits", "features"), "SafeCut")
        logits_a, feats_a = outputs["logits"], outputs["features"]
        logits_b, feats_b = self._second_forward(batch)
        if feats_b is None:  # no forward_features: its centroid pseudo-labels use the frozen graph's features
            with torch.no_grad():
                feats_b = self.graph_encoder(batch[self.input_key])
        if logits_b.shape != logits_a.shape:
            raise ValueError(f"SafeCut: the second model's logits {tuple(logits_b.shape)} do not match the "
                             f"module's {tuple(logits_a.shape)} (same classes, same order expected).")
        with torch.no_grad():
            labels_a, labels_b = logits_a.argmax(-1), logits_b.argmax(-1)
            z_a, z_b = self.reliability(batch, feats_a, feats_b, labels_a, labels_b, logits_a.shape[-1])
            to_a, to_b = safecut_gate(z_a.z, z_b.z, self.threshold, self.gap_scale, self.mode)
        cross = (to_a * F.cross_entropy(logits_a, labels_b, reduction="none")).mean()
        if self.adapt_second:
            cross = cross + (to_b * F.cross_entropy(logits_b, labels_a, reduction="none")).mean()
        base = self._shot_loss(logits_a, feats_a)
        if self.adapt_second:
            base = base + self._shot_loss(logits_b, feats_b)
        self._diagnose(pl_module, batch, to_a, to_b, labels_a, labels_b, z_a, z_b)
        return loss + self.weight * cross + base

    def reliability(self, batch: Any, feats_a: Tensor, feats_b: Tensor, labels_a: Tensor, labels_b: Tensor,
                    num_classes: int) -> tuple[CutStatistic, CutStatistic]:
        """Cut statistics of both models' labels ``(B,)`` on the graph(s) ``graph_features`` names."""
        k = min(self.k, labels_a.shape[0] - 1)

        def graph(*parts: Tensor) -> Tensor:
            return knn_graph(torch.cat([F.normalize(p.flatten(1).float(), dim=1) for p in parts], 1), k)

        if self.graph_features == "own":
            shared_a, shared_b = graph(feats_a), graph(feats_b)
        else:
            if self.graph_features == "frozen":
                parts = (self.graph_encoder(batch[self.input_key]),)
            else:
                parts = {"first": (feats_a,), "second": (feats_b,), "both": (feats_a, feats_b)}[self.graph_features]
            shared_a = shared_b = graph(*parts)
        return (cut_statistic(None, labels_a, weights=shared_a, num_classes=num_classes),
                cut_statistic(None, labels_b, weights=shared_b, num_classes=num_classes))

    def _shot_loss(self, logits: Tensor, features: Tensor) -> Tensor:
        loss = self.im_weight * information_maximization_loss(logits)
        if self.beta > 0:
            pseudo = centroid_pseudo_labels(features.detach(), logits.detach())
            loss = loss + self.beta * F.cross_entropy(logits, pseudo)
        return loss

    def _diagnose(self, pl_module: "pl.LightningModule", batch: Any, to_a: Tensor, to_b: Tensor,
                  labels_a: Tensor, labels_b: Tensor, z_a: CutStatistic, z_b: CutStatistic) -> None:
        disagree = labels_a != labels_b
        n_to_a, n_to_b = int(((to_a > 0) & disagree).sum()), int(((to_b > 0) & disagree).sum())
        n_none = int((disagree & (to_a == 0) & (to_b == 0)).sum())
        self.counts["to_first"] += n_to_a
        self.counts["to_second"] += n_to_b
        self.counts["none"] += n_none
        self.log_method(pl_module, "gate_to_first", float(n_to_a))
        self.log_method(pl_module, "gate_to_second", float(n_to_b))
        self.log_method(pl_module, "gate_none", float(n_none))
        self.log_method(pl_module, "z_global_first", z_a.z_global)
        self.log_method(pl_module, "z_global_second", z_b.z_global)
        y = batch.get("y") if isinstance(batch, dict) else None
        if y is not None:  # evaluation only: labels are read for these counts, never for the loss
            fixes, breaks = self._count_corrections(y, to_a, to_b, labels_a, labels_b)
            self._count_z(y, z_a.z, z_b.z, labels_a, labels_b)
            self.log_method(pl_module, "corrections", float(fixes))
            self.log_method(pl_module, "miscorrections", float(breaks))

    def _count_corrections(self, y: Tensor, to_a: Tensor, to_b: Tensor, labels_a: Tensor,
                           labels_b: Tensor) -> tuple[int, int]:
        """Taught labels that fix the student (teacher right, student wrong) or break it
        (teacher wrong, student right), per direction, as counts and gate-weighted sums;
        returns this batch's (fixes, breaks) over both directions."""
        right_a, right_b = labels_a == y, labels_b == y
        fix_a, break_a = (to_a > 0) & right_b & ~right_a, (to_a > 0) & ~right_b & right_a
        fix_b, break_b = (to_b > 0) & right_a & ~right_b, (to_b > 0) & ~right_a & right_b
        c = self.counts
        c["corrections"] += int(fix_a.sum())
        c["miscorrections"] += int(break_a.sum())
        c["corrections_to_second"] += int(fix_b.sum())
        c["miscorrections_to_second"] += int(break_b.sum())
        c["correction_weight_first"] += float((to_a * fix_a).sum())
        c["miscorrection_weight_first"] += float((to_a * break_a).sum())
        c["correction_weight_second"] += float((to_b * fix_b).sum())
        c["miscorrection_weight_second"] += float((to_b * break_b).sum())
        c["seen"] += int(y.numel())
        return int(fix_a.sum() + fix_b.sum()), int(break_a.sum() + break_b.sum())

    def _count_z(self, y: Tensor, z_a: Tensor, z_b: Tensor, labels_a: Tensor, labels_b: Tensor) -> None:
        """Sums of the local z of right and of wrong labels, both models (the gate's premise)."""
        z, right = torch.cat([z_a, z_b]), torch.cat([labels_a == y, labels_b == y])
        c = self.counts
        c["z_right_sum"] += float(z[right].sum())
        c["z_right_n"] += int(right.sum())
        c["z_wrong_sum"] += float(z[~right].sum())
        c["z_wrong_n"] += int((~right).sum())

    def z_separation(self) -> float:
        """Mean local z of wrong labels minus that of right labels, both models, over every step so
        far (labels read for evaluation only). > 0: the statistic ranks right labels as more
        reliable, what the gate needs; NaN before any labelled batch."""
        c = self.counts
        if not (c["z_right_n"] and c["z_wrong_n"]):
            return float("nan")
        return c["z_wrong_sum"] / c["z_wrong_n"] - c["z_right_sum"] / c["z_right_n"]

    def net_correction(self, into: Literal["both", "first", "second"] = "both") -> float:
        """Gate-weighted (corrections − miscorrections) / (corrections + miscorrections) of the
        cross-labels over every step so far, taught to both models (``"both"``) or to one.

        > 0: a net-positive correction signal. A gate blind to which model is right (a coin
        flip per sample) gives 0 in expectation for ``"both"``; into one model, a blind gate
        still scores the teacher's average edge. NaN before any taught label.
        """
        if into not in ("both", "first", "second"):
            raise ValueError(f"`into`={into!r}, expected 'both', 'first' or 'second'.")
        parts = ("first", "second") if into == "both" else (into,)
        good = sum(self.counts[f"correction_weight_{p}"] for p in parts)
        bad = sum(self.counts[f"miscorrection_weight_{p}"] for p in parts)
        return (good - bad) / (good + bad) if good + bad > 0 else float("nan")

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Dashboard: the gate's decisions on disagreeing samples and, with labels (evaluation only),
        the taught labels that fixed vs broke the student, so far in the run."""
        from lit_lowrank.core.figures import figure_due, log_figure, new_figure

        if not figure_due(trainer, self.figure_every_n_epochs):
            return
        c = self.counts
        fig, (left, right) = new_figure(9.0, 3.4, ncols=2)
        names, values = ["taught to first", "taught to second", "no exchange"], [c["to_first"], c["to_second"], c["none"]]
        bars = left.bar(names, values, color=["tab:blue", "tab:orange", "tab:gray"])
        left.bar_label(bars, labels=[f"{int(v)}" for v in values])
        left.set(ylabel="disagreeing samples", title=f"SafeCut gate decisions ({self.mode}), to epoch {trainer.current_epoch}")
        if c["seen"]:
            import numpy as np

            x = np.arange(2)
            fixes = [c["corrections"], c["corrections_to_second"]]
            breaks = [c["miscorrections"], c["miscorrections_to_second"]]
            b1 = right.bar(x - 0.2, fixes, 0.4, label="fixed (teacher right)", color="tab:green")
            b2 = right.bar(x + 0.2, breaks, 0.4, label="broke (teacher wrong)", color="tab:red")
            right.bar_label(b1, labels=[str(int(v)) for v in fixes])
            right.bar_label(b2, labels=[str(int(v)) for v in breaks])
            right.set_xticks(x, labels=["into first", "into second"])
            right.set(ylabel="taught labels", title=f"net correction {self.net_correction():+.2f}")
            right.legend(fontsize=8)
        else:
            right.axis("off")
            right.text(0.5, 0.5, "no labels: corrections not counted", ha="center", va="center")
        log_figure(trainer, "method/safecut/gate_decisions", fig)

    @override
    def on_validation_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if isinstance(batch, dict) and "y" in batch and self.input_key in batch:
            with torch.no_grad():
                acc = (self.second_model(batch[self.input_key]).argmax(-1) == batch["y"]).float().mean()
            pl_module.log("method/safecut/second_acc", acc, on_epoch=True, on_step=False,
                          batch_size=batch["y"].numel(), sync_dist=True)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "second_model": {k: v.detach().clone() for k, v in self.second_model.state_dict().items()},
            "second_optimizer": None if self.second_optimizer is None else self.second_optimizer.state_dict(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counts = {**_empty_counts(), **state_dict["counts"]}
        self.second_model.load_state_dict(state_dict["second_model"])
        if state_dict.get("second_optimizer") is not None:
            if self.second_optimizer is not None:
                self.second_optimizer.load_state_dict(state_dict["second_optimizer"])
            else:  # restored before setup built the optimizer
                self._pending_optimizer_state = state_dict["second_optimizer"]
