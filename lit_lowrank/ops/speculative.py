"""The math of lossless tree speculative decoding and of SpecBlock's training targets (no Lightning).

A draft tree is given by ``parents``: a long tensor ``(N,)`` in topological order where
``parents[i] < i`` is the index of node ``i``'s parent and ``-1`` marks a child of the
root. The root (the token the target already chose) is *not* part of these ``N`` nodes
unless a caller includes it as node 0 with parent ``-1``.

- :func:`tree_depths`, :func:`tree_ancestor_matrix`, :func:`tree_position_ids`,
  :func:`tree_attention_mask`: what one target forward over the whole tree needs
  (mask[i, j] = 1 iff j is an ancestor of i or i itself; position = prefix length + depth).
- :func:`tree_layout` validates a rooted tree once per round and precomputes its ancestor
  matrix and depths (:class:`TreeLayout`; a chain is detected and needs no mask);
  :func:`accept_greedy` / :func:`accept_sampling` verify on it.
- :func:`greedy_tree_accept`: the longest path whose tokens are the target's argmax.
- :func:`recursive_rejection_sample` and :func:`sampling_tree_accept`: the speculative
  sampling acceptance rule generalised to several candidates per node (SpecInfer's
  multi-round rule); with deterministic candidates (``q`` one-hot) it accepts candidate
  ``x`` with probability ``p_res(x)`` and removes it from ``p_res`` on rejection. Either way
  the emitted token is distributed exactly as ``p``.
- :func:`valid_prefix_mask`, :func:`masked_block_loss`: SpecBlock's loss mask
  ``mask_j = prod_{i<j} 1[argmax q_i = y_i]``.
- :func:`rank_bucket_targets`, :func:`rank_probabilities`: the rank head's targets (the
  bucket of the target token's rank in the drafter's sorted distribution) and the
  per-rank acceptance estimate it implies.

.. code-block:: python

    from lit_lowrank.ops.speculative import tree_attention_mask, tree_position_ids

    parents = torch.tensor([-1, -1, 0, 0, 2])       # two children of the root, ...
    mask = tree_attention_mask(parents)              # (5, 5) bool
    pos = tree_position_ids(parents, prefix_len=10)  # tensor([10, 10, 11, 11, 12])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: Upper rank edges of the rank head's buckets: {1}, {2}, {3-4}, {5-8}; anything beyond is "miss".
RANK_BUCKET_EDGES: tuple[int, ...] = (1, 2, 4, 8)


def _check_parents(parents: Tensor) -> Tensor:
    if not isinstance(parents, Tensor) or parents.dim() != 1 or parents.dtype not in (torch.long, torch.int32):
        raise ValueError(f"`parents` must be an integer tensor (N,), got {getattr(parents, 'shape', parents)!r}.")
    n = parents.numel()
    if n and (parents < -1).any():
        raise ValueError(f"`parents` entries must be >= -1, got {parents.tolist()}.")
    if n and (parents >= torch.arange(n, device=parents.device)).any():
        raise ValueError(f"`parents` must be topologically ordered (parents[i] < i), got {parents.tolist()}.")
    return parents.long()


def _ancestors(parents: Tensor) -> Tensor:
    """``(N, N)`` bool ancestor-or-self matrix of *validated* parents, by pointer doubling.

    ``ceil(log2(depth)) + 1`` rounds of a few tensor ops (no per-node Python loop): row ``i``
    starts as ``{i, parent(i)}`` and each round ORs in the row of the farthest ancestor
    reached so far, doubling the covered stretch of the path.
    """
    n = parents.numel()
    anc = torch.eye(n, dtype=torch.bool, device=parents.device)
    if n == 0:
        return anc
    rows = torch.arange(n, device=parents.device)
    has = parents >= 0
    anc[rows[has], parents[has]] = True
    jump = torch.where(has, parents, rows)  # a root child jumps to itself: its row is already complete
    while True:
        nxt = jump[jump]
        anc |= anc[jump]
        if torch.equal(nxt, jump):
            return anc
        jump = nxt


def tree_depths(parents: Tensor) -> Tensor:
    """Depth of every node: 1 for a child of the root, parent's depth + 1 otherwise.

    Args:
        parents: ``(N,)`` parent indices (``-1`` = root), topologically ordered.

    Returns:
        ``(N,)`` long depths.

    .. code-block:: python

        tree_depths(torch.tensor([-1, 0, 0, 1]))   # tensor([1, 2, 2, 3])
    """
    return _ancestors(_check_parents(parents)).sum(-1)


def tree_ancestor_matrix(parents: Tensor) -> Tensor:
    """``A[i, j] = True`` iff node ``j`` is node ``i`` or one of its ancestors (``(N, N)`` bool).

    .. code-block:: python

        tree_ancestor_matrix(torch.tensor([-1, 0, -1]))
        # [[T, F, F], [T, T, F], [F, F, T]]
    """
    return _ancestors(_check_parents(parents))


def tree_attention_mask(parents: Tensor, prefix_len: int = 0) -> Tensor:
    """Boolean attention mask ``(N, prefix_len + N)`` of a tree verified after a cached prefix.

    Every node sees the whole prefix, itself and its ancestors; nothing else.

    Args:
        parents: ``(N,)`` parent indices (``-1`` = the last prefix token).
        prefix_len: number of cached tokens before the tree.

    .. code-block:: python

        mask = tree_attention_mask(torch.tensor([-1, -1, 0]), prefix_len=4)   # (3, 7)
    """
    if prefix_len < 0:
        raise ValueError(f"`prefix_len` must be >= 0, got {prefix_len}.")
    anc = tree_ancestor_matrix(parents)
    prefix = torch.ones(anc.shape[0], prefix_len, dtype=torch.bool, device=anc.device)
    return torch.cat([prefix, anc], dim=1)


def tree_position_ids(parents: Tensor, prefix_len: int) -> Tensor:
    """Position id of every node: ``prefix_len + depth - 1`` (a child of the root sits at ``prefix_len``).

    With the root itself included as node 0 (parent ``-1``) it gets ``prefix_len`` and its
    children ``prefix_len + 1``: position = prefix length + depth counted from the root.

    .. code-block:: python

        tree_position_ids(torch.tensor([-1, 0, 0, 1]), prefix_len=5)   # tensor([5, 6, 6, 7])
    """
    return prefix_len + tree_depths(parents) - 1


def additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """A boolean mask ``(..., Q, K)`` as an additive ``(1, 1, Q, K)`` float mask (0 / dtype min)."""
    out = torch.zeros(mask.shape[-2:], dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask.reshape(mask.shape[-2:]), torch.finfo(dtype).min)[None, None]


def children_lists(parents: Tensor) -> list[list[int]]:
    """``children[i + 1]`` lists node ``i``'s children in index order; ``children[0]`` the root's."""
    parents = _check_parents(parents)
    children: list[list[int]] = [[] for _ in range(parents.numel() + 1)]
    for i, p in enumerate(parents.tolist()):
        children[p + 1].append(i)
    return children


@dataclass(frozen=True)
class TreeLayout:
    """A verified tree ``(tokens, parents)`` with node 0 the root, checked once, and what one
    target forward over it needs.

    Attributes:
        tokens: ``(N,)`` node tokens, ``tokens[0]`` the root.
        parents: ``(N,)`` parents, ``parents[0] == -1``, every other node below node 0.
        chain: the tree is a chain ``0 <- 1 <- 2 ...`` (plain causal attention suffices).
        ancestors: ``(N, N)`` ancestor-or-self matrix (``None`` for a chain).
        depths: ``(N,)`` depth from the root (root 0).
    """

    tokens: Tensor
    parents: Tensor
    chain: bool
    ancestors: Tensor | None
    depths: Tensor

    @property
    def size(self) -> int:
        return self.tokens.numel()

    def attention_mask(self, prefix_len: int) -> Tensor | None:
        """``(N, prefix_len + N)`` bool, or ``None`` for a chain (causal attention)."""
        if self.chain:
            return None
        ones = torch.ones(self.size, prefix_len, dtype=torch.bool, device=self.tokens.device)
        return torch.cat([ones, self.ancestors], dim=1)

    def position_ids(self, prefix_len: int) -> Tensor:
        """``(N,)`` positions: ``prefix_len + depth`` (the root sits at ``prefix_len``)."""
        return prefix_len + self.depths


def tree_layout(tokens: Tensor, parents: Tensor) -> TreeLayout:
    """Validate a rooted tree once (node 0 = the root, siblings distinct) and precompute its layout.

    Args:
        tokens: ``(N,)`` node tokens, node 0 the root.
        parents: ``(N,)`` parents, ``parents[0] == -1`` and no other node has parent ``-1``.

    .. code-block:: python

        layout = tree_layout(torch.tensor([9, 5, 6, 7]), torch.tensor([-1, 0, 0, 1]))
        layout.position_ids(10)      # tensor([10, 11, 11, 12])
    """
    parents = _check_parents(parents)
    if tokens.shape != parents.shape:
        raise ValueError(f"`tokens` {tuple(tokens.shape)} and `parents` {tuple(parents.shape)} must have one shape.")
    n = parents.numel()
    if n == 0 or parents[0] != -1 or (parents[1:] == -1).any():
        raise ValueError(f"node 0 must be the only root child (the verified root), got parents={parents.tolist()}.")
    index = torch.arange(n, device=parents.device)
    if torch.equal(parents, index - 1):
        return TreeLayout(tokens, parents, True, None, index)
    tokens = tokens.long()
    key = parents * (int(tokens.max()) + 1) + tokens  # (parent, token) pairs must be distinct among siblings
    if torch.unique(key).numel() != n:
        kids = [[int(t) for t, p in zip(tokens.tolist(), parents.tolist()) if p == q] for q in range(n)]
        node = next(q for q, k in enumerate(kids) if len(set(k)) != len(k))
        raise ValueError(f"node {node} has repeated child tokens {kids[node]}; siblings must differ.")
    anc = _ancestors(parents)
    return TreeLayout(tokens, parents, False, anc, anc.sum(-1) - 1)


def accept_greedy(layout: TreeLayout, target_argmax: Tensor) -> tuple[list[int], int]:
    """Greedy verification on a :class:`TreeLayout`: the path whose tokens are the target's argmax.

    Vectorised: node ``i`` *matches* when its token is its parent's argmax; a node is accepted
    when it and all its ancestors below the root match (siblings are distinct, so the accepted
    nodes form one path); the bonus is the argmax at the deepest accepted node.
    """
    tokens = layout.tokens.to(target_argmax.device)
    if layout.chain:
        ok = tokens[1:] == target_argmax[:-1]
        accepted = int(ok.long().cumprod(0).sum())
        return list(range(accepted + 1)), int(target_argmax[accepted])
    match = torch.ones_like(tokens, dtype=torch.bool)
    match[1:] = tokens[1:] == target_argmax[layout.parents[1:]]
    anc = layout.ancestors.to(match.device)
    good = ~(anc & ~match[None, :]).any(-1)  # (N,) every ancestor-or-self matches
    path = torch.nonzero(good).flatten()  # ancestors come first: topological order
    return path.tolist(), int(target_argmax[path[-1]])


def greedy_tree_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> tuple[list[int], int]:
    """Greedy verification: follow the children whose token equals the target's argmax.

    Args:
        tokens: ``(N,)`` drafted tokens; node 0 must be the root (parent ``-1``, already accepted).
        parents: ``(N,)`` parent indices, ``parents[0] == -1`` and no other node has parent ``-1``.
        target_argmax: ``(N,)`` the target's argmax at every node (its next token there).

    Returns:
        ``(path, bonus)``: the accepted node indices from the root (``path[0] == 0``) and the
        target's token after the last accepted node.

    .. code-block:: python

        path, bonus = greedy_tree_accept(tokens, parents, logits.argmax(-1))
    """
    return accept_greedy(tree_layout(tokens, parents), target_argmax)


def recursive_rejection_sample(
    p: Tensor, candidates: Sequence[int], q: Tensor | None = None, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Multi-candidate speculative sampling at one node (lossless for any candidate rule).

    Candidates are tried in order. With ``q`` (rows: the drafter's distribution each
    candidate was drawn from, ``(C, V)``), candidate ``x`` is accepted with probability
    ``min(1, p_res(x) / q(x))`` and on rejection ``p_res <- norm(max(p_res - q, 0))``
    (Leviathan et al. / SpecInfer). With ``q=None`` the candidates are deterministic
    (``q`` one-hot): accept with probability ``p_res(x)``, on rejection zero ``x`` in
    ``p_res``. If every candidate is rejected a token is drawn from ``p_res``.
    The returned token is distributed exactly as ``p``.

    Args:
        p: ``(V,)`` the target's probabilities at the node.
        candidates: drafted tokens (distinct when ``q`` is ``None``).
        q: optional ``(C, V)`` proposal distributions, one row per candidate.
        generator: random generator (reproducible sampling).

    Returns:
        ``(index, token)``: the accepted candidate's index and its token, or ``(-1, token)``
        with a token drawn from the residual distribution.

    .. code-block:: python

        idx, tok = recursive_rejection_sample(torch.softmax(logits, -1), [5, 9])
    """
    if p.dim() != 1:
        raise ValueError(f"`p` must be (V,), got shape {tuple(p.shape)}.")
    if q is not None and (q.dim() != 2 or q.shape[0] != len(candidates) or q.shape[1] != p.shape[0]):
        raise ValueError(f"`q` must be (len(candidates)={len(candidates)}, V={p.shape[0]}), got {tuple(q.shape)}.")
    residual = p.double().clone()
    for i, x in enumerate(candidates):
        u = torch.rand((), generator=generator, dtype=torch.float64, device=p.device)
        total = residual.sum()
        if q is None:
            accept = u * total < residual[x]
            if accept:
                return i, int(x)
            residual[x] = 0.0
        else:
            qi = q[i].double()
            if qi[x] <= 0:
                raise ValueError(f"candidate {x} has zero probability under its proposal q[{i}].")
            accept = u * qi[x] * total < residual[x]
            if accept:
                return i, int(x)
            residual = torch.clamp(residual / total - qi, min=0.0)
        if residual.sum() <= 0:  # unreachable: a candidate holding all the residual mass is accepted surely
            raise RuntimeError("speculative sampling: the residual distribution vanished (p is not normalised?).")
    token = torch.multinomial(residual / residual.sum(), 1, generator=generator).item()
    return -1, int(token)


def accept_sampling(layout: TreeLayout, target_probs: Tensor,
                    generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Sampling verification on a :class:`TreeLayout` (see :func:`sampling_tree_accept`)."""
    tok = layout.tokens.tolist()
    children: list[list[int]] = [[] for _ in tok]
    for i, p in enumerate(layout.parents.tolist()[1:], start=1):
        children[p].append(i)
    path = [0]
    while True:
        node = path[-1]
        kids = children[node]
        idx, token = recursive_rejection_sample(target_probs[node], [tok[c] for c in kids], None, generator)
        if idx < 0:
            return path, token
        path.append(kids[idx])


def sampling_tree_accept(
    tokens: Tensor, parents: Tensor, target_probs: Tensor, generator: torch.Generator | None = None
) -> tuple[list[int], int]:
    """Sampling verification of a tree with deterministic candidates (lossless).

    From the root, the children of the current node are the candidates of
    :func:`recursive_rejection_sample` (``q=None``) under the target's probabilities at
    that node; an accepted child becomes the current node, otherwise the residual sample
    is the bonus token. At a leaf the bonus is drawn from the target's probabilities.

    Args:
        tokens: ``(N,)`` node tokens, node 0 the root.
        parents: ``(N,)`` parents, ``parents[0] == -1``.
        target_probs: ``(N, V)`` the target's (temperature-scaled) next-token probabilities.
        generator: random generator.

    Returns:
        ``(path, bonus)`` as in :func:`greedy_tree_accept`.

    .. code-block:: python

        path, bonus = sampling_tree_accept(tokens, parents, torch.softmax(logits / 0.8, -1))
    """
    return accept_sampling(tree_layout(tokens, parents), target_probs, generator)


def valid_prefix_mask(draft_logits: Tensor, targets: Tensor, valid: Tensor | None = None) -> Tensor:
    """SpecBlock's valid-prefix mask: ``mask_j = prod_{i<j} 1[argmax q_i = y_i]`` along the block axis.

    Position ``j`` of a block is trained only if the drafter got every earlier position of
    the same block right: at inference it never drafts on a wrong prefix that survives
    verification. ``valid`` (optional, e.g. document boundaries / padding) also cuts the
    prefix: an invalid position masks itself and everything after it.

    Args:
        draft_logits: ``(..., K, V)`` the drafter's logits for the K block positions.
        targets: ``(..., K)`` target token ids (negative = ignore).
        valid: optional ``(..., K)`` bool.

    Returns:
        ``(..., K)`` float mask in {0, 1}; position 0 is 1 unless invalid.

    .. code-block:: python

        mask = valid_prefix_mask(logits, y)             # (B, T, K)
        loss = (mask * ce).sum() / mask.sum().clamp(min=1)
    """
    if draft_logits.shape[:-1] != targets.shape:
        raise ValueError(f"`draft_logits` {tuple(draft_logits.shape)} must be `targets` {tuple(targets.shape)} + (V,).")
    ok = targets >= 0
    if valid is not None:
        ok = ok & valid.bool()
    correct = (draft_logits.argmax(-1) == targets) & ok
    # position j needs all i < j correct: exclusive cumulative product of `correct`
    before = torch.cumprod(correct.float(), dim=-1)
    before = torch.cat([torch.ones_like(before[..., :1]), before[..., :-1]], dim=-1)
    return before * ok.float()


def masked_block_loss(per_position: Tensor, mask: Tensor) -> Tensor:
    """``sum(mask * loss) / sum(mask)`` (0 when nothing is valid), the masked block objective."""
    return (per_position * mask).sum() / mask.sum().clamp(min=1.0)


def target_ranks(draft_logits: Tensor, targets: Tensor) -> Tensor:
    """1-based rank of each target token in the drafter's sorted distribution (ties count in its favour).

    Targets outside the vocabulary (negative) get rank ``V + 1``.
    """
    safe = targets.clamp(min=0)
    picked = draft_logits.gather(-1, safe.unsqueeze(-1))
    rank = (draft_logits > picked).sum(-1) + 1
    return torch.where(targets >= 0, rank, torch.full_like(rank, draft_logits.shape[-1] + 1))


def rank_bucket_targets(draft_logits: Tensor, targets: Tensor, edges: Sequence[int] = RANK_BUCKET_EDGES) -> Tensor:
    """Bucket of the target token's rank: ``{1}, {2}, {3-4}, {5-8}, miss`` -> ``0..4`` with the default edges.

    Args:
        draft_logits: ``(..., V)`` drafter logits.
        targets: ``(...)`` target ids; a negative id (not in the draft vocabulary) is a miss.
        edges: increasing upper rank edges of the buckets; ``len(edges)`` is the miss bucket.

    .. code-block:: python

        buckets = rank_bucket_targets(logits, y)   # long, same shape as y
    """
    edges_t = torch.tensor(list(edges), device=draft_logits.device)
    if edges_t.numel() == 0 or (edges_t[1:] <= edges_t[:-1]).any() or edges_t[0] < 1:
        raise ValueError(f"`edges` must be increasing positive ranks, got {list(edges)}.")
    return torch.bucketize(target_ranks(draft_logits, targets), edges_t, right=False)


def rank_probabilities(bucket_probs: Tensor, edges: Sequence[int] = RANK_BUCKET_EDGES) -> Tensor:
    """Per-rank probability that the target token is the drafter's rank-``r`` token, ``r = 1..edges[-1]``.

    A bucket's mass is spread evenly over its ranks (``{3-4}``: half each); the miss bucket
    is dropped. This is the acceptance estimate the rank head gives each branch.

    Args:
        bucket_probs: ``(..., len(edges) + 1)`` probabilities over the buckets.

    Returns:
        ``(..., edges[-1])``.
    """
    if bucket_probs.shape[-1] != len(edges) + 1:
        raise ValueError(f"`bucket_probs` last dim must be {len(edges) + 1}, got {bucket_probs.shape[-1]}.")
    lows = [1, *[e + 1 for e in edges[:-1]]]
    cols = []
    for b, (lo, hi) in enumerate(zip(lows, edges)):
        cols += [bucket_probs[..., b] / (hi - lo + 1)] * (hi - lo + 1)
    return torch.stack(cols, dim=-1)
