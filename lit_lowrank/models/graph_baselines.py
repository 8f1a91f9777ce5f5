"""Node-classification baselines for Castor that PyG has as layers but not as models, or not at all.

All share one signature, ``Net(in_channels, out_channels, hidden_channels=64,
num_layers=2, dropout=0.5, ...)`` and ``forward(x, edge_index) -> (N, out_channels)``,
so :class:`~lit_lowrank.tasks.NodeClassificationModule` builds them by name
(:data:`lit_lowrank.models.GRAPH_MODELS`). PyG's own ``MLP``, ``GCN``, ``GAT`` and
``LINKX`` models are used directly.

- Wrappers around PyG layers: :class:`APPNPNet` (Klicpera et al. 2019), :class:`SGCNet`
  (Wu et al. 2019), :class:`ChebNet` (Defferrard et al. 2016), :class:`GCNIINet` (Chen et
  al. 2020), :class:`FAGCNNet` (Bo et al. 2021), :class:`MixHopNet` (Abu-El-Haija et al. 2019).
- Written here (read, not copied, from the authors' code): :class:`GPRGNN` (Chien et al.,
  ICLR 2021; jianhao2016/GPRGNN), :class:`BernNet` (He et al., NeurIPS 2021;
  ivam-he/BernNet), :class:`ChebNetII` (He et al., NeurIPS 2022; ivam-he/ChebNetII),
  :class:`ACMGCN` (Luan et al., NeurIPS 2022, the ACM-GCN variant).

The polynomial filters (GPRGNN, BernNet, ChebNetII) propagate the MLP's class logits
like Castor does, with the operators of :mod:`lit_lowrank.ops.graph_propagation`.

.. code-block:: python

    from lit_lowrank.models.graph_baselines import GPRGNN

    logits = GPRGNN(in_channels=100, out_channels=2, K=10)(data.x, data.edge_index)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.ops.graph_propagation import normalized_adjacency

# PyG layers are imported inside the constructors: importing torch_geometric costs ~8 s and
# ``lit_lowrank.models`` is imported by every task, graph or not.


def _check_rate(name: str, value: float) -> float:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}`={value!r}: expected a dropout probability in [0, 1).")
    return float(value)


class _LogitMLP(nn.Module):
    """``dropout -> Linear (-> ReLU)`` layers into class logits (the polynomial filters' H⁰)."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int, dropout: float):
        super().__init__()
        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(F.dropout(x, self.dropout, self.training))
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


class APPNPNet(nn.Module):
    """MLP, then personalised-PageRank propagation (``K`` power steps, teleport ``alpha``)."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, K: int = 10, alpha: float = 0.1) -> None:
        super().__init__()
        from torch_geometric.nn import APPNP

        self.mlp = _LogitMLP(in_channels, hidden_channels, out_channels, num_layers, dropout)
        self.prop = APPNP(K, alpha)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.prop(self.mlp(x), edge_index)


class SGCNet(nn.Module):
    """Simplified graph convolution: ``softmax(Â^K X W)`` (linear; ``hidden_channels``/``num_layers`` unused)."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, K: int = 2) -> None:
        super().__init__()
        from torch_geometric.nn import SGConv

        self.conv = SGConv(in_channels, out_channels, K=K)
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(F.dropout(x, self.dropout, self.training), edge_index)


class ChebNet(nn.Module):
    """``num_layers`` Chebyshev convolutions of order ``K`` with ReLU between them."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, K: int = 2) -> None:
        super().__init__()
        from torch_geometric.nn import ChebConv

        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(ChebConv(a, b, K=K) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(F.dropout(x, self.dropout, self.training), edge_index)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


class GCNIINet(nn.Module):
    """GCNII: ``Linear``, ``num_layers`` GCN2Conv (initial residual ``alpha``, identity map ``theta``), ``Linear``."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 8,
                 dropout: float = 0.5, alpha: float = 0.1, theta: float = 0.5) -> None:
        super().__init__()
        from torch_geometric.nn import GCN2Conv

        self.lin_in, self.lin_out = nn.Linear(in_channels, hidden_channels), nn.Linear(hidden_channels, out_channels)
        self.convs = nn.ModuleList(GCN2Conv(hidden_channels, alpha, theta, layer=i + 1) for i in range(num_layers))
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = x0 = F.relu(self.lin_in(F.dropout(x, self.dropout, self.training)))
        for conv in self.convs:
            x = F.relu(conv(F.dropout(x, self.dropout, self.training), x0, edge_index))
        return self.lin_out(F.dropout(x, self.dropout, self.training))


class FAGCNNet(nn.Module):
    """FAGCN: ``Linear``, ``num_layers`` frequency-adaptive (signed attention) convolutions, ``Linear``."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, eps: float = 0.3) -> None:
        super().__init__()
        from torch_geometric.nn import FAConv

        self.lin_in, self.lin_out = nn.Linear(in_channels, hidden_channels), nn.Linear(hidden_channels, out_channels)
        self.convs = nn.ModuleList(FAConv(hidden_channels, eps=eps, dropout=dropout) for _ in range(num_layers))
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = x0 = F.relu(self.lin_in(F.dropout(x, self.dropout, self.training)))
        for conv in self.convs:
            x = conv(x, x0, edge_index)
        return self.lin_out(F.dropout(x, self.dropout, self.training))


class MixHopNet(nn.Module):
    """MixHop: ``num_layers`` layers concatenating ``Â^p X W_p`` for ``p`` in ``powers``, then ``Linear``."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, powers: tuple[int, ...] = (0, 1, 2)) -> None:
        super().__init__()
        from torch_geometric.nn import MixHopConv

        width = hidden_channels // len(powers)
        ins = [in_channels] + [width * len(powers)] * (num_layers - 1)
        self.convs = nn.ModuleList(MixHopConv(a, width, powers=list(powers)) for a in ins)
        self.lin_out = nn.Linear(width * len(powers), out_channels)
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for conv in self.convs:
            x = F.relu(conv(F.dropout(x, self.dropout, self.training), edge_index))
        return self.lin_out(F.dropout(x, self.dropout, self.training))


class GPRGNN(nn.Module):
    """GPR-GNN: ``Σ_k γ_k Âᵏ MLP(X)``, ``γ`` learned, initialised to personalised PageRank (``alpha``).

    ``dprate``: dropout on the MLP's logits before propagation (the authors' code; 0.5 in their runs).
    """

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, K: int = 10, alpha: float = 0.1, dprate: float = 0.0) -> None:
        super().__init__()
        self.mlp = _LogitMLP(in_channels, hidden_channels, out_channels, num_layers, dropout)
        self.dprate = _check_rate("dprate", dprate)
        gamma = alpha * (1 - alpha) ** torch.arange(K + 1, dtype=torch.float32)
        gamma[-1] = (1 - alpha) ** K
        self.gamma = nn.Parameter(gamma)
        self.K = K

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = F.dropout(self.mlp(x), self.dprate, self.training)
        adj = normalized_adjacency(edge_index, x.shape[0], dtype=h.dtype)
        out = self.gamma[0] * h
        for k in range(1, self.K + 1):
            h = torch.sparse.mm(adj, h)
            out = out + self.gamma[k] * h
        return out


class BernNet(nn.Module):
    """BernNet: ``Σ_k θ_k C(K,k)/2^K (2I − L)^(K−k) L^k MLP(X)`` with ``θ = relu(θ_raw) ≥ 0`` (init 1).

    ``L = I − D^(-1/2) A D^(-1/2)`` (no self loops, spectrum in ``[0, 2]``). ``dprate``: dropout
    on the logits before propagation (the authors' code; 0.5 in their runs).
    """

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, K: int = 10, dprate: float = 0.0) -> None:
        super().__init__()
        self.mlp = _LogitMLP(in_channels, hidden_channels, out_channels, num_layers, dropout)
        self.dprate = _check_rate("dprate", dprate)
        self.theta = nn.Parameter(torch.ones(K + 1))
        self.K = K

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = F.dropout(self.mlp(x), self.dprate, self.training)
        adj = normalized_adjacency(edge_index, x.shape[0], self_loops=False, dtype=h.dtype)
        theta = F.relu(self.theta)
        powers = [h]  # L^k h
        for _ in range(self.K):
            powers.append(powers[-1] - torch.sparse.mm(adj, powers[-1]))
        out = torch.zeros_like(h)
        for k, lk in enumerate(powers):
            z = lk
            for _ in range(self.K - k):
                z = z + torch.sparse.mm(adj, z)  # (2I − L) z = (I + D^-1/2 A D^-1/2) z
            out = out + theta[k] * math.comb(self.K, k) / 2**self.K * z
        return out


class ChebNetII(nn.Module):
    """ChebNetII: a Chebyshev expansion whose coefficients interpolate learned values at Chebyshev nodes.

    ``γ_j = relu(γ_raw_j)`` (init 1) are the filter's values at ``x_j = cos((j + 1/2)π/(K+1))``;
    ``w_k = 2/(K+1) Σ_j γ_j T_k(x_j)``; output ``w_0/2 h + Σ_{k≥1} w_k T_k(L̃) h`` with
    ``L̃ = L − I = −D^(-1/2) A D^(-1/2)``. ``dprate``: dropout on the logits before propagation
    (the authors' code; 0.5 in their runs).
    """

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5, K: int = 10, dprate: float = 0.0) -> None:
        super().__init__()
        self.mlp = _LogitMLP(in_channels, hidden_channels, out_channels, num_layers, dropout)
        self.dprate = _check_rate("dprate", dprate)
        self.gamma = nn.Parameter(torch.ones(K + 1))
        nodes = torch.cos((torch.arange(K + 1) + 0.5) * math.pi / (K + 1))
        # T_k(x_j) by the recurrence: (K+1 orders, K+1 nodes)
        table = [torch.ones_like(nodes), nodes]
        for _ in range(2, K + 1):
            table.append(2 * nodes * table[-1] - table[-2])
        self.register_buffer("cheb_at_nodes", torch.stack(table[: K + 1]), persistent=False)
        self.K = K

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = F.dropout(self.mlp(x), self.dprate, self.training)
        adj = normalized_adjacency(edge_index, x.shape[0], self_loops=False, dtype=h.dtype)
        coef = 2.0 / (self.K + 1) * self.cheb_at_nodes @ F.relu(self.gamma)
        t_prev, t = h, -torch.sparse.mm(adj, h)
        out = coef[0] / 2 * h + (coef[1] * t if self.K >= 1 else 0)
        for k in range(2, self.K + 1):
            t_prev, t = t, -2 * torch.sparse.mm(adj, t) - t_prev
            out = out + coef[k] * t
        return out


class _ACMLayer(nn.Module):
    """One ACM-GCN layer: low-pass, high-pass and identity channels mixed per node by attention."""

    def __init__(self, in_channels: int, out_channels: int, activation: bool, temperature: float = 3.0):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(in_channels, out_channels) for _ in range(3))
        self.att_vec = nn.ModuleList(nn.Linear(out_channels, 1, bias=False) for _ in range(3))
        self.att_mix = nn.Linear(3, 3, bias=False)
        self.activation, self.temperature = activation, temperature

    def forward(self, x: Tensor, adj: Tensor) -> Tensor:
        z = [lin(x) for lin in self.lins]
        az = torch.sparse.mm(adj, z[0])
        channels = [az, z[1] - torch.sparse.mm(adj, z[1]), z[2]]
        if self.activation:
            channels = [F.relu(c) for c in channels]
        scores = torch.cat([torch.sigmoid(v(c)) for v, c in zip(self.att_vec, channels)], dim=1)
        alpha = torch.softmax(self.att_mix(scores) / self.temperature, dim=1)
        return 3 * sum(alpha[:, i : i + 1] * channels[i] for i in range(3))


class ACMGCN(nn.Module):
    """ACM-GCN: ``num_layers`` adaptive channel-mixing layers over ``Â``, ``I − Â`` and ``I``."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.5) -> None:
        super().__init__()
        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.layers = nn.ModuleList(_ACMLayer(a, b, activation=i < num_layers - 1)
                                    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])))
        self.dropout = dropout

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        adj = normalized_adjacency(edge_index, x.shape[0], dtype=x.dtype)
        for layer in self.layers:
            x = layer(F.dropout(x, self.dropout, self.training), adj)
        return x
