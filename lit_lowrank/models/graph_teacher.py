"""SD-LoRA's training-only teacher: a small graph transformer over a :class:`~lit_lowrank.ops.sd_lora.HeteroGraph`.

Each layer is pre-norm multi-head attention restricted to the graph's edges, with a learned
per-head bias for each edge type, followed by an MLP; node-type embeddings are added to the
inputs. The teacher reads the global node against the class-text nodes for its logits and the
patch nodes against the patch / text nodes for its relations.

The teacher's class scores are plain cosines ``cos(global node, text node)`` in ``[-1, 1]``; its one
learned ``logit_scale`` is applied exactly once, by :meth:`HeteroGraphTeacher.logits`, for its
cross-entropy. Prototype Predictive Alignment reads the cosines with its own temperature ``τ``
(``softmax(cos / τ)``), the same scale as the student's ``f Pᵀ / τ``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.ops.sd_lora import EDGE_TYPES, NODE_TYPES, HeteroGraph, relation_matrices


class _GraphLayer(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.edge_bias = nn.Parameter(torch.zeros(len(EDGE_TYPES), heads))
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, h: Tensor, graph: HeteroGraph) -> Tensor:
        b, n, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        bias = self.edge_bias[graph.edge_type.clamp(min=0)].permute(0, 3, 1, 2)  # (B, H, N, N)
        bias = bias.masked_fill(~graph.adjacency[:, None], float("-inf"))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        h = h + self.out(att.transpose(1, 2).reshape(b, n, d))
        return h + self.mlp(self.norm2(h))


class HeteroGraphTeacher(nn.Module):
    """Graph transformer teacher: typed-edge attention over patch / global / local / text nodes.

    Args:
        dim: node feature width (the dual encoder's joint embedding width).
        num_layers: graph-attention layers.
        heads: attention heads (must divide ``dim``).
        mlp_ratio: hidden width of each layer's MLP relative to ``dim``.
        tau: temperature of the teacher's relations.
        init_logit_scale: initial ``log`` of the scale of the teacher's cosines in its cross-entropy.

    .. code-block:: python

        teacher = HeteroGraphTeacher(dim=64)
        out = teacher(build_hetero_graph(patches, glob, local, text, quadrant_crop_mask(4)))
        out["cosines"], out["patch_patch"], out["patch_text"]   # (B, C) in [-1, 1], (B, P, P), (B, P, C)
        loss = F.cross_entropy(teacher.logits(out["cosines"]), y)   # exp(logit_scale) * cosines, once
    """

    def __init__(self, dim: int, num_layers: int = 2, heads: int = 4, mlp_ratio: float = 2.0, tau: float = 0.1,
                 init_logit_scale: float = 2.7) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"`heads`={heads} must divide `dim`={dim}.")
        if num_layers < 1:
            raise ValueError(f"`num_layers`={num_layers}, expected >= 1.")
        self.tau = tau
        self.type_embedding = nn.Embedding(len(NODE_TYPES), dim)
        nn.init.normal_(self.type_embedding.weight, std=0.02)
        self.layers = nn.ModuleList(_GraphLayer(dim, heads, mlp_ratio) for _ in range(num_layers))
        self.norm = nn.LayerNorm(dim)
        self.logit_scale = nn.Parameter(torch.tensor(float(init_logit_scale)))

    def logits(self, cosines: Tensor) -> Tensor:
        """The cross-entropy logits ``exp(logit_scale) · cosines`` (the only place the scale is applied)."""
        return self.logit_scale.exp() * cosines

    def forward(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """``cosines (B, C)`` (global node vs class-text nodes, unscaled), ``nodes (B, N, D)`` and relations
        ``patch_patch (B, P, P)``, ``patch_text (B, P, C)``."""
        h = graph.x + self.type_embedding(graph.node_type)[None]
        for layer in self.layers:
            h = layer(h, graph)
        # residual to the input features: the frozen CLIP geometry is the teacher's starting point
        h = self.norm(h) + graph.x
        sl = graph.slices
        glob = F.normalize(h[:, sl["global"]], dim=-1)  # (B, 1, D)
        text = F.normalize(h[:, sl["text"]], dim=-1)    # (B, C, D)
        cosines = (glob @ text.transpose(1, 2)).squeeze(1)
        pp, pt = relation_matrices(h[:, sl["patch"]], text, self.tau)
        return {"cosines": cosines, "nodes": h, "patch_patch": pp, "patch_text": pt}
