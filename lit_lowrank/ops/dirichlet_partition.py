"""Dirichlet non-IID partitioning of labelled rows over clients (METHODS.md §5).

For every class ``c`` a proportion vector ``p_c ~ Dir(α·1_K)`` over ``K`` clients splits that
class's rows; small ``α`` gives each client few classes (high skew), large ``α`` tends to IID.
A draw is repeated (up to ``max_tries``) until every client holds ``min_size`` rows.

.. code-block:: python

    from lit_lowrank.ops.dirichlet_partition import dirichlet_partition, partition_statistics

    parts = dirichlet_partition(labels, num_clients=8, alpha=0.3, seed=0)
    stats = partition_statistics(labels, parts)     # histogram, mean TV distance to the global mix
"""

from __future__ import annotations

import numpy as np


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int = 0, min_size: int = 10, max_tries: int = 100
) -> list[np.ndarray]:
    """Split row indices over ``num_clients`` with per-class Dirichlet(``alpha``) proportions.

    Args:
        labels: ``(N,)`` integer labels.
        num_clients: ``K ≥ 1``.
        alpha: Dirichlet concentration (``> 0``).
        seed: random seed.
        min_size: each client needs at least this many rows (redraw otherwise).
        max_tries: redraws before giving up.

    Returns:
        ``K`` sorted index arrays that partition ``range(N)``.

    .. code-block:: python

        parts = dirichlet_partition(np.repeat(np.arange(5), 100), num_clients=4, alpha=0.5)
    """
    labels = np.asarray(labels)
    if num_clients < 1:
        raise ValueError(f"dirichlet_partition: `num_clients`={num_clients!r}, expected >= 1")
    if alpha <= 0:
        raise ValueError(f"dirichlet_partition: `alpha`={alpha!r}, expected > 0")
    if num_clients * min_size > len(labels):
        raise ValueError(f"dirichlet_partition: {len(labels)} rows cannot give {num_clients} clients "
                         f"`min_size`={min_size} rows each")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_tries):
        buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            rows = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(rows)).astype(int)
            for k, part in enumerate(np.split(rows, cuts)):
                buckets[k].append(part)
        parts = [np.sort(np.concatenate(b)) for b in buckets]
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise RuntimeError(f"dirichlet_partition: no draw in {max_tries} tries gave every client {min_size} rows "
                       f"(alpha={alpha}, num_clients={num_clients}); lower `min_size` or raise `alpha`")


def partition_statistics(labels: np.ndarray, parts: list[np.ndarray]) -> dict[str, np.ndarray | float]:
    """Skew diagnostics of a partition.

    Returns:
        ``histogram`` ``(K, C)`` rows per client and class, ``sizes`` ``(K,)``,
        ``mean_tv``: mean total-variation distance between each client's class mix and the
        global one (0 = IID), ``mean_classes``: classes per client holding ≥ 1 row.

    .. code-block:: python

        partition_statistics(labels, dirichlet_partition(labels, 5, 0.1))["mean_tv"]
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    hist = np.stack([np.array([(labels[p] == c).sum() for c in classes]) for p in parts])
    global_mix = hist.sum(0) / hist.sum()
    local_mix = hist / np.maximum(hist.sum(1, keepdims=True), 1)
    tv = 0.5 * np.abs(local_mix - global_mix).sum(1)
    return {"histogram": hist, "sizes": hist.sum(1), "mean_tv": float(tv.mean()),
            "mean_classes": float((hist > 0).sum(1).mean())}
