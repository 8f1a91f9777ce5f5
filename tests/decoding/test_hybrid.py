"""Prompt lookup in the engine, the hybrid tree and its cost model: lossless, and sized as the model says."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.decoding import (
    HybridDrafter,
    NgramDrafter,
    SpecBlockDrafter,
    SpeculativeDecoder,
    TargetLM,
    VerifyCost,
    fit_verify_cost,
    plain_decode,
)
from lit_lowrank.decoding.engine import DraftRequest
from lit_lowrank.decoding.hybrid import ngram_continuations
from lit_lowrank.models.spec_drafter import BlockDrafterNet
from tests.decoding.test_engine import tiny_target


def test_ngram_continuations_longest_match_most_recent_first():
    seq = torch.tensor([5, 6, 7, 1, 5, 6, 9, 2, 5, 6])
    assert ngram_continuations(seq, max_ngram=3, length=2) == (2, [[9, 2], [7, 1]])
    assert ngram_continuations(seq, max_ngram=3, length=2, max_matches=1) == (2, [[9, 2]])
    assert ngram_continuations(torch.tensor([1, 2, 3, 4]), max_ngram=2) == (0, [])
    # the suffix itself is not a match; a single repeat of one token is (n = 1)
    assert ngram_continuations(torch.tensor([4, 8, 4]), max_ngram=3, length=3) == (1, [[8, 4]])
    with pytest.raises(ValueError, match="min_ngram"):
        ngram_continuations(seq, max_ngram=1, min_ngram=2)


def test_ngram_trie_merges_shared_prefixes_and_counts_shares():
    seq = torch.tensor([3, 9, 4, 5, 0, 3, 9, 4, 6, 0, 3, 9])  # "3 9" is followed by "4 5 .." and "4 6 .."
    n, tok, par, share = NgramDrafter(max_ngram=2, length=2).trie(seq)
    assert n == 2
    assert tok == [4, 6, 5] and par == [-1, 0, 0]  # breadth first: the shared "4", then its two children
    assert share == [1.0, 0.5, 0.5]
    tree = NgramDrafter(max_ngram=2, length=2).draft(DraftRequest(seq, None, 2, None))
    assert tree.tokens.tolist() == [4, 6] and tree.parents.tolist() == [-1, 0]  # capped at the budget


def test_verify_cost_model_and_tree_sizing():
    cost = VerifyCost(base=1.5, slope=0.1)
    assert cost.steps(0) == 1.0 and cost.steps(3) == pytest.approx(1.8)
    # tokens per step: 0 nodes 1/1; 1 node (1 + .9)/1.6 = 1.19; 2 nodes 2.7/1.7 = 1.59; 3 nodes 2.75/1.8 = 1.53
    assert cost.best_size([0.9, 0.8, 0.05]) == 2
    assert cost.best_size([0.3, 0.1]) == 0  # (1.3)/1.6 < 1: a plain step is faster
    assert cost.best_size([0.9] * 5, draft_steps=0.5) == 5
    assert cost.best_size([]) == 0
    with pytest.raises(ValueError, match="base"):
        VerifyCost(base=0.0)
    with pytest.raises(ValueError, match="nodes"):
        cost.steps(-1)


def test_fit_verify_cost_restores_the_cache_and_reports_every_size():
    target = TargetLM(tiny_target())
    prompt = torch.tensor([1, 2, 3, 4])
    cost = fit_verify_cost(target, prompt, sizes=(1, 3, 6), repeats=2)
    assert sorted(cost.measured) == [1, 3, 6] and cost.base > 0 and cost.slope >= 0 and cost.step_seconds > 0
    assert target.length == prompt.numel()  # every measured verification was cut back
    with pytest.raises(ValueError, match="sizes"):
        fit_verify_cost(target, prompt, sizes=(4,))


def _specblock(vocab: int = 23) -> SpecBlockDrafter:
    torch.manual_seed(3)
    return SpecBlockDrafter(BlockDrafterNet(32, vocab, block_size=3, num_heads=4).double(), blocks=2, expand=2)


@pytest.mark.parametrize("seed", range(3))
def test_hybrid_is_lossless_and_accepts_repeated_text(seed):
    model = tiny_target(seed=seed)
    target = TargetLM(model)
    g = torch.Generator().manual_seed(seed)
    part = torch.randint(0, 23, (6,), generator=g)
    prompt = torch.cat([part, part, part[:3]])  # a prompt that repeats itself
    ref, _ = plain_decode(target, prompt, max_new_tokens=20)
    drafters = {
        "ngram+specblock, sized": HybridDrafter(_specblock(), NgramDrafter(), cost=VerifyCost(base=1.2, slope=0.01)),
        "ngram only, unsized": HybridDrafter(None, NgramDrafter(length=5)),
        "specblock only, sized": HybridDrafter(_specblock(), None, cost=VerifyCost()),
    }
    for name, drafter in drafters.items():
        for budget in (1, 8):
            out, stats = SpeculativeDecoder(target, drafter, budget=budget).generate(prompt, max_new_tokens=20)
            assert torch.equal(out, ref), (name, budget)
            assert all(n <= budget for n in drafter.sized[-stats.rounds:])
    # the target's greedy text repeats (a prompt that repeats, a tiny random model that loops): where the
    # most recent n-gram match predicts the next token, prompt lookup in the engine is accepted
    hits = sum(1 for i in range(prompt.numel() + 1, ref.numel())
               if (c := ngram_continuations(ref[:i], length=1)[1]) and c[0][0] == ref[i])
    assert hits > 0
    _, stats = SpeculativeDecoder(target, HybridDrafter(None, NgramDrafter(length=8)), budget=8).generate(
        prompt, max_new_tokens=20)
    assert sum(stats.accepted) >= 1 and stats.mean_acceptance_length > 1.0


def test_hybrid_sizing_skips_drafts_that_cannot_pay_and_calibrates_online():
    target = TargetLM(tiny_target(seed=4))
    prompt = torch.tensor([7, 1, 2, 3, 9, 11])  # no repeated n-gram at the start
    # a verification so expensive that no draft pays: every round is a plain step
    costly = HybridDrafter(_specblock(), NgramDrafter(), cost=VerifyCost(base=50.0, slope=1.0))
    ref, _ = plain_decode(target, prompt, max_new_tokens=12)
    out, stats = SpeculativeDecoder(target, costly, budget=8).generate(prompt, max_new_tokens=12)
    assert torch.equal(out, ref) and stats.draft_nodes == 0 and set(costly.sized) == {0}
    # free verification: every candidate is taken; the model source's calibration moves off its prior
    free = HybridDrafter(_specblock(), None, cost=VerifyCost(base=1.0, slope=0.0))
    SpeculativeDecoder(target, free, budget=8).generate(prompt, max_new_tokens=12)
    assert max(free.sized) > 0 and free.model_scale.proposed > 0
    assert free.model_scale.value != pytest.approx(1.0)


def test_hybrid_argument_errors():
    with pytest.raises(ValueError, match="model `drafter`, an `ngram`"):
        HybridDrafter(None, None)
    with pytest.raises(TypeError, match="Drafter"):
        HybridDrafter(object(), NgramDrafter())
    with pytest.raises(ValueError, match="model_budget"):
        HybridDrafter(None, NgramDrafter(), model_budget=0)
