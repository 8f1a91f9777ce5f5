"""Tree-growing drafters over a :class:`~lit_lowrank.models.spec_drafter.BlockDrafterNet`.

- :class:`EagleDrafter` (baseline): one drafter forward per tree depth; EAGLE-2's
  dynamic top-k tree — expand the ``topk`` best nodes of the newest depth (score = the
  path's summed draft log-probability), then keep the ``budget`` best nodes overall.
- :class:`MedusaDrafter` (baseline): Medusa-style parallel heads on the root's target
  feature, one forward per round; the tree is the best-first top-``budget`` set of paths
  by the product of head probabilities (every depth offers its head's top-k tokens).
- :class:`SpecBlockDrafter`: each forward drafts a block of ``K`` dependent positions;
  the tree grows by block expansion (a new block starts at a node of the previous
  block and inherits its hidden state); per-position branching comes from the rank
  head's acceptance estimate (best-first over path values = products of per-rank
  acceptance probabilities) under the verifier budget.

Both keep a drafter KV cache over the committed positions (tokens and the target's
features) across rounds: each round only the positions committed since the last round run
through the drafter, in its first forward; every position attends to the ``context_window``
positions before it, as in training. Tree nodes attend to the root's window and their
ancestors; their cache entries are dropped after the round (only committed positions are
kept), so nothing needs rolling back after verification.

.. code-block:: python

    drafter = SpecBlockDrafter(net, blocks=2, expand=4)
    engine = SpeculativeDecoder(target, drafter, budget=24)
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lit_lowrank.decoding.engine import Drafter, DraftRequest, DraftTree
from lit_lowrank.models.spec_drafter import BlockDrafterNet, MedusaHeads
from lit_lowrank.ops.speculative import RANK_BUCKET_EDGES, rank_probabilities


class _ContextCache:
    """The drafter's KV cache over the committed positions, kept across rounds.

    Context item ``i`` (committed position ``i``) is ``fc([e(x_{i+1}); f_i])`` at rotary
    position ``i`` and attends to items ``i - window .. i`` (the training layout of
    :func:`~lit_lowrank.models.spec_drafter.block_training_layout`). Each round only the
    items committed since the last round run through the drafter (about τ of them, not the
    whole window); older entries are dropped once no new item can see them. A new sequence
    (fewer items than cached) or :meth:`reset` (e.g. after the drafter's weights changed)
    starts over from the last ``window + 1`` items.
    """

    def __init__(self, net: BlockDrafterNet) -> None:
        self.net = net
        self.reset()

    def reset(self) -> None:
        self.kv: list[tuple[Tensor, Tensor]] | None = None
        self.first = 0  # item index of the first cached entry
        self.items = 0  # items encoded so far (the next item's index)

    def new_items(self, request: DraftRequest) -> tuple[Tensor, Tensor, Tensor]:
        """The new items' input states ``(m, H)``, their item indices ``(m,)`` and the mask ``(m, C + m)``
        over the cached entries and themselves; drops cached entries the new items cannot see."""
        tokens, features = request.tokens, request.features
        if features is None or features.shape[0] != tokens.numel() - 1 or features.shape[0] == 0:
            raise ValueError(f"DraftRequest: features {None if features is None else tuple(features.shape)} must have "
                             f"len(tokens) - 1 = {tokens.numel() - 1} >= 1 rows.")
        if features.shape[-1] != self.net.feature_size:  # e.g. a verifier not asked for the fused layers
            raise ValueError(f"DraftRequest: features of width {features.shape[-1]}, the drafter reads "
                             f"{self.net.feature_size} (feature_layers={self.net.feature_layers}); set the "
                             "verifier's TargetLM.feature_layers to the drafter's.")
        n, window = features.shape[0], self.net.context_window
        if self.kv is None or n < self.items or n - window - 1 > self.items:  # new sequence, or a gap
            self.kv = None
            self.first = self.items = max(0, n - window - 1)
        start = self.items
        keep_from = max(self.first, start - window)  # entries older than this are invisible from now on
        if self.kv is not None and keep_from > self.first:
            drop = keep_from - self.first
            self.kv = [(k[:, drop:], v[:, drop:]) for k, v in self.kv]
            self.first = keep_from
        device, dtype = tokens.device, self.net.fc.weight.dtype
        idx = torch.arange(start, n, device=device)
        emb = request.target.embed(tokens[idx + 1]).to(dtype)
        h = self.net.input_states(emb, features[idx].to(dtype))
        cols = torch.arange(self.first, n, device=device)
        mask = (cols[None, :] <= idx[:, None]) & (cols[None, :] >= idx[:, None] - window)
        return h, idx, mask

    def commit(self, kv: list[tuple[Tensor, Tensor]], items: int) -> None:
        """Keep the first ``items - first`` entries of ``kv`` (the context) for the next round."""
        length = items - self.first
        self.kv = [(k[:, :length], v[:, :length]) for k, v in kv]
        self.items = items

    @property
    def length(self) -> int:
        return self.items - self.first

    def visible(self, root: int) -> Tensor:
        """Bool ``(C,)`` over the cached entries: the ones the root item's window covers."""
        cols = torch.arange(self.first, self.items)
        return cols >= root - self.net.context_window


def _feature_layers(net: BlockDrafterNet) -> tuple[int, ...] | None:
    """The target states ``net`` fuses (what the engine asks the verifier for), ``None``: the last one."""
    return None if net.fuse is None else tuple(net.feature_layers)


class _DraftVocabulary:
    """The draft head's rows: the net's draft vocabulary, plus the sequence's prompt tokens when allowed.

    A reduced draft vocabulary (EAGLE-3 / FR-Spec) cannot propose the names and rare words an
    answer copies from its prompt. When the net's head is the target's own frozen rows (EAGLE's
    recipe), the rows of the prompt's tokens are the target's too, so they are appended for the
    sequence (its first request): the same head, over the static ids plus the context's ids.
    Verification uses the target's full vocabulary, so this only changes what can be drafted.
    """

    def __init__(self, net: BlockDrafterNet, extend: bool) -> None:
        self.net, self.extend = net, extend
        self.reset()

    def reset(self) -> None:
        self.ids: Tensor | None = None
        self.rows: Tensor | None = None

    def _head_is_targets(self, target: Any) -> bool:
        """Whether the net's head rows are exactly the target's (checked per sequence: an update may train it)."""
        head = getattr(target, "head", None)
        if head is None:
            return False
        mine = self.net.head.weight
        rows = head.weight[self.net.draft_vocab.to(head.weight.device)]
        return rows.shape == mine.shape and torch.equal(rows.to(mine), mine)

    def prepare(self, request: DraftRequest) -> None:
        """Build the sequence's vocabulary at its first request."""
        if self.ids is not None:
            return
        self.ids, self.rows = self.net.draft_vocab, self.net.head.weight
        if not self.extend or not self._head_is_targets(request.target):
            return
        seen = torch.zeros(self.net.vocab_size, dtype=torch.bool, device=self.ids.device)
        seen[request.tokens.to(seen.device)] = True
        seen[self.ids] = False
        extra = torch.nonzero(seen).flatten()
        if extra.numel():
            self.ids = torch.cat([self.ids, extra])
            self.rows = torch.cat([self.rows, request.target.head.weight[extra.to(self.rows.device)].to(self.rows)])

    def logits(self, g: Tensor) -> Tensor:
        """Logits ``(..., V')`` of output hidden states ``g`` over the sequence's draft vocabulary."""
        return self.net.head_input(g) @ self.rows.T


class EagleDrafter(Drafter):
    """EAGLE-style autoregressive feature drafter with a dynamic top-k tree (the main baseline).

    The drafter keeps a KV cache over the committed positions across rounds (only the newly
    committed ones run each round, in the first forward); each further depth is one forward
    of the ``topk`` expanded nodes attending to the context and their ancestors.

    Args:
        net: a :class:`BlockDrafterNet` (trained with ``block_size=1`` for a faithful baseline).
        depth: tree depth = drafter forwards per round.
        topk: children per expanded node and nodes expanded per depth.
        extend_vocab: add the sequence's prompt tokens to a reduced draft vocabulary when the
            net's head is the target's frozen rows (see :class:`_DraftVocabulary`).

    .. code-block:: python

        drafter = EagleDrafter(net, depth=6, topk=4)
    """

    def __init__(self, net: BlockDrafterNet, depth: int = 6, topk: int = 4, extend_vocab: bool = True) -> None:
        if depth < 1 or topk < 1:
            raise ValueError(f"EagleDrafter: depth and topk must be >= 1, got depth={depth}, topk={topk}.")
        self.net, self.depth, self.topk = net.eval(), depth, topk
        self.feature_layers = _feature_layers(net)
        self.context = _ContextCache(self.net)
        self.vocab = _DraftVocabulary(self.net, extend_vocab)

    def reset(self) -> None:
        self.context.reset()
        self.vocab.reset()

    @torch.no_grad()
    def draft(self, request: DraftRequest) -> DraftTree:
        net, device = self.net, request.tokens.device
        ctx, vocab = self.context, self.vocab
        vocab.prepare(request)
        h, idx, mask = ctx.new_items(request)
        g, kv = net.run(h[None], idx, mask, ctx.kv)
        root = int(idx[-1])
        ctx.commit(kv, root + 1)
        cache_len = ctx.length
        visible = ctx.visible(root)
        tok: list[int] = []
        parent: list[int] = []
        score: list[float] = []
        src: list[Tensor] = []  # the output hidden that produced each node's distribution
        slots: list[list[int]] = []  # drafter-cache slots of a node's processed ancestors (itself once processed)

        def add_children(par: int, g_out: Tensor, base: float) -> list[int]:
            logp = torch.log_softmax(vocab.logits(g_out).float(), -1)
            top = logp.topk(min(self.topk, logp.numel()))
            ids = vocab.ids[top.indices].tolist()
            new = []
            for t, lp in zip(ids, top.values.tolist()):
                tok.append(t), parent.append(par), score.append(base + lp), src.append(g_out)
                slots.append(slots[par] if par >= 0 else [])
                new.append(len(tok) - 1)
            return new

        layer = add_children(-1, g[0, -1], 0.0)
        forwards = 1
        for d in range(2, self.depth + 1):
            frontier = sorted(layer, key=lambda i: (-score[i], i))[: self.topk]
            f = len(frontier)
            inputs = net.input_states(request.target.embed(torch.tensor([tok[i] for i in frontier], device=device))
                                      .to(h.dtype), torch.stack([src[i] for i in frontier]))
            mask = torch.zeros(f, cache_len + f, dtype=torch.bool, device=device)
            mask[:, : visible.numel()] = visible.to(device)
            rows = [r for r, i in enumerate(frontier) for _ in slots[i]]
            cols = [c for i in frontier for c in slots[i]]
            if rows:
                mask[rows, cols] = True
            mask[:, cache_len:] = torch.eye(f, dtype=torch.bool, device=device)
            positions = torch.full((f,), root + d - 1, device=device)
            g, kv = net.run(inputs[None], positions, mask, kv)
            for r, i in enumerate(frontier):
                slots[i] = slots[i] + [cache_len + r]
            cache_len += f
            forwards += 1
            layer = [c for r, i in enumerate(frontier) for c in add_children(i, g[0, r], score[i])]
        return _select_tree(tok, parent, score, request.budget, forwards)


def _select_tree(tok: list[int], parent: list[int], score: list[float], budget: int, forwards: int) -> DraftTree:
    """The ``budget`` best nodes (ancestors come first: scores never increase along a path)."""
    order = sorted(range(len(tok)), key=lambda i: (-score[i], i))[:budget]
    keep = sorted(order)
    new_index = {old: k for k, old in enumerate(keep)}
    parents = [new_index[parent[i]] if parent[i] >= 0 else -1 for i in keep]
    return DraftTree(torch.tensor([tok[i] for i in keep], dtype=torch.long),
                     torch.tensor(parents, dtype=torch.long), forwards=forwards,
                     info={"values": [math.exp(score[i]) for i in keep]})  # path probabilities


@dataclass
class _Block:
    hidden: Tensor  # (K, H) output hidden per block position
    tokens: list[list[int]]  # (K, R) target ids of the R best draft tokens per position
    accept: list[list[float]]  # (K, R) estimated acceptance of each rank
    slots: list[int]  # drafter-cache slot of each block position
    visible: list[int]  # slots the block's tokens attend to besides their own block
    depth0: int  # depth of the start node (0 = root)


class SpecBlockDrafter(Drafter):
    """SpecBlock: block-iterative drafting with block expansion and rank-head branching.

    Args:
        net: a :class:`BlockDrafterNet` with ``block_size = K``.
        blocks: drafter forwards per round (the first block plus ``blocks - 1`` expansions).
        expand: start nodes per expansion forward (all run in one batched forward).
        max_branch: most children per node (ranks considered per position; the rank head's
            buckets cover ranks up to 8).
        use_rank_head: branch by the rank head's acceptance estimate; ``False`` (ablation,
            and what a net without a rank head uses) branches by the draft probabilities.
        extend_vocab: add the sequence's prompt tokens to a reduced draft vocabulary when the
            net's head is the target's frozen rows (see :class:`_DraftVocabulary`).

    .. code-block:: python

        drafter = SpecBlockDrafter(net, blocks=2, expand=4)
        tree = drafter.draft(request)    # tree.forwards == 2
    """

    def __init__(self, net: BlockDrafterNet, blocks: int = 2, expand: int = 4, max_branch: int = 8,
                 use_rank_head: bool = True, extend_vocab: bool = True) -> None:
        if blocks < 1 or expand < 1 or max_branch < 1:
            raise ValueError(f"SpecBlockDrafter: blocks, expand, max_branch must be >= 1, got {blocks}, {expand}, "
                             f"{max_branch}.")
        if use_rank_head and max_branch > RANK_BUCKET_EDGES[-1]:
            raise ValueError(f"`max_branch` must be <= {RANK_BUCKET_EDGES[-1]} with the rank head, got {max_branch}.")
        self.net, self.blocks, self.expand, self.max_branch = net.eval(), blocks, expand, max_branch
        self.use_rank_head = use_rank_head and net.rank_head is not None
        self.feature_layers = _feature_layers(net)
        self.context = _ContextCache(self.net)
        self.vocab = _DraftVocabulary(self.net, extend_vocab)

    def _block_from_outputs(self, g: Tensor, slots: list[int], visible: list[int], depth0: int) -> _Block:
        net = self.net
        logits = self.vocab.logits(g).float()  # (K, Vd)
        top = logits.topk(min(self.max_branch, logits.shape[-1]), -1)
        if self.use_rank_head:
            acc = rank_probabilities(torch.softmax(net.bucket_logits(g).float(), -1))[:, : top.indices.shape[1]]
        else:
            acc = torch.softmax(logits, -1).gather(-1, top.indices)
        return _Block(g, self.vocab.ids[top.indices].tolist(), acc.tolist(), slots, visible, depth0)

    def reset(self) -> None:
        self.context.reset()
        self.vocab.reset()

    @torch.no_grad()
    def draft(self, request: DraftRequest) -> DraftTree:
        net, device = self.net, request.tokens.device
        k = net.block_size
        ctx = self.context
        self.vocab.prepare(request)
        # block 1 in the same forward as the context update: the new context items (the root's item last),
        # then K - 1 placeholders continuing the root's item (block position 1)
        h, idx, ctx_mask = ctx.new_items(request)
        m, c = h.shape[0], ctx.length
        root = int(idx[-1])
        visible = ctx_mask[-1]  # the root item's window over the cached entries and the new items
        x = torch.cat([h, net.placeholders.to(h.dtype)]) if k > 1 else h
        total = m + k - 1
        mask = torch.zeros(total, c + total, dtype=torch.bool, device=device)
        mask[:m, : c + m] = ctx_mask
        if k > 1:
            mask[m:, : c + m] = visible  # the root's window
            mask[m:, c + m - 1:] = torch.ones(k, k, dtype=torch.bool, device=device).tril()[1:]
        shift = torch.full((total,), -1, dtype=torch.long, device=device)
        shift[m:] = torch.arange(m - 1, total - 1, device=device)
        positions = torch.cat([idx, root + torch.arange(1, k, device=device)])
        g, kv = net.run(x[None], positions, mask, ctx.kv, shift)
        ctx.commit(kv, root + 1)
        vis_slots = torch.nonzero(visible).flatten().tolist()
        blocks = [self._block_from_outputs(g[0, m - 1:], list(range(c + m - 1, c + total)), vis_slots, 0)]
        cache_len, forwards = c + total, 1
        started: dict[tuple[int, int, int], int] = {}  # node key (block, j, r) -> block it starts
        for _ in range(1, self.blocks):
            nodes = self._select(blocks, started, request.budget)
            ends = [nd for nd in nodes if nd[2][1] == k - 1 and nd[2] not in started]
            pool = ends or [nd for nd in nodes if nd[2] not in started and not any(c2[3] == nd[0] for c2 in nodes)]
            starts = sorted(pool, key=lambda nd: -nd[1])[: self.expand]
            if not starts:
                break
            e = len(starts)
            emb = request.target.embed(torch.tensor([blocks[b].tokens[j][r] for _, _, (b, j, r), _ in starts],
                                                    device=device)).to(h.dtype)
            hid = torch.stack([blocks[b].hidden[j] for _, _, (b, j, _), _ in starts])
            first = net.input_states(emb, hid)  # (E, H)
            new = torch.cat([first[:, None], net.placeholders.to(h.dtype).expand(e, -1, -1)], 1).reshape(e * k, -1) \
                if k > 1 else first
            mask = torch.zeros(e * k, cache_len + e * k, dtype=torch.bool, device=device)
            rows, cols, pos_rows = [], [], []
            for s_, (_, _, (b, j, _), _) in enumerate(starts):
                blk = blocks[b]
                vis = blk.visible + blk.slots[: j + 1]
                rows += [s_ * k + q for q in range(k) for _ in vis]
                cols += [v for _ in range(k) for v in vis]
                pos_rows.append(root + blk.depth0 + j + 1 + torch.arange(k, device=device))
            mask[rows, cols] = True
            tri = torch.ones(k, k, dtype=torch.bool, device=device).tril()
            mask[:, cache_len:] = torch.block_diag(*([tri] * e))
            shift = torch.arange(-1, e * k - 1, device=device)
            shift[::k] = -1  # every block start has no predecessor in the block
            g, kv = net.run(new[None], torch.cat(pos_rows), mask, kv, shift)
            for s_, (_, _, key, _) in enumerate(starts):
                b, j, _ = key
                blk = blocks[b]
                slots = list(range(cache_len + s_ * k, cache_len + (s_ + 1) * k))
                blocks.append(self._block_from_outputs(g[0, s_ * k: (s_ + 1) * k], slots,
                                                       blk.visible + blk.slots[: j + 1], blk.depth0 + j + 1))
                started[key] = len(blocks) - 1
            cache_len += e * k
            forwards += 1
        nodes = self._select(blocks, started, request.budget)
        index = {nd[0]: i for i, nd in enumerate(nodes)}
        toks = [blocks[b].tokens[j][r] for _, _, (b, j, r), _ in nodes]
        parents = [index[p] if p >= 0 else -1 for _, _, _, p in nodes]
        return DraftTree(torch.tensor(toks, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                         forwards=forwards, info={"values": [nd[1] for nd in nodes]})

    def _select(self, blocks: list[_Block], started: dict[tuple[int, int, int], int],
                budget: int) -> list[tuple[int, float, tuple[int, int, int], int]]:
        """Best-first tree under ``budget``: nodes ``(id, value, (block, j, rank), parent id)`` in pop order."""
        k = self.net.block_size
        heap: list[tuple[float, int, tuple[int, int, int], int, float]] = []
        counter = 0

        def push_children(b: int, j: int, parent_id: int, value: float) -> None:
            nonlocal counter
            blk = blocks[b]
            for r, a in enumerate(blk.accept[j]):
                heapq.heappush(heap, (-(value * a), counter, (b, j, r), parent_id, value * a))
                counter += 1

        push_children(0, 0, -1, 1.0)
        chosen: list[tuple[int, float, tuple[int, int, int], int]] = []
        while heap and len(chosen) < budget:
            _, _, key, parent_id, value = heapq.heappop(heap)
            node_id = len(chosen)
            chosen.append((node_id, value, key, parent_id))
            b, j, _ = key
            if key in started:
                push_children(started[key], 0, node_id, value)
            elif j + 1 < k:
                push_children(b, j + 1, node_id, value)
        return chosen


class MedusaDrafter(Drafter):
    """Medusa-style parallel heads (baseline): one forward drafts every depth from the root's feature.

    Head ``d`` guesses the token ``d`` levels below the root without seeing the tokens above
    it, so a depth offers the same ``topk`` candidates under every parent; the tree keeps
    the ``budget`` best paths by the product of the heads' probabilities (Medusa's sparse
    tree built from the heads' own accuracy estimates, here their probabilities).

    Args:
        heads: a :class:`~lit_lowrank.models.spec_drafter.MedusaHeads`.
        topk: candidates per depth (children per node).

    .. code-block:: python

        drafter = MedusaDrafter(heads, topk=4)
        engine = SpeculativeDecoder(target, drafter, budget=24)
    """

    def __init__(self, heads: MedusaHeads, topk: int = 4) -> None:
        if topk < 1:
            raise ValueError(f"MedusaDrafter: `topk` must be >= 1, got {topk}.")
        self.heads, self.topk = heads.eval(), topk

    @torch.no_grad()
    def draft(self, request: DraftRequest) -> DraftTree:
        if request.features.shape[0] != request.tokens.numel() - 1 or request.features.shape[0] == 0:
            raise ValueError(f"DraftRequest: features {tuple(request.features.shape)} must have len(tokens) - 1 = "
                             f"{request.tokens.numel() - 1} >= 1 rows.")
        w = self.heads.heads[0].weight
        probs = torch.softmax(self.heads(request.features[-1].to(w.dtype)).float(), -1)  # (D, V)
        top = probs.topk(min(self.topk, probs.shape[-1]), -1)
        cand_tok, cand_p = self.heads.draft_vocab[top.indices].tolist(), top.values.tolist()
        depth_max = len(cand_tok)
        heap: list[tuple[float, int, int, int, int, float]] = []  # (-value, tie, depth, rank, parent, value)
        counter = 0
        for r, p in enumerate(cand_p[0]):
            heapq.heappush(heap, (-p, counter, 0, r, -1, p))
            counter += 1
        tok: list[int] = []
        parent: list[int] = []
        while heap and len(tok) < request.budget:
            _, _, d, r, par, value = heapq.heappop(heap)
            tok.append(cand_tok[d][r]), parent.append(par)
            node = len(tok) - 1
            if d + 1 < depth_max:
                for r2, p2 in enumerate(cand_p[d + 1]):
                    heapq.heappush(heap, (-(value * p2), counter, d + 1, r2, node, value * p2))
                    counter += 1
        return DraftTree(torch.tensor(tok, dtype=torch.long), torch.tensor(parent, dtype=torch.long), forwards=1)
