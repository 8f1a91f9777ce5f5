"""Episodic few-shot evaluation: sampling, the episode classifiers and the F1 summary.

An ``N``-way ``K``-shot episode draws ``N`` novel classes, ``K`` support and ``Q`` query rows
of each. Classifiers on ``(d,)`` features:

- :func:`gaussian_classify`: Gaussian (QDA) log-likelihood under per-class ``(μ̂, Σ̂)``
  (the adapted distributions of the prior bank, or any prior's);
- :func:`sampled_logistic_classify`: a logistic head trained on samples drawn from the
  adapted distributions plus the support (Distribution Calibration's classifier);
- :func:`prototype_classify`: nearest support mean (ProtoNet-style baseline);
- :func:`finetuned_head_classify`: a softmax head trained on the support only (baseline).

.. code-block:: python

    from lit_lowrank.ops.fed_lowshot.episodes import sample_episode, gaussian_classify, macro_f1, mean_ci

    s_idx, s_y, q_idx, q_y, classes = sample_episode(labels, novel_classes, ways=5, shots=1, queries=15, rng=rng)
    pred = gaussian_classify(features[q_idx], means, covs)
    f1 = macro_f1(pred, q_y, num_classes=5)
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def sample_episode(
    labels: np.ndarray, classes: np.ndarray, ways: int, shots: int, queries: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row indices of one episode.

    Args:
        labels: ``(N,)`` labels of the pool.
        classes: candidate classes (each needs ``shots + queries`` rows).
        ways, shots, queries: episode shape.
        rng: numpy generator.

    Returns:
        support indices, support labels in ``[0, ways)``, query indices, query labels, the
        chosen original classes.

    .. code-block:: python

        s, sy, q, qy, chosen = sample_episode(y, np.arange(5), 5, 1, 15, np.random.default_rng(0))
    """
    labels = np.asarray(labels)
    if len(classes) < ways:
        raise ValueError(f"sample_episode: {len(classes)} candidate classes < `ways`={ways}")
    chosen = rng.choice(np.asarray(classes), size=ways, replace=False)
    s_idx, s_y, q_idx, q_y = [], [], [], []
    for j, c in enumerate(chosen):
        rows = np.flatnonzero(labels == c)
        if len(rows) < shots + queries:
            raise ValueError(f"sample_episode: class {c} has {len(rows)} rows < shots + queries = {shots + queries}")
        pick = rng.choice(rows, size=shots + queries, replace=False)
        s_idx.append(pick[:shots])
        q_idx.append(pick[shots:])
        s_y += [j] * shots
        q_y += [j] * queries
    return np.concatenate(s_idx), np.array(s_y), np.concatenate(q_idx), np.array(q_y), chosen


def gaussian_classify(query: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """Argmax of the Gaussian log-likelihood ``log N(x; μ_j, Σ_j)`` over the ``N`` classes.

    .. code-block:: python

        pred = gaussian_classify(q_feats, torch.stack(mus), torch.stack(sigmas))
    """
    x = query.to(torch.float64)
    chol = torch.linalg.cholesky(covs.to(torch.float64))  # (N, d, d)
    diff = (x[None] - means.to(torch.float64)[:, None]).transpose(1, 2)  # (N, d, Q)
    sol = torch.linalg.solve_triangular(chol, diff, upper=False)
    maha = (sol**2).sum(1)  # (N, Q)
    logdet = 2 * torch.log(torch.diagonal(chol, dim1=1, dim2=2)).sum(1)
    return torch.argmax(-0.5 * (maha + logdet[:, None]), dim=0)


def prototype_classify(query: Tensor, support: Tensor, support_y: Tensor, ways: int) -> Tensor:
    """Nearest support mean in Euclidean distance.

    .. code-block:: python

        pred = prototype_classify(q_feats, s_feats, s_y, ways=5)
    """
    protos = torch.stack([support[support_y == j].mean(0) for j in range(ways)])
    return torch.cdist(query.float(), protos.float()).argmin(1)


def _train_softmax_head(x: Tensor, y: Tensor, ways: int, steps: int, lr: float, weight_decay: float,
                        seed: int) -> tuple[Tensor, Tensor]:
    # Full-batch gradient descent with the analytic softmax-CE gradient, in numpy: episodes are tiny,
    # and autograd + torch.optim (or torch's intra-op threads on a busy machine) cost ~100x the arithmetic.
    rng = np.random.default_rng(seed)
    xn = x.detach().cpu().numpy().astype(np.float64)
    w = rng.normal(0.0, 0.01, (xn.shape[1], ways))
    b = np.zeros(ways)
    target = np.eye(ways)[y.cpu().numpy().astype(int)]
    n = xn.shape[0]
    for _ in range(steps):
        logits = xn @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        err = (p / p.sum(1, keepdims=True) - target) / n
        w -= lr * (xn.T @ err + weight_decay * w)
        b -= lr * err.sum(0)
    return torch.from_numpy(w), torch.from_numpy(b)


def finetuned_head_classify(query: Tensor, support: Tensor, support_y: Tensor, ways: int, steps: int = 100,
                            lr: float = 1.0, weight_decay: float = 1e-3, seed: int = 0) -> Tensor:
    """A linear softmax head trained on the (standardised) support features only.

    .. code-block:: python

        pred = finetuned_head_classify(q_feats, s_feats, s_y, ways=5)
    """
    mu, sd = support.mean(0), support.std(0, unbiased=False) + 1.0
    w, b = _train_softmax_head((support - mu) / sd, support_y, ways, steps, lr, weight_decay, seed)
    return (((query - mu) / sd).to(torch.float64) @ w + b).argmax(1)


def sampled_logistic_classify(query: Tensor, support: Tensor, support_y: Tensor, means: Tensor, covs: Tensor,
                              num_samples: int = 50, steps: int = 100, lr: float = 1.0, seed: int = 0) -> Tensor:
    """A softmax head trained on the support plus ``num_samples`` draws per adapted Gaussian.

    .. code-block:: python

        pred = sampled_logistic_classify(q_feats, s_feats, s_y, mus, sigmas, num_samples=50)
    """
    gen = torch.Generator().manual_seed(seed)
    ways, d = means.shape
    chol = torch.linalg.cholesky(covs.to(torch.float64)).float()
    eps = torch.randn(ways, num_samples, d, generator=gen)
    draws = means.float()[:, None] + torch.einsum("nij,nsj->nsi", chol, eps)
    x = torch.cat([support.float(), draws.reshape(-1, d)])
    y = torch.cat([support_y.long(), torch.arange(ways).repeat_interleave(num_samples)])
    mu, sd = x.mean(0), x.std(0, unbiased=False) + 1e-6
    w, b = _train_softmax_head((x - mu) / sd, y, ways, steps, lr, 1e-4, seed)
    return (((query.float() - mu) / sd).to(torch.float64) @ w + b).argmax(1)


def macro_f1(pred: Tensor | np.ndarray, target: Tensor | np.ndarray, num_classes: int) -> float:
    """Macro-averaged F1 over ``num_classes`` (a class never predicted nor present counts 0).

    .. code-block:: python

        macro_f1(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]), num_classes=2)   # 0.6667
    """
    p = np.asarray(pred).ravel()
    t = np.asarray(target).ravel()
    scores = []
    for c in range(num_classes):
        tp = float(((p == c) & (t == c)).sum())
        fp = float(((p == c) & (t != c)).sum())
        fn = float(((p != c) & (t == c)).sum())
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def mean_ci(values: list[float] | np.ndarray) -> tuple[float, float]:
    """Mean and 95% half-width ``1.96·std/√n`` (METHODS.md shared definitions).

    .. code-block:: python

        mean, half = mean_ci([0.9, 0.8, 0.85])
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("mean_ci: needs at least one value")
    half = 1.96 * float(v.std(ddof=1)) / math.sqrt(v.size) if v.size > 1 else float("nan")
    return float(v.mean()), half
