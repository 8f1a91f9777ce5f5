"""A CLIP-style dual encoder: transformers ``CLIPModel`` from a local path, or a small embedded digits model.

:class:`DualEncoder` gives every few-shot method the same four calls — global and patch
image embeddings, class-text embeddings, the logit scale — whatever the towers are:

- :meth:`DualEncoder.from_pretrained` / :meth:`DualEncoder.from_clip`: a transformers
  ``CLIPModel`` (ViT image tower, CLIP text tower pooled at the EOS token).
- :func:`tiny_digit_clip`: the offline default. No CLIP weights ship offline, so a small
  CLIP ViT image tower (28×28 grey digits, 7×7 patches → 16 patch tokens) is trained
  contrastively against the shipped all-MiniLM-L6-v2 text encoder (frozen, mean-pooled, plus a
  learned text projection) on the *base* digits of MNIST-5k, and cached under
  ``$LIT_LOWRANK_CACHE`` (like the benchmarks' tiny LMs). Few-shot tasks then adapt it to the
  held-out digits.

Patch embeddings are the last layer's patch tokens through the same post-LayerNorm and visual
projection as the class token (MaskCLIP-style), so they live in the joint space.

.. code-block:: python

    encoder = tiny_digit_clip()                         # ~10 s the first time, cached after
    g, patches = encoder.encode_image(x)                # (B, D), (B, 16, D), L2-normalised
    t = encoder.encode_text(**encoder.tokenize(["a photo of the digit five."]))
    logits = encoder.logit_scale.exp() * g @ t.T
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.core.temporary import temporarily_set

#: LoRA targets of the few-shot methods: q/k/v of every attention layer of both towers
#: (CLIP's ``q_proj/k_proj/v_proj``, BERT/MiniLM's ``query/key/value``).
QKV_TARGETS = r".*\.(q_proj|k_proj|v_proj|query|key|value)$"
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class ImageTower(nn.Module):
    """The image half of a :class:`DualEncoder` (what an exported few-shot classifier keeps).

    ``forward(pixels in [0, 1]) -> (global (B, D), patches (B, P, D))``, both L2-normalised.
    """

    def __init__(self, vision_model: nn.Module, visual_projection: nn.Module, image_mean: Sequence[float],
                 image_std: Sequence[float], image_size: int) -> None:
        super().__init__()
        self.vision_model = vision_model
        self.visual_projection = visual_projection
        self.image_size = int(image_size)
        self.register_buffer("image_mean", torch.tensor(image_mean, dtype=torch.float32).view(-1, 1, 1),
                             persistent=False)
        self.register_buffer("image_std", torch.tensor(image_std, dtype=torch.float32).view(-1, 1, 1),
                             persistent=False)

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        if pixels.dim() != 4:
            raise ValueError(f"`pixels` has shape {tuple(pixels.shape)}, expected (B, C, H, W) in [0, 1].")
        if pixels.shape[-2:] != (self.image_size, self.image_size):
            pixels = F.interpolate(pixels, size=(self.image_size, self.image_size), mode="bilinear",
                                   align_corners=False)
        x = (pixels - self.image_mean.to(pixels.dtype)) / self.image_std.to(pixels.dtype)
        out = self.vision_model(pixel_values=x)
        tokens = out.last_hidden_state
        glob = self.visual_projection(out.pooler_output)
        patches = self.visual_projection(self.vision_model.post_layernorm(tokens[:, 1:]))
        return F.normalize(glob, dim=-1), F.normalize(patches, dim=-1)


class DualEncoder(nn.Module):
    """Image tower + text tower + projections + logit scale, CLIP's interface over any two towers.

    Args:
        vision_model: a transformers CLIP vision tower (``CLIPModel.vision_model``) with ``post_layernorm``.
        text_model: ``CLIPTextTransformer`` (``text_pooling="eos"``) or a BERT-like encoder
            (``"mean"``: masked mean of the last hidden states, as sentence-transformers).
        visual_projection / text_projection: maps into the joint space.
        logit_scale: ``log`` of the similarity scale (a Parameter, CLIP's convention).
        tokenizer: the text tower's tokenizer (not a module: not in the ``state_dict``).
        image_mean / image_std: pixel normalisation applied to inputs in [0, 1].
        text_pooling: ``"eos"`` or ``"mean"``.

    .. code-block:: python

        enc = DualEncoder.from_pretrained("~/models/clip-vit-base-patch32")
        g, p = enc.encode_image(images)                   # images (B, 3, 224, 224) in [0, 1]
    """

    def __init__(self, vision_model: nn.Module, text_model: nn.Module, visual_projection: nn.Module,
                 text_projection: nn.Module, logit_scale: nn.Parameter, tokenizer: Any,
                 image_mean: Sequence[float] = OPENAI_CLIP_MEAN, image_std: Sequence[float] = OPENAI_CLIP_STD,
                 text_pooling: str = "eos") -> None:
        super().__init__()
        if text_pooling not in ("eos", "mean"):
            raise ValueError(f"`text_pooling`={text_pooling!r}, expected 'eos' (CLIP) or 'mean' (BERT-like).")
        self.image = ImageTower(vision_model, visual_projection, image_mean, image_std,
                                image_size=vision_model.config.image_size)
        self.text_model = text_model
        self.text_projection = text_projection
        self.logit_scale = logit_scale
        self.tokenizer = tokenizer
        self.text_pooling = text_pooling

    @property
    def embed_dim(self) -> int:
        """Width of the joint embedding space."""
        return int(self.image.visual_projection.out_features)

    @classmethod
    def from_clip(cls, clip: nn.Module, tokenizer: Any, image_mean: Sequence[float] = OPENAI_CLIP_MEAN,
                  image_std: Sequence[float] = OPENAI_CLIP_STD) -> DualEncoder:
        """Wrap a transformers ``CLIPModel`` (its modules are shared, not copied)."""
        for attr in ("vision_model", "text_model", "visual_projection", "text_projection", "logit_scale"):
            if not hasattr(clip, attr):
                raise TypeError(f"`clip` must be a transformers CLIPModel (missing `{attr}`); got {type(clip).__name__}.")
        return cls(clip.vision_model, clip.text_model, clip.visual_projection, clip.text_projection,
                   clip.logit_scale, tokenizer, image_mean, image_std, text_pooling="eos")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> DualEncoder:
        """A local transformers CLIP folder (``config.json``, weights, tokenizer; never a hub download)."""
        import json

        from transformers import AutoTokenizer, CLIPModel

        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"`path`={str(path)!r}: expected a local transformers CLIP folder with config.json "
                                    "(e.g. a saved openai/clip-vit-base-patch16); none found.")
        mean, std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
        if (folder / "preprocessor_config.json").is_file():
            pre = json.loads((folder / "preprocessor_config.json").read_text())
            mean, std = tuple(pre.get("image_mean", mean)), tuple(pre.get("image_std", std))
        clip = CLIPModel.from_pretrained(folder, local_files_only=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return cls.from_clip(clip, tokenizer, mean, std)

    def tokenize(self, texts: Sequence[str]) -> dict[str, Tensor]:
        """``{"input_ids", "attention_mask"}`` of ``texts`` (padded to the longest)."""
        if isinstance(texts, str):
            raise ValueError("`texts`: expected a sequence of strings, got a single string; wrap it in a list.")
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=77, return_tensors="pt")
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def encode_image(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        """L2-normalised ``(global (B, D), patches (B, P, D))`` of images ``(B, C, H, W)`` in [0, 1]."""
        return self.image(pixels)

    def pool_text(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The text tower's pooled output before the projection ``(T, width)``."""
        out = self.text_model(input_ids=input_ids, attention_mask=attention_mask)
        if self.text_pooling == "eos":
            return out.pooler_output
        mask = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
        return (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """L2-normalised text embeddings ``(T, D)``."""
        return F.normalize(self.text_projection(self.pool_text(input_ids, attention_mask)), dim=-1)


@contextlib.contextmanager
def adapters_disabled(module: nn.Module) -> Iterator[None]:
    """Run ``module`` as its base model: every PEFT LoRA layer inside it is bypassed, then restored.

    Sets the layers' ``_disable_adapters`` flag directly (PEFT's ``enable_adapters`` would also
    flip ``requires_grad`` of the adapter weights, which training must keep).
    """
    from peft.tuners.lora import LoraLayer

    with temporarily_set([m for m in module.modules() if isinstance(m, LoraLayer)], "_disable_adapters", True):
        yield


# ----------------------------------------------------------------------------- the embedded default

DIGIT_PRETRAIN_TEMPLATES = ("a photo of the digit {}.", "a handwritten {}.", "the number {}.",
                            "a drawing of the numeral {}.", "a {} written by hand.", "a blurry picture of a {}.",
                            "a low-resolution scan of the digit {}.", "the numeral {}, written with a pen.")
#: Sources of the embedded pretraining images (``concepts``): MNIST-5k pools of the base digits only, and
#: scikit-learn's 8×8 digits (another writer population, another resolution) of every digit.
CONCEPT_SOURCES = ("sklearn_digits", "none")


def sklearn_digit_images(size: int = 28, digit_box: int = 20) -> tuple[Tensor, Tensor]:
    """scikit-learn's 1,797 8×8 digits laid out as MNIST: upsampled to ``digit_box`` and centred in ``size``.

    Returns ``images (N, 1, size, size)`` in [0, 1] and ``labels (N,)``.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy(digits.images / 16.0).float().unsqueeze(1)
    x = F.interpolate(x, size=(digit_box, digit_box), mode="bilinear", align_corners=False).clamp(0, 1)
    pad = (size - digit_box) // 2
    x = F.pad(x, (pad, size - digit_box - pad, pad, size - digit_box - pad))
    return x, torch.from_numpy(digits.target).long()


def _tiny_vision_config(embed_dim: int, width: int, layers: int) -> Any:
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                            num_attention_heads=4, image_size=28, patch_size=7, num_channels=1,
                            projection_dim=embed_dim)


def build_tiny_digit_clip(embed_dim: int = 64, width: int = 64, layers: int = 3, seed: int = 0) -> DualEncoder:
    """The untrained embedded dual encoder: small CLIP ViT (1×28×28) + all-MiniLM-L6-v2 (mean-pooled)."""
    from transformers import CLIPVisionModel

    from lit_lowrank.models.pretrained import load_minilm

    torch.manual_seed(seed)
    vision = CLIPVisionModel(_tiny_vision_config(embed_dim, width, layers))
    text, tokenizer = load_minilm()
    return DualEncoder(vision, text, nn.Linear(width, embed_dim, bias=False),
                       nn.Linear(text.config.hidden_size, embed_dim, bias=False),
                       nn.Parameter(torch.tensor(2.6592)), tokenizer, image_mean=(0.5,), image_std=(0.5,),
                       text_pooling="mean")


def pretraining_set(base_classes: Sequence[int], concepts: str = "sklearn_digits") -> tuple[Tensor, Tensor]:
    """The embedded model's image–label pretraining pairs (labels are digits 0–9).

    MNIST-5k's pool images (the first 300 per class; query images are never used) of ``base_classes``, plus,
    with ``concepts="sklearn_digits"``, every scikit-learn 8×8 digit: the held-out digits are then known as
    *concepts* from another source — as web-scale CLIP knows most few-shot classes — while their MNIST
    images stay unseen, so zero-shot transfer to them is possible and few-shot adaptation still has a
    domain gap to close.
    """
    from lit_lowrank.datamodules.fewshot import load_digit_pools

    if concepts not in CONCEPT_SOURCES:
        raise ValueError(f"`concepts`={concepts!r}, expected one of {CONCEPT_SOURCES}.")
    images, labels, in_pool = load_digit_pools()
    keep = in_pool & torch.isin(labels, torch.tensor(sorted(base_classes)))
    x, y = images[keep], labels[keep]
    if concepts == "sklearn_digits":
        xs, ys = sklearn_digit_images()
        x, y = torch.cat([x, xs]), torch.cat([y, ys])
    return x, y


def _pretrain(encoder: DualEncoder, base_classes: Sequence[int], steps: int, seed: int, concepts: str) -> None:
    """Contrastive (image → class-text) training of the image tower and both projections.

    The MiniLM tower stays frozen, so the pooled prompt states are computed once; each step an
    image is scored against the prompts of every digit in the pretraining set under one random
    template (CLIP's image-side loss with class prompts as the text batch).
    """
    from lit_lowrank.datamodules.fewshot import DIGIT_NAMES, random_shift

    x, labels = pretraining_set(base_classes, concepts)
    classes = torch.unique(labels)
    y = torch.searchsorted(classes, labels)
    prompts = [t.format(DIGIT_NAMES[int(c)]) for t in DIGIT_PRETRAIN_TEMPLATES for c in classes]
    encoder.text_model.requires_grad_(False)
    with torch.no_grad():
        pooled = encoder.pool_text(**encoder.tokenize(prompts)).view(len(DIGIT_PRETRAIN_TEMPLATES), len(classes), -1)
    params = [p for n, p in encoder.named_parameters() if not n.startswith("text_model.")]
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # random_shift draws from the global generator
    shift = random_shift(2)
    encoder.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (64,), generator=g)
        batch = torch.stack([shift(img) for img in x[idx]])
        template = int(torch.randint(0, len(DIGIT_PRETRAIN_TEMPLATES), (1,), generator=g))
        text = F.normalize(encoder.text_projection(pooled[template]), dim=-1)
        feats, _ = encoder.encode_image(batch)
        loss = F.cross_entropy(encoder.logit_scale.exp().clamp(max=100) * feats @ text.T, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    encoder.eval()


def tiny_digit_clip(base_classes: Sequence[int] = (0, 1, 2, 3, 4), embed_dim: int = 64, width: int = 64,
                    layers: int = 3, steps: int = 600, seed: int = 0, concepts: str = "sklearn_digits",
                    cache_dir: str | os.PathLike | None = None) -> DualEncoder:
    """The embedded CLIP-like model, pretrained once (:func:`pretraining_set`) and cached.

    Args:
        base_classes: digits whose MNIST-5k images are seen in pretraining (the few-shot datamodule's
            default novel classes are the rest).
        embed_dim / width / layers: joint width, ViT width and depth.
        steps: contrastive pretraining steps (batch 64).
        seed: initialisation and sampling seed.
        concepts: ``"sklearn_digits"`` (the default: every digit also from scikit-learn's 8×8 set, so
            zero-shot on the held-out MNIST digits is above chance, as a real CLIP's is) or ``"none"``
            (MNIST base digits only: the held-out digits are unknown concepts, zero-shot near chance).
        cache_dir: cache root; default ``$LIT_LOWRANK_CACHE`` or ``~/.cache/lit_lowrank``.

    Returns:
        A :class:`DualEncoder` in eval mode with every parameter trainable (callers freeze).

    .. code-block:: python

        enc = tiny_digit_clip()          # pretrained on MNIST digits 0-4 + sklearn digits 0-9; adapt to MNIST 5-9
    """
    from lit_lowrank.models.pretrained import _cache_root

    if concepts not in CONCEPT_SOURCES:
        raise ValueError(f"`concepts`={concepts!r}, expected one of {CONCEPT_SOURCES}.")
    encoder = build_tiny_digit_clip(embed_dim, width, layers, seed)
    key = f"{sorted(base_classes)}-{embed_dim}-{width}-{layers}-{steps}-{seed}-{concepts}-v2"
    path = _cache_root(cache_dir) / f"tiny_digit_clip-{hashlib.sha1(key.encode()).hexdigest()[:10]}.pt"
    trained = [n for n in encoder.state_dict() if not n.startswith("text_model.")]
    if path.is_file():
        encoder.load_state_dict(torch.load(path, weights_only=True), strict=False)
        return encoder.eval()
    _pretrain(encoder, base_classes, steps, seed, concepts)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")  # per-process name: concurrent runs never read a partial file
    torch.save({n: t for n, t in encoder.state_dict().items() if n in trained}, tmp)
    os.replace(tmp, path)
    return encoder


def build_dual_encoder(encoder: str, **kwargs: Any) -> DualEncoder:
    """``"tiny_digit_clip"`` (embedded default, ``kwargs`` to :func:`tiny_digit_clip`) or a local CLIP folder."""
    if encoder == "tiny_digit_clip":
        return tiny_digit_clip(**kwargs)
    if kwargs:
        raise ValueError(f"`encoder_kwargs`={kwargs}: only the embedded 'tiny_digit_clip' takes options.")
    return DualEncoder.from_pretrained(encoder)


def crop_boxes(height: int, width: int, crops: int = 4) -> list[tuple[int, int, int, int]]:
    """``(top, left, h, w)`` of the crops whose patches :func:`~lit_lowrank.ops.sd_lora.quadrant_crop_mask` marks.

    Quadrants in row-major order (top-left, top-right, bottom-left, bottom-right), then the centre half.
    """
    if crops not in (1, 4, 5):
        raise ValueError(f"`crops`={crops}, expected 1 (centre), 4 (quadrants) or 5 (quadrants + centre).")
    h2, w2 = -(-height // 2), -(-width // 2)
    boxes = []
    if crops in (4, 5):
        boxes += [(0, 0, h2, w2), (0, width - w2, h2, w2), (height - h2, 0, h2, w2), (height - h2, width - w2, h2, w2)]
    if crops in (1, 5):
        boxes.append((height // 4, width // 4, height // 2, width // 2))
    return boxes


@torch.no_grad()
def crop_embeddings(encoder: DualEncoder, pixels: Tensor, crops: int = 4, frozen: bool = True) -> Tensor:
    """``(B, K, D)`` L2-normalised embeddings of each image's crops (:func:`crop_boxes`), each resized to the
    full image and encoded without gradients; ``frozen`` bypasses every LoRA layer."""
    h, w = pixels.shape[-2:]
    boxes = crop_boxes(h, w, crops)
    with adapters_disabled(encoder) if frozen else contextlib.nullcontext():
        views = [F.interpolate(pixels[..., t:t + ch, le:le + cw], size=(h, w), mode="bilinear", align_corners=False)
                 for t, le, ch, cw in boxes]
        local, _ = encoder.encode_image(torch.cat(views))
    return local.view(len(boxes), pixels.shape[0], -1).transpose(0, 1)


@torch.no_grad()
def frozen_graph_inputs(encoder: DualEncoder, pixels: Tensor, input_ids: Tensor | None = None,
                        attention_mask: Tensor | None = None, crops: int = 4, frozen: bool = True,
                        text: Tensor | None = None) -> dict[str, Tensor]:
    """The SD-LoRA teacher's inputs from the dual encoder without gradients.

    Returns ``patches (B, P, D)``, ``global (B, D)``, ``local (B, K, D)`` (:func:`crop_embeddings`) and
    ``text (C, D)``.

    Args:
        frozen: bypass every LoRA layer (the pretrained towers); ``False`` reads the current adapted
            towers (detached).
        text: precomputed ``(C, D)`` class-text embeddings (the frozen ones never change, so callers cache
            them); otherwise ``input_ids``/``attention_mask`` are encoded.

    .. code-block:: python

        inputs = frozen_graph_inputs(encoder, x, **encoder.tokenize(prompts), crops=4)
    """
    with adapters_disabled(encoder) if frozen else contextlib.nullcontext():
        glob, patches = encoder.encode_image(pixels)
        if text is None:
            if input_ids is None or attention_mask is None:
                raise ValueError("frozen_graph_inputs: pass `text` or both `input_ids` and `attention_mask`.")
            text = encoder.encode_text(input_ids, attention_mask)
    return {"patches": patches, "global": glob, "local": crop_embeddings(encoder, pixels, crops, frozen),
            "text": text}
