"""A zero-shot CLIP classifier over class prompts: the vision–language second model of SafeCut (and DIFO).

:class:`ZeroShotCLIP` turns a CLIP model and a list of class names into a classifier with
``forward(x) -> logits (B, C)`` and ``forward_features(x) -> (B, D)`` (the L2-normalised image
embedding), the interface :class:`~lit_lowrank.callbacks.SafeCut` reads. It accepts

- a local transformers CLIP folder (a string: never a hub download), a transformers ``CLIPModel``
  (with its tokenizer) or a :class:`~lit_lowrank.models.dual_encoder.DualEncoder`;
- an open_clip model (``encode_image`` / ``encode_text`` / ``logit_scale``, with its tokenizer),
  when open_clip is installed (it is not a dependency).

Class embeddings are CLIP's prompt ensemble: the mean over ``templates`` of the L2-normalised
prompt embeddings, renormalised; the text tower runs once, at construction. Every CLIP weight is
frozen; with ``learn_class_embeddings=True`` the class embeddings are a trainable Parameter
(prompt-embedding tuning: the only parameter a SafeCut run adapts unless the user unfreezes or
injects LoRA into ``zero_shot.encoder``).

Inputs: whatever the target datamodule yields. ``input_mean`` / ``input_std`` undo its
standardisation, in **units of pixel intensity in [0, 1]**: the model computes
``pixels = x * input_std + input_mean`` (so pass ``DigitsDataModule.mean`` / ``.std``, never
0–255 or scikit-learn's 0–16 counts); grey images are repeated to the tower's channels, then
resized to its resolution and normalised with CLIP's own mean/std.

.. code-block:: python

    clip = ZeroShotCLIP("~/models/clip-vit-base-patch16", class_names=["zero", "one", ...],
                        templates=("a photo of the digit {}.",), input_mean=dm.mean, input_std=dm.std)
    SafeCut(second_model=clip)       # adapts only clip.class_embeddings
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.models.dual_encoder import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, DualEncoder

DEFAULT_TEMPLATES = ("a photo of a {}.",)


class _OpenCLIPTowers(nn.Module):
    """An open_clip model behind :class:`DualEncoder`'s three calls (``encode_image`` → (global, None))."""

    def __init__(self, model: nn.Module, tokenizer: Callable[[list[str]], Tensor],
                 image_mean: Sequence[float], image_std: Sequence[float]) -> None:
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        size = getattr(getattr(model, "visual", None), "image_size", 224)
        self.image_size = int(size[0] if isinstance(size, (tuple, list)) else size)
        self.channels = len(image_mean)
        self.register_buffer("image_mean", torch.tensor(image_mean).view(-1, 1, 1), persistent=False)
        self.register_buffer("image_std", torch.tensor(image_std).view(-1, 1, 1), persistent=False)
        self.logit_scale = model.logit_scale

    def encode_image(self, pixels: Tensor) -> tuple[Tensor, None]:
        pixels = F.interpolate(pixels, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        return F.normalize(self.model.encode_image((pixels - self.image_mean) / self.image_std), dim=-1), None

    def encode_prompts(self, prompts: list[str]) -> Tensor:
        return F.normalize(self.model.encode_text(self.tokenizer(prompts)), dim=-1)


def _towers(clip: Any, tokenizer: Any, image_mean: Sequence[float] | None,
            image_std: Sequence[float] | None) -> tuple[nn.Module, int]:
    """``(towers, image channels)`` for every accepted kind of ``clip``."""
    mean, std = image_mean or OPENAI_CLIP_MEAN, image_std or OPENAI_CLIP_STD
    if isinstance(clip, str):
        encoder = DualEncoder.from_pretrained(clip)
    elif isinstance(clip, DualEncoder):
        encoder = clip
    elif all(hasattr(clip, a) for a in ("vision_model", "text_model", "visual_projection", "text_projection")):
        if tokenizer is None:
            raise ValueError("ZeroShotCLIP: a transformers CLIPModel needs its `tokenizer` (e.g. "
                             "CLIPTokenizer.from_pretrained(folder, local_files_only=True)); got None.")
        encoder = DualEncoder.from_clip(clip, tokenizer, mean, std)
    elif all(hasattr(clip, a) for a in ("encode_image", "encode_text", "logit_scale")):
        if tokenizer is None:
            raise ValueError("ZeroShotCLIP: an open_clip model needs its `tokenizer` "
                             "(open_clip.get_tokenizer(model_name)); got None.")
        return _OpenCLIPTowers(clip, tokenizer, mean, std), len(mean)
    else:
        raise TypeError(f"ZeroShotCLIP: `clip` of type {type(clip).__name__} is none of a local CLIP folder (str), "
                        "a transformers CLIPModel, a DualEncoder or an open_clip model (encode_image/encode_text/"
                        "logit_scale).")
    return encoder, int(getattr(encoder.image.vision_model.config, "num_channels", 3))


class ZeroShotCLIP(nn.Module):
    """CLIP zero-shot classification over class prompts, with ``forward_features``.

    ``logits = exp(logit_scale) · f(x) · normalize(T)ᵀ``, ``f`` the L2-normalised image embedding
    ``(B, D)`` and ``T (C, D)`` the class embeddings (prompt ensemble over ``templates``).

    Args:
        clip: a local transformers CLIP folder, a transformers ``CLIPModel``, a
            :class:`~lit_lowrank.models.dual_encoder.DualEncoder` or an open_clip model.
        class_names: one name per class, in the label order of the target data (>= 2).
        templates: prompt templates with one ``{}`` each (CLIP's ensemble: embeddings averaged).
        tokenizer: the tokenizer of a ``CLIPModel`` / open_clip model (a folder or DualEncoder has its own).
        input_mean, input_std: the standardisation the inputs carry, in pixel units in [0, 1]
            (``pixels = x · input_std + input_mean``); scalars or one value per channel.
        image_mean, image_std: CLIP's own pixel normalisation (default OpenAI's) for ``CLIPModel`` /
            open_clip inputs.
        learn_class_embeddings: make the class embeddings a trainable Parameter (every CLIP weight
            stays frozen either way).

    .. code-block:: python

        clip = ZeroShotCLIP(CLIPModel.from_pretrained(folder), ["cat", "dog"], tokenizer=tok)
        logits, feats = clip(images), clip.forward_features(images)     # (B, 2), (B, D)
    """

    def __init__(self, clip: Any, class_names: Sequence[str], templates: Sequence[str] = DEFAULT_TEMPLATES,
                 tokenizer: Any = None, input_mean: float | Sequence[float] = 0.0,
                 input_std: float | Sequence[float] = 1.0, image_mean: Sequence[float] | None = None,
                 image_std: Sequence[float] | None = None, learn_class_embeddings: bool = True) -> None:
        super().__init__()
        if isinstance(class_names, str) or len(class_names) < 2:
            raise ValueError(f"`class_names`={class_names!r}: expected a list of >= 2 names.")
        if not templates or any("{}" not in t for t in templates):
            raise ValueError(f"`templates`={templates!r}: expected >= 1 template, each with a '{{}}' placeholder.")
        std = torch.as_tensor(input_std, dtype=torch.float32).reshape(-1)
        if not bool((std > 0).all()):
            raise ValueError(f"`input_std`={input_std!r}: expected > 0 (pixel units in [0, 1]).")
        self.encoder, self.channels = _towers(clip, tokenizer, image_mean, image_std)
        self.encoder.requires_grad_(False).eval()
        self.class_names, self.templates = list(class_names), tuple(templates)
        self.register_buffer("input_mean", torch.as_tensor(input_mean, dtype=torch.float32).reshape(-1, 1, 1),
                             persistent=False)
        self.register_buffer("input_std", std.reshape(-1, 1, 1), persistent=False)
        with torch.no_grad():
            embeddings = F.normalize(self.prompt_embeddings().mean(0), dim=-1)
        self.class_embeddings = nn.Parameter(embeddings, requires_grad=learn_class_embeddings)

    def prompt_embeddings(self) -> Tensor:
        """L2-normalised embeddings ``(templates, C, D)`` of every (template, class) prompt."""
        prompts = [t.format(n.replace("_", " ")) for t in self.templates for n in self.class_names]
        if isinstance(self.encoder, _OpenCLIPTowers):
            text = self.encoder.encode_prompts(prompts)
        else:
            tokens = self.encoder.tokenize(prompts)
            device = self.encoder.logit_scale.device
            text = self.encoder.encode_text(**{k: v.to(device) for k, v in tokens.items()})
        return text.view(len(self.templates), len(self.class_names), -1)

    def pixels(self, x: Tensor) -> Tensor:
        """Inputs ``(B, C, H, W)`` back to pixels in [0, 1], with the tower's channel count."""
        if x.dim() != 4:
            raise ValueError(f"ZeroShotCLIP: input of shape {tuple(x.shape)}, expected (B, C, H, W) images.")
        pixels = x * self.input_std.to(x.dtype) + self.input_mean.to(x.dtype)
        if pixels.shape[1] == 1 and self.channels != 1:
            pixels = pixels.expand(-1, self.channels, -1, -1)
        if pixels.shape[1] != self.channels:
            raise ValueError(f"ZeroShotCLIP: input has {x.shape[1]} channels, the image tower expects "
                             f"{self.channels} (or 1, repeated).")
        return pixels

    def forward_features(self, x: Tensor) -> Tensor:
        """L2-normalised image embeddings ``(B, D)``."""
        return self.encoder.encode_image(self.pixels(x))[0]

    def logits_from_features(self, features: Tensor) -> Tensor:
        """``exp(logit_scale) · features · normalize(class_embeddings)ᵀ``: ``(B, C)``."""
        scale = self.encoder.logit_scale.detach().exp()
        return scale * features @ F.normalize(self.class_embeddings, dim=-1).T

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, C)``."""
        return self.logits_from_features(self.forward_features(x))
