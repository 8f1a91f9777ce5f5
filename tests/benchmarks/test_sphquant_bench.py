"""The sphquant benchmark's bit budgets, control codebook and dense evaluation view."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lit_lowrank.benchmarks.sphquant import FORMATS, _DenseView, random_codebook, window_nll
from lit_lowrank.ops.quantization import BitsBreakdown, uniform_bits
from lit_lowrank.ops.sphquant import sph_bits
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
    assert 0 < sph.bits_per_weight_with_shared - uniform.bits_per_weight <= 0.006  # + the codebook once
    assert 0 < signs / uniform.num_weights <= 0.012                              # Hadamard's int8 signs
    expected = {"w2g128": 2.2708, "w2g64": 2.5, "w3g128": 3.2708}[budget]
    assert uniform.bits_per_weight == pytest.approx(expected, abs=1e-4)


def test_random_codebook_is_unit_nonnegative_and_seeded():
    c = random_codebook(64, seed=3)
    assert c.shape == (64, 8) and bool((c >= 0).all())
    torch.testing.assert_close(c.norm(dim=1), torch.ones(64))
    torch.testing.assert_close(random_codebook(64, seed=3), c)


class _TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))])
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.model.layers[0](x))


@pytest.mark.parametrize("method", ["sph", "hadamard_gptq"])
def test_dense_view_computes_what_the_packed_layers_compute_and_restores_them(method):
    torch.manual_seed(0)
    model = _TinyLM()
    x = torch.randn(8, 16)
    if method == "sph":
        quantize_sph(model, codebook_size=16, radius_bits=3, group_size=16, target=r"^model\.layers", finetune_rounds=0)
    else:
        quantize_uniform(model, "hadamard_gptq", bits=3, group_size=16, target=r"^model\.layers",
                         calibration=[torch.randn(32, 16)], forward=lambda m, b: m(b))
    packed = [m for m in model.modules() if hasattr(m, "decode_rows")]
    with torch.no_grad():
        y_packed = model(x)
        with _DenseView(model):
            assert not any(hasattr(m, "decode_rows") for m in model.modules())
            y_dense = model(x)
    torch.testing.assert_close(y_dense, y_packed, atol=1e-4, rtol=1e-4)
    assert [m for m in model.modules() if hasattr(m, "decode_rows")] == packed


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
