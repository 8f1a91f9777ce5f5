"""Reference drafters that bound what a drafter can do: an oracle and a random guesser.

- :class:`OracleDrafter` proposes the true continuation (e.g. the target's own greedy
  output, computed beforehand) as a chain: every draft is accepted, so its speed is the
  engine's ceiling at that chain length — the cost of verifying ``k + 1`` tokens in one
  forward against ``k + 1`` plain steps, plus the engine's own overhead. With ``cost=`` a
  real drafter runs first and its chain is thrown away: an always-right drafter at that
  drafter's price, the most its drafting cost allows it to reach.
- :class:`RandomDrafter` proposes uniformly random tokens: nothing is accepted, so it
  measures the verification cost alone. A speed-up claim that a random drafter also
  "achieves" measures the clock, not the drafter (a benchmark control).

.. code-block:: python

    ref, _ = plain_decode(target, prompt, 64)
    fast, _ = SpeculativeDecoder(target, OracleDrafter(ref, length=4), budget=4).generate(prompt, 64)
    slow, _ = SpeculativeDecoder(target, RandomDrafter(49152, length=4), budget=4).generate(prompt, 64)
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_lowrank.decoding.engine import Drafter, DraftRequest, DraftTree


class OracleDrafter(Drafter):
    """Drafts the next ``length`` tokens of a known ``reference`` sequence (prompt + continuation) as a chain.

    Args:
        reference: ``(T,)`` the sequence decoding is expected to produce (its first tokens are the prompt).
        length: chain length per round (also capped by the verifier budget and the reference's end).
        cost: a drafter run before every round, its output discarded, so each round pays its
            drafting time: the ceiling of *that* drafter (its speed if it were always right). It
            must draft ``length`` tokens per call (a chain drafter with no early stop), else the
            price would not match the chain; a mismatch raises.

    .. code-block:: python

        skip = LayerSkipDrafter(pattern, draft_length=6, stop_confidence=0.0)
        ceiling, _ = SpeculativeDecoder(target, OracleDrafter(ref, 6, cost=skip), budget=8).generate(prompt, 64)
    """

    uses_features = False

    def __init__(self, reference: Tensor | list[int], length: int = 4, cost: Drafter | None = None) -> None:
        if length < 1:
            raise ValueError(f"OracleDrafter: `length` must be >= 1, got {length}.")
        if cost is not None and getattr(cost, "uses_features", False):
            raise ValueError(f"OracleDrafter: `cost`={type(cost).__name__} needs target features; give a drafter "
                             "that drafts from tokens (uses_features=False).")
        self.reference = torch.as_tensor(reference, dtype=torch.long).flatten()
        self.length = length
        self.cost = cost

    def reset(self) -> None:
        if self.cost is not None:
            self.cost.reset()

    def draft(self, request: DraftRequest) -> DraftTree:
        n = request.tokens.numel()
        chain = self.reference[n: n + min(self.length, request.budget)]
        forwards = 0
        if self.cost is not None and chain.numel():
            paid = self.cost.draft(request)
            if paid.tokens.numel() < chain.numel():
                raise ValueError(f"OracleDrafter: `cost` drafted {paid.tokens.numel()} tokens for a {chain.numel()}-"
                                 "token chain; give it draft_length >= length and no early stop.")
            forwards = paid.forwards
        return DraftTree(chain, torch.arange(chain.numel()) - 1, forwards=forwards)


class RandomDrafter(Drafter):
    """Drafts ``length`` uniformly random tokens as a chain (a drafter that knows nothing).

    Args:
        vocab_size: ids are drawn from ``0..vocab_size-1``.
        length: chain length per round (capped by the verifier budget).
        seed: the generator's seed (reset at every new sequence, so runs repeat).
    """

    uses_features = False

    def __init__(self, vocab_size: int, length: int = 4, seed: int = 0) -> None:
        if vocab_size < 1 or length < 1:
            raise ValueError(f"RandomDrafter: vocab_size={vocab_size} and length={length} must be >= 1.")
        self.vocab_size, self.length, self.seed = vocab_size, length, seed
        self.generator = torch.Generator().manual_seed(seed)

    def reset(self) -> None:
        self.generator.manual_seed(self.seed)

    def draft(self, request: DraftRequest) -> DraftTree:
        k = min(self.length, request.budget)
        chain = torch.randint(self.vocab_size, (k,), generator=self.generator)
        return DraftTree(chain, torch.arange(k) - 1, forwards=0)
