"""Prompt lookup in the engine, and the hybrid tree: n-gram candidates beside a model drafter's tree, one verify.

- :class:`NgramDrafter`: prompt-lookup decoding (Saxena 2023; transformers'
  ``prompt_lookup_num_tokens``) as a drafter of this engine: the last ``n`` committed tokens
  are looked up earlier in the sequence (prompt and answer so far, longest ``n`` first) and
  the tokens that followed *every* match form a trie (distinct continuations branch).
- :class:`HybridDrafter`: merges the n-gram trie with a model drafter's tree (SpecBlock,
  EAGLE-style) into one tree and verifies it in one target forward. Every node carries an
  estimate of the probability that its path is accepted: the model drafter's (SpecBlock: the
  rank head's per-rank acceptance, multiplied along the path), the n-gram source's acceptance
  rate per match length. Both are calibrated online from the verifier's feedback (accepted /
  proposed among nodes whose parent was accepted). The tree is then *sized* by the machine's
  verification cost (:class:`~lit_lowrank.decoding.cost.VerifyCost`): the best ``n`` nodes
  maximising expected tokens per unit of time, ``n = 0`` (a plain step) when no draft pays.

Greedy output stays identical to the target's (verification is the engine's, lossless).

.. code-block:: python

    from lit_lowrank.decoding import HybridDrafter, NgramDrafter, SpecBlockDrafter, SpeculativeDecoder
    from lit_lowrank.decoding.cost import fit_verify_cost

    cost = fit_verify_cost(target, prompt)
    drafter = HybridDrafter(SpecBlockDrafter(net, blocks=1), NgramDrafter(), cost=cost)
    out, stats = SpeculativeDecoder(target, drafter, budget=32).generate(prompt, 64)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lit_lowrank.decoding.cost import VerifyCost
from lit_lowrank.decoding.engine import Drafter, DraftRequest, DraftTree, RoundFeedback

#: Prior per-token acceptance of an n-gram candidate by match length (1, 2, >= 3 tokens), before feedback.
NGRAM_PRIOR: dict[int, float] = {1: 0.3, 2: 0.5, 3: 0.65}


def ngram_continuations(tokens: Tensor, max_ngram: int = 3, min_ngram: int = 1, length: int = 10,
                        max_matches: int = 4) -> tuple[int, list[list[int]]]:
    """Continuations of the longest suffix n-gram of ``tokens`` that occurs earlier in ``tokens``.

    Args:
        tokens: ``(T,)`` the sequence so far (its last token is the one to continue).
        max_ngram / min_ngram: suffix lengths tried, longest first (the first that matches wins).
        length: tokens per continuation.
        max_matches: most matches used (the most recent first).

    Returns:
        ``(n, continuations)``: the matched length (``0``: none) and each match's following tokens.

    .. code-block:: python

        ngram_continuations(torch.tensor([5, 6, 7, 1, 5, 6]), length=2)    # (2, [[7, 1]])
    """
    if not 1 <= min_ngram <= max_ngram or length < 1 or max_matches < 1:
        raise ValueError(f"ngram_continuations: need 1 <= min_ngram <= max_ngram, length >= 1, max_matches >= 1; got "
                         f"{min_ngram}, {max_ngram}, {length}, {max_matches}.")
    t = tokens.numel()
    for n in range(min(max_ngram, t - 1), min_ngram - 1, -1):
        windows = tokens[: t - 1].unfold(0, n, 1)  # starts 0..t-1-n: the suffix itself (start t-n) is excluded
        hits = torch.nonzero((windows == tokens[t - n:]).all(-1)).flatten()
        if hits.numel() == 0:
            continue
        out = []
        for start in reversed(hits.tolist()):
            cont = tokens[start + n: start + n + length].tolist()
            if cont and cont not in out:
                out.append(cont)
            if len(out) == max_matches:
                break
        return n, out
    return 0, []


class NgramDrafter(Drafter):
    """Prompt lookup as a drafter: the continuations of the last n-gram's earlier matches, as a trie.

    Args:
        max_ngram / min_ngram: suffix lengths looked up, longest first.
        length: tokens per continuation (the trie's depth).
        max_matches: continuations merged into the trie.

    ``draft`` returns the trie (every node, capped at the budget, shallow nodes first); its
    ``info["ngram"]`` is the matched length and ``info["share"]`` each node's fraction of the
    matches passing through it.

    .. code-block:: python

        engine = SpeculativeDecoder(target, NgramDrafter(length=10), budget=10)
    """

    uses_features = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, length: int = 10, max_matches: int = 4) -> None:
        ngram_continuations(torch.zeros(1, dtype=torch.long), max_ngram, min_ngram, length, max_matches)  # checks
        self.max_ngram, self.min_ngram, self.length, self.max_matches = max_ngram, min_ngram, length, max_matches

    def trie(self, tokens: Tensor) -> tuple[int, list[int], list[int], list[float]]:
        """``(n, tokens, parents, share)`` of the continuation trie in breadth-first order (parents ``-1`` = root)."""
        n, conts = ngram_continuations(tokens, self.max_ngram, self.min_ngram, self.length, self.max_matches)
        tok: list[int] = []
        par: list[int] = []
        count: list[int] = []
        index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for cont in conts:
            parent = -1
            for x in cont:
                node = index.get((parent, x))
                if node is None:
                    node = index[(parent, x)] = len(tok)
                    tok.append(x), par.append(parent), count.append(0)
                count[node] += 1
                parent = node
        depth = [0] * len(tok)
        for i, p in enumerate(par):
            depth[i] = 0 if p < 0 else depth[p] + 1
        order = sorted(range(len(tok)), key=lambda i: (depth[i], -count[i], i))  # parents before children
        new = {old: k for k, old in enumerate(order)}
        total = max(len(conts), 1)
        return (n, [tok[i] for i in order], [new[par[i]] if par[i] >= 0 else -1 for i in order],
                [count[i] / total for i in order])

    def draft(self, request: DraftRequest) -> DraftTree:
        n, tok, par, share = self.trie(request.tokens)
        tok, par, share = tok[: request.budget], par[: request.budget], share[: request.budget]
        return DraftTree(torch.tensor(tok, dtype=torch.long), torch.tensor(par, dtype=torch.long), forwards=0,
                         info={"ngram": n, "share": share})


@dataclass
class _Rate:
    """A Beta-smoothed acceptance rate: ``(accepted + prior * strength) / (proposed + strength)``."""

    prior: float
    strength: float = 4.0
    accepted: float = 0.0
    proposed: float = 0.0

    @property
    def value(self) -> float:
        return (self.accepted + self.prior * self.strength) / (self.proposed + self.strength)


@dataclass
class _Node:
    token: int
    parent: int  # index into the merged node list, -1 = root
    cond: float  # estimated P(accepted | parent accepted)
    sources: dict[str, float] = field(default_factory=dict)  # source -> its own conditional estimate


class HybridDrafter(Drafter):
    """A model drafter's tree and prompt-lookup candidates merged into one tree, sized by the verify cost.

    Args:
        drafter: the model drafter (``SpecBlockDrafter``, ``EagleDrafter``, any drafter whose
            ``DraftTree.info["values"]`` gives each node's path-acceptance estimate; without it
            its nodes get a calibrated constant per depth), or ``None`` for prompt lookup alone.
        ngram: the n-gram source (``None``: the model drafter alone, still sized by ``cost``).
        cost: the verification cost model (fit it on the machine with
            :func:`~lit_lowrank.decoding.cost.fit_verify_cost`); ``None``: every candidate is
            verified up to the budget (no sizing).
        model_budget: nodes asked of the model drafter (``None``: the engine's budget).
        calibrate: scale each source's estimates by its observed acceptance (online, kept
            across sequences; :meth:`forget` clears it).

    The engine's ``budget`` caps the merged tree. Drafting time counts in the sizing (the
    running mean drafting time over ``cost.step_seconds``, when the step time is known).

    .. code-block:: python

        drafter = HybridDrafter(SpecBlockDrafter(net, blocks=1), NgramDrafter(), cost=fit_verify_cost(target, p))
        out, stats = SpeculativeDecoder(target, drafter, budget=32).generate(prompt, 64)
    """

    def __init__(self, drafter: Drafter | None, ngram: NgramDrafter | None = None, cost: VerifyCost | None = None,
                 model_budget: int | None = None, calibrate: bool = True) -> None:
        if drafter is None and ngram is None:
            raise ValueError("HybridDrafter: give a model `drafter`, an `ngram` source, or both.")
        if drafter is not None and not isinstance(drafter, Drafter):
            raise TypeError(f"HybridDrafter: `drafter` must be a Drafter, got {type(drafter).__name__}.")
        if model_budget is not None and model_budget < 1:
            raise ValueError(f"HybridDrafter: `model_budget` must be >= 1, got {model_budget}.")
        self.drafter, self.ngram, self.cost = drafter, ngram, cost
        self.model_budget, self.calibrate = model_budget, calibrate
        self.uses_features = bool(drafter is not None and getattr(drafter, "uses_features", True))
        self.feature_layers = getattr(drafter, "feature_layers", None) if self.uses_features else None
        self.forget()

    def forget(self) -> None:
        """Drop the online calibration (acceptance rates and drafting time)."""
        self.rates = {f"ngram{n}": _Rate(NGRAM_PRIOR[min(n, 3)]) for n in range(1, 9)}
        self.model_scale = _Rate(1.0, strength=8.0)  # observed / predicted acceptance of the model's nodes
        self.draft_seconds, self.rounds = 0.0, 0
        self.sized: list[int] = []  # nodes verified per round (diagnostics)

    def reset(self) -> None:
        if self.drafter is not None:
            self.drafter.reset()

    def _model_nodes(self, request: DraftRequest) -> tuple[list[int], list[int], list[float], int]:
        budget = min(self.model_budget or request.budget, request.budget)
        tree = self.drafter.draft(DraftRequest(request.tokens, request.features, budget, request.target))
        tok, par = tree.tokens.tolist(), tree.parents.tolist()
        values = tree.info.get("values")
        if values is None:  # no estimate: a depth-decaying constant, calibrated online
            depth = [0] * len(tok)
            for i, p in enumerate(par):
                depth[i] = 1 if p < 0 else depth[p] + 1
            values = [0.5 ** d for d in depth]
        cond = [v / (values[p] if p >= 0 else 1.0) if (values[p] if p >= 0 else 1.0) > 0 else 0.0
                for v, p in zip(values, par)]
        return tok, par, cond, tree.forwards

    def draft(self, request: DraftRequest) -> DraftTree:
        start = time.perf_counter()
        nodes: list[_Node] = []
        index: dict[tuple[int, int], int] = {}

        def add(source: str, tok: list[int], par: list[int], cond: list[float]) -> None:
            local: list[int] = []
            for x, p, c in zip(tok, par, cond):
                parent = local[p] if p >= 0 else -1
                key = (parent, x)
                node = index.get(key)
                c = min(max(c, 0.0), 0.99)
                if node is None:
                    node = index[key] = len(nodes)
                    nodes.append(_Node(x, parent, c, {source: c}))
                else:  # both sources propose it: it is wrong only if both are
                    nd = nodes[node]
                    nd.cond = min(1.0 - (1.0 - nd.cond) * (1.0 - c), 0.99)
                    nd.sources[source] = c
                local.append(node)

        forwards, ngram_n = 0, 0
        if self.drafter is not None:
            tok, par, cond, forwards = self._model_nodes(request)
            scale = self.model_scale.value if self.calibrate else 1.0
            add("model", tok, par, [c * scale for c in cond])
        if self.ngram is not None:
            ngram_n, tok, par, share = self.ngram.trie(request.tokens)
            if tok:
                rate = self.rates[f"ngram{min(ngram_n, 8)}"].value
                # a branch's share of the matches splits the rate among siblings
                cond = [rate * (s / (share[p] if p >= 0 else 1.0)) for s, p in zip(share, par)]
                add(f"ngram{min(ngram_n, 8)}", tok, par, cond)
        # path values, best first (a child's value never exceeds its parent's: parents come first)
        value = [0.0] * len(nodes)
        for i, nd in enumerate(nodes):
            value[i] = nd.cond * (value[nd.parent] if nd.parent >= 0 else 1.0)
        depth = [0] * len(nodes)
        for i, nd in enumerate(nodes):
            depth[i] = 1 if nd.parent < 0 else depth[nd.parent] + 1
        order = sorted(range(len(nodes)), key=lambda i: (-value[i], depth[i], i))[: request.budget]
        keep = order
        if self.cost is not None:
            draft_steps = 0.0
            if self.cost.step_seconds > 0 and self.rounds:
                draft_steps = self.draft_seconds / self.rounds / self.cost.step_seconds
            keep = order[: self.cost.best_size([value[i] for i in order], draft_steps)]
        keep = sorted(keep, key=lambda i: (depth[i], i))  # topological
        new = {old: k for k, old in enumerate(keep)}
        tokens = torch.tensor([nodes[i].token for i in keep], dtype=torch.long)
        parents = torch.tensor([new[nodes[i].parent] if nodes[i].parent >= 0 else -1 for i in keep], dtype=torch.long)
        self.draft_seconds += time.perf_counter() - start
        self.rounds += 1
        self.sized.append(len(keep))
        info = {"nodes": [nodes[i] for i in keep], "values": [value[i] for i in keep], "ngram": ngram_n}
        return DraftTree(tokens, parents, forwards=forwards, info=info)

    def observe(self, feedback: RoundFeedback) -> None:
        """Update each source's acceptance rate on the nodes whose parent was accepted."""
        if not self.calibrate:
            return
        nodes: list[_Node] = feedback.tree.info.get("nodes", [])
        accepted = set(feedback.accepted)
        parents = feedback.tree.parents.tolist()
        for i, nd in enumerate(nodes):
            if parents[i] >= 0 and parents[i] not in accepted:
                continue  # never had a chance
            ok = float(i in accepted)
            for source, c in nd.sources.items():
                if source == "model":
                    self.model_scale.accepted += ok
                    self.model_scale.proposed += c / max(self.model_scale.value, 1e-3)  # the raw estimate
                else:
                    rate = self.rates[source]
                    share = c / max(rate.value, 1e-6)  # this branch's fraction of the matches
                    rate.accepted += ok
                    rate.proposed += min(share, 1.0)
