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

Both see the same inputs: the last ``context_window + 1`` committed positions (tokens and
the target's features) and, within the round, the tree drafted so far. No drafter KV
cache is kept across rounds (the target's feature at the root carries the context), so
nothing needs rolling back after verification.

.. code-block:: python

    drafter = SpecBlockDrafter(net, blocks=2, expand=4)
    engine = SpeculativeDecoder(target, drafter, budget=24)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_lowrank.decoding.engine import Drafter, DraftRequest, DraftTree
from lit_lowrank.models.spec_drafter import BlockDrafterNet, MedusaHeads
from lit_lowrank.ops.speculative import RANK_BUCKET_EDGES, rank_probabilities


def _context_inputs(net: BlockDrafterNet, request: DraftRequest) -> tuple[Tensor, Tensor]:
    """Input states ``(n, H)`` and positions ``(n,)`` of the last committed positions (the root last)."""
    tokens, features = request.tokens, request.features
    if features.shape[0] != tokens.numel() - 1:
        raise ValueError(f"DraftRequest: features {tuple(features.shape)} must have len(tokens) - 1 = "
                         f"{tokens.numel() - 1} rows.")
    n = min(net.context_window + 1, features.shape[0])
    idx = torch.arange(features.shape[0] - n, features.shape[0], device=tokens.device)
    dtype = net.fc.weight.dtype
    emb = request.target.embed(tokens[idx + 1]).to(dtype)
    return net.input_states(emb, features[idx].to(dtype)), idx


class EagleDrafter(Drafter):
    """EAGLE-style autoregressive feature drafter with a dynamic top-k tree (the main baseline).

    Args:
        net: a :class:`BlockDrafterNet` (trained with ``block_size=1`` for a faithful baseline).
        depth: tree depth = drafter forwards per round.
        topk: children per expanded node and nodes expanded per depth.

    .. code-block:: python

        drafter = EagleDrafter(net, depth=6, topk=4)
    """

    def __init__(self, net: BlockDrafterNet, depth: int = 6, topk: int = 4) -> None:
        if depth < 1 or topk < 1:
            raise ValueError(f"EagleDrafter: depth and topk must be >= 1, got depth={depth}, topk={topk}.")
        self.net, self.depth, self.topk = net.eval(), depth, topk

    @torch.no_grad()
    def draft(self, request: DraftRequest) -> DraftTree:
        net, device = self.net, request.tokens.device
        ctx, pos = _context_inputs(net, request)
        n = ctx.shape[0]
        g, kv = net.run(ctx[None], pos, torch.ones(n, n, dtype=torch.bool, device=device).tril())
        root_pos = int(pos[-1])
        tok: list[int] = []
        parent: list[int] = []
        score: list[float] = []
        src: list[Tensor] = []  # the output hidden that produced each node's distribution
        slot: list[int] = []  # drafter-cache slot of a processed node (-1 until processed)

        def add_children(par: int, g_out: Tensor, base: float) -> list[int]:
            logp = torch.log_softmax(net.logits(g_out).float(), -1)
            top = logp.topk(min(self.topk, logp.numel()))
            ids = net.draft_vocab[top.indices].tolist()
            new = []
            for t, lp in zip(ids, top.values.tolist()):
                tok.append(t), parent.append(par), score.append(base + lp), src.append(g_out), slot.append(-1)
                new.append(len(tok) - 1)
            return new

        layer = add_children(-1, g[0, -1], 0.0)
        cache_len = n
        forwards = 1
        for d in range(2, self.depth + 1):
            frontier = sorted(layer, key=lambda i: (-score[i], i))[: self.topk]
            f = len(frontier)
            inputs = net.input_states(request.target.embed(torch.tensor([tok[i] for i in frontier], device=device))
                                      .to(ctx.dtype), torch.stack([src[i] for i in frontier]))
            mask = torch.zeros(f, cache_len + f, dtype=torch.bool, device=device)
            mask[:, :n] = True
            for r, i in enumerate(frontier):
                a = parent[i]
                while a >= 0:
                    mask[r, slot[a]] = True
                    a = parent[a]
                mask[r, cache_len + r] = True
            positions = torch.full((f,), root_pos + d - 1, device=device)
            g, kv = net.run(inputs[None], positions, mask, kv)
            for r, i in enumerate(frontier):
                slot[i] = cache_len + r
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
                     torch.tensor(parents, dtype=torch.long), forwards=forwards)


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

    .. code-block:: python

        drafter = SpecBlockDrafter(net, blocks=2, expand=4)
        tree = drafter.draft(request)    # tree.forwards == 2
    """

    def __init__(self, net: BlockDrafterNet, blocks: int = 2, expand: int = 4, max_branch: int = 8,
                 use_rank_head: bool = True) -> None:
        if blocks < 1 or expand < 1 or max_branch < 1:
            raise ValueError(f"SpecBlockDrafter: blocks, expand, max_branch must be >= 1, got {blocks}, {expand}, "
                             f"{max_branch}.")
        if use_rank_head and max_branch > RANK_BUCKET_EDGES[-1]:
            raise ValueError(f"`max_branch` must be <= {RANK_BUCKET_EDGES[-1]} with the rank head, got {max_branch}.")
        self.net, self.blocks, self.expand, self.max_branch = net.eval(), blocks, expand, max_branch
        self.use_rank_head = use_rank_head and net.rank_head is not None

    def _block_from_outputs(self, g: Tensor, slots: list[int], visible: list[int], depth0: int) -> _Block:
        net = self.net
        logits = net.logits(g).float()  # (K, Vd)
        top = logits.topk(min(self.max_branch, logits.shape[-1]), -1)
        if self.use_rank_head:
            acc = rank_probabilities(torch.softmax(net.bucket_logits(g).float(), -1))[:, : top.indices.shape[1]]
        else:
            acc = torch.softmax(logits, -1).gather(-1, top.indices)
        return _Block(g, net.draft_vocab[top.indices].tolist(), acc.tolist(), slots, visible, depth0)

    @torch.no_grad()
    def draft(self, request: DraftRequest) -> DraftTree:
        net, device = self.net, request.tokens.device
        k = net.block_size
        ctx, pos = _context_inputs(net, request)
        n = ctx.shape[0]
        root_pos = int(pos[-1])
        # block 1: the root's context position is block position 1, K - 1 placeholders follow
        h = torch.cat([ctx, net.placeholders.to(ctx.dtype)]) if k > 1 else ctx
        m = n + k - 1
        mask = torch.ones(m, m, dtype=torch.bool, device=device).tril()
        shift = torch.full((m,), -1, dtype=torch.long, device=device)
        shift[n:] = torch.arange(n - 1, m - 1, device=device)
        positions = torch.cat([pos, root_pos + torch.arange(1, k, device=device)])
        g, kv = net.run(h[None], positions, mask, None, shift)
        blocks = [self._block_from_outputs(g[0, n - 1:], list(range(n - 1, m)), list(range(n)), 0)]
        cache_len, forwards = m, 1
        started: dict[tuple[int, int, int], int] = {}  # node key (block, j, r) -> block it starts
        for _ in range(1, self.blocks):
            nodes = self._select(blocks, started, request.budget)
            ends = [nd for nd in nodes if nd[2][1] == k - 1 and nd[2] not in started]
            pool = ends or [nd for nd in nodes if nd[2] not in started and not any(c[3] == nd[0] for c in nodes)]
            starts = sorted(pool, key=lambda nd: -nd[1])[: self.expand]
            if not starts:
                break
            e = len(starts)
            inputs, vis_rows, pos_rows = [], [], []
            for _, _, (b, j, r), _ in starts:
                blk = blocks[b]
                emb = request.target.embed(torch.tensor([blk.tokens[j][r]], device=device)).to(ctx.dtype)
                inputs.append(torch.cat([net.input_states(emb, blk.hidden[j: j + 1]),
                                         net.placeholders.to(ctx.dtype)]))
                vis_rows.append(blk.visible + blk.slots[: j + 1])
                pos_rows.append(root_pos + blk.depth0 + j + 1 + torch.arange(k, device=device))
            new = torch.cat(inputs)  # (E*K, H)
            mask = torch.zeros(e * k, cache_len + e * k, dtype=torch.bool, device=device)
            shift = torch.full((e * k,), -1, dtype=torch.long, device=device)
            for s, vis in enumerate(vis_rows):
                rows = slice(s * k, (s + 1) * k)
                mask[rows, vis] = True
                mask[rows, cache_len + s * k: cache_len + (s + 1) * k] = torch.ones(k, k, dtype=torch.bool).tril()
                shift[s * k + 1: (s + 1) * k] = torch.arange(s * k, (s + 1) * k - 1, device=device)
            g, kv = net.run(new[None], torch.cat(pos_rows), mask, kv, shift)
            for s, (_, _, key, _) in enumerate(starts):
                b, j, _ = key
                blk = blocks[b]
                slots = list(range(cache_len + s * k, cache_len + (s + 1) * k))
                blocks.append(self._block_from_outputs(g[0, s * k: (s + 1) * k], slots,
                                                       blk.visible + blk.slots[: j + 1], blk.depth0 + j + 1))
                started[key] = len(blocks) - 1
            cache_len += e * k
            forwards += 1
        nodes = self._select(blocks, started, request.budget)
        index = {nd[0]: i for i, nd in enumerate(nodes)}
        toks = [blocks[b].tokens[j][r] for _, _, (b, j, r), _ in nodes]
        parents = [index[p] if p >= 0 else -1 for _, _, _, p in nodes]
        return DraftTree(torch.tensor(toks, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                         forwards=forwards)

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
        cand_tok, cand_p = top.indices.tolist(), top.values.tolist()
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
