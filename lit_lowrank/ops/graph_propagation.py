"""Graph propagation primitives shared by Castor and the spectral baselines (pure torch).

- :func:`as_edge_index` accepts the three ways a graph reaches a model (``edge_index
  (2, E)``, a dense ``(N, N)`` adjacency, a ``torch.sparse`` adjacency) and returns one
  ``(edge_index, edge_weight)`` form, so sparse and dense inputs give the same result.
- :func:`normalized_adjacency` builds ``Â = D̃^(-1/2) (A + I) D̃^(-1/2)`` (or without the
  self loops, for the Laplacian-polynomial baselines) as a sparse ``(N, N)`` matrix whose
  ``(i, j)`` entry is the weight of the message ``j -> i`` (PyG's ``source_to_target``).
- :func:`local_homophily` is each node's fraction of same-label neighbours, the
  quantity Castor's router mass is reported against.

.. code-block:: python

    from lit_lowrank.ops.graph_propagation import normalized_adjacency, local_homophily

    adj = normalized_adjacency(edge_index, num_nodes=x.shape[0])   # sparse (N, N)
    smoothed = adj @ x                                             # Â X
    h = local_homophily(edge_index, y)                             # (N,), NaN on isolated nodes
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_edge_index(adjacency: Tensor, edge_weight: Tensor | None = None,
                  num_nodes: int | None = None) -> tuple[Tensor, Tensor | None, int]:
    """``(edge_index (2, E), edge_weight (E,) or None, num_nodes)`` from any adjacency form.

    Args:
        adjacency: ``edge_index`` of shape ``(2, E)`` (integer; row 0 the source, row 1
            the target), a dense ``(N, N)`` float matrix whose nonzero ``[i, j]`` is an
            edge ``i -> j`` with that weight (PyG's ``to_dense_adj`` convention), or a
            ``torch.sparse`` ``(N, N)`` matrix with the same convention.
        edge_weight: ``(E,)`` weights, only with an ``edge_index``.
        num_nodes: node count for an ``edge_index`` (defaults to ``max index + 1``).

    Raises:
        ValueError: a shape or dtype that is none of the three forms.
    """
    if adjacency.is_sparse or adjacency.layout in (torch.sparse_csr, torch.sparse_csc):
        coo = adjacency.to_sparse_coo().coalesce()
        if coo.dim() != 2 or coo.shape[0] != coo.shape[1] or edge_weight is not None:
            raise ValueError(f"adjacency: a sparse adjacency must be square (N, N) without `edge_weight`, "
                             f"got shape {tuple(coo.shape)}")
        return coo.indices(), coo.values().float(), coo.shape[0]
    if adjacency.dtype.is_floating_point or adjacency.dtype == torch.bool:
        if adjacency.dim() != 2 or adjacency.shape[0] != adjacency.shape[1] or edge_weight is not None:
            raise ValueError(f"adjacency: a dense adjacency must be square (N, N) without `edge_weight`, "
                             f"got shape {tuple(adjacency.shape)}")
        edge_index = adjacency.nonzero().T.contiguous()
        return edge_index, adjacency[edge_index[0], edge_index[1]].float(), adjacency.shape[0]
    if adjacency.dim() != 2 or adjacency.shape[0] != 2:
        raise ValueError(f"edge_index: expected an integer tensor of shape (2, E), a dense (N, N) float "
                         f"adjacency or a sparse one, got dtype {adjacency.dtype} shape {tuple(adjacency.shape)}")
    if edge_weight is not None and edge_weight.shape != (adjacency.shape[1],):
        raise ValueError(f"edge_weight: expected shape ({adjacency.shape[1]},), got {tuple(edge_weight.shape)}")
    n = int(adjacency.max()) + 1 if num_nodes is None and adjacency.numel() else (num_nodes or 0)
    return adjacency, edge_weight, n


def normalized_adjacency(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None,
                         self_loops: bool = True, dtype: torch.dtype = torch.float32) -> Tensor:
    """The symmetrically normalised adjacency as a sparse COO ``(N, N)`` matrix.

    ``self_loops=True``: ``Â = D̃^(-1/2)(A + I)D̃^(-1/2)`` (GCN). A self loop already in the
    graph is kept with its weight, not doubled (PyG ``gcn_norm``'s
    ``add_remaining_self_loops``); an isolated node gets ``Â_ii = 1``.
    ``self_loops=False``: ``D^(-1/2) A D^(-1/2)`` with zero-degree rows left zero (the
    operator of ``L = I - D^(-1/2) A D^(-1/2)``, spectrum in ``[0, 2]``).
    Duplicate edges add up. Entry ``(i, j)`` weighs the message ``j -> i``.

    Args:
        edge_index: ``(2, E)`` source/target indices.
        num_nodes: ``N``.
        edge_weight: ``(E,)`` nonnegative weights (default 1).
        self_loops: add the remaining unit self loops (``Â``) or not.
        dtype: value dtype.
    """
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    index, weight = gcn_norm(edge_index, edge_weight, num_nodes, improved=False, add_self_loops=self_loops,
                             dtype=dtype)
    # gcn_norm returns messages source -> target; the matrix row is the target.
    return torch.sparse_coo_tensor(index.flip(0), weight, (num_nodes, num_nodes), check_invariants=False).coalesce()


def local_homophily(edge_index: Tensor, y: Tensor, num_nodes: int | None = None) -> Tensor:
    """Per node, the fraction of its neighbours (self loops excluded) that share its label.

    Args:
        edge_index: ``(2, E)``; for an undirected graph both directions present.
        y: ``(N,)`` integer labels.

    Returns:
        ``(N,)`` float in ``[0, 1]``; ``NaN`` for nodes with no neighbour.
    """
    n = y.numel() if num_nodes is None else num_nodes
    src, dst = edge_index
    keep = src != dst
    src, dst = src[keep], dst[keep]
    same = (y[src] == y[dst]).float()
    agree = torch.zeros(n).index_add_(0, dst, same)
    degree = torch.zeros(n).index_add_(0, dst, torch.ones_like(same))
    return torch.where(degree > 0, agree / degree.clamp_min(1), torch.full_like(degree, float("nan")))
