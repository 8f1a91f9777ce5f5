"""A plain user causal-LM LightningModule (not ours) around a tiny transformers Qwen3-MoE, for the
``moe_quant`` contract case: its only lit_lowrank line is ``apply_loss_hooks``; packed text batches."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from lit_lowrank.core import apply_loss_hooks

TINY_QWEN3_MOE = {"vocab_size": 258, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "intermediate_size": 64}


class PlainUserMoELM(pl.LightningModule):
    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM

        self.save_hyperparameters()
        self.model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **TINY_QWEN3_MOE))

    def forward(self, input_ids: torch.Tensor):
        return self.model(input_ids=input_ids)

    def training_step(self, batch, batch_idx):
        logits = self(batch["input_ids"]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        loss = apply_loss_hooks(self, batch, {"logits": logits}, loss)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.hparams.lr)
