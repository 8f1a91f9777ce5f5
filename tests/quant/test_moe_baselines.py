"""W4A8 experts, GPTQ-MXFP4 and the equal-bits mixed-precision baseline on a tiny Qwen3-MoE."""

from __future__ import annotations

import copy

import pytest
import torch

import lit_lowrank.quant.moe as moe
from lit_lowrank.quant.moe import MXFP4Experts, apply_moe_quant, expert_loads, moe_experts
from lit_lowrank.quant.moe_baselines import allocate_fp8_experts, apply_gptq_mxfp4, expert_hessians
from lit_lowrank.quant.ptq import default_forward

CONFIG = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 64, "intermediate_size": 128, "norm_topk_prob": True,
          "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def model():
    from lit_lowrank.tasks import CausalLMModule

    torch.manual_seed(0)
    return CausalLMModule(model_config=CONFIG).eval()


def _batches(n=2):
    g = torch.Generator().manual_seed(3)
    return [{"input_ids": (ids := torch.randint(0, 250, (2, 24), generator=g)), "labels": ids} for _ in range(n)]


def test_a8_loop_equals_the_family_forward_when_activations_are_exact(model, monkeypatch):
    batch = _batches(1)[0]
    ref = apply_moe_quant(copy.deepcopy(model))
    a8 = apply_moe_quant(copy.deepcopy(model), act_quant=True)
    with torch.no_grad():
        expected = ref.step(batch)["logits"]
        quantized = a8.step(batch)["logits"]
        monkeypatch.setattr(moe, "fp8_act_fake_quant", lambda x: x)    # the loop itself, activations exact
        torch.testing.assert_close(a8.step(batch)["logits"], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(quantized, expected, atol=1e-5)          # A8 changes the output
    with moe.fp_reference(a8), torch.no_grad():                        # the FP pass has no A8
        torch.testing.assert_close(a8.step(batch)["logits"], model.step(batch)["logits"])


def test_gptq_mxfp4_serves_its_codes_and_beats_rtn_on_the_calibration_output(model):
    batches = _batches()
    hessians = expert_hessians(model, batches, default_forward)
    name = next(iter(hessians))
    assert hessians[name][0].shape == (8, 64, 64) and hessians[name][1].shape == (8, 64, 64)
    gptq = apply_gptq_mxfp4(copy.deepcopy(model), hessians)
    rtn = apply_moe_quant(copy.deepcopy(model))
    for (blk, g), r in zip(moe_experts(gptq).items(), moe_experts(rtn).values()):
        for j, proj in enumerate(moe.PROJECTIONS):
            w = getattr(g.base, proj).detach()
            h = hessians[blk][j]

            def err(q):
                e = q - w
                return float(torch.einsum("eoi,eij,eoj->", e, h, e))

            assert err(g.quantized_weight(proj)) < err(r.quantized_weight(proj))
        assert g.storage().bits_per_weight == pytest.approx(4.25)
    with pytest.raises(ValueError, match="MXFP4 grid"):
        next(iter(moe_experts(gptq).values())).set_quantized("down_proj", torch.randn(8, 64, 64))


def test_mixed_precision_spends_at_most_the_budget_on_the_best_experts(model):
    loads = expert_loads(model, _batches(), default_forward)
    budget = 3 * 4 * 128 * 64 + 100                                    # three gate_up matrices' worth of extra bits
    fp8 = allocate_fp8_experts(model, loads, budget)
    mixed = apply_moe_quant(copy.deepcopy(model), fp8_experts=fp8)
    extra = sum(e.storage().payload_bits for e in moe_experts(mixed).values()) - \
        sum(e.storage().payload_bits for e in moe_experts(apply_moe_quant(copy.deepcopy(model))).values())
    assert 0 < extra <= budget
    for name, experts in moe_experts(mixed).items():
        for j, proj in enumerate(moe.PROJECTIONS):
            w = getattr(experts.base, proj).detach()
            for e in fp8[name][j]:   # those experts' error dropped by the MXFP8 factor
                assert float((experts.quantized_weight(proj)[e] - w[e]).pow(2).sum()) < \
                    float((moe.mxfp4_quantize(w[e]) - w[e]).pow(2).sum()) / 10
    with pytest.raises(ValueError, match="fp8_experts"):
        MXFP4Experts(copy.deepcopy(next(iter(moe_experts(mixed).values())).base), fp8_experts=[[9], []])
