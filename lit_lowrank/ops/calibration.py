"""Calibration and OOD metrics as torchmetrics: ECE (torchmetrics), NLL, Brier, OOD AUROC.

torchmetrics has ECE (``CalibrationError(n_bins=15, norm="l1")``, the project's one
ECE) and AUROC but no multiclass NLL or Brier score, so those two are added here as
``Metric`` classes that take *probabilities* (as ``CalibrationError`` does). OOD AUROC
is torchmetrics ``BinaryAUROC`` over an OOD score (``1 - max p`` by default) with
out-of-distribution samples as the positive class.

.. code-block:: python

    metrics = calibration_metrics(num_classes=10)        # a MetricCollection
    metrics.update(probs, y)
    metrics.compute()   # {"acc", "ece", "nll", "brier"}
    auroc = OODAUROC()
    auroc.update(probs_id, ood=False); auroc.update(probs_ood, ood=True)
    auroc.compute()
"""

from __future__ import annotations

import torch
import torchmetrics
from torch import Tensor


def _check_probs(probs: Tensor, target: Tensor | None, name: str) -> None:
    if probs.dim() != 2:
        raise ValueError(f"{name}: `probs` must be (B, C) probabilities, got shape {tuple(probs.shape)}.")
    if target is not None and target.shape != probs.shape[:1]:
        raise ValueError(f"{name}: `target` {tuple(target.shape)} must be (B,) for probs {tuple(probs.shape)}.")


class MulticlassNLL(torchmetrics.Metric):
    """Mean negative log-likelihood ``-log p_y`` of predicted class probabilities.

    Args:
        eps: probabilities are clamped to ``>= eps`` before the log (a confident
            wrong prediction costs ``-log eps`` instead of ``inf``).

    .. code-block:: python

        nll = MulticlassNLL()
        nll.update(torch.tensor([[0.5, 0.5]]), torch.tensor([0]))
        nll.compute()   # log 2
    """

    higher_is_better = False
    full_state_update = False

    def __init__(self, eps: float = 1e-12, **kwargs) -> None:
        super().__init__(**kwargs)
        self.eps = eps
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, probs: Tensor, target: Tensor) -> None:
        _check_probs(probs, target, "MulticlassNLL")
        p = probs.gather(1, target.long()[:, None]).squeeze(1)
        self.total += -p.clamp_min(self.eps).log().double().sum()
        self.count += target.numel()

    def compute(self) -> Tensor:
        return (self.total / self.count.clamp_min(1)).float()


class MulticlassBrierScore(torchmetrics.Metric):
    """Mean multiclass Brier score ``sum_c (p_c - 1[y = c])^2`` (range 0..2).

    .. code-block:: python

        brier = MulticlassBrierScore()
        brier.update(torch.tensor([[0.5, 0.5]]), torch.tensor([0]))
        brier.compute()   # 0.5
    """

    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, probs: Tensor, target: Tensor) -> None:
        _check_probs(probs, target, "MulticlassBrierScore")
        onehot = torch.nn.functional.one_hot(target.long(), probs.shape[1]).to(probs.dtype)
        self.total += ((probs - onehot) ** 2).sum().double()
        self.count += target.numel()

    def compute(self) -> Tensor:
        return (self.total / self.count.clamp_min(1)).float()


def ood_score(probs: Tensor, kind: str = "max_prob") -> Tensor:
    """Per-sample OOD score (higher = more likely out of distribution).

    ``"max_prob"``: ``1 - max_c p_c``; ``"entropy"``: the predictive entropy.
    """
    _check_probs(probs, None, "ood_score")
    if kind == "max_prob":
        return 1.0 - probs.max(dim=-1).values
    if kind == "entropy":
        return -(probs * probs.clamp_min(1e-12).log()).sum(-1)
    raise ValueError(f"ood_score: `kind`={kind!r}, expected 'max_prob' or 'entropy'.")


class OODAUROC(torchmetrics.classification.BinaryAUROC):
    """AUROC of separating OOD (positive) from in-distribution samples by :func:`ood_score`.

    Args:
        score: ``"max_prob"`` or ``"entropy"``.

    .. code-block:: python

        auroc = OODAUROC()
        auroc.update(probs_in, ood=False)
        auroc.update(probs_out, ood=True)
        auroc.compute()
    """

    def __init__(self, score: str = "max_prob", **kwargs) -> None:
        super().__init__(**kwargs)
        ood_score(torch.full((1, 2), 0.5), score)  # validates `score` now, not at the first update
        self.score_kind = score

    def update(self, probs: Tensor, ood: bool | Tensor) -> None:  # type: ignore[override]
        scores = ood_score(probs, self.score_kind)
        target = torch.as_tensor(ood, device=scores.device).to(torch.long).expand(scores.shape[0])
        super().update(scores, target)


def calibration_metrics(num_classes: int) -> torchmetrics.MetricCollection:
    """Accuracy, ECE (15 bins, l1), NLL and Brier over predicted probabilities ``(B, C)`` and labels ``(B,)``."""
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"calibration_metrics: `num_classes`={num_classes!r}, expected an integer >= 2.")
    return torchmetrics.MetricCollection({
        "acc": torchmetrics.Accuracy(task="multiclass", num_classes=num_classes),
        "ece": torchmetrics.CalibrationError(task="multiclass", num_classes=num_classes, n_bins=15, norm="l1"),
        "nll": MulticlassNLL(),
        "brier": MulticlassBrierScore(),
    })


def fit_temperature(logits: Tensor, target: Tensor, max_iter: int = 100) -> float:
    """Temperature scaling (Guo et al. 2017): the ``T > 0`` minimising the NLL of ``softmax(logits / T)``.

    Fit on a held-out (validation) split; ``T`` is optimised in log space by L-BFGS, so it stays positive.

    .. code-block:: python

        t = fit_temperature(val_logits, val_y)
        probs = (test_logits / t).softmax(-1)
    """
    _check_probs(logits, target, "fit_temperature")
    logits, target = logits.detach().double(), target.long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / log_t.exp(), target)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp())
