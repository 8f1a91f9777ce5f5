"""MoEQuantQAT + RoutingReplay inside fit: routers stay frozen, only the compensators move, replay
decisions follow the schedule, and the diagnostics are logged under method/moe_quant/."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.callbacks.moe_quant import MoEQuantQAT, RoutingReplay
from lit_lowrank.datamodules.text import PackedTextDataModule
from lit_lowrank.quant.moe import moe_experts
from lit_lowrank.quant.moe_routing import find_moe_blocks
from tests.callbacks.moe_plain import PlainUserMoELM


def _fit(callbacks, steps=4, **kwargs):
    torch.manual_seed(0)
    module = PlainUserMoELM()
    trainer = pl.Trainer(max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         accelerator="cpu", **kwargs)
    trainer.fit(module, datamodule=PackedTextDataModule(seq_len=32, batch_size=2, max_documents=8))
    return module, trainer


class _InitProbe(pl.Callback):
    """Copies the compensators as they are when training starts (after MoEQuantQAT.setup)."""

    def on_train_start(self, trainer, pl_module):
        self.init = {n: p.detach().clone() for n, p in pl_module.named_parameters() if ".lora_" in n}


def test_router_frozen_and_only_compensators_train():
    torch.manual_seed(0)
    reference = PlainUserMoELM()
    probe = _InitProbe()
    replay = RoutingReplay(replay_start=1.0, replay_end=1.0, schedule="constant")
    module, trainer = _fit([MoEQuantQAT(avg_rank=2, calibration_batches=1), replay, probe])
    reference_blocks = dict(find_moe_blocks(reference))
    for name, block in find_moe_blocks(module):
        assert not block.gate.weight.requires_grad
        assert torch.equal(block.gate.weight, reference_blocks[name].gate.weight), f"{name}: the router moved"
    experts = moe_experts(module)
    assert len(experts) == 2
    for name, e in experts.items():  # frozen expert weights (the base keeps the FP weights)
        assert torch.equal(e.base.down_proj, reference_blocks[name].experts.down_proj)
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A_" in n or ".lora_B_" in n for n in trainable)
    params = dict(module.named_parameters())
    assert any(not torch.equal(params[n], v) for n, v in probe.init.items()), "no compensator moved"
    metrics = trainer.callback_metrics
    assert float(metrics["method/moe_quant/replayed"]) == 1.0
    assert "method/moe_quant/agreement/layer1" in metrics and "method/moe_quant/kl" in metrics
    assert "method/moe_quant/rank/layer0/gate_up_proj/expert0" in metrics


def test_replay_decisions_follow_the_schedule_and_are_seeded():
    rr = RoutingReplay(replay_start=1.0, replay_end=0.0, anneal_steps=1000, seed=3)
    probs = [rr.replay_probability(s) for s in range(0, 1000, 100)]
    assert probs == sorted(probs, reverse=True) and probs[0] == 1.0
    draws = [rr.replay_decision(s, 0.3) for s in range(2000)]
    assert draws == [RoutingReplay(seed=3).replay_decision(s, 0.3) for s in range(2000)]
    assert 0.25 < sum(draws) / len(draws) < 0.35
    with pytest.raises(ValueError, match="replay_start"):
        RoutingReplay(replay_start=1.5)
    with pytest.raises(ValueError, match="allocation"):
        MoEQuantQAT(allocation="random")


def test_shuffled_route_control_replays_a_permutation_of_the_fp_routes():
    """The control keeps each layer's expert loads and breaks the token-to-expert pairs."""
    torch.manual_seed(0)
    seen = {}

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen[batch_idx] = {i: [c.clone() for c in calls] for i, calls in replay.controller.routes.items()}

    replay = RoutingReplay(replay_start=1.0, replay_end=1.0, schedule="constant", route_source="shuffled")
    fp = RoutingReplay(replay_start=1.0, replay_end=1.0, schedule="constant")
    _fit([MoEQuantQAT(avg_rank=2, calibration_batches=1), replay, Spy()], steps=1)
    shuffled = seen[0]
    recorded = {}

    class Spy2(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            recorded.update({i: [c.clone() for c in calls] for i, calls in fp.controller.routes.items()})

    _fit([MoEQuantQAT(avg_rank=2, calibration_batches=1), fp, Spy2()], steps=1)
    changed = False
    for i, calls in recorded.items():
        for a, b in zip(calls, shuffled[i]):
            assert torch.equal(torch.bincount(a.flatten(), minlength=8), torch.bincount(b.flatten(), minlength=8))
            changed |= not torch.equal(a, b)
    assert changed
    with pytest.raises(ValueError, match="route_source"):
        RoutingReplay(route_source="random")
