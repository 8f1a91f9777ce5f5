"""The contextual stochastic block model (cSBM): graphs with a chosen homophily.

Deshpande, Sen, Montanari & Mossel, "Contextual Stochastic Block Models" (NeurIPS
2018), parametrised as in GPRGNN (Chien et al., ICLR 2021) so one number,
``phi`` in [-1, 1], moves the graph from heterophilous to homophilous while the
total signal (graph + features) stays fixed by ``epsilon``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import homophily, to_undirected


def csbm_parameters(phi: float, num_nodes: int, num_features: int, epsilon: float) -> tuple[float, float]:
    """``(lambda, mu)`` for a cSBM with angle ``phi``: graph signal and feature signal.

    ``xi = n / f``; ``lambda = sqrt(1 + eps) sin(phi pi / 2)``;
    ``mu = sqrt(xi (1 + eps)) cos(phi pi / 2)``, so ``lambda^2 + mu^2 / xi = 1 + eps``.
    """
    if not -1.0 <= phi <= 1.0:
        raise ValueError(f"phi: expected a value in [-1, 1] (-1 heterophilous, 1 homophilous), got {phi}")
    xi = num_nodes / num_features
    lam = math.sqrt(1.0 + epsilon) * math.sin(phi * math.pi / 2)
    mu = math.sqrt(xi * (1.0 + epsilon)) * math.cos(phi * math.pi / 2)
    return lam, mu


def contextual_sbm(
    num_nodes: int = 1000,
    num_features: int = 100,
    phi: float = 0.0,
    avg_degree: float = 5.0,
    epsilon: float = 3.25,
    seed: int = 0,
) -> Data:
    """Sample a two-class contextual SBM graph (the GPRGNN synthetic benchmark).

    Nodes get balanced labels ``v_i`` in {-1, +1} (stored as ``y`` in {0, 1}, randomly
    placed). With ``d = avg_degree`` and :func:`csbm_parameters`:

    - edge ``{i, j}`` (undirected, no self loops) appears with probability
      ``(d + lambda sqrt(d)) / n`` if ``v_i = v_j`` and ``(d - lambda sqrt(d)) / n``
      otherwise, so the expected edge homophily is ``1/2 + lambda / (2 sqrt(d))``;
    - features ``x_i = sqrt(mu / n) v_i u + Z_i / sqrt(f)`` with a shared
      ``u ~ N(0, I / f)`` and ``Z_i ~ N(0, I)``.

    ``phi = 1``: graph only, homophilous; ``phi = 0``: features only;
    ``phi = -1``: graph only, heterophilous. ``phi = (2 / pi) arctan(lambda sqrt(xi) / mu)``.
    GPRGNN used ``n=5000, f=2000, d=5, epsilon=3.25``.

    Returns:
        ``Data(x (n, f) float, edge_index (2, E) long, y (n,) long)`` with both
        directions of every edge (sorted); ``data.phi`` records the angle.

    Example:
        .. code-block:: python

            data = contextual_sbm(num_nodes=1000, phi=-0.5, seed=0)
            edge_homophily(data.edge_index, data.y)  # about 0.5 - 0.46 * sin(pi / 4)
    """
    lam, mu = csbm_parameters(phi, num_nodes, num_features, epsilon)
    d, n = avg_degree, num_nodes
    p_in, p_out = (d + lam * math.sqrt(d)) / n, (d - lam * math.sqrt(d)) / n
    for name, p in (("within-class", p_in), ("across-class", p_out)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(
                f"avg_degree/epsilon: the {name} edge probability {p:.4f} is outside [0, 1] "
                f"(need lambda <= sqrt(avg_degree); lambda={lam:.3f}, avg_degree={d})"
            )
    gen = torch.Generator().manual_seed(seed)
    v = torch.ones(n)
    v[n // 2 :] = -1.0
    v = v[torch.randperm(n, generator=gen)]

    # Upper-triangular Bernoulli draws, a block of rows at a time to bound memory.
    rows, cols = [], []
    block = max(1, 2**22 // n)
    for first in range(0, n, block):
        i = torch.arange(first, min(first + block, n))
        same = v[i, None] == v[None, :]
        prob = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
        upper = torch.arange(n)[None, :] > i[:, None]
        hit = (torch.rand(prob.shape, generator=gen) < prob) & upper
        r, c = torch.nonzero(hit, as_tuple=True)
        rows.append(i[r])
        cols.append(c)
    edge_index = to_undirected(torch.stack([torch.cat(rows), torch.cat(cols)]), num_nodes=n)

    f = num_features
    u = torch.randn(f, generator=gen) / math.sqrt(f)
    z = torch.randn(n, f, generator=gen)
    x = math.sqrt(mu / n) * v[:, None] * u[None, :] + z / math.sqrt(f)
    y = (v > 0).long()
    return Data(x=x, edge_index=edge_index, y=y, phi=float(phi))


def edge_homophily(edge_index: Tensor, y: Tensor) -> float:
    """Fraction of edges joining nodes of the same class (PyG's ``homophily(method="edge")``)."""
    return float(homophily(edge_index, y, method="edge"))
