"""Class moments and Normal-Inverse-Wishart MAP shrinkage (METHODS.md §5, steps 2 and 4).

Clients summarise each class by its moments ``(n_c, Σz, Σzzᵀ)``; summed over clients (by
secure aggregation) these give the global mean and covariance of every base class. For
a novel class with ``n`` shots of mean ``x̄`` and scatter ``S = Σ(x−x̄)(x−x̄)ᵀ`` and a prior
``(μ₀, Σ₀)`` retrieved from the bank, the NIW posterior mode is

    μ̂ = (n x̄ + κ μ₀) / (n + κ)
    Ψₙ = Ψ₀ + S + κn/(κ+n) (x̄ − μ₀)(x̄ − μ₀)ᵀ,    Ψ₀ = (ν₀ − d − 1) Σ₀
    Σ̂ = Ψₙ / (ν₀ + n + d + 1)

(``ν₀ > d + 1`` so that the prior's mean covariance is ``Σ₀``).

.. code-block:: python

    from lit_lowrank.ops.fed_lowshot.niw import class_moments, moments_to_gaussian, niw_map

    count, total, second = class_moments(features, labels, num_classes=10)
    means, covs = moments_to_gaussian(count, total, second)
    mu, sigma = niw_map(support, mu0=means[3], sigma0=covs[3], kappa=1.0, nu0=feature_dim + 3.0)
"""

from __future__ import annotations

import torch
from torch import Tensor


def class_moments(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-class count, sum and second moment ``(n_c, Σz, Σzzᵀ)`` of ``(N, d)`` features.

    Args:
        features: ``(N, d)`` feature rows.
        labels: ``(N,)`` integer labels in ``[0, num_classes)``.
        num_classes: number of classes ``C``.

    Returns:
        ``counts (C,)``, ``sums (C, d)``, ``second (C, d, d)`` in float64 (moments are summed
        across clients, so they are kept at full precision).

    .. code-block:: python

        counts, sums, second = class_moments(torch.randn(100, 4), torch.randint(0, 3, (100,)), 3)
    """
    if features.ndim != 2 or labels.shape != features.shape[:1]:
        raise ValueError(f"class_moments: features must be (N, d) and labels (N,), got {tuple(features.shape)} "
                         f"and {tuple(labels.shape)}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"class_moments: labels must lie in [0, {num_classes}), got range "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    z = features.detach().to(torch.float64)
    onehot = torch.nn.functional.one_hot(labels.long(), num_classes).to(torch.float64)  # (N, C)
    counts = onehot.sum(0)
    sums = onehot.T @ z
    second = torch.einsum("nc,ni,nj->cij", onehot, z, z)
    return counts, sums, second


def moments_to_gaussian(
    counts: Tensor, sums: Tensor, second: Tensor, ridge: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Means and (maximum-likelihood) covariances from summed moments.

    ``μ = Σz / n``; ``Σ = Σzzᵀ / n − μμᵀ`` plus ``ridge·I`` (keeps a one-sample class
    positive definite). Classes with ``n = 0`` get ``μ = 0`` and ``Σ = ridge·I``.

    .. code-block:: python

        means, covs = moments_to_gaussian(*class_moments(z, y, num_classes=5))
    """
    n = counts.to(torch.float64).clamp(min=1.0)
    mu = sums / n[:, None]
    cov = second / n[:, None, None] - torch.einsum("ci,cj->cij", mu, mu)
    cov = 0.5 * (cov + cov.transpose(1, 2))
    eye = torch.eye(sums.shape[1], dtype=cov.dtype, device=cov.device)
    return mu, cov + ridge * eye


def niw_map(
    support: Tensor, mu0: Tensor, sigma0: Tensor, kappa: float = 1.0, nu0: float | None = None
) -> tuple[Tensor, Tensor]:
    """NIW posterior mode ``(μ̂, Σ̂)`` of one class from its ``(n, d)`` support features.

    Args:
        support: ``(n, d)`` shots of the class (``n ≥ 1``).
        mu0: ``(d,)`` prior mean.
        sigma0: ``(d, d)`` prior covariance (the mean of the Inverse-Wishart prior).
        kappa: prior pseudo-count on the mean (``> 0``; larger = more shrinkage to ``μ₀``).
        nu0: prior degrees of freedom (``> d + 1``); ``None`` uses ``d + 2 + n_eff`` with
            ``n_eff = 4``: the prior covariance counts as four extra shots.

    Returns:
        ``(d,)`` mean and ``(d, d)`` covariance in float64.

    .. code-block:: python

        mu, sigma = niw_map(torch.randn(1, 8), torch.zeros(8), torch.eye(8), kappa=2.0)
    """
    if support.ndim != 2 or support.shape[0] < 1:
        raise ValueError(f"niw_map: `support` must be (n >= 1, d), got {tuple(support.shape)}")
    n, d = support.shape
    if mu0.shape != (d,) or sigma0.shape != (d, d):
        raise ValueError(f"niw_map: mu0 {tuple(mu0.shape)} / sigma0 {tuple(sigma0.shape)} must be ({d},) / ({d}, {d})")
    if kappa <= 0:
        raise ValueError(f"niw_map: `kappa`={kappa!r}, expected > 0")
    nu0 = float(d + 2 + 4) if nu0 is None else float(nu0)
    if nu0 <= d + 1:
        raise ValueError(f"niw_map: `nu0`={nu0!r}, expected > d + 1 = {d + 1}")
    x = support.to(torch.float64)
    mu0 = mu0.to(torch.float64)
    xbar = x.mean(0)
    centred = x - xbar
    scatter = centred.T @ centred
    diff = (xbar - mu0)[:, None]
    psi_n = (nu0 - d - 1) * sigma0.to(torch.float64) + scatter + (kappa * n / (kappa + n)) * (diff @ diff.T)
    mu_hat = (n * xbar + kappa * mu0) / (n + kappa)
    sigma_hat = psi_n / (nu0 + n + d + 1)
    return mu_hat, 0.5 * (sigma_hat + sigma_hat.T)
