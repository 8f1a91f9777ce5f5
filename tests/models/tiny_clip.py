"""A tiny random transformers ``CLIPModel`` and a character tokenizer (no CLIP weights or vocab ship offline)."""

from __future__ import annotations

import torch

EOS = 99


class CharTokenizer:
    """Enough of a Hugging Face tokenizer for CLIP prompts: characters -> ids 3..92, BOS 1, EOS 99, pad 0."""

    def __call__(self, texts, padding=True, truncation=True, max_length=77, return_tensors="pt"):
        ids = [[1] + [3 + ord(c) % 90 for c in t][: max_length - 2] + [EOS] for t in texts]
        n = max(map(len, ids))
        input_ids = torch.zeros(len(ids), n, dtype=torch.long)
        mask = torch.zeros(len(ids), n, dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return {"input_ids": input_ids, "attention_mask": mask}


def tiny_clip(seed: int = 0, image_size: int = 16, channels: int = 3):
    """A random ``CLIPModel`` (2 layers, width 32, joint width 16, 4x4 patches) in eval mode."""
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config={"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "max_position_embeddings": 80, "eos_token_id": EOS,
                     "bos_token_id": 1, "pad_token_id": 0},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": image_size, "patch_size": 4, "num_channels": channels},
        projection_dim=16)
    return CLIPModel(config).eval()
