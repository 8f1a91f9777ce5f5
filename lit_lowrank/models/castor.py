"""Castor: a self-tuning graph filter with per-node routing and per-hop momentum.

A PyG-compatible node classifier, ``forward(x, edge_index) -> (N, out_channels)``:

1. ``H⁰ = MLP(X)`` (dropout, ``num_layers`` linear layers, ReLU) into class logits —
   propagation happens at the width of the output, as in GPRGNN and APPNP, so ``K`` hops
   cost ``K`` sparse products of width ``C``;
2. ``K`` hops of :func:`~lit_lowrank.ops.castor.castor_hop`: a router reads
   ``[hᵢᵏ ‖ hᵢ⁰]`` and mixes low-pass ``Â``, high-pass ``I − Â`` and identity per node;
   a bounded learnable ``β_k`` carries the last change forward;
3. readout: the last state, or a learned sum ``Σ_k γ_k Hᵏ``.

Decisions (METHODS.md §6 leaves them open; each is a parameter):

- ``router="node"`` (default) routes per node; ``"global"`` learns one mix per hop for
  all nodes (the no-router ablation: the same primitives and momentum, no node
  dependence); ``"oracle"`` learns one mix per hop for each group of ``groups`` (a node's
  true regime, given: the benchmark's upper bound on what per-node routing can gain over
  ``"global"``); ``"low"``, ``"high"``, ``"identity"`` fix the route (tests, ablations).
- ``router_sharing="per_hop"`` (default; ``W_k`` per hop, ``3·2C + 3`` parameters each)
  or ``"shared"`` (one router for every hop).
- ``readout="sum"`` (default; ``γ`` learned, initialised to personalised-PageRank weights
  with ``readout_alpha = 0.1`` as in GPRGNN) or ``"last"``.
- ``momentum="heavy_ball"`` (default), ``"nesterov"`` (router and primitives evaluated at
  the look-ahead point) or ``"none"`` (``β ≡ 0``: the no-momentum ablation).
- ``β_k = beta_max · tanh(b_k)``, ``b_k = 0`` at init, ``beta_max = 0.9``. ``β_0`` multiplies
  ``H⁰ − H⁻¹ = 0`` and never changes (kept so there is one coefficient per hop).
- Router init: zero weights, bias ``τ log(router_init)`` with ``router_init = (0.8, 0.1, 0.1)``:
  every node starts low-pass (operator ``0.7 Â + 0.2 I``); uniform routing would start at
  ``(2/3) I`` (no propagation) and on a homophilous cSBM did not find the graph. ``τ = 0.05``:
  a small temperature lets Adam move the route logits by about ``lr/τ`` per step, so the
  router can turn high-pass within tens of epochs (``τ = 1``: it could not in 60).

After each forward ``last_routes`` holds the detached ``(K, N, 3)`` router
probabilities (for :class:`~lit_lowrank.callbacks.castor.CastorDiagnostics`) and
:meth:`betas` the current ``β``.

.. code-block:: python

    from lit_lowrank.models import Castor

    model = Castor(in_channels=100, out_channels=2, hidden_channels=64, K=10)
    logits = model(data.x, data.edge_index)      # (N, 2); a dense (N, N) adjacency works too
    model.last_routes.mean((0, 1))                # mass on (low, high, identity)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.ops.castor import PRIMITIVES, bounded_beta, castor_hop, castor_mix, router_probabilities
from lit_lowrank.ops.graph_propagation import as_edge_index, normalized_adjacency

ROUTERS = ("node", "global", "oracle") + PRIMITIVES
SHARING = ("per_hop", "shared")
READOUTS = ("sum", "last")
MOMENTUM = ("heavy_ball", "nesterov", "none")


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"`{name}`={value!r}: expected one of {allowed}.")


class Castor(nn.Module):
    """Castor node classifier (see the module docstring for the propagation).

    Args:
        in_channels: node feature width.
        out_channels: number of classes (the propagation width).
        hidden_channels: MLP hidden width.
        num_layers: MLP depth (linear layers, ≥ 1).
        K: propagation hops (≥ 0; 0 is the MLP).
        dropout: dropout before every MLP layer.
        router: ``"node"``, ``"global"``, ``"oracle"``, ``"low"``, ``"high"`` or ``"identity"``.
        router_sharing: ``"per_hop"`` or ``"shared"``.
        readout: ``"sum"`` or ``"last"``.
        momentum: ``"heavy_ball"``, ``"nesterov"`` or ``"none"``.
        beta_max: bound of ``|β_k|`` (in ``[0, 1)``).
        tau: router softmax temperature.
        groups: ``(N,)`` integer group of every node, required by (and only by) ``router="oracle"``:
            the model then runs on graphs of exactly ``N`` nodes.

    Shapes:
        ``x: (N, in_channels)``, ``edge_index: (2, E)`` (or dense / sparse ``(N, N)``),
        optional ``edge_weight: (E,)`` -> ``(N, out_channels)``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: int = 64,
        num_layers: int = 2,
        K: int = 10,
        dropout: float = 0.5,
        router: str = "node",
        router_sharing: str = "per_hop",
        readout: str = "sum",
        momentum: str = "heavy_ball",
        beta_max: float = 0.9,
        tau: float = 0.05,
        router_init: tuple[float, float, float] = (0.8, 0.1, 0.1),
        readout_alpha: float = 0.1,
        groups: Tensor | None = None,
    ) -> None:
        super().__init__()
        _check("router", router, ROUTERS)
        _check("router_sharing", router_sharing, SHARING)
        _check("readout", readout, READOUTS)
        _check("momentum", momentum, MOMENTUM)
        if num_layers < 1 or K < 0:
            raise ValueError(f"`num_layers`={num_layers}, `K`={K}: expected num_layers >= 1 and K >= 0.")
        if tau <= 0:
            raise ValueError(f"`tau`={tau!r}: expected a temperature > 0.")
        if len(router_init) != 3 or min(router_init) <= 0 or abs(sum(router_init) - 1) > 1e-6:
            raise ValueError(f"`router_init`={router_init!r}: expected three positive probabilities summing to 1.")
        if not 0 < readout_alpha <= 1:
            raise ValueError(f"`readout_alpha`={readout_alpha!r}: expected a teleport probability in (0, 1].")
        if (router == "oracle") != (groups is not None):
            raise ValueError(f"`groups`: router='oracle' needs the (N,) node groups and no other router takes them "
                             f"(router={router!r}, groups={'given' if groups is not None else None}).")
        if groups is not None and (groups.dim() != 1 or groups.dtype not in (torch.int32, torch.int64)
                                   or groups.numel() == 0 or int(groups.min()) < 0):
            raise ValueError(f"`groups`: expected a non-empty (N,) tensor of non-negative integers, got "
                             f"{tuple(groups.shape)} {groups.dtype}.")
        bounded_beta(torch.zeros(()), beta_max)  # validates beta_max
        self.K, self.dropout, self.tau, self.beta_max = K, dropout, tau, beta_max
        self.router, self.router_sharing, self.readout, self.momentum = router, router_sharing, readout, momentum

        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

        num_routers = 0 if K == 0 else (1 if router_sharing == "shared" else K)
        c = out_channels
        # node router: W_k (3, 2C) reads the states; global router: the bias alone.
        self.router_weight = nn.Parameter(torch.zeros(num_routers, 3, 2 * c)) if router == "node" else None
        if router in ("node", "global", "oracle"):
            # bias = tau * log p so the initial mix is router_init whatever the temperature
            init = tau * torch.log(torch.tensor([router_init], dtype=torch.float32))
            num_groups = int(groups.max()) + 1 if groups is not None else 1
            shape = (num_routers, num_groups, 3) if router == "oracle" else (num_routers, 3)
            self.router_bias = nn.Parameter(init.expand(*shape).clone())
        else:
            self.register_parameter("router_bias", None)
        self.register_buffer("groups", None if groups is None else groups.long().clone())
        self.beta_raw = nn.Parameter(torch.zeros(K)) if momentum != "none" else None
        if readout == "sum":
            # personalised-PageRank weights (as GPRGNN): early hops keep each node's own evidence
            gamma = readout_alpha * (1 - readout_alpha) ** torch.arange(K + 1, dtype=torch.float32)
            gamma[-1] = (1 - readout_alpha) ** K
            self.gamma = nn.Parameter(gamma)
        else:
            self.register_parameter("gamma", None)
        self.last_routes: Tensor | None = None

    def betas(self) -> Tensor:
        """``(K,)`` the current momentum coefficients (zeros with ``momentum="none"``)."""
        if self.beta_raw is None:
            return torch.zeros(self.K)
        return bounded_beta(self.beta_raw, self.beta_max)

    def encode(self, x: Tensor) -> Tensor:
        """``H⁰ = MLP(X)``: ``(N, in_channels) -> (N, out_channels)``."""
        for i, layer in enumerate(self.mlp):
            x = layer(F.dropout(x, self.dropout, self.training))
            if i < len(self.mlp) - 1:
                x = F.relu(x)
        return x

    def routes(self, k: int, h: Tensor, h0: Tensor) -> Tensor:
        """``(N, 3)`` router probabilities of hop ``k`` at state ``h``."""
        if self.router in PRIMITIVES:
            fixed = torch.zeros(3, dtype=h.dtype, device=h.device)
            fixed[PRIMITIVES.index(self.router)] = 1.0
            return fixed.expand(h.shape[0], 3)
        j = 0 if self.router_sharing == "shared" else k
        if self.router == "global":
            return torch.softmax(self.router_bias[j] / self.tau, dim=0).expand(h.shape[0], 3)
        if self.router == "oracle":
            if self.groups.numel() != h.shape[0]:
                raise ValueError(f"router='oracle': `groups` names {self.groups.numel()} nodes, the graph has "
                                 f"{h.shape[0]}.")
            return torch.softmax(self.router_bias[j] / self.tau, dim=1)[self.groups]
        return router_probabilities(h, h0, self.router_weight[j], self.router_bias[j], self.tau)

    def propagate(self, h0: Tensor, adj: Tensor) -> Tensor:
        """``K`` Castor hops from ``H⁰`` with the sparse ``Â``, then the readout."""
        betas = self.betas().to(h0)
        h_prev, h = h0, h0
        states, all_routes = [h0], []
        for k in range(self.K):
            if self.momentum == "nesterov":
                y = h + betas[k] * (h - h_prev)
                r = self.routes(k, y, h0)
                h_next = castor_mix(y, torch.sparse.mm(adj, y), r)
            else:
                r = self.routes(k, h, h0)
                h_next = castor_hop(h, h_prev, torch.sparse.mm(adj, h), r, betas[k])
            all_routes.append(r.detach())
            h_prev, h = h, h_next
            states.append(h)
        self.last_routes = torch.stack(all_routes) if all_routes else None
        if self.readout == "sum":
            return torch.einsum("k,knc->nc", self.gamma, torch.stack(states))
        return h

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None) -> Tensor:
        """Node logits ``(N, out_channels)``."""
        if x.dim() != 2:
            raise ValueError(f"x: expected node features (N, in_channels), got shape {tuple(x.shape)}")
        index, weight, _ = as_edge_index(edge_index, edge_weight, num_nodes=x.shape[0])
        if index.numel() and int(index.max()) >= x.shape[0]:
            raise ValueError(f"edge_index: node index {int(index.max())} out of range for {x.shape[0]} nodes")
        adj = normalized_adjacency(index, x.shape[0], weight, dtype=x.dtype)
        return self.propagate(self.encode(x), adj)
