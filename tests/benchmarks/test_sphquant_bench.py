"""The sphquant benchmark's bit budgets, control codebook, held-out output error and throughput rows."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.benchmarks.sphquant import (
    COMPETITOR_GROUP,
    FORMATS,
    layer_output_errors,
    random_codebook,
    throughput,
    window_nll,
)
from lit_lowrank.ops.quantization import BitsBreakdown, uniform_bits
from lit_lowrank.ops.sphquant.codec import sph_bits
from lit_lowrank.quant import quantize_sph, quantize_uniform

# SmolLM2-135M's decoder Linear shapes (out, in), 30 layers of each
SMOLLM2_SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


@pytest.mark.parametrize("budget", sorted(FORMATS))
def test_formats_have_equal_bits_per_weight_on_smollm2(budget):
    """Every stored number counted (codes, fp16 group scales, the codebook once, Hadamard signs per layer)."""
    bits, group = FORMATS[budget]["uniform"]
    k, radius_bits, sph_group = FORMATS[budget]["sph"]
    uniform = sum((uniform_bits(o, i, bits, group) for o, i in SMOLLM2_SHAPES * 30), BitsBreakdown(0, 0, 0, 0))
    sph_layers = [sph_bits(o, i, k, radius_bits, sph_group) for o, i in SMOLLM2_SHAPES * 30]
    sph = sum(sph_layers[1:], BitsBreakdown(0, 0, 0, 0)) + sph_layers[0]  # codebook once: shared bits of one
    sph = BitsBreakdown(sph.num_weights, sph.payload_bits, sph.scale_bits, sph_layers[0].shared_bits)
    signs = 8 * sum(i for _, i in SMOLLM2_SHAPES * 30)
    assert sph.bits_per_weight == pytest.approx(uniform.bits_per_weight)        # per layer, exactly
    assert 0 < sph.bits_per_weight_with_shared - uniform.bits_per_weight <= 0.02   # + the codebook once
    assert 0 < signs / uniform.num_weights <= 0.012                              # Hadamard's int8 signs
    expected = {"w2g128": 2.2708, "w3g128": 3.2708, "w4g128": 4.2708}[budget]
    assert uniform.bits_per_weight == pytest.approx(expected, abs=1e-4)
    if budget == "w3g128":  # the competitor's finer groups buy at least SPH's codebook bits
        finer = sum((uniform_bits(o, i, bits, COMPETITOR_GROUP) for o, i in SMOLLM2_SHAPES * 30),
                    BitsBreakdown(0, 0, 0, 0))
        assert sph.bits_per_weight_with_shared <= finer.bits_per_weight <= sph.bits_per_weight_with_shared + 0.001


def test_random_codebook_is_unit_nonnegative_and_seeded():
    c = random_codebook(64, seed=3)
    assert c.shape == (64, 8) and bool((c >= 0).all())
    torch.testing.assert_close(c.norm(dim=1), torch.ones(64))
    torch.testing.assert_close(random_codebook(64, seed=3), c)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(config).eval()


def _batch():
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 64, (2, 16), generator=g), "position_ids": torch.arange(16)[None],
            "doc_ids": torch.zeros(2, 16, dtype=torch.long), "labels": torch.randint(0, 64, (2, 16), generator=g)}


@pytest.mark.parametrize("method", ["sph", "hadamard_gptq"])
def test_layer_output_error_is_the_hessian_weighted_error_of_each_decoder_layer(method):
    import lit_lowrank.benchmarks.sphquant as bench
    from lit_lowrank.quant.ptq import collect_hessians, select_linears

    model = _tiny_llama()
    originals = dict(select_linears(model, bench.TARGET))
    dense = {n: m.weight.detach().clone() for n, m in originals.items()}
    h = collect_hessians(model, originals, [_batch()], bench._lm_forward)
    if method == "sph":
        quantize_sph(model, codebook_size=16, radius_bits=3, group_size=32, target=bench.TARGET, hessians=h,
                     finetune_rounds=0)
    else:
        quantize_uniform(model, "hadamard_gptq", bits=3, group_size=32, target=bench.TARGET, hessians=h)
    errors = layer_output_errors(model, originals, h)
    assert sorted(errors) == [0, 1]
    # layer 1 by hand: the quantized layers' products on the calibration inputs against the float layers'
    num = den = 0.0
    for name, w in dense.items():
        if ".1." not in name:
            continue
        w_hat = bench.effective_weight(model.get_submodule(name))
        e = w_hat - w
        num += float(((e @ h[name]) * e).sum())
        den += float(((w @ h[name]) * w).sum())
    assert errors[1] == pytest.approx(num / den, rel=1e-5)
    assert 0 < errors[1] < 1


def test_throughput_rows_cover_the_three_arms_and_restore_the_model():
    import lit_lowrank.benchmarks.sphquant as bench
    from lit_lowrank.quant import quantized_layers
    from lit_lowrank.quant.ptq import select_linears

    model = _tiny_llama()
    originals = dict(select_linears(model, bench.TARGET))
    quantize_sph(model, codebook_size=16, radius_bits=3, group_size=32, target=bench.TARGET, finetune_rounds=0)
    packed = quantized_layers(model)
    with torch.no_grad():
        before = bench._lm_forward(model, _batch())
    speed = throughput(model, originals, _batch(), repeats=2)
    assert set(speed) == {"sph_cached", "sph_decode_each_call", "dense"} and min(speed.values()) > 0
    assert quantized_layers(model) == packed and all(m.cache_decoded for m in packed.values())
    with torch.no_grad():
        torch.testing.assert_close(bench._lm_forward(model, _batch()), before)


def test_window_nll_is_the_mean_token_cross_entropy(monkeypatch):
    import lit_lowrank.benchmarks.sphquant as bench

    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[1, 2, 3, -100, -100], [0, 1, 2, 3, 4]])
    monkeypatch.setattr(bench, "_lm_forward", lambda model, batch: logits)
    nll, count = window_nll(None, [{"labels": labels}])
    assert count == [3, 5]
    logp = torch.log_softmax(logits, -1)
    assert nll[0] == pytest.approx(float(-(logp[0, [0, 1, 2], [1, 2, 3]]).mean()), rel=1e-5)
    assert nll[1] == pytest.approx(float(-(logp[1, range(5), [0, 1, 2, 3, 4]]).mean()), rel=1e-5)
    assert math.isfinite(nll[0])


def test_first_window_keeps_per_token_tensors_only():
    """The throughput row's input: the evaluation batches also carry 1-D per-window fields (a crash once)."""
    from lit_lowrank.benchmarks.sphquant import first_window

    batch = {**_batch(), "doc_lengths": torch.tensor([16, 16])}
    out = first_window(batch, tokens=8)
    assert set(out) == {"input_ids", "position_ids", "doc_ids", "labels"}
    assert all(v.shape == (1, 8) for v in out.values())
