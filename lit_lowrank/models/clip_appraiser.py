"""CAMEL's Appraiser for natural images: a frozen CLIP scoring class prompts, LoRA on its text projection.

The learnable part φ is a PEFT LoRA adapter (``peft.tuners.lora.Linear``, injected with
``peft.inject_adapter_in_model``) on CLIP's ``text_projection``; everything else is frozen.
Logits of an image against the class prompts are CLIP's zero-shot scores
``exp(logit_scale)·⟨img, text_c⟩`` of L2-normalised embeddings, where ``text_c`` passes the
prompt's (frozen, cached) pooled text feature through the adapted projection. The CAMEL
inner loop adapts only :meth:`CLIPAppraiser.adapter_params` with
:func:`lit_lowrank.ops.camel.classification_loss`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD


class CLIPAppraiser(nn.Module):
    """Frozen CLIP + LoRA on the text projection, scoring images against one prompt per class.

    Args:
        clip: a ``transformers.CLIPModel``. It is modified in place: a LoRA layer named
            ``adapter_name`` wraps its ``text_projection``, and all its parameters are frozen.
        input_ids: ``(P, L)`` tokenised prompts, one per class (row ``c`` is class ``c``'s prompt).
        attention_mask: ``(P, L)`` mask for ``input_ids`` (default: all ones).
        rank / alpha: the LoRA rank r and scale α (update ``(α/r)·B A``; B starts at 0, so the
            adapter starts as the identity change and φ₀ is the pretrained CLIP).
        data_mean / data_std: per-channel statistics the Creator's images are normalised with;
            images are mapped back to [0, 1] by ``x·std + mean`` (default ``0.5``/``0.5``: data in [-1, 1]).
        image_mean / image_std: CLIP's own pixel normalisation (default OpenAI CLIP's).
        adapter_name: the PEFT adapter name.

    .. code-block:: python

        appraiser = CLIPAppraiser.from_pretrained("models/clip-vit-base-patch32", ["airplane", "cat", "dog"])
        feats = appraiser.embed_images(images)             # frozen image tower, differentiable in images
        logits = appraiser(feats)                          # (N, 3) zero-shot logits
        phi0 = appraiser.adapter_params()                  # only the LoRA A/B matrices
    """

    def __init__(
        self,
        clip: nn.Module,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        rank: int = 4,
        alpha: float = 8.0,
        data_mean: Sequence[float] = (0.5,),
        data_std: Sequence[float] = (0.5,),
        image_mean: Sequence[float] = OPENAI_CLIP_MEAN,
        image_std: Sequence[float] = OPENAI_CLIP_STD,
        adapter_name: str = "camel",
    ) -> None:
        super().__init__()
        from peft import LoraConfig, inject_adapter_in_model
        from peft.tuners.lora import LoraLayer

        for attr in ("text_model", "text_projection", "get_image_features", "logit_scale", "config"):
            if not hasattr(clip, attr):
                raise TypeError(f"`clip` must be a transformers CLIPModel (missing `{attr}`); got {type(clip).__name__}.")
        if isinstance(clip.text_projection, LoraLayer):
            raise ValueError("`clip.text_projection` already carries a LoRA adapter: pass a fresh CLIPModel.")
        if rank < 1:
            raise ValueError(f"`rank`={rank}, expected >= 1.")
        if input_ids.dim() != 2 or input_ids.shape[0] < 2:
            raise ValueError(f"`input_ids` has shape {tuple(input_ids.shape)}, expected (P, L) with P >= 2 prompts.")
        for name, value in (("data_std", data_std), ("image_std", image_std)):
            if any(v <= 0 for v in value):
                raise ValueError(f"`{name}`={tuple(value)}, expected positive values.")
        clip.requires_grad_(False)
        # PEFT's LoRA layer keeps the base projection and adds (α/r)·B(A x); the adapter's weights are the
        # only tensors the CAMEL inner loop touches (see adapter_params).
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=["text_projection"])
        self.clip = inject_adapter_in_model(config, clip, adapter_name=adapter_name)
        self.clip.requires_grad_(False)
        self.adapter_name = adapter_name
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        with torch.no_grad():
            pooled = self.clip.text_model(input_ids=input_ids, attention_mask=mask).pooler_output
        # The text tower is frozen and the prompts are fixed, so its pooled output is computed once; only the
        # projection after it is adapted. Not persistent: rebuilt from the prompts on construction.
        self.register_buffer("text_pooled", pooled.detach(), persistent=False)
        self.register_buffer("data_mean", torch.tensor(data_mean, dtype=torch.float32).view(-1, 1, 1), persistent=False)
        self.register_buffer("data_std", torch.tensor(data_std, dtype=torch.float32).view(-1, 1, 1), persistent=False)
        self.register_buffer("image_mean", torch.tensor(image_mean, dtype=torch.float32).view(-1, 1, 1),
                             persistent=False)
        self.register_buffer("image_std", torch.tensor(image_std, dtype=torch.float32).view(-1, 1, 1),
                             persistent=False)
        self.image_size = int(self.clip.config.vision_config.image_size)
        self.num_channels = int(getattr(self.clip.config.vision_config, "num_channels", 3))

    @property
    def num_prompts(self) -> int:
        """Number of class prompts P (the logits' width)."""
        return int(self.text_pooled.shape[0])

    @classmethod
    def from_pretrained(
        cls,
        clip_path: str | Path,
        class_names: Sequence[str],
        template: str = "a photo of a {}.",
        **kwargs: Any,
    ) -> CLIPAppraiser:
        """Load a local ``CLIPModel`` + tokenizer from ``clip_path`` and prompt ``template.format(name)`` per class.

        ``image_mean``/``image_std`` default to the directory's ``preprocessor_config.json`` when it has them.
        Other ``kwargs`` go to the constructor (``rank``, ``alpha``, ``data_mean``, ``data_std``, ...).

        .. code-block:: python

            appraiser = CLIPAppraiser.from_pretrained("~/models/clip-vit-base-patch32", ["zero", "one"],
                                                      template="a handwritten digit {}.", rank=4)
        """
        from transformers import AutoTokenizer, CLIPModel

        path = Path(clip_path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"`clip_path`={str(clip_path)!r}: expected a local transformers CLIP directory "
                                    "with config.json (e.g. a saved openai/clip-vit-base-patch32); none found.")
        if "{}" not in template:
            raise ValueError(f"`template`={template!r}: expected a '{{}}' placeholder for the class name.")
        if len(class_names) < 2:
            raise ValueError(f"`class_names`={list(class_names)}: expected one name per Creator class (>= 2).")
        processor_file = path / "preprocessor_config.json"
        if processor_file.is_file():
            processor = json.loads(processor_file.read_text())
            for key in ("image_mean", "image_std"):
                if key in processor:
                    kwargs.setdefault(key, tuple(processor[key]))
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokens = tokenizer([template.format(name) for name in class_names], padding=True, return_tensors="pt")
        clip = CLIPModel.from_pretrained(path).eval()
        return cls(clip, tokens["input_ids"], tokens["attention_mask"], **kwargs)

    def adapter_params(self) -> dict[str, Tensor]:
        """The adapter's parameters by their names in this module: the CAMEL inner loop's φ (LoRA A and B only)."""
        return {n: p for n, p in self.named_parameters() if ".lora_A." in n or ".lora_B." in n}

    def embed_images(self, images: Tensor) -> Tensor:
        """L2-normalised CLIP image embeddings ``(N, projection_dim)`` of Creator images ``(N, C, H, W)``.

        Differentiable in ``images``: un-normalise with ``data_mean/std``, repeat a gray channel
        to RGB, bilinear resize to CLIP's input size, CLIP-normalise, frozen image tower. No
        clamping to [0, 1] — it would cut the gradient to out-of-range pixels.
        """
        if images.dim() != 4 or images.shape[1] not in (1, self.num_channels):
            raise ValueError(f"`images` has shape {tuple(images.shape)}, expected (N, 1 or {self.num_channels}, H, W).")
        x = images * self.data_std.to(images.dtype) + self.data_mean.to(images.dtype)
        if x.shape[1] != self.num_channels:
            x = x.expand(-1, self.num_channels, -1, -1)
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        x = (x - self.image_mean.to(x.dtype)) / self.image_std.to(x.dtype)
        out = self.clip.get_image_features(pixel_values=x)
        # transformers 5 returns a ModelOutput whose pooler_output is the projected embedding; 4.x a tensor.
        feats = out if torch.is_tensor(out) else out.pooler_output
        return F.normalize(feats, dim=-1)

    def text_embeddings(self) -> Tensor:
        """L2-normalised prompt embeddings ``(P, projection_dim)`` through the (adapted) text projection."""
        return F.normalize(self.clip.text_projection(self.text_pooled), dim=-1)

    def forward(self, x: Tensor, scaled: bool = True) -> Tensor:
        """Zero-shot logits ``(N, P)``; ``x`` is images ``(N, C, H, W)`` or embeddings ``(N, D)`` from :meth:`embed_images`.

        Passing embeddings lets the CAMEL inner loop run the frozen image tower once per sample
        set instead of once per inner step (the embeddings stay differentiable in the images).
        ``scaled=False`` returns the plain cosines (for :func:`~lit_lowrank.ops.camel.alignment_loss`).
        """
        feats = self.embed_images(x) if x.dim() == 4 else x
        cosines = feats @ self.text_embeddings().T
        return self.clip.logit_scale.exp() * cosines if scaled else cosines
