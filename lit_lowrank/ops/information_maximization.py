"""Source-free adaptation losses of SHOT (Liang et al., ICML 2020): information
maximisation and centroid pseudo-labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def information_maximization_loss(logits: Tensor, eps: float = 1e-5) -> Tensor:
    """SHOT's IM loss: mean per-sample entropy minus the entropy of the mean prediction.

    Low when each prediction is confident (first term) and the batch uses every
    class (diversity, second term). ``logits``: ``(N, C)``.
    """
    p = logits.softmax(-1)
    entropy = -(p * (p + eps).log()).sum(-1).mean()
    p_mean = p.mean(0)
    diversity = -(p_mean * (p_mean + eps).log()).sum()
    return entropy - diversity


@torch.no_grad()
def centroid_pseudo_labels(features: Tensor, logits: Tensor, iterations: int = 1) -> Tensor:
    """SHOT's self-supervised pseudo-labels ``(N,)``: class centroids weighted by the
    softmax, labels by the nearest centroid (cosine), refined ``iterations`` times
    with hard assignments. ``features``: ``(N, D)``; ``logits``: ``(N, C)``.
    """
    f = F.normalize(features.float(), dim=1)
    weights = logits.float().softmax(-1)
    centroids = weights.T @ f / weights.sum(0)[:, None].clamp_min(1e-8)
    labels = (f @ F.normalize(centroids, dim=1).T).argmax(1)
    for _ in range(iterations):
        onehot = F.one_hot(labels, logits.shape[1]).float()
        centroids = onehot.T @ f / onehot.sum(0)[:, None].clamp_min(1e-8)
        labels = (f @ F.normalize(centroids, dim=1).T).argmax(1)
    return labels
