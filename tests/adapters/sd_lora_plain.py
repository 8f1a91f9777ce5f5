"""A tiny random dual encoder and a plain user LightningModule for the SD-LoRA tests and contract case.

The plain module is not ours: a user's CLIP-LoRA loop whose only lit_lowrank lines are
``apply_loss_hooks`` and the two members SDLoRA reads (``embed_dim``, ``frozen_graph_inputs``).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from lit_lowrank.core import apply_loss_hooks
from lit_lowrank.models.dual_encoder import DualEncoder, frozen_graph_inputs

PROMPTS = [f"a photo of the digit {n}." for n in ("five", "six", "seven", "eight", "nine")]


def tiny_encoder(seed: int = 0, embed_dim: int = 16) -> DualEncoder:
    """Random CLIP ViT (1×28×28, 7×7 patches) + random 1-layer BERT with the shipped MiniLM tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel, CLIPVisionConfig, CLIPVisionModel

    from lit_lowrank.models.pretrained import minilm_path

    torch.manual_seed(seed)
    vision = CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=4, image_size=28, patch_size=7, num_channels=1))
    text = BertModel(BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                vocab_size=30522, max_position_embeddings=64))
    tokenizer = AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)
    return DualEncoder(vision, text, nn.Linear(32, embed_dim, bias=False), nn.Linear(32, embed_dim, bias=False),
                       nn.Parameter(torch.tensor(2.0)), tokenizer, image_mean=(0.5,), image_std=(0.5,),
                       text_pooling="mean")


class PlainFewShotCLIP(pl.LightningModule):
    """A user's CLIP-LoRA few-shot module (PEFT LoRA on q/k/v of both towers)."""

    def __init__(self) -> None:
        super().__init__()
        from peft import LoraConfig, inject_adapter_in_model

        self.encoder = tiny_encoder()
        self.encoder.requires_grad_(False)
        inject_adapter_in_model(LoraConfig(r=2, lora_alpha=1, target_modules=r".*\.(q_proj|k_proj|v_proj|query|key|value)$"),
                                self.encoder)
        for name, p in self.encoder.named_parameters():
            p.requires_grad_("lora_" in name)
        self.tokens = self.encoder.tokenize(PROMPTS)
        self.embed_dim = self.encoder.embed_dim

    def frozen_graph_inputs(self, x: torch.Tensor, crops: int = 4, frozen: bool = True) -> dict[str, torch.Tensor]:
        return frozen_graph_inputs(self.encoder, x, **self.tokens, crops=crops, frozen=frozen)

    def training_step(self, batch, batch_idx):
        glob, patches = self.encoder.encode_image(batch["x"])
        text = self.encoder.encode_text(**self.tokens)
        logits = self.encoder.logit_scale.exp() * glob @ text.T
        loss = F.cross_entropy(logits, batch["y"])
        outputs = {"logits": logits, "features": glob, "patch_features": patches, "text_features": text}
        loss = apply_loss_hooks(self, batch, outputs, loss)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-3)
