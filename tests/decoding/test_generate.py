"""speculative_generate returns what transformers generate returns; sampling warpers match transformers'."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.decoding import HybridDrafter, NgramDrafter, SpecBlockDrafter, sampling_probs, speculative_generate
from lit_lowrank.models.spec_drafter import BlockDrafterNet
from tests.decoding.test_engine import tiny_target


def _generate(model, ids, **kw):
    return model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **kw)


@pytest.mark.parametrize("seed", range(2))
def test_greedy_equals_transformers_generate_shape_and_tokens(seed):
    model = tiny_target(seed=seed)
    ids = torch.tensor([[4, 8, 15, 16, 23 % 23, 4, 8]])
    want = _generate(model, ids, max_new_tokens=20, do_sample=False, eos_token_id=None)
    torch.manual_seed(0)
    net = BlockDrafterNet(32, 23, block_size=2, num_heads=4).double()
    for drafter in (None, HybridDrafter(SpecBlockDrafter(net), NgramDrafter())):
        got = speculative_generate(model, ids, max_new_tokens=20, drafter=drafter, do_sample=False)
        assert got.shape == want.shape == (1, ids.shape[1] + 20)
        assert torch.equal(got, want)


def test_stop_tokens_list_and_left_padding():
    model = tiny_target(seed=1)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    full = speculative_generate(model, ids, max_new_tokens=15)
    new = full[0, ids.shape[1]:].tolist()
    stops = [new[6], new[3]]  # the earlier one must stop decoding
    want = _generate(model, ids, max_new_tokens=15, do_sample=False, eos_token_id=stops)
    got = speculative_generate(model, ids, max_new_tokens=15, eos_token_id=stops)
    assert torch.equal(got, want[:, : got.shape[1]]) and got[0, -1].item() in stops
    assert got.shape[1] == ids.shape[1] + 4
    from transformers import GenerationConfig

    config = GenerationConfig(eos_token_id=stops, max_new_tokens=15, do_sample=False)
    assert torch.equal(speculative_generate(model, ids, generation_config=config), got)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], 1)
    assert torch.equal(speculative_generate(model, padded, max_new_tokens=15, attention_mask=mask), full)


def test_sampling_probs_equal_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    for temperature, top_k, top_p in ((0.7, 5, None), (1.3, None, 0.8), (0.9, 10, 0.5), (1.0, None, None)):
        scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p:
            scores = TopPLogitsWarper(top_p)(None, scores)
        torch.testing.assert_close(sampling_probs(logits, temperature, top_k, top_p), torch.softmax(scores, -1))


def test_sampling_with_top_k_one_is_greedy():
    """top-k 1 leaves one token: the sampled output must be the greedy one (the warpers reach the engine)."""
    model = tiny_target(seed=2)
    ids = torch.tensor([[2, 7, 1, 8, 2, 8]])
    greedy = speculative_generate(model, ids, max_new_tokens=12)
    g = torch.Generator().manual_seed(0)
    sampled = speculative_generate(model, ids, max_new_tokens=12, do_sample=True, top_k=1, temperature=1.7,
                                   generator=g)
    assert torch.equal(sampled, greedy)
    other = speculative_generate(model, ids, max_new_tokens=12, do_sample=True, top_k=0, temperature=5.0,
                                 generator=torch.Generator().manual_seed(0))
    assert not torch.equal(other, greedy)  # without the filter, a hot temperature leaves the greedy path


def test_unsupported_options_raise_clear_errors():
    model = tiny_target()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="batch size 1"):
        speculative_generate(model, ids.repeat(2, 1), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"`num_beams`=2 is not supported"):
        speculative_generate(model, ids, max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="repetition_penalty"):
        speculative_generate(model, ids, max_new_tokens=4, repetition_penalty=1.2)
    with pytest.raises(TypeError, match="unknown option 'beams'"):
        speculative_generate(model, ids, max_new_tokens=4, beams=2)
    with pytest.raises(ValueError, match="max_length"):
        speculative_generate(model, ids, max_length=10)
    with pytest.raises(ValueError, match="right or inner padding"):
        speculative_generate(model, ids, max_new_tokens=4, attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="top_p"):
        speculative_generate(model, ids, max_new_tokens=4, do_sample=True, top_p=1.5)
    assert speculative_generate(model, ids, max_new_tokens=4, num_beams=1, pad_token_id=0).shape == (1, 7)
