"""GRPOModule (SR-GRPO): a few manual-optimisation steps on a tiny policy, rewards and checkpoint reload."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.datamodules.prompts import PromptDataModule
from lit_lowrank.tasks.grpo import GRPOModule

TINY_POLICY = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256}


def _module(**kwargs):
    torch.manual_seed(0)
    defaults = dict(policy=TINY_POLICY, tokenizer="byte", chat=False, group_size=3, max_new_tokens=4,
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    return GRPOModule(**{**defaults, **kwargs})


def _trainer(tmp_path, steps=2, **kwargs):
    return pl.Trainer(max_steps=steps, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1, **kwargs)


@pytest.mark.parametrize("reward", ["stable_rank", "arithmetic"])
def test_grpo_steps_move_the_policy(reward, tmp_path):
    module = _module(reward=reward, eval_reward="arithmetic", updates_per_batch=2)
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    ref_before = {k: v.clone() for k, v in module.reference.state_dict().items()}
    trainer = _trainer(tmp_path, limit_val_batches=1)
    data = PromptDataModule("arithmetic", batch_size=2, num_train=4, num_val=2)
    trainer.fit(module, datamodule=data)
    metrics = dict(trainer.callback_metrics)
    assert math.isfinite(float(metrics["train/loss"])) and "method/stable_rank/grpo_kl" in metrics
    val = trainer.validate(module, datamodule=data, verbose=False)[0]
    assert 0.0 <= val["val/task_reward"] <= 1.0 and math.isfinite(val["val/reward"])
    after = module.policy.state_dict()
    if reward == "stable_rank":  # arithmetic rewards of a random byte LM are all 0: zero advantage, no move
        assert any(not torch.equal(before[k], after[k]) for k in before), "no weight moved"
    # the reference stays frozen and is not part of the module's parameters or checkpoint
    assert all(torch.equal(ref_before[k], v) for k, v in module.reference.state_dict().items())
    assert not any(k.startswith("_reference") for k in module.state_dict())


def test_trainable_regex_freezes_the_rest_and_reload(tmp_path):
    module = _module(trainable=r"layers\.0\.mlp", beta=0.0)
    trainable = [n for n, p in module.policy.named_parameters() if p.requires_grad]
    assert trainable and all("layers.0.mlp" in n for n in trainable)
    trainer = _trainer(tmp_path, limit_val_batches=0)
    trainer.fit(module, datamodule=PromptDataModule("arithmetic", batch_size=2, num_train=4, num_val=2))
    path = tmp_path / "grpo.ckpt"
    trainer.save_checkpoint(path)
    reloaded = GRPOModule.load_from_checkpoint(path, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    for (k, a), b in zip(module.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="trainable"):
        _module(trainable="nothing_matches_this")
    with pytest.raises(ValueError, match="group_size"):
        _module(group_size=1)
