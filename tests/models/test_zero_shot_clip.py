"""ZeroShotCLIP on a tiny random transformers CLIPModel: CLIP's zero-shot logits, input units, what trains,
clear errors, and an open_clip-shaped model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_lowrank.models import ZeroShotCLIP
from lit_lowrank.models.dual_encoder import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from tests.models.tiny_clip import CharTokenizer, tiny_clip

NAMES = ["zero", "one", "two"]


def _manual(clip, pixels, names, templates):
    """CLIP zero-shot logits computed from the CLIPModel's own submodules."""
    mean, std = torch.tensor(OPENAI_CLIP_MEAN).view(1, 3, 1, 1), torch.tensor(OPENAI_CLIP_STD).view(1, 3, 1, 1)
    pixels = F.interpolate(pixels, size=(16, 16), mode="bilinear", align_corners=False)
    f = F.normalize(clip.visual_projection(clip.vision_model(pixel_values=(pixels - mean) / std).pooler_output), dim=-1)
    tok = CharTokenizer()([t.format(n) for t in templates for n in names])
    t = F.normalize(clip.text_projection(clip.text_model(**tok).pooler_output), dim=-1)
    t = F.normalize(t.view(len(templates), len(names), -1).mean(0), dim=-1)
    return clip.logit_scale.exp() * f @ t.T, f


def test_logits_are_clips_prompt_ensemble_zero_shot():
    clip, templates = tiny_clip(), ("a {}.", "the digit {}.")
    model = ZeroShotCLIP(clip, NAMES, templates=templates, tokenizer=CharTokenizer())
    pixels = torch.rand(4, 3, 12, 12)
    with torch.no_grad():
        expected, feats = _manual(clip, pixels, NAMES, templates)
        assert torch.allclose(model(pixels), expected, atol=1e-5)
        assert torch.allclose(model.forward_features(pixels), feats, atol=1e-6)


def test_input_standardisation_is_undone_and_grey_is_repeated():
    clip = tiny_clip()
    plain = ZeroShotCLIP(clip, NAMES, tokenizer=CharTokenizer())
    standardised = ZeroShotCLIP(clip, NAMES, tokenizer=CharTokenizer(), input_mean=0.3, input_std=0.4)
    grey = torch.rand(3, 1, 16, 16)
    with torch.no_grad():
        assert torch.allclose(standardised((grey - 0.3) / 0.4), plain(grey.expand(-1, 3, -1, -1)), atol=1e-5)
    with pytest.raises(ValueError, match="2 channels"):
        plain(torch.rand(2, 2, 16, 16))
    with pytest.raises(ValueError, match="input_std"):
        ZeroShotCLIP(clip, NAMES, tokenizer=CharTokenizer(), input_std=0.0)


def test_only_the_class_embeddings_train():
    model = ZeroShotCLIP(tiny_clip(), NAMES, tokenizer=CharTokenizer())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["class_embeddings"]
    frozen = ZeroShotCLIP(tiny_clip(), NAMES, tokenizer=CharTokenizer(), learn_class_embeddings=False)
    assert not any(p.requires_grad for p in frozen.parameters())


def test_clear_errors():
    clip = tiny_clip()
    with pytest.raises(ValueError, match="tokenizer"):
        ZeroShotCLIP(clip, NAMES)
    with pytest.raises(ValueError, match="class_names"):
        ZeroShotCLIP(clip, ["only"], tokenizer=CharTokenizer())
    with pytest.raises(ValueError, match="templates"):
        ZeroShotCLIP(clip, NAMES, templates=("no placeholder",), tokenizer=CharTokenizer())
    with pytest.raises(TypeError, match="Linear"):
        ZeroShotCLIP(nn.Linear(2, 2), NAMES)
    with pytest.raises(FileNotFoundError, match="config.json"):
        ZeroShotCLIP("/nonexistent/clip", NAMES)


def test_an_open_clip_shaped_model():
    """open_clip's interface (encode_image / encode_text / logit_scale + a tokenizer returning ids)."""
    clip = tiny_clip()
    tok = CharTokenizer()

    class OpenCLIPLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.clip, self.logit_scale = clip, clip.logit_scale
            self.visual = nn.Module()
            self.visual.image_size = 16

        def encode_image(self, x):
            return self.clip.visual_projection(self.clip.vision_model(pixel_values=x).pooler_output)

        def encode_text(self, ids):
            mask = (ids != 0).long()
            return self.clip.text_projection(self.clip.text_model(input_ids=ids, attention_mask=mask).pooler_output)

    model = ZeroShotCLIP(OpenCLIPLike(), NAMES, tokenizer=lambda texts: tok(texts)["input_ids"])
    pixels = torch.rand(4, 3, 16, 16)
    with torch.no_grad():
        expected, _ = _manual(clip, pixels, NAMES, ("a photo of a {}.",))
        assert torch.allclose(model(pixels), expected, atol=1e-5)
