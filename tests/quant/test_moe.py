"""MXFP4 experts, compensators and routing record/replay on tiny Qwen3-MoE, Mixtral and OLMoE configs."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.ops.lowrank import singular_values
from lit_lowrank.ops.mxfp4 import mxfp4_quantize
from lit_lowrank.quant.moe import (
    MXFP4Experts,
    allocate_expert_ranks,
    apply_moe_quant,
    expert_loads,
    expert_residual_spectra,
    fp_reference,
    load_weighted_error,
    load_weighted_residual,
    moe_experts,
)
from lit_lowrank.quant.moe_routing import RouteController, find_moe_blocks, replay_schedule, select_layers

FAMILIES = {
    "qwen3_moe": {"num_experts": 8, "moe_intermediate_size": 64, "head_dim": 16},
    "mixtral": {"num_local_experts": 8, "intermediate_size": 64},
    "olmoe": {"num_experts": 8, "intermediate_size": 64},
}


def tiny_moe(family: str, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(family, vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, num_experts_per_tok=2, pad_token_id=0, bos_token_id=1,
                               eos_token_id=2, **FAMILIES[family])
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _ids(seed: int = 0):
    return torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(seed))


def _capture_expert_routes(model):
    """The top-k indices the experts actually receive, per layer (pre-hooks on the experts modules)."""
    seen: dict[int, list[torch.Tensor]] = {}
    handles = []
    for i, (_, block) in enumerate(find_moe_blocks(model)):
        def hook(module, args, kwargs, i=i):
            index = args[1] if len(args) > 1 else kwargs["top_k_index"]
            seen.setdefault(i, []).append(index.clone())
        handles.append(block.experts.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_replay_reproduces_recorded_routes_exactly(family):
    model = tiny_moe(family)
    x = _ids()
    ctl = RouteController(model)
    with ctl.mode("record"):
        model(x)
    recorded = {i: [r.clone() for r in calls] for i, calls in ctl.routes.items()}
    apply_moe_quant(model)
    with torch.no_grad():  # a different model: routes now change on their own
        for _, block in find_moe_blocks(model):
            block.gate.weight.add_(torch.randn_like(block.gate.weight) * 2)
    seen, handles = _capture_expert_routes(model)
    with ctl.mode("observe"):
        model(x)
    own = {i: v[0] for i, v in seen.items()}
    seen.clear()
    with ctl.mode("replay"):
        model(x)
    for h in handles:
        h.remove()
    for i, calls in recorded.items():
        assert torch.equal(seen[i][0], calls[0]), f"layer {i}: replayed routes differ from the recorded ones"
    assert any(not torch.equal(own[i], recorded[i][0]) for i in recorded), "the test must perturb the routes"
    assert min(ctl.agreement_per_layer().values()) < 1.0  # the model's own choice is still measured


def test_replay_weights_come_from_the_current_router_and_layers_subset():
    model = tiny_moe("qwen3_moe")
    x = _ids(1)
    ctl = RouteController(model)
    with ctl.mode("record"):
        model(x)
    recorded = {i: c[0].clone() for i, c in ctl.routes.items()}
    with torch.no_grad():
        for _, block in find_moe_blocks(model):
            block.gate.weight.add_(torch.randn_like(block.gate.weight) * 2)
    ctl.replay_layers = select_layers(2, [1])
    got: dict[int, tuple] = {}
    for i, router in ctl.routers.items():
        router.register_forward_hook(lambda m, a, out, i=i: got.__setitem__(i, (a[0], out)))
    with ctl.mode("replay"):
        model(x)
    hidden, (logits, weights, index) = got[1]
    assert torch.equal(index, recorded[1])
    probs = torch.softmax(logits.float(), -1).gather(-1, recorded[1])
    if ctl.routers[1].norm_topk_prob:
        probs = probs / probs.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, probs.to(weights.dtype))
    assert not torch.equal(got[0][1][2], recorded[0])  # layer 0 is not replayed: it routes itself


def test_replay_needs_a_recording_of_the_same_batch():
    model = tiny_moe("mixtral")
    ctl = RouteController(model)
    with ctl.mode("record"):
        model(_ids())
    with pytest.raises(RuntimeError, match="recorded"), ctl.mode("replay"):
        model(torch.randint(0, 64, (3, 5)))


def test_compensators_start_at_the_svd_of_the_residual_and_fp_reference_is_exact():
    model = tiny_moe("qwen3_moe")
    x = _ids(2)
    with torch.no_grad():
        fp = model(x).logits
    loads = expert_loads(model, [x], lambda m, b: m(b))
    spectra = expert_residual_spectra(model)
    ranks = allocate_expert_ranks(spectra, loads, avg_rank=4)
    uniform = allocate_expert_ranks(spectra, loads, avg_rank=4, allocation="uniform")
    assert sum(map(sum, (r for v in ranks.values() for r in v))) == sum(map(sum, (r for v in uniform.values()
                                                                                  for r in v)))
    assert load_weighted_residual(spectra, loads, ranks) <= load_weighted_residual(spectra, loads, uniform)
    apply_moe_quant(model, ranks=ranks)
    # the error left is exactly the SVD tail (Eckart–Young), expert by expert
    assert load_weighted_error(model, loads) == pytest.approx(load_weighted_residual(spectra, loads, ranks), rel=1e-4)
    experts = next(iter(moe_experts(model).values()))
    w = experts.base.gate_up_proj.detach()
    left = w - mxfp4_quantize(w) - experts.correction("gate_up_proj").detach()
    r0 = experts.ranks[0][0]
    tail = singular_values(w[0] - mxfp4_quantize(w[0]))[r0:]
    assert float(left[0].pow(2).sum()) == pytest.approx(float(tail.pow(2).sum()), rel=1e-3)
    with torch.no_grad(), fp_reference(model):
        torch.testing.assert_close(model(x).logits, fp, rtol=0, atol=0)
    with torch.no_grad():
        q = model(x).logits
    assert not torch.equal(q, fp)


def test_apply_is_idempotent_and_only_compensators_train():
    model = tiny_moe("olmoe")
    once = apply_moe_quant(model, ranks={"model.layers.0.mlp": [[2] * 8, [1] * 8]})
    names = list(once.state_dict())
    apply_moe_quant(model, ranks={"model.layers.0.mlp": [[2] * 8, [1] * 8]})
    assert list(model.state_dict()) == names
    experts = moe_experts(model)["model.layers.0.mlp"]
    assert isinstance(experts, MXFP4Experts)
    assert not experts.base.gate_up_proj.requires_grad and experts.lora_A_gate_up_proj.requires_grad
    assert experts.trainable_parameters() == 8 * 2 * (128 + 64) + 8 * 1 * (64 + 64)
    # every stored parameter: 4.25 bits per expert weight + the compensator factors in BF16
    weights = 8 * (128 * 64 + 64 * 64)
    assert experts.storage(compensator_bits=None).bits_per_weight == 4.25
    assert experts.storage().bits_per_weight == pytest.approx(4.25 + 16 * experts.trainable_parameters() / weights)
    assert experts.storage().num_weights == weights
    with pytest.raises(ValueError, match="not MoE blocks"):
        apply_moe_quant(tiny_moe("olmoe"), ranks={"model.layers.9.mlp": [[1] * 8, [1] * 8]})


def test_load_from_checkpoint_rebuilds_the_quantized_experts(tmp_path):
    import lightning.pytorch as pl

    from lit_lowrank.callbacks.moe_quant import MoEQuantQAT
    from lit_lowrank.datamodules.text import PackedTextDataModule
    from lit_lowrank.tasks import CausalLMModule

    cfg = {"model_type": "qwen3_moe", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "intermediate_size": 64}
    torch.manual_seed(0)
    module = CausalLMModule(model_config=cfg)
    data = PackedTextDataModule(seq_len=32, batch_size=2, max_documents=8)
    trainer = pl.Trainer(max_steps=2, callbacks=[MoEQuantQAT(avg_rank=2, calibration_batches=1)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, accelerator="cpu")
    trainer.fit(module, datamodule=data)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    reloaded = CausalLMModule.load_from_checkpoint(path)
    assert list(reloaded.state_dict()) == list(module.state_dict())
    x = torch.randint(0, 258, (1, 16))
    module.eval(), reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, module(x).logits)
    # resuming fit takes the checkpoint's ranks (a different budget here would not load otherwise)
    resumed = pl.Trainer(max_steps=3, callbacks=[MoEQuantQAT(avg_rank=3, calibration_batches=1)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, accelerator="cpu")
    torch.manual_seed(1)
    fresh = CausalLMModule(model_config=cfg)
    resumed.fit(fresh, datamodule=data, ckpt_path=path)
    assert resumed.global_step == 3
    assert [e.ranks for e in moe_experts(fresh).values()] == [e.ranks for e in moe_experts(module).values()]


def test_schedule_and_layer_selection():
    assert replay_schedule(50, 100, 1.0, 0.0, "linear") == 0.5
    assert replay_schedule(100, 100, 1.0, 0.0, "cosine") == pytest.approx(0.0)
    assert replay_schedule(7, 100, 0.3, 0.0, "constant") == 0.3
    assert select_layers(8, 0.25) == {6, 7} and select_layers(3, None) == {0, 1, 2}
    with pytest.raises(ValueError, match="layers"):
        select_layers(4, [5])
    with pytest.raises(ValueError, match="schedule"):
        replay_schedule(0, 1, 1.0, 0.0, "step")


def test_packed_mxfp4_linear_matches_fake_quant_and_counts_4_25_bits():
    from torch import nn

    from lit_lowrank.quant import buffer_bytes
    from lit_lowrank.quant.mxfp4 import MXFP4Linear

    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    layer = MXFP4Linear.from_linear(linear)
    layer.tile_rows = 7  # ragged tiles exercise the offset reads
    torch.testing.assert_close(layer.dequantize(), mxfp4_quantize(linear.weight.detach()), rtol=0, atol=0)
    x = torch.randn(5, 96)
    torch.testing.assert_close(layer(x), x @ mxfp4_quantize(linear.weight.detach()).T + linear.bias.detach())
    assert layer.storage().bits_per_weight == 4.25
    assert abs(buffer_bytes(layer) * 8 / (96 * 40) - 4.25) < 0.05  # padding only


@pytest.mark.parametrize("seed", range(4))
def test_load_aware_ranks_never_leave_more_weighted_residual_than_uniform(seed):
    """Greedy allocation is optimal for the load-weighted residual energy: a test, not a benchmark claim."""
    model = tiny_moe("qwen3_moe", seed=seed)
    spectra = expert_residual_spectra(model)
    torch.manual_seed(seed)  # the Dirichlet draws
    for concentration in (0.3, 1.0, 10.0):
        loads = {name: torch.distributions.Dirichlet(torch.full((8,), concentration)).sample()
                 for name in spectra}
        for avg_rank in (1, 4):
            ranks = allocate_expert_ranks(spectra, loads, avg_rank)
            uniform = allocate_expert_ranks(spectra, loads, avg_rank, allocation="uniform")
            total = lambda r: sum(sum(x) for v in r.values() for x in v)  # noqa: E731
            assert total(ranks) == total(uniform)
            assert load_weighted_residual(spectra, loads, ranks) <= load_weighted_residual(spectra, loads, uniform) + 1e-12


def test_random_subspace_compensators_keep_ranks_and_leave_more_residual():
    model = tiny_moe("qwen3_moe")
    ranks = {name: [[3] * 8, [2] * 8] for name, _ in find_moe_blocks(model)}
    svd = apply_moe_quant(tiny_moe("qwen3_moe"), ranks=ranks)
    rnd = apply_moe_quant(model, ranks=ranks, init="random", seed=1)
    loads = {name: torch.full((8,), 1 / 8) for name in ranks}
    for name, e in moe_experts(rnd).items():
        assert e.ranks == moe_experts(svd)[name].ranks
        assert e.trainable_parameters() == moe_experts(svd)[name].trainable_parameters()
        w = e.base.gate_up_proj.detach()[0]
        residual = w - mxfp4_quantize(w)
        a = e.lora_A_gate_up_proj.detach()[0, :3]  # orthonormal rows: the correction is R V Vᵀ
        torch.testing.assert_close(a @ a.T, torch.eye(3), atol=1e-5, rtol=0)
        torch.testing.assert_close(e.correction("gate_up_proj").detach()[0], residual @ a.T @ a, atol=1e-5, rtol=1e-4)
    assert 0 < load_weighted_error(svd, loads) < load_weighted_error(rnd, loads) < 1
    again = apply_moe_quant(tiny_moe("qwen3_moe"), ranks=ranks, init="random", seed=1)
    for (n1, p1), (n2, p2) in zip(rnd.named_parameters(), again.named_parameters()):
        assert torch.equal(p1, p2), n1  # seeded
    with pytest.raises(ValueError, match="init"):
        apply_moe_quant(tiny_moe("qwen3_moe"), init="orthogonal")


def test_qat_refuses_to_freeze_an_adapter_injected_before_it():
    """#29: an adapter injected before MoE QAT's setup would be frozen silently; it is refused, naming the fix."""
    from lit_lowrank.adapters import inject_adapters
    from lit_lowrank.callbacks.moe_quant import MoEQuantQAT
    from lit_lowrank.tasks import CausalLMModule

    cfg = {"model_type": "qwen3_moe", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "intermediate_size": 64}
    module = CausalLMModule(model_config=cfg)
    MoEQuantQAT(avg_rank=2)._freeze(module)  # no adapter: freezes quietly
    inject_adapters(module, method="lora", target_modules=["q_proj"], rank=2)
    with pytest.raises(RuntimeError, match="q_proj.*AdapterInjector after MoEQuantQAT"):
        MoEQuantQAT(avg_rank=2)._freeze(module)
