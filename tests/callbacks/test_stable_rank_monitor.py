"""StableRankMonitor logs stable rank of training hidden states and of generated responses."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.callbacks.stable_rank import StableRankMonitor
from lit_lowrank.datamodules import PackedTextDataModule
from lit_lowrank.tasks import CausalLMModule

TINY = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256}


def test_monitor_logs_train_and_generated(tmp_path):
    torch.manual_seed(0)
    monitor = StableRankMonitor(prompts=["The cat", "A"], max_new_tokens=5, every_n_steps=1, generate_every_n_steps=2)
    trainer = pl.Trainer(max_steps=2, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                         limit_val_batches=1, val_check_interval=2, callbacks=[monitor])
    trainer.fit(CausalLMModule(model_config=TINY), datamodule=PackedTextDataModule(corpus="lee", seq_len=64,
                                                                                  batch_size=4, max_documents=40))
    metrics = trainer.callback_metrics
    for key in ("method/stable_rank/train_hidden", "method/stable_rank/generated", "method/stable_rank/generated_tokens"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    assert 1.0 <= float(metrics["method/stable_rank/train_hidden"]) <= 32
    assert float(metrics["method/stable_rank/generated_tokens"]) <= 5


def test_monitor_requires_a_causal_lm(tmp_path):
    from tests.methods.plain import PlainUserClassifier

    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         accelerator="cpu", devices=1, default_root_dir=tmp_path, callbacks=[StableRankMonitor()])
    from lit_lowrank.datamodules import DigitsDataModule

    with pytest.raises(ValueError, match="model_attr"):
        trainer.fit(PlainUserClassifier(), datamodule=DigitsDataModule(batch_size=8))
