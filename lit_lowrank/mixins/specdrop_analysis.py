"""SpecDrop specialisation analysis: the per-branch pruning-sensitivity matrix, logged at validation.

``S[c, k]`` is how much category ``c`` loses when branch ``k`` is zeroed (accuracy
drop for classification, loss increase for language modelling). Specialisation is
diagonal dominance: each category depends on its own branch more than on all the
others together (:func:`~lit_lowrank.ops.specdrop.diagonal_dominance`).

.. code-block:: python

    trainer = L.Trainer(callbacks=[SpecDropSensitivity(max_batches=8)])
    trainer.fit(ClassificationModule(..., branches={"target": r"backbone\\.stages\\.2$", "num_branches": 3}), dm)
    # logs method/specdrop/branch_specialization, method/specdrop/specialization_gap and a heatmap
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor, nn
from typing_extensions import override

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.temporary import temporarily_set
from lit_lowrank.mixins.specdrop import (
    METHOD,
    specdrop_blocks,
    specdrop_category,
)
from lit_lowrank.ops.specdrop import (
    diagonal_dominance,
    per_category_mean,
    sensitivity_matrix,
    specialization_gap,
)


@contextmanager
def ablate_branch(model: nn.Module, branch: int, renormalise: bool = True) -> Iterator[None]:
    """Prune branch ``branch`` in every block for the forwards inside the context: pruning analysis.

    ``renormalise=True`` (default) rescales the remaining branches' weights to the old
    total (a learned router re-routes to the remaining experts; Soft MoE's combine
    renormalises over the remaining slots), so the analysis measures what the branch
    *computes*, not the weight the merge rule gives it. ``renormalise=False`` only
    zeroes the branch: the output then shrinks by that branch's weight, and SpecDrop's
    own branch (``p_a / D`` ≈ 0.71 at K = 5, p_i = 0.1) looks important even when every
    branch computes the same function (weight-tied branches score as fully specialised).
    """
    blocks = specdrop_blocks(model)
    for block in blocks:
        if not 0 <= branch < block.num_branches:
            raise ValueError(f"`branch`={branch!r}: expected an index in [0, {block.num_branches}).")
    with temporarily_set(blocks, "ablation_renormalise", renormalise), \
            temporarily_set(blocks, "ablated_branch", branch):
        yield


ScoreFn = Callable[["pl.LightningModule", dict[str, Any]], Tensor]


def default_score(pl_module: pl.LightningModule, batch: dict[str, Any]) -> Tensor:
    """Per-sample score ``(B,)``: 1/0 correctness for ``{"x", "y"}`` batches, minus the mean
    token loss for ``{"input_ids", "labels"}`` batches.

    Uses the module's ``step(batch)`` (lit_lowrank task modules) when it has one, else
    ``module(batch["x"])`` inside :func:`specdrop_category`.
    """
    if hasattr(pl_module, "step"):
        logits = pl_module.step(batch)["logits"]
    elif "x" in batch:
        with specdrop_category(pl_module, batch.get("category")):
            logits = pl_module(batch["x"])
    else:
        raise ValueError("SpecDropSensitivity: the module has no `step` and the batch no 'x'; pass `score_fn`.")
    if "labels" in batch:
        labels = batch["labels"]
        nll = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="none")
        valid = (labels != -100).float()
        return -(nll.view(labels.shape) * valid).sum(1) / valid.sum(1).clamp_min(1.0)
    return (logits.argmax(-1) == batch["y"]).float()


def sensitivity_heatmap(matrix: Tensor, cell: int = 16) -> np.ndarray:
    """An ``(C*cell, K*cell, 3)`` uint8 image of ``S (C, K)``: white = no drop, dark red = the
    largest drop, blue = a gain; rows are categories, columns branches."""
    s = matrix.detach().double().cpu()
    scale = float(s.abs().max()) or 1.0
    v = (s / scale).clamp(-1, 1).numpy()
    white = np.array([255.0, 255.0, 255.0])
    red, blue = np.array([165.0, 15.0, 21.0]), np.array([33.0, 102.0, 172.0])
    pos, neg = np.clip(v, 0, 1)[..., None], np.clip(-v, 0, 1)[..., None]
    rgb = white * (1 - pos - neg) + red * pos + blue * neg
    return np.kron(rgb, np.ones((cell, cell, 1))).astype(np.uint8)


class SpecDropSensitivity(pl.Callback):
    """Per-branch pruning sensitivity of every SpecDrop model, computed on validation batches.

    For up to ``max_batches`` validation batches per checked epoch the callback runs the
    model ``K + 1`` times (intact, and with each branch zeroed in every block), sums the
    per-category scores across ranks, and at the epoch end logs

    - ``method/specdrop/branch_specialization``: fraction of diagonally dominant rows;
    - ``method/specdrop/specialization_gap``: own-branch drop minus other-branch drop;
    - the matrix as a heatmap image (``WandbLogger.log_image``, TensorBoard
      ``add_image``; other loggers: ``specdrop_sensitivity_epoch<N>.png`` and ``.csv``
      in the log dir). The last matrix is also kept as ``self.matrix``.

    Args:
        max_batches: validation batches analysed per epoch (``None``: all).
        every_n_epochs: analyse every n-th validation epoch.
        score_fn: ``(module, batch) -> (B,)`` per-sample score (higher is better);
            default :func:`default_score`.
        log_image: log the heatmap.

    Requires batches with a ``category`` tag and a module containing SpecDrop blocks.

    .. code-block:: python

        L.Trainer(callbacks=[SpecDropSensitivity(max_batches=4)])
    """

    def __init__(self, max_batches: int | None = 8, every_n_epochs: int = 1, score_fn: ScoreFn | None = None,
                 log_image: bool = True) -> None:
        if max_batches is not None and max_batches < 1:
            raise ValueError(f"`max_batches`={max_batches!r}: expected None or an integer >= 1.")
        if every_n_epochs < 1:
            raise ValueError(f"`every_n_epochs`={every_n_epochs!r}: expected an integer >= 1.")
        self.max_batches, self.every_n_epochs = max_batches, every_n_epochs
        self.score_fn = score_fn or default_score
        self.log_image = log_image
        self.matrix: Tensor | None = None
        self._sums: Tensor | None = None

    def _active(self, trainer: pl.Trainer) -> bool:
        return not trainer.sanity_checking and trainer.current_epoch % self.every_n_epochs == 0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not specdrop_blocks(pl_module):
            raise ValueError(
                f"SpecDropSensitivity: {type(pl_module).__name__} has no SpecDrop blocks; build it with "
                "`branches={...}` or apply_specdrop(...) first."
            )

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sums = None

    @override
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self._active(trainer) or (self.max_batches is not None and batch_idx >= self.max_batches):
            return
        if not isinstance(batch, dict) or batch.get("category") is None:
            raise ValueError("SpecDropSensitivity needs dict batches with a 'category' tag per sample.")
        block = specdrop_blocks(pl_module)[0]
        num_branches = block.num_branches
        mapping = block.config["category_to_branch"]
        num_categories = len(mapping) if mapping is not None else num_branches
        category = batch["category"].long()
        with torch.no_grad():
            scores = [self.score_fn(pl_module, batch)]
            for k in range(num_branches):
                with ablate_branch(pl_module, k):
                    scores.append(self.score_fn(pl_module, batch))
        rows = []
        counts = None
        for score in scores:
            sums, counts = per_category_mean(score.detach(), category, num_categories)
            rows.append(sums)
        batch_sums = torch.stack([*rows, counts])  # (K + 2, C): intact, ablated k, counts
        self._sums = batch_sums if self._sums is None else self._sums + batch_sums

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active(trainer):
            return
        block = specdrop_blocks(pl_module)[0]
        num_branches = block.num_branches
        mapping = block.config["category_to_branch"]
        num_categories = len(mapping) if mapping is not None else num_branches
        sums = self._sums
        if sums is None:  # this rank saw no batch; still take part in the reduction
            sums = torch.zeros(num_branches + 2, num_categories, dtype=torch.float64)
        sums = trainer.strategy.reduce(sums.to(pl_module.device).float(), reduce_op="sum").double().cpu()
        counts = sums[-1]
        seen = counts > 0
        if not bool(seen.any()):
            return
        means = sums[:-1, seen] / counts[seen]
        self.matrix = sensitivity_matrix(means[0], means[1:])
        seen_map = None if mapping is None else [mapping[c] for c in torch.nonzero(seen).flatten().tolist()]
        if mapping is None and not bool(seen.all()):
            seen_map = torch.nonzero(seen).flatten().tolist()
        dominance = diagonal_dominance(self.matrix, seen_map)
        log_method(pl_module, METHOD, "branch_specialization", dominance, on_step=False, on_epoch=True)
        if num_branches > 1:
            gap = specialization_gap(self.matrix, seen_map)
            log_method(pl_module, METHOD, "specialization_gap", gap, on_step=False, on_epoch=True)
        if self.log_image:
            rows = torch.nonzero(seen).flatten().tolist()
            self._log_heatmap(trainer, [f"cat {c}" + (f" (branch {mapping[c]})" if mapping is not None else "")
                                        for c in rows])

    @rank_zero_only
    def _log_heatmap(self, trainer: pl.Trainer, row_labels: list[str]) -> None:
        """A labelled heatmap with the values (core/figures.py: W&B image panel, TensorBoard image,
        else a PNG under ``<log_dir>/images/``); CSV-like loggers also get the matrix as CSV."""
        from lit_lowrank.core.figures import heatmap, log_figure, new_figure

        assert self.matrix is not None
        matrix = self.matrix.numpy()
        rows, cols = matrix.shape
        fig, ax = new_figure(1.8 + 0.9 * cols, 1.0 + 0.45 * rows)
        bound = float(np.abs(matrix).max()) or 1.0
        heatmap(ax, matrix, row_labels, [f"branch {k}" for k in range(cols)], xlabel="branch zeroed",
                ylabel="category", title=f"SpecDrop pruning sensitivity, epoch {trainer.current_epoch}",
                cmap="RdBu_r", colorbar_label="score drop when the branch is zeroed", fmt="{:.3f}")
        ax.images[0].set_clim(-bound, bound)
        log_figure(trainer, f"method/{METHOD}/sensitivity", fig)
        for logger in trainer.loggers:
            if type(logger).__name__ not in ("WandbLogger", "TensorBoardLogger", "DummyLogger") and \
                    getattr(logger, "log_dir", None) is not None:
                folder = Path(logger.log_dir)
                folder.mkdir(parents=True, exist_ok=True)
                stem = folder / f"specdrop_sensitivity_epoch{trainer.current_epoch}"
                np.savetxt(stem.with_suffix(".csv"), matrix, delimiter=",", fmt="%.6f")
