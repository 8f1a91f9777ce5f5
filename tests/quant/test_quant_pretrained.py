"""Quantized transformers models: save_pretrained -> load_quantized, the CPU decode cache, feedback defaults."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lit_lowrank.quant import (
    SPHLinear,
    SPHQuantizer,
    load_quantized,
    quantize_sph,
    quantize_uniform,
    quantized_layers,
    set_decode_cache,
)


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def _calibration(n: int = 2):
    g = torch.Generator().manual_seed(5)
    return [{"input_ids": torch.randint(0, 96, (2, 16), generator=g)} for _ in range(n)]


@pytest.mark.parametrize("method", ["sph", "hadamard_gptq"])
def test_save_pretrained_then_load_quantized_gives_identical_logits(tmp_path, method):
    model = _tiny_llama()
    if method == "sph":
        quantize_sph(model, codebook_size=32, radius_bits=3, group_size=32, calibration=_calibration(),
                     finetune_rounds=0)
    else:
        quantize_uniform(model, "hadamard_gptq", bits=3, group_size=32, calibration=_calibration())
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(tmp_path)                      # safetensors: the shared codebook stored once
    assert (tmp_path / "model.safetensors").is_file()
    assert json.loads((tmp_path / "config.json").read_text())["lit_lowrank_surgery"]
    reloaded = load_quantized(tmp_path)
    assert set(quantized_layers(reloaded)) == set(quantized_layers(model))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, expected)
    if method == "sph":  # one codebook tensor again, shared by every layer
        assert len({m.codebook.data_ptr() for m in reloaded.modules() if isinstance(m, SPHLinear)}) == 1
        reloaded.save_pretrained(tmp_path / "again")      # a reloaded model saves too
        with torch.no_grad():
            assert torch.equal(load_quantized(tmp_path / "again")(ids).logits, expected)


def test_load_quantized_refuses_a_plain_model(tmp_path):
    _tiny_llama().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="lit_lowrank_surgery"):
        load_quantized(tmp_path)


def test_decode_cache_gives_the_same_product_and_follows_buffer_changes():
    model = nn.Sequential(nn.Linear(64, 48))
    quantize_sph(model, codebook_size=16, radius_bits=3, group_size=32, finetune_rounds=0)
    layer = model[0]
    x = torch.randn(5, 64)
    set_decode_cache(model, False)
    uncached = layer(x)
    assert layer._decoded is None
    set_decode_cache(model, True)
    torch.testing.assert_close(layer(x), uncached, atol=1e-5, rtol=1e-5)
    first = layer._decoded[1]
    layer(x)
    assert layer._decoded[1] is first                     # decoded once, reused
    with torch.no_grad():                                 # a changed buffer (load_state_dict) invalidates it
        layer.radius_step.mul_(2)
    set_decode_cache(model, False)
    changed = layer(x)
    set_decode_cache(model, True)
    torch.testing.assert_close(layer(x), changed, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(changed, uncached)


def test_feedback_is_on_with_calibration_and_lowers_the_output_error():
    from lit_lowrank.ops.sphquant.codec import hessian_error

    torch.manual_seed(0)
    mix = torch.eye(64) + 0.7 * torch.randn(64, 64)
    batches = [torch.randn(64, 64) @ mix for _ in range(4)]
    h = sum(b.T @ b for b in batches)
    dense = nn.Sequential(nn.Linear(64, 48))
    errors = {}
    for feedback in (None, False):
        model = nn.Sequential(nn.Linear(64, 48))
        model.load_state_dict(dense.state_dict())
        report = quantize_sph(model, codebook_size=32, radius_bits=3, group_size=32, calibration=batches,
                              forward=lambda m, b: m(b), finetune_rounds=0, feedback=feedback)
        assert report["feedback"] is (feedback is None)
        errors[feedback] = float(hessian_error(dense[0].weight.detach(), model[0].dequantize(), h))
    assert errors[None] < 0.9 * errors[False]
    with pytest.raises(ValueError, match="feedback"):
        quantize_sph(nn.Sequential(nn.Linear(64, 48)), codebook_size=32, radius_bits=3, group_size=32, feedback=True)
    with pytest.raises(ValueError, match="calibration_batches"):
        SPHQuantizer(codebook_size=32, radius_bits=3, group_size=32, feedback=True)
