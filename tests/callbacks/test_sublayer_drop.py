"""SublayerDrop skips a random sublayer pattern for one training batch and restores the model after it."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_lowrank.callbacks.sublayer_drop import SublayerDrop


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        cfg = LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
                          num_attention_heads=2, num_key_value_heads=2)
        self.model = LlamaForCausalLM(cfg)


def _structure(lm) -> list[str]:
    return [f"{type(layer.self_attn).__name__}/{type(layer.mlp).__name__}" for layer in lm.model.layers]


def test_skips_during_the_batch_and_restores_after():
    holder = _Holder()
    full = _structure(holder.model)
    cb = SublayerDrop(max_ratio=1.0, prob=1.0, seed=0)
    changed = 0
    for i in range(5):
        cb.on_train_batch_start(None, holder, None, i)
        changed += _structure(holder.model) != full
        cb.on_train_batch_end(None, holder, None, None, i)
        assert _structure(holder.model) == full
    assert changed >= 3  # ratio ~ U(0, 1): most batches skip something
    state = cb.state_dict()
    first = SublayerDrop(prob=1.0)
    first.load_state_dict(state)
    assert torch.equal(first.generator.get_state(), cb.generator.get_state())


def test_prob_zero_never_skips_and_errors():
    holder = _Holder()
    cb = SublayerDrop(prob=0.0)
    cb.on_train_batch_start(None, holder, None, 0)
    assert cb._stack is None
    with pytest.raises(ValueError, match="max_ratio"):
        SublayerDrop(max_ratio=0.0)
    with pytest.raises(ValueError, match="decoder LM"):
        SublayerDrop(prob=1.0).on_train_batch_start(None, torch.nn.Linear(2, 2), None, 0)
