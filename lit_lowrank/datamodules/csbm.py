"""The contextual stochastic block model (cSBM): graphs with a chosen homophily.

Deshpande, Sen, Montanari & Mossel, "Contextual Stochastic Block Models" (NeurIPS
2018), parametrised as in GPRGNN (Chien et al., ICLR 2021) so one number,
``phi`` in [-1, 1], moves the graph from heterophilous to homophilous while the
total signal (graph + features) stays fixed by ``epsilon``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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
    same = torch.tensor([[p_in, p_out], [p_out, p_in]])
    edge_index = _sample_edges(lambda i: same[(v[i, None] < 0).long(), (v[None, :] < 0).long()], n, gen)
    x = _features(v, torch.full((n,), mu), num_features, gen)
    y = (v > 0).long()
    return Data(x=x, edge_index=edge_index, y=y, phi=float(phi))


def mixed_csbm(
    num_nodes: int = 1000,
    num_features: int = 100,
    phis: tuple[float, ...] = (-0.75, 0.75),
    avg_degree: float = 5.0,
    epsilon: float = 3.25,
    cross_fraction: float = 0.2,
    seed: int = 0,
) -> Data:
    """A cSBM whose homophily varies across nodes: one cSBM regime per entry of ``phis``.

    Nodes are split evenly (and class-balanced) into ``len(phis)`` regimes. Within regime
    ``r`` edges follow a cSBM with angle ``phis[r]`` and expected degree
    ``(1 - cross_fraction) · avg_degree``; across regimes, edges ignore labels (expected
    degree ``cross_fraction · avg_degree``). Features follow each node's regime
    (``mu`` of :func:`csbm_parameters` for its ``phi``). With ``phis = (-0.75, 0.75)`` half
    the nodes live in a heterophilous and half in a homophilous neighbourhood, so a filter
    shared by every node must compromise and per-node routing has something to use — the
    regime is not in the features, only in the neighbourhood.

    Returns:
        ``Data(x, edge_index, y, regime (n,) long)``.

    Example:
        .. code-block:: python

            data = mixed_csbm(num_nodes=600, phis=(-0.75, 0.75), seed=0)
            local_homophily(data.edge_index, data.y)[data.regime == 0].mean()   # about 0.1
    """
    if not phis:
        raise ValueError("`phis`: expected at least one regime angle.")
    if not 0.0 <= cross_fraction < 1.0:
        raise ValueError(f"`cross_fraction`={cross_fraction!r}: expected a fraction in [0, 1).")
    n, regimes = num_nodes, len(phis)
    gen = torch.Generator().manual_seed(seed)
    v = torch.ones(n)
    v[n // 2 :] = -1.0
    # regimes class-balanced: alternate regimes within each class, then shuffle nodes
    regime = torch.cat([torch.arange(n // 2) % regimes, torch.arange(n - n // 2) % regimes])
    perm = torch.randperm(n, generator=gen)
    v, regime = v[perm], regime[perm]
    size = torch.bincount(regime, minlength=regimes).float()
    d_in, d_cross = (1 - cross_fraction) * avg_degree, cross_fraction * avg_degree
    p_same = torch.zeros(regimes, 2)  # [regime, same label?] within-regime probabilities
    mu = torch.zeros(n)
    for r, phi in enumerate(phis):
        lam, mu_r = csbm_parameters(phi, num_nodes, num_features, epsilon)
        p_in, p_out = (d_in + lam * math.sqrt(d_in)) / size[r], (d_in - lam * math.sqrt(d_in)) / size[r]
        if not (0 <= p_in <= 1 and 0 <= p_out <= 1):
            raise ValueError(f"phis[{r}]={phi}: edge probabilities ({p_in:.4f}, {p_out:.4f}) leave [0, 1]; "
                             "lower |phi| or raise avg_degree.")
        p_same[r] = torch.tensor([p_out, p_in])
        mu[regime == r] = mu_r
    p_cross = d_cross / max(float(n - size.max()), 1.0)

    def prob(i: Tensor) -> Tensor:
        same_regime = regime[i, None] == regime[None, :]
        within = p_same[regime[i]][:, None, :].expand(-1, n, -1)
        same_label = (v[i, None] == v[None, :]).long()
        p = within.gather(2, same_label[..., None])[..., 0]
        return torch.where(same_regime, p, torch.tensor(p_cross))

    edge_index = _sample_edges(prob, n, gen)
    x = _features(v, mu, num_features, gen)
    return Data(x=x, edge_index=edge_index, y=(v > 0).long(), regime=regime, phis=tuple(phis))


def regime_sbm(
    num_nodes: int = 900,
    num_features: int = 100,
    num_classes: int = 3,
    homophily: tuple[float, ...] = (0.05, 0.9),
    avg_degree: float = 6.0,
    feature_snr: float = 1.5,
    cross_fraction: float = 0.1,
    seed: int = 0,
) -> Data:
    """A ``num_classes``-class SBM whose regions need different *operators*: one region per ``homophily``.

    Nodes are split evenly (class-balanced) into ``len(homophily)`` regions. Inside region ``r`` a
    node's expected within-region degree is ``(1 - cross_fraction) · avg_degree``, a share
    ``homophily[r]`` of it to its own class and the rest spread evenly over the other classes;
    across regions edges ignore labels. Features are ``x_i = (feature_snr / √2) · u_{y_i} + Z_i``
    (scaled by ``1/√f``) with random unit class centroids ``u_c`` shared by every region and
    ``Z_i ~ N(0, I)``: two classes' feature clouds lie ``feature_snr`` noise standard deviations
    apart, and the region is not in the features.

    With three or more classes the heterophilous region's label signal sits at ``λ ≈ −1/(C−1)`` of
    ``Â``, not at ``−1``: ``Â²`` no longer makes it low-pass (as it does for the two-class ``±φ``
    mixture of :func:`mixed_csbm`), so one polynomial filter cannot serve the low-pass region and the
    high-pass one together and routing by region has room.

    Returns:
        ``Data(x, edge_index, y, regime (n,) long)``.

    Example:
        .. code-block:: python

            data = regime_sbm(900, homophily=(0.05, 0.9), seed=0)
            local_homophily(data.edge_index, data.y)[data.regime == 0].mean()   # about 0.1
    """
    if not homophily or not all(0.0 <= h <= 1.0 for h in homophily):
        raise ValueError(f"`homophily`={homophily!r}: expected one or more fractions in [0, 1].")
    if num_classes < 2:
        raise ValueError(f"`num_classes`={num_classes}: expected >= 2.")
    if not 0.0 <= cross_fraction < 1.0:
        raise ValueError(f"`cross_fraction`={cross_fraction!r}: expected a fraction in [0, 1).")
    n, regimes, C = num_nodes, len(homophily), num_classes
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % C
    regime = torch.cat([torch.arange((y == c).sum()) % regimes for c in range(C)])[torch.argsort(y, stable=True).argsort()]
    perm = torch.randperm(n, generator=gen)
    y, regime = y[perm], regime[perm]
    d_in, d_cross = (1 - cross_fraction) * avg_degree, cross_fraction * avg_degree
    size = torch.bincount(regime, minlength=regimes).float()
    p_same = torch.zeros(regimes, 2)  # [regime, same label?]
    for r, h in enumerate(homophily):
        p_in, p_out = d_in * h / (size[r] / C), d_in * (1 - h) / (size[r] * (C - 1) / C)
        if p_in > 1 or p_out > 1:
            raise ValueError(f"homophily[{r}]={h}: edge probabilities ({p_in:.3f}, {p_out:.3f}) exceed 1; "
                             "use more nodes or a lower avg_degree.")
        p_same[r] = torch.tensor([p_out, p_in])
    p_cross = d_cross / max(float(n - size.max()), 1.0)

    def prob(i: Tensor) -> Tensor:
        same_regime = regime[i, None] == regime[None, :]
        same_label = (y[i, None] == y[None, :]).long()
        p = p_same[regime[i]][:, None, :].expand(-1, n, -1).gather(2, same_label[..., None])[..., 0]
        return torch.where(same_regime, p, torch.tensor(p_cross))

    edge_index = _sample_edges(prob, n, gen)
    centroids = torch.nn.functional.normalize(torch.randn(C, num_features, generator=gen), dim=1)
    x = (feature_snr / math.sqrt(2) * centroids[y] + torch.randn(n, num_features, generator=gen)) / math.sqrt(num_features)
    return Data(x=x, edge_index=edge_index, y=y, regime=regime, homophily=tuple(homophily))


def periphery_sbm(
    num_nodes: int = 600,
    num_features: int = 100,
    num_classes: int = 2,
    periphery_fraction: float = 1 / 3,
    periphery_degree: float = 3.0,
    core_degree: float = 6.0,
    core_homophily: float = 0.9,
    feature_snr: float = 1.5,
    seed: int = 0,
) -> Data:
    """A homophilous core with a heterophilous periphery: two regions that need opposite *operators*.

    A class-balanced share ``periphery_fraction`` of the nodes is the periphery (``regime`` 0), the rest the
    core (``regime`` 1). A core node has ``core_degree`` expected edges inside the core, a share
    ``core_homophily`` of them to its own class (the rest spread over the other classes); a periphery node has
    ``periphery_degree`` expected edges, **every one to a core node of another class**, and none inside the
    periphery. Features are those of :func:`regime_sbm` (``feature_snr`` noise standard deviations between
    two class centroids, the same in both regions: the region is not in the features).

    Why no global filter serves both regions: a periphery node's neighbours are core nodes of other classes,
    and their neighbours are mostly core nodes of those same classes, so every power ``Âᵏ`` (``k ≥ 1``) reads
    the *other* classes at a periphery node and the node's own class at a core node. With two classes the
    label vector with its sign flipped on the periphery is smooth on the graph, so a polynomial ``g(Â)``
    recovers that flipped vector — wrong on every periphery node — while a per-node operator (low-pass in the
    core, high-pass ``I − Â`` in the periphery) reads both regions right. Unlike the two-class ``±φ``
    mixture of :func:`mixed_csbm`, ``Â²`` does not rescue the heterophilous region here: its two-hop paths
    run through the homophilous core.

    Returns:
        ``Data(x, edge_index, y, regime (n,) long)``.

    Example:
        .. code-block:: python

            data = periphery_sbm(600, seed=0)
            local_homophily(data.edge_index, data.y)[data.regime == 0].mean()   # 0: all edges to other classes
    """
    if num_classes < 2:
        raise ValueError(f"`num_classes`={num_classes}: expected >= 2.")
    if not 0.0 < periphery_fraction < 1.0:
        raise ValueError(f"`periphery_fraction`={periphery_fraction!r}: expected a fraction in (0, 1).")
    if not 0.0 <= core_homophily <= 1.0:
        raise ValueError(f"`core_homophily`={core_homophily!r}: expected a fraction in [0, 1].")
    if periphery_degree < 0 or core_degree < 0:
        raise ValueError(f"`periphery_degree`={periphery_degree!r}, `core_degree`={core_degree!r}: expected >= 0.")
    n, C = num_nodes, num_classes
    gen = torch.Generator().manual_seed(seed)
    n_periphery = round(n * periphery_fraction)
    n_core = n - n_periphery
    if n_periphery < C or n_core < C:
        raise ValueError(f"`num_nodes`={n}, `periphery_fraction`={periphery_fraction!r}: each region needs at least "
                         f"`num_classes`={C} nodes.")
    y = torch.arange(n) % C  # class-interleaved: the first n_periphery nodes are class-balanced
    regime = (torch.arange(n) >= n_periphery).long()
    perm = torch.randperm(n, generator=gen)
    y, regime = y[perm], regime[perm]
    p_pc = periphery_degree / (n_core * (C - 1) / C)             # periphery -> core node of another class
    p_in = core_degree * core_homophily / (n_core / C)           # core -> core, same class
    p_out = core_degree * (1 - core_homophily) / (n_core * (C - 1) / C)
    for name, p in (("periphery_degree", p_pc), ("core_degree", max(p_in, p_out))):
        if p > 1:
            raise ValueError(f"`{name}`: an edge probability ({p:.3f}) exceeds 1; use more nodes or a lower degree.")

    def prob(i: Tensor) -> Tensor:
        core_i, core_j = regime[i, None] == 1, regime[None, :] == 1
        same = y[i, None] == y[None, :]
        core = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
        return torch.where(core_i & core_j, core,
                           torch.where((core_i != core_j) & ~same, torch.tensor(p_pc), torch.tensor(0.0)))

    edge_index = _sample_edges(prob, n, gen)
    centroids = torch.nn.functional.normalize(torch.randn(C, num_features, generator=gen), dim=1)
    x = (feature_snr / math.sqrt(2) * centroids[y] + torch.randn(n, num_features, generator=gen)) / math.sqrt(num_features)
    return Data(x=x, edge_index=edge_index, y=y, regime=regime, core_homophily=float(core_homophily))


def _sample_edges(prob: Callable[[Tensor], Tensor], n: int, gen: torch.Generator) -> Tensor:
    """Undirected edges from upper-triangular Bernoulli draws with ``prob(rows) -> (len(rows), n)``,
    a block of rows at a time to bound memory."""
    rows, cols = [], []
    block = max(1, 2**22 // n)
    for first in range(0, n, block):
        i = torch.arange(first, min(first + block, n))
        upper = torch.arange(n)[None, :] > i[:, None]
        hit = (torch.rand((i.numel(), n), generator=gen) < prob(i)) & upper
        r, c = torch.nonzero(hit, as_tuple=True)
        rows.append(i[r])
        cols.append(c)
    return to_undirected(torch.stack([torch.cat(rows), torch.cat(cols)]), num_nodes=n)


def _features(v: Tensor, mu: Tensor, num_features: int, gen: torch.Generator) -> Tensor:
    """``x_i = sqrt(mu_i / n) v_i u + Z_i / sqrt(f)`` with a shared ``u ~ N(0, I/f)``."""
    n, f = v.numel(), num_features
    u = torch.randn(f, generator=gen) / math.sqrt(f)
    z = torch.randn(n, f, generator=gen)
    return torch.sqrt(mu / n)[:, None] * v[:, None] * u[None, :] + z / math.sqrt(f)


def edge_homophily(edge_index: Tensor, y: Tensor) -> float:
    """Fraction of edges joining nodes of the same class (PyG's ``homophily(method="edge")``)."""
    return float(homophily(edge_index, y, method="edge"))
