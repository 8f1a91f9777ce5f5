"""The feature drafter network shared by the EAGLE-style baseline and SpecBlock.

A drafter reads the target's last hidden state ``f_t`` and the embedding of the next
token ``x_{t+1}``: its input is ``fc([e(x_{t+1}); f_t])``; its output hidden ``g`` imitates
``f_{t+1}`` and its head predicts the target's next token. A *block* of ``K`` positions
starts at such an input and continues with ``K - 1`` learned placeholder states (the
tokens there are not drafted yet), so one forward drafts ``K`` dependent positions.
**Layer-wise shift** (SpecBlock): in every layer ``l`` a block position ``j >= 2`` first
receives the previous position's layer input, ``h_j <- h_j + W_l h_{j-1}`` (``W_l``
zero-initialised, so the shift starts as a no-op). A new block can start at any drafted
node, inheriting that node's output hidden ``g`` in place of ``f``. ``block_size=1`` and
no shift is the EAGLE-style drafter (one forward per tree depth).

Layers are pre-norm (RMSNorm) attention + SwiGLU MLP with rotary positions, written
here so attention can take any boolean mask (tree masks at inference, the training
layout of :func:`block_training_layout`). The head covers a *draft vocabulary* (a
subset of target ids, EAGLE-3's reduced vocabulary; default: all ids); the **rank
head** predicts the bucket of the target token's rank in the drafter's sorted
distribution (``{1},{2},{3-4},{5-8},miss``).

.. code-block:: python

    net = BlockDrafterNet(hidden_size=576, vocab_size=49152, block_size=4)
    loss, parts = net.training_loss(embed(tokens), features, target_ids)   # (B, T, H), (B, T)
"""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.ops.speculative import (
    RANK_BUCKET_EDGES,
    rank_bucket_targets,
    valid_prefix_mask,
)


def _rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotary embedding of ``x`` ``(..., N, heads, d)`` at ``positions`` ``(..., N)``."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.to(torch.float32)[..., None] * inv  # (..., N, d/2)
    cos, sin = ang.cos()[..., None, :].to(x.dtype), ang.sin()[..., None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class DrafterLayer(nn.Module):
    """Pre-norm attention + SwiGLU block with an optional layer-wise shift ``W h_{j-1}``."""

    def __init__(self, dim: int, num_heads: int, intermediate_size: int, shift: bool, rope_theta: float) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"`hidden_size` {dim} must be divisible by `num_heads` {num_heads}.")
        self.num_heads, self.rope_theta = num_heads, rope_theta
        self.attn_norm, self.mlp_norm = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, dim, bias=False)
        self.shift = nn.Linear(dim, dim, bias=False) if shift else None
        if self.shift is not None:
            nn.init.zeros_(self.shift.weight)  # start as the plain layer; training turns the shift on

    def forward(self, h: Tensor, positions: Tensor, mask: Tensor, past: tuple[Tensor, Tensor] | None,
                shift_src: Tensor | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``h`` ``(B, N, D)``; ``mask`` ``(B or 1, N, M + N)`` over ``past`` (M) and ``h``; returns (h, (k, v))."""
        if self.shift is not None and shift_src is not None:
            has = (shift_src >= 0)[..., None].to(h.dtype)
            prev = h[:, shift_src.clamp(min=0)] * has
            h = h + self.shift(prev)
        b, n, d = h.shape
        q, k, v = self.qkv(self.attn_norm(h)).view(b, n, 3, self.num_heads, d // self.num_heads).unbind(2)
        q, k = _rope(q, positions, self.rope_theta), _rope(k, positions, self.rope_theta)
        if past is not None:
            k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask[:, None])
        h = h + self.o(att.transpose(1, 2).reshape(b, n, d))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, -1)
        return h + self.down(F.silu(gate) * up), (k, v)


def block_training_layout(seq_len: int, block_size: int, window: int, expand_at: int | None,
                          device: torch.device | None = None) -> dict[str, Tensor]:
    """Token layout of one training pass: context positions, block-1 placeholders, block-2 positions.

    Every context position ``t`` (``0..T-1``) is the first position of its own block; its
    ``K - 1`` placeholders follow; with ``expand_at = j*`` a second block of ``K`` positions
    starts at block-1 position ``j*`` of every ``t`` (its first input inherits that
    position's output hidden, filled in by the caller). Attention: a context position sees
    context ``[t - window, t]``; a block position sees what its first position sees plus the
    earlier positions of its block chain.

    Returns a dict with ``positions`` ``(N,)``, ``mask`` ``(N, N)`` bool, ``shift_src``
    ``(N,)`` (index of the previous block position, ``-1`` for block starts), ``start``
    ``(N,)`` (the context position ``t`` a token belongs to), ``offset`` ``(N,)`` (depth
    below ``t``: block-1 position ``j`` -> ``j``, block-2 position ``i`` -> ``j* + i``),
    ``block1`` ``(T, K)`` / ``block2`` ``(T, K)`` token indices.
    """
    t_idx = torch.arange(seq_len, device=device)
    k = block_size
    n1 = seq_len * k
    # block-1 tokens: index t for position 1, then seq_len + t*(k-1) + (j-2) for positions j >= 2
    block1 = torch.empty(seq_len, k, dtype=torch.long, device=device)
    block1[:, 0] = t_idx
    if k > 1:
        block1[:, 1:] = seq_len + t_idx[:, None] * (k - 1) + torch.arange(k - 1, device=device)
    n = n1 + (seq_len * k if expand_at is not None else 0)
    start = torch.empty(n, dtype=torch.long, device=device)
    offset = torch.empty(n, dtype=torch.long, device=device)
    shift_src = torch.full((n,), -1, dtype=torch.long, device=device)
    start[block1] = t_idx[:, None].expand(-1, k)
    offset[block1] = torch.arange(1, k + 1, device=device).expand(seq_len, -1)
    shift_src[block1[:, 1:]] = block1[:, :-1]
    # chain[i] = the tokens (besides context) token i may attend to, built as a boolean matrix
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    ctx_ok = (t_idx[None, :] <= t_idx[:, None]) & (t_idx[None, :] >= t_idx[:, None] - window)  # (T, T)
    mask[block1.reshape(-1)[:, None], t_idx[None, :]] = ctx_ok[start[block1.reshape(-1)]]
    within = torch.ones(k, k, dtype=torch.bool, device=device).tril()
    for j in range(1, k):  # placeholders see their earlier block-1 positions (position 1 is the context token)
        mask[block1[:, j][:, None], block1[:, 1 : j + 1]] = True
    block2 = None
    if expand_at is not None:
        if not 1 <= expand_at <= k:
            raise ValueError(f"`expand_at` must be in 1..{k}, got {expand_at}.")
        block2 = n1 + t_idx[:, None] * k + torch.arange(k, device=device)
        flat2 = block2.reshape(-1)
        start[block2] = t_idx[:, None].expand(-1, k)
        offset[block2] = expand_at + torch.arange(1, k + 1, device=device)
        shift_src[block2[:, 1:]] = block2[:, :-1]
        mask[flat2[:, None], t_idx[None, :]] = ctx_ok[start[flat2]]
        if expand_at > 1:  # the chain through block 1 up to the start node
            rows = flat2[:, None]
            cols = block1[:, 1:expand_at].repeat_interleave(k, 0)
            mask[rows, cols] = True
        for j in range(k):
            mask[block2[:, j][:, None], block2[:, : j + 1]] = within[j, : j + 1]
    positions = start + offset - 1
    out = {"positions": positions, "mask": mask, "shift_src": shift_src, "start": start, "offset": offset,
           "block1": block1}
    if block2 is not None:
        out["block2"] = block2
    return out


class BlockDrafterNet(nn.Module):
    """Feature drafter (EAGLE-style with ``block_size=1``, SpecBlock with ``block_size=K``).

    Args:
        hidden_size: the target's hidden size ``H`` (features and embeddings).
        vocab_size: the target's vocabulary size.
        block_size: ``K`` positions per forward.
        num_layers: drafter decoder layers.
        num_heads: attention heads.
        intermediate_size: MLP width (default ``2 * hidden_size``).
        layer_shift: the layer-wise shift ``h_j += W_l h_{j-1}`` (SpecBlock; ablation: off).
        rank_head: the co-trained rank head (SpecBlock; ablation: off).
        valid_prefix: train with the valid-prefix mask (SpecBlock; ablation: plain mean).
        draft_vocab_size: size of the draft vocabulary (``None``: the full vocabulary).
            Set its ids with :meth:`set_draft_vocab`.
        context_window: committed positions before the root a drafter attends to.
        feature_loss_weight: weight of the smooth-L1 regression of ``g`` onto the target features.
        rope_theta: rotary base.
        head_norm: an RMSNorm before the LM head. With features taken after the target's final
            norm (as here) and the target's head frozen, ``False`` keeps the logits at the target's
            scale (a fresh norm would flatten them by the features' RMS).
        feature_layers: EAGLE-3's fused features: the target hidden states (indices into
            transformers' ``hidden_states``, low to high, the last = the final normed output) a block
            start reads, concatenated ``(.., H * L)`` and fused by a linear map to ``H``. A start at a
            drafted node reads the drafter's own output ``g`` ``(.., H)`` instead (training-time test).
            ``None``: the last hidden state only (EAGLE-1/2).

    .. code-block:: python

        net = BlockDrafterNet(576, 49152, block_size=4, draft_vocab_size=4096)
        net.set_draft_vocab(most_frequent_ids)
        net.init_head_from(target.lm_head.weight, target.model.norm.weight)
    """

    def __init__(self, hidden_size: int, vocab_size: int, block_size: int = 4, num_layers: int = 1,
                 num_heads: int = 4, intermediate_size: int | None = None, layer_shift: bool = True,
                 rank_head: bool = True, valid_prefix: bool = True, draft_vocab_size: int | None = None,
                 context_window: int = 16, feature_loss_weight: float = 0.5, rope_theta: float = 10000.0,
                 head_norm: bool = True, feature_layers: list[int] | None = None) -> None:
        super().__init__()
        if block_size < 1:
            raise ValueError(f"`block_size` must be >= 1, got {block_size}.")
        if draft_vocab_size is not None and not 1 <= draft_vocab_size <= vocab_size:
            raise ValueError(f"`draft_vocab_size` must be in 1..vocab_size={vocab_size}, got {draft_vocab_size}.")
        self.config = dict(hidden_size=hidden_size, vocab_size=vocab_size, block_size=block_size,
                           num_layers=num_layers, num_heads=num_heads, intermediate_size=intermediate_size,
                           layer_shift=layer_shift, rank_head=rank_head, valid_prefix=valid_prefix,
                           draft_vocab_size=draft_vocab_size, context_window=context_window,
                           feature_loss_weight=feature_loss_weight, rope_theta=rope_theta, head_norm=head_norm,
                           feature_layers=None if feature_layers is None else [int(x) for x in feature_layers])
        self.hidden_size = hidden_size
        self.feature_layers = self.config["feature_layers"]
        n_feat = 1 if feature_layers is None else len(feature_layers)
        if n_feat < 1:
            raise ValueError("`feature_layers` must name at least one layer (or be None).")
        # EAGLE-3: low/mid/high target states fused to one H-vector before the usual fc([e; f])
        self.fuse = nn.Linear(n_feat * hidden_size, hidden_size, bias=False) if n_feat > 1 else None
        self.block_size, self.context_window = block_size, context_window
        self.valid_prefix, self.feature_loss_weight = valid_prefix, feature_loss_weight
        self.vocab_size, self.head_norm = vocab_size, head_norm
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.placeholders = nn.Parameter(torch.randn(max(block_size - 1, 0), hidden_size) * 0.02)
        self.layers = nn.ModuleList(
            DrafterLayer(hidden_size, num_heads, intermediate_size or 2 * hidden_size,
                         layer_shift and block_size > 1, rope_theta) for _ in range(num_layers))
        self.norm = nn.RMSNorm(hidden_size, eps=1e-6)
        vd = draft_vocab_size or vocab_size
        self.head = nn.Linear(hidden_size, vd, bias=False)
        self.rank_head = nn.Linear(hidden_size, len(RANK_BUCKET_EDGES) + 1) if rank_head else None
        self.register_buffer("draft_vocab", torch.arange(vd), persistent=True)
        self.register_buffer("target_to_draft", torch.arange(vocab_size) if vd == vocab_size else
                             torch.full((vocab_size,), -1, dtype=torch.long), persistent=True)

    # ------------------------------------------------------------------ setup
    def set_draft_vocab(self, ids: Tensor) -> None:
        """Use target ids ``ids`` ``(Vd,)`` (distinct) as the draft vocabulary."""
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() != self.head.out_features or ids.unique().numel() != ids.numel():
            raise ValueError(f"draft vocabulary: expected {self.head.out_features} distinct ids, got {ids.numel()} "
                             f"({ids.unique().numel()} distinct).")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"draft vocabulary ids must be in 0..{self.vocab_size - 1}.")
        self.draft_vocab.copy_(ids)
        self.target_to_draft.fill_(-1)
        self.target_to_draft[ids] = torch.arange(ids.numel(), device=ids.device)

    @torch.no_grad()
    def init_head_from(self, lm_head_weight: Tensor, final_norm_weight: Tensor | None = None) -> None:
        """Copy the target's LM-head rows of the draft vocabulary (and its final norm) as a warm start."""
        self.head.weight.copy_(lm_head_weight[self.draft_vocab.to(lm_head_weight.device)])
        if final_norm_weight is not None:
            self.norm.weight.copy_(final_norm_weight)

    # ------------------------------------------------------------------ forward pieces
    @property
    def feature_size(self) -> int:
        """Width of the target features a block start reads (``H`` times the fused layers)."""
        return self.hidden_size * (1 if self.fuse is None else len(self.feature_layers))

    def input_states(self, token_embeds: Tensor, features: Tensor) -> Tensor:
        """``fc([e(x); f])``: the input state of a block start.

        ``features`` is the target's (``(.., feature_size)``, fused first when several layers) or a
        drafted node's own output state ``g`` (``(.., H)``).
        """
        features = features.to(token_embeds.dtype)
        if self.fuse is not None and features.shape[-1] == self.feature_size:
            features = self.fuse(features)
        elif features.shape[-1] != self.hidden_size:
            raise ValueError(f"input_states: features of width {features.shape[-1]}, expected the target's "
                             f"{self.feature_size} or a drafted state's {self.hidden_size}.")
        return self.fc(torch.cat([token_embeds, features], -1))

    def run(self, h: Tensor, positions: Tensor, mask: Tensor, past: list[tuple[Tensor, Tensor]] | None = None,
            shift_src: Tensor | None = None) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """All layers over ``h`` ``(B, N, H)``; returns the output hidden ``g`` (before the norm) and the KV."""
        if mask.dim() == 2:
            mask = mask[None]
        kv = []
        for i, layer in enumerate(self.layers):
            h, layer_kv = layer(h, positions, mask, None if past is None else past[i], shift_src)
            kv.append(layer_kv)
        return h, kv

    def head_input(self, g: Tensor) -> Tensor:
        """What the LM head reads: ``norm(g)``, or ``g`` itself with ``head_norm=False`` (``g`` imitates the
        target's features, which are already after its final norm: the target's head applies to them as is)."""
        return self.norm(g) if self.head_norm else g

    def logits(self, g: Tensor) -> Tensor:
        """Draft-vocabulary logits of output hidden states ``g``."""
        return self.head(self.head_input(g))

    def bucket_logits(self, g: Tensor) -> Tensor | None:
        """Rank-head logits over the rank buckets (``None`` without a rank head)."""
        return None if self.rank_head is None else self.rank_head(self.norm(g).detach())

    # ------------------------------------------------------------------ training
    def training_loss(self, token_embeds: Tensor, features: Tensor, target_ids: Tensor,
                      doc_ids: Tensor | None = None, expand_at: int | None = -1) -> tuple[Tensor, dict[str, Tensor]]:
        """The drafter loss on teacher-forced sequences (frozen target's features and argmax).

        Args:
            token_embeds: ``(B, T, H)`` target embeddings of the tokens ``x``.
            features: ``(B, T, feature_size)`` target features ``f`` (``f_t`` produced ``x_{t+1}``); the
                last ``H`` columns are the last hidden state, which ``g`` regresses onto.
            target_ids: ``(B, T)`` the target's argmax at each position (``-100`` to ignore).
            doc_ids: optional ``(B, T)``: no block crosses a document boundary.
            expand_at: block-2 start position ``j*`` (``-1``: random in ``1..K``; ``None``: no block 2).

        Block-1 position ``j`` of start ``t`` (input ``x_{t+1}``, ``f_t``) predicts
        ``target_ids[t + j]`` and regresses ``g`` onto ``f_{t+j}``; block-2 position ``i``
        predicts ``target_ids[t + j* + i]``. Positions are weighted by the valid-prefix mask
        (or all valid ones when ``valid_prefix=False``). The rank head learns the bucket of the
        target token's rank under the valid-prefix mask (on detached states).

        Returns:
            ``(loss, parts)`` with ``ce``, ``feature``, ``rank``, ``acc1`` (block-position-1
            accuracy) and ``valid_fraction``.
        """
        b, t, fdim = features.shape
        hdim = self.hidden_size
        if token_embeds.shape != (b, t, hdim) or fdim != self.feature_size or target_ids.shape != (b, t):
            raise ValueError(f"training_loss: token_embeds {tuple(token_embeds.shape)}, features "
                             f"{tuple(features.shape)}, target_ids {tuple(target_ids.shape)} do not match (B, T, H), "
                             f"(B, T, {self.feature_size}), (B, T).")
        k = self.block_size
        s = t - 1  # starts: t = 0..T-2 (x_{t+1} must exist)
        if expand_at == -1:
            expand_at = random.randint(1, k)
        device = features.device
        lay = block_training_layout(s, k, self.context_window, expand_at, device)
        x_next = token_embeds[:, 1:]
        f_ctx = features[:, :-1]
        ctx = self.input_states(x_next, f_ctx)  # (B, S, H)
        n = lay["positions"].numel()
        doc_mask = lay["mask"][None]
        if doc_ids is not None:
            d = doc_ids[:, :-1]
            doc_mask = doc_mask & (d[:, lay["start"]][:, :, None] == d[:, lay["start"]][:, None, :])

        def assemble(block2_inputs: Tensor | None) -> Tensor:
            h = ctx.new_zeros(b, n, hdim)
            h[:, : s] = ctx
            if k > 1:
                h[:, lay["block1"][:, 1:]] = self.placeholders.expand(b, s, -1, -1)
            if block2_inputs is not None:
                h[:, lay["block2"][:, 0]] = block2_inputs
                if k > 1:
                    h[:, lay["block2"][:, 1:]] = self.placeholders.expand(b, s, -1, -1)
            return h

        # targets of every token: target_ids[start + offset] (out of range / ignored -> -1)
        idx = lay["start"] + lay["offset"]
        in_range = idx < t
        tgt_full = torch.where(in_range[None], target_ids[:, idx.clamp(max=t - 1)], torch.full_like(target_ids[:, :1], -1))
        valid = in_range[None] & (tgt_full >= 0)
        if doc_ids is not None:
            valid = valid & (doc_ids[:, idx.clamp(max=t - 1)] == doc_ids[:, lay["start"]])
        tgt_draft = torch.where(valid, self.target_to_draft[tgt_full.clamp(min=0)], torch.full_like(tgt_full, -1))
        feat_idx = (lay["start"] + lay["offset"]).clamp(max=t - 1)
        block2_inputs = None
        if expand_at is not None:
            with torch.no_grad():  # the inherited hidden state is detached (a state, like a target feature)
                g1, _ = self.run(assemble(None), lay["positions"], doc_mask, None, lay["shift_src"])
            start_node = lay["block1"][:, expand_at - 1]
            tok = token_embeds[:, (torch.arange(s, device=device) + expand_at + 1).clamp(max=t - 1)]
            block2_inputs = self.input_states(tok, g1[:, start_node])
            # block-2 starts past the sequence end or across a document are invalid
            ok2 = (torch.arange(s, device=device) + expand_at + 1) < t
            valid[:, lay["block2"][:, 0]] &= ok2[None]
        g, _ = self.run(assemble(block2_inputs), lay["positions"], doc_mask, None, lay["shift_src"])
        logits = self.logits(g)  # (B, N, Vd)

        chains = [lay["block1"]]
        if expand_at is not None:
            chains.append(torch.cat([lay["block1"][:, :expand_at], lay["block2"]], 1))
        ce_all = F.cross_entropy(logits.flatten(0, 1).float(), tgt_draft.flatten().clamp(min=0), reduction="none")
        ce_all = ce_all.view(b, n)
        last = features[..., fdim - hdim:]  # the final hidden state the head reads
        feat_err = F.smooth_l1_loss(g.float(), last[:, feat_idx].float(), reduction="none").mean(-1)
        buckets = rank_bucket_targets(logits.detach(), tgt_draft)
        rank_logits = self.bucket_logits(g)
        ce_sum = feat_sum = rank_sum = mask_sum = valid_sum = rank_count = 0.0
        for chain in chains:
            cl, ct, cv = logits[:, chain], tgt_draft[:, chain], valid[:, chain]
            vp = valid_prefix_mask(cl.detach(), ct, cv)  # (B, S, L)
            m = vp if self.valid_prefix else (cv & (ct >= 0)).float()
            # the rank head also learns misses (targets outside the draft vocabulary) on valid prefixes
            correct = ((cl.detach().argmax(-1) == ct) & (ct >= 0) & cv).float()
            before = torch.cat([torch.ones_like(correct[..., :1]), torch.cumprod(correct, -1)[..., :-1]], -1)
            rank_mask = before * cv.float()
            if chain is not chains[0]:  # block-2 chains: only score the block-2 part
                keep = torch.zeros(chain.shape[1], device=device)
                keep[expand_at:] = 1.0
                m, vp, rank_mask = m * keep, vp * keep, rank_mask * keep
            ce_sum = ce_sum + (ce_all[:, chain] * m).sum()
            feat_sum = feat_sum + (feat_err[:, chain] * m).sum()
            mask_sum = mask_sum + m.sum()
            valid_sum = valid_sum + vp.sum()
            if rank_logits is not None:
                rce = F.cross_entropy(rank_logits[:, chain].flatten(0, -2).float(), buckets[:, chain].flatten(),
                                      reduction="none").view_as(vp)
                rank_sum = rank_sum + (rce * rank_mask).sum()
                rank_count = rank_count + rank_mask.sum()
        denom = torch.clamp(torch.as_tensor(mask_sum, device=device), min=1.0)
        ce, feat = ce_sum / denom, feat_sum / denom
        rank = rank_sum / torch.clamp(torch.as_tensor(rank_count, device=device), min=1.0)
        loss = ce + self.feature_loss_weight * feat + (rank if rank_logits is not None else 0.0)
        first = lay["block1"][:, 0]
        v0 = valid[:, first]
        acc1 = ((logits[:, first].argmax(-1) == tgt_draft[:, first]) & v0).sum() / v0.sum().clamp(min=1)
        parts = {"ce": ce.detach(), "feature": feat.detach(),
                 "rank": torch.as_tensor(rank).detach(), "acc1": acc1.detach(),
                 "valid_fraction": (torch.as_tensor(valid_sum) / valid.sum().clamp(min=1)).detach()}
        return loss, parts

    def save(self, path: Any) -> None:
        """Write config and weights (a drafter checkpoint, loadable with :meth:`load`)."""
        torch.save({"config": self.config, "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path: Any, map_location: Any = "cpu") -> BlockDrafterNet:
        """Rebuild a drafter saved with :meth:`save`."""
        from lit_lowrank.core.safe_load import load_weights_file

        blob = load_weights_file(path, param="path", map_location=map_location)  # config + tensors only
        net = cls(**blob["config"])
        net.load_state_dict(blob["state_dict"])
        return net


def parameter_count(module: nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in module.parameters())


class MedusaHeads(nn.Module):
    """Medusa-style parallel heads (the Medusa baseline): head ``k`` predicts the token ``k + 1`` steps ahead.

    Each head reads only the target's last hidden state ``f_t`` (whose own LM head gives the
    token at ``t + 1``, the root) through a residual SiLU block, ``h = f + SiLU(W f)``, and an
    LM head (initialised from the target's, trainable): all heads run in one forward and
    never see the tokens they draft before them (Medusa-1: frozen target). The heads may
    cover a reduced *draft vocabulary* (as :class:`BlockDrafterNet`'s), which on a CPU is most
    of their cost: ``num_heads`` full 49k-row heads read ``num_heads`` times the target's head.

    Args:
        hidden_size: the target's hidden size.
        vocab_size: the target's vocabulary size.
        num_heads: heads = drafted depths.
        draft_vocab_size: rows of each head (``None``: the full vocabulary); set the ids with
            :meth:`set_draft_vocab`.

    .. code-block:: python

        heads = MedusaHeads(576, 49152, num_heads=4)
        heads.init_head_from(target.lm_head.weight)
        loss, parts = heads.training_loss(features, target_ids)    # (B, T, H), (B, T)
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 4,
                 draft_vocab_size: int | None = None) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"MedusaHeads: `num_heads` must be >= 1, got {num_heads}.")
        if draft_vocab_size is not None and not 1 <= draft_vocab_size <= vocab_size:
            raise ValueError(f"`draft_vocab_size` must be in 1..vocab_size={vocab_size}, got {draft_vocab_size}.")
        self.config = dict(hidden_size=hidden_size, vocab_size=vocab_size, num_heads=num_heads,
                           draft_vocab_size=draft_vocab_size)
        self.num_heads, self.vocab_size = num_heads, vocab_size
        self.res = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        for lin in self.res:
            nn.init.zeros_(lin.weight)  # Medusa: start as the target's own head (a no-op residual)
            nn.init.zeros_(lin.bias)
        vd = draft_vocab_size or vocab_size
        self.heads = nn.ModuleList(nn.Linear(hidden_size, vd, bias=False) for _ in range(num_heads))
        self.register_buffer("draft_vocab", torch.arange(vd), persistent=True)
        self.register_buffer("target_to_draft", torch.arange(vocab_size) if vd == vocab_size else
                             torch.full((vocab_size,), -1, dtype=torch.long), persistent=True)

    set_draft_vocab = BlockDrafterNet.set_draft_vocab

    @property
    def head(self) -> nn.Linear:  # what set_draft_vocab checks the size against
        return self.heads[0]

    @torch.no_grad()
    def init_head_from(self, lm_head_weight: Tensor) -> None:
        """Copy the target's LM-head rows of the draft vocabulary into every head (Medusa's warm start)."""
        rows = lm_head_weight[self.draft_vocab.to(lm_head_weight.device)]
        for head in self.heads:
            head.weight.copy_(rows)

    def forward(self, features: Tensor) -> Tensor:
        """``features`` ``(..., H)`` -> draft-vocabulary logits ``(..., num_heads, Vd)``."""
        return torch.stack([head(features + F.silu(res(features))) for res, head in zip(self.res, self.heads)], -2)

    def training_loss(self, features: Tensor, target_ids: Tensor,
                      doc_ids: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Mean CE of head ``k`` at position ``t`` against the target's argmax at ``t + k + 1`` (``-100`` ignored).

        Targets outside the draft vocabulary and (with ``doc_ids``) across a document boundary are ignored.

        Args:
            features: ``(B, T, H)`` target last hidden states.
            target_ids: ``(B, T)`` the target's argmax (``target_ids[t]`` follows ``f_t``).
            doc_ids: optional ``(B, T)`` document ids.
        """
        if features.dim() != 3 or target_ids.shape != features.shape[:2]:
            raise ValueError(f"MedusaHeads.training_loss: features {tuple(features.shape)} and target_ids "
                             f"{tuple(target_ids.shape)} must be (B, T, H) and (B, T).")
        t = features.shape[1]
        logits = self(features.to(self.heads[0].weight.dtype)).float()  # (B, T, K, Vd)
        mapped = torch.where(target_ids >= 0, self.target_to_draft[target_ids.clamp(min=0)],
                             torch.full_like(target_ids, -100))
        mapped = torch.where(mapped < 0, torch.full_like(mapped, -100), mapped)
        losses, acc = [], []
        for k in range(min(self.num_heads, t - 1)):
            lg, y = logits[:, : t - k - 1, k], mapped[:, k + 1:]
            if doc_ids is not None:
                y = torch.where(doc_ids[:, k + 1:] == doc_ids[:, : t - k - 1], y, torch.full_like(y, -100))
            losses.append(F.cross_entropy(lg.flatten(0, 1), y.flatten(), ignore_index=-100))
            ok = y != -100
            acc.append(((lg.argmax(-1) == y) & ok).sum() / ok.sum().clamp(min=1))
        if not losses:
            raise ValueError(f"MedusaHeads.training_loss: sequences of length {t} are too short (need >= 2).")
        loss = torch.stack(losses).mean()
        return loss, {"ce": loss.detach(), "acc1": acc[0].detach()}

    def save(self, path: Any) -> None:
        """Write config and weights (loadable with :meth:`load`)."""
        torch.save({"config": self.config, "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path: Any, map_location: Any = "cpu") -> MedusaHeads:
        """Rebuild heads saved with :meth:`save` (config and tensors only: a pickled object is refused)."""
        from lit_lowrank.core.safe_load import load_weights_file

        blob = load_weights_file(path, param="path", map_location=map_location)
        heads = cls(**blob["config"])
        heads.load_state_dict(blob["state_dict"])
        return heads
