"""The engine is lossless: greedy output == plain greedy decoding; sampling keeps the target distribution."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from lit_lowrank.decoding import (
    Drafter,
    DraftTree,
    EagleDrafter,
    SpecBlockDrafter,
    SpeculativeDecoder,
    TargetLM,
    plain_decode,
    skip_decoder_layers,
)
from lit_lowrank.models.spec_drafter import BlockDrafterNet


def tiny_target(vocab: int = 23, seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    # float64: no near-ties between differently shaped forwards, so argmax comparisons are exact
    return LlamaForCausalLM(cfg).double().eval()


class OracleDrafter(Drafter):
    """Proposes the true continuation (a chain) plus a wrong sibling at every depth."""

    def __init__(self, reference: list[int], vocab: int, depth: int = 5) -> None:
        self.reference, self.vocab, self.depth = reference, vocab, depth

    def draft(self, request):
        n = request.tokens.numel()
        true = self.reference[n: n + self.depth]
        tokens, parents, prev = [], [], -1
        for t in true:
            tokens += [(t + 1) % self.vocab, t]
            parents += [prev, prev]
            prev = len(tokens) - 1
        tokens, parents = tokens[: request.budget], parents[: request.budget]
        return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), forwards=1)


def _drafters(vocab: int, reference: list[int]) -> dict[str, Drafter]:
    torch.manual_seed(1)
    return {
        "eagle": EagleDrafter(BlockDrafterNet(32, vocab, block_size=1, num_heads=4).double(), depth=4, topk=3),
        "specblock": SpecBlockDrafter(BlockDrafterNet(32, vocab, block_size=3, num_heads=4).double(), blocks=3,
                                      expand=2),
        "specblock_no_rank": SpecBlockDrafter(
            BlockDrafterNet(32, vocab, block_size=2, num_heads=4, rank_head=False, draft_vocab_size=7).double(),
            blocks=2, expand=3),
        "oracle": OracleDrafter(reference, vocab),
    }


@pytest.mark.parametrize("seed", range(6))
def test_greedy_output_equals_plain_greedy(seed):
    """Many random targets and prompts; each seed checks the oracle and one learned-drafter policy."""
    model = tiny_target(seed=seed)
    target = TargetLM(model)
    g = torch.Generator().manual_seed(100 + seed)
    prompt = torch.randint(0, 23, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
    ref, _ = plain_decode(target, prompt, max_new_tokens=16)
    full = ref.tolist()
    # EOS edge: a token the greedy continuation emits mid-way; max-length edges: 1 and an odd length
    eos = full[prompt.numel() + 5]
    cases = [(16, None), (16, eos), (1, None), (7, None)]
    drafters = _drafters(23, full)
    policy = ["eagle", "specblock", "specblock_no_rank"][seed % 3]
    budget = (1, 6, 16)[seed % 3 if seed < 3 else (seed + 1) % 3]
    for drafter_name in (policy, "oracle"):
        engine = SpeculativeDecoder(target, drafters[drafter_name], budget=budget)
        for max_new, eos_id in cases:
            want, _ = plain_decode(target, prompt, max_new_tokens=max_new, eos_token_id=eos_id)
            got, stats = engine.generate(prompt, max_new_tokens=max_new, eos_token_id=eos_id)
            assert torch.equal(got, want), (drafter_name, budget, max_new, eos_id)
            assert stats.new_tokens == want.numel() - prompt.numel()


def test_oracle_drafter_is_accepted_and_cut_at_eos_and_max_length():
    model = tiny_target(seed=3)
    target = TargetLM(model)
    prompt = torch.tensor([1, 2, 3])
    ref, _ = plain_decode(target, prompt, max_new_tokens=30)
    engine = SpeculativeDecoder(target, OracleDrafter(ref.tolist(), 23, depth=5), budget=10)
    out, stats = engine.generate(prompt, max_new_tokens=30)
    assert torch.equal(out, ref)
    assert stats.mean_acceptance_length > 4.5  # 5 accepted + bonus per round, except the last
    eos = ref.tolist()[3 + 4]  # inside an accepted path: the engine must stop right after it
    want, _ = plain_decode(target, prompt, max_new_tokens=30, eos_token_id=eos)
    got, _ = engine.generate(prompt, max_new_tokens=30, eos_token_id=eos)
    assert torch.equal(got, want) and got[-1] == eos
    got, _ = engine.generate(prompt, max_new_tokens=3)  # a round accepts 6 > 3: cut
    assert torch.equal(got, ref[:6])


def test_plain_decode_matches_transformers_generate():
    model = tiny_target(seed=5)
    prompt = torch.tensor([[4, 8, 15, 16]])
    ours, _ = plain_decode(TargetLM(model), prompt, max_new_tokens=25)
    theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=25, do_sample=False,
                            pad_token_id=0, eos_token_id=None)
    assert torch.equal(ours, theirs[0])


def _chisquare_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled into one."""
    expected = probs.flatten() * counts.sum()
    small = expected < 5
    obs = torch.cat([counts.flatten()[~small], counts.flatten()[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    return chisquare(obs.numpy(), exp.numpy()).pvalue


@pytest.mark.slow
def test_sampling_preserves_the_target_distribution():
    """Tiny vocabulary: the first two sampled tokens' joint law equals the target's, exactly computed."""
    vocab, temperature = 4, 0.9
    model = tiny_target(vocab=vocab, seed=7)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # a peaked target: rejections and acceptances both happen often
    target = TargetLM(model)
    prompt = torch.tensor([1, 0, 2])

    def joint(temp: float) -> torch.Tensor:
        with torch.no_grad():
            p1 = torch.softmax(model(prompt[None]).logits[0, -1] / temp, -1)
            out = torch.zeros(vocab, vocab, dtype=torch.float64)
            for a in range(vocab):
                nxt = model(torch.cat([prompt, torch.tensor([a])])[None]).logits[0, -1]
                out[a] = p1[a] * torch.softmax(nxt / temp, -1)
        return out

    exact = joint(temperature)
    torch.manual_seed(2)
    # a random-weight drafter: its guesses are often wrong, which exercises the residual path
    drafter = SpecBlockDrafter(BlockDrafterNet(32, vocab, block_size=2, num_heads=4).double(), blocks=2, expand=2,
                               max_branch=3)
    engine = SpeculativeDecoder(target, drafter, budget=5)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab, vocab)
    accepted = 0
    for _ in range(300):
        out, stats = engine.generate(prompt, max_new_tokens=2, do_sample=True, temperature=temperature, generator=g)
        counts[out[3], out[4]] += 1
        accepted += sum(stats.accepted)
    assert 0 < accepted < 300  # both branches of the rule were taken
    assert _chisquare_pvalue(counts, exact) > 1e-3
    # power check: the same counts are told apart from a nearby wrong law (temperature 1.5)
    assert _chisquare_pvalue(counts, joint(1.5)) < 1e-4


def test_target_cache_keep_equals_recompute():
    model = tiny_target(seed=2)
    target = TargetLM(model)
    target.start(torch.tensor([3, 4, 5]))
    tokens, parents = torch.tensor([6, 7, 8, 9]), torch.tensor([-1, 0, 0, 2])
    target.extend(tokens, parents)
    target.keep([0, 2, 3])
    assert target.length == 6
    logits, _ = target.extend(torch.tensor([1]), torch.tensor([-1]))
    with torch.no_grad():
        ref = model(torch.tensor([[3, 4, 5, 6, 8, 9, 1]])).logits[0, -1]
    torch.testing.assert_close(logits[0], ref)
    with pytest.raises(ValueError, match="keep: nodes"):
        target.keep([3])


def test_skip_decoder_layers_is_restored_and_changes_the_model():
    model = tiny_target(seed=4, layers=3)
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        full = model(x).logits
        with skip_decoder_layers(model, {1}):
            assert len(model.model.layers) == 2
            skipped = model(x).logits
        again = model(x).logits
    assert len(model.model.layers) == 3
    torch.testing.assert_close(again, full)
    assert not torch.allclose(skipped, full)
    with pytest.raises(ValueError, match="outside"):
        with skip_decoder_layers(model, {5}):
            pass


def test_engine_argument_errors():
    target = TargetLM(tiny_target())
    with pytest.raises(ValueError, match="budget"):
        SpeculativeDecoder(target, OracleDrafter([], 23), budget=0)
    engine = SpeculativeDecoder(target, OracleDrafter([], 23), budget=4)
    with pytest.raises(ValueError, match="batch size 1"):
        engine.generate(torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate(torch.zeros(3, dtype=torch.long), 0)
