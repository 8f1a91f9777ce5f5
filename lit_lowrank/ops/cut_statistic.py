"""The cut edge weight statistic (Zighed, Lallich & Muhlenbach 2005) on a kNN graph.

A labelling that agrees with the geometry of the features cuts few edges of a
neighbourhood graph. Under the null hypothesis (labels drawn independently with
the observed proportions π) the weight of cut edges has a known mean and variance,
so its z-score measures agreement without any ground truth: strongly negative z =
far fewer cut edges than chance = a reliable labelling.

Local (per sample i with label ŷ_i, neighbour weights w_ij, W_i = Σ_j w_ij)::

    J_i = Σ_j w_ij 1[ŷ_j ≠ ŷ_i]
    E_i = (1 − π_{ŷ_i}) W_i
    V_i = π_{ŷ_i} (1 − π_{ŷ_i}) Σ_j w_ij²
    z_i = (J_i − E_i) / √V_i

Global (each undirected edge once, q = 1 − Σ_r π_r²)::

    J   = Σ_{i<j} w_ij 1[ŷ_i ≠ ŷ_j],   E = q Σ_{i<j} w_ij
    Var = q(1 − q) Σ w² + (Σ_r π_r(1 − π_r)² − q²)(Σ_i W_i² − 2 Σ w²)
    z   = (J − E) / √Var

(the second variance term is the covariance of two edges that share a vertex).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class CutStatistic:
    """Result of :func:`cut_statistic`.

    Attributes:
        z: ``(N,)`` local z-scores (0 where a sample's variance is 0).
        cut: ``(N,)`` local cut weights J_i.
        expected: ``(N,)`` their expectations E_i.
        z_global: global z-score of the whole labelling.
    """

    z: Tensor
    cut: Tensor
    expected: Tensor
    z_global: Tensor


def knn_graph(features: Tensor, k: int, weighting: Literal["binary", "cosine"] = "binary") -> Tensor:
    """Symmetric kNN adjacency ``(N, N)`` from cosine similarity of ``features`` ``(N, D)``.

    An edge joins i and j when either is among the other's ``k`` nearest neighbours
    (no self loops). ``weighting="binary"`` gives weight 1; ``"cosine"`` the
    similarity clipped at 0.
    """
    if features.dim() != 2:
        raise ValueError(f"`features` must be (N, D), got shape {tuple(features.shape)}.")
    n = features.shape[0]
    if not 1 <= k < n:
        raise ValueError(f"`k`={k} must be in [1, N-1] = [1, {n - 1}] for N={n} samples.")
    if weighting not in ("binary", "cosine"):
        raise ValueError(f"`weighting`={weighting!r}, expected 'binary' or 'cosine'.")
    f = F.normalize(features.float(), dim=1)
    sim = f @ f.T
    sim.fill_diagonal_(-float("inf"))
    idx = sim.topk(k, dim=1).indices
    adj = torch.zeros(n, n, device=features.device)
    adj.scatter_(1, idx, 1.0)
    adj = torch.maximum(adj, adj.T)
    if weighting == "cosine":
        adj = adj * sim.clamp_min(0).nan_to_num(posinf=0.0, neginf=0.0)
    return adj


def cut_statistic(
    features: Tensor | None,
    labels: Tensor,
    k: int = 10,
    num_classes: int | None = None,
    weights: Tensor | None = None,
    weighting: Literal["binary", "cosine"] = "binary",
) -> CutStatistic:
    """Local and global cut edge weight z-scores of ``labels`` on a kNN graph.

    Args:
        features: ``(N, D)`` features the graph is built on (ignored when ``weights``
            is given).
        labels: ``(N,)`` integer labels (predicted or true).
        k: neighbours per sample.
        num_classes: number of classes (default ``labels.max() + 1``).
        weights: a precomputed symmetric ``(N, N)`` weight matrix with zero diagonal,
            so several labellings can be scored on the same graph.
        weighting: edge weights of the kNN graph, see :func:`knn_graph`.

    .. code-block:: python

        stat = cut_statistic(features, logits.argmax(-1), k=10)
        reliable = stat.z < -2.0          # labels agree with the neighbourhood
    """
    if labels.dim() != 1:
        raise ValueError(f"`labels` must be (N,), got shape {tuple(labels.shape)}.")
    if weights is None:
        if features is None:
            raise ValueError("Pass `features` (to build the kNN graph) or a precomputed `weights` matrix.")
        if features.shape[0] != labels.shape[0]:
            raise ValueError(f"`features` has {features.shape[0]} rows but `labels` has {labels.shape[0]}.")
        weights = knn_graph(features, k, weighting)
    elif weights.shape != (labels.shape[0], labels.shape[0]):
        raise ValueError(f"`weights` must be (N, N) = {(labels.shape[0],) * 2}, got {tuple(weights.shape)}.")
    w = weights.float()
    labels = labels.long()
    c = int(labels.max()) + 1 if num_classes is None else num_classes
    pi = torch.bincount(labels, minlength=c).float() / labels.numel()
    differ = (labels[:, None] != labels[None, :]).float()
    cut = (w * differ).sum(1)
    degree = w.sum(1)
    pi_i = pi[labels]
    expected = (1 - pi_i) * degree
    var = pi_i * (1 - pi_i) * (w * w).sum(1)
    z = torch.where(var > 0, (cut - expected) / var.clamp_min(1e-12).sqrt(), torch.zeros_like(cut))

    # global: every undirected edge once
    sum_w = w.sum() / 2
    sum_w2 = (w * w).sum() / 2
    q = 1 - (pi * pi).sum()
    cut_total = (w * differ).sum() / 2
    cov_term = (pi * (1 - pi) ** 2).sum() - q * q
    var_total = q * (1 - q) * sum_w2 + cov_term * ((degree * degree).sum() - 2 * sum_w2)
    z_global = (cut_total - q * sum_w) / var_total.clamp_min(1e-12).sqrt()
    return CutStatistic(z=z, cut=cut, expected=expected, z_global=z_global)
