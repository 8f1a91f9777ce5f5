"""Reference drafters that bound what a drafter can do: an oracle and a random guesser.

- :class:`OracleDrafter` proposes the true continuation (e.g. the target's own greedy
  output, computed beforehand) as a chain: every draft is accepted, so its speed is the
  engine's ceiling at that chain length — the cost of verifying ``k + 1`` tokens in one
  forward against ``k + 1`` plain steps, plus the engine's own overhead.
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
    """

    uses_features = False

    def __init__(self, reference: Tensor | list[int], length: int = 4) -> None:
        if length < 1:
            raise ValueError(f"OracleDrafter: `length` must be >= 1, got {length}.")
        self.reference = torch.as_tensor(reference, dtype=torch.long).flatten()
        self.length = length

    def draft(self, request: DraftRequest) -> DraftTree:
        n = request.tokens.numel()
        chain = self.reference[n: n + min(self.length, request.budget)]
        return DraftTree(chain, torch.arange(chain.numel()) - 1, forwards=0)


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
