"""A zero-shot-style prototype classifier: the embedded stand-in for a vision–language
model's zero-shot head (image embedding vs class-prompt embeddings).

Logits are ``scale · cos(P f(x), t_c) + b_c``: ``f`` is a fixed hand-made feature
view (different from what a CNN learns, so its failure modes differ), ``P`` a
learnable projection (identity at init), ``t_c`` class prototypes playing the part of
text embeddings, ``b_c`` a fixed class-specific bias (a VLM's prompt bias).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

View = Literal["profiles", "pooled"]


def digit_view(x: Tensor, view: View = "profiles") -> Tensor:
    """Hand-made features of images ``(N, 1, H, W)``: ``"profiles"`` = row means, column
    means and a 2x2-pooled image; ``"pooled"`` = the 2x2-pooled image only."""
    if x.dim() != 4:
        raise ValueError(f"`x` must be (N, C, H, W), got shape {tuple(x.shape)}.")
    pooled = F.avg_pool2d(x, 2).flatten(1)
    if view == "pooled":
        return pooled
    if view != "profiles":
        raise ValueError(f"`view`={view!r}, expected 'profiles' or 'pooled'.")
    return torch.cat([x.mean(3).flatten(1), x.mean(2).flatten(1), pooled], 1)


class PrototypeClassifier(nn.Module):
    """Cosine classifier over a fixed feature view with class prototypes.

    Args:
        prototypes: ``(C, D)`` class prototypes in the view's feature space.
        view: the feature view (see :func:`digit_view`).
        feature_mean / feature_std: ``(D,)`` standardisation of the view.
        scale: logit scale (CLIP's temperature, ~1/0.07 there).
        class_bias: ``(C,)`` fixed additive logit bias.

    .. code-block:: python

        second = DigitPrototypeClassifier(class_bias=0.5)
        logits = second(images)                 # (N, 10)
        embedding = second.forward_features(images)
    """

    def __init__(self, prototypes: Tensor, view: View = "profiles", feature_mean: Tensor | None = None,
                 feature_std: Tensor | None = None, scale: float = 10.0, class_bias: Tensor | None = None) -> None:
        super().__init__()
        c, d = prototypes.shape
        self.view = view
        self.scale = scale
        self.register_buffer("feature_mean", torch.zeros(d) if feature_mean is None else feature_mean.clone())
        self.register_buffer("feature_std", torch.ones(d) if feature_std is None else feature_std.clone())
        self.register_buffer("class_bias", torch.zeros(c) if class_bias is None else class_bias.clone())
        self.projection = nn.Linear(d, d, bias=False)
        nn.init.eye_(self.projection.weight)
        self.prototypes = nn.Parameter(prototypes.clone())
        self.num_features = d

    def forward_features(self, x: Tensor) -> Tensor:
        """L2-normalised embeddings ``(N, D)``."""
        f = (digit_view(x, self.view) - self.feature_mean) / self.feature_std
        return F.normalize(self.projection(f), dim=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * self.forward_features(x) @ F.normalize(self.prototypes, dim=1).T + self.class_bias


class DigitPrototypeClassifier(PrototypeClassifier):
    """The embedded second model for source-free adaptation (buildable from YAML).

    Prototypes are the class means of the view on the training split of
    ``DigitsDataModule(source, seed)`` (like a VLM's class-prompt embeddings, no
    training); with ``broad=True`` that split is widened with seeded rotated, noisy
    and blurred copies — the stand-in for a VLM's broad pre-training, which is what
    makes it robust where the source model is not (its images are the source
    *training* digits, never the target ones). Classes of ``biased_group`` (see
    ``DIGIT_SUPERCLASSES``) get ``+class_bias`` on their logits: the systematic
    class bias a zero-shot head has.

    .. code-block:: python

        second = DigitPrototypeClassifier(class_bias=0.5)
        SafeCut(second_model=second)
    """

    def __init__(
        self,
        source: Literal["sklearn", "mnist5k"] = "sklearn",
        view: View = "profiles",
        class_bias: float = 0.5,
        biased_group: str = "strokes",
        scale: float = 10.0,
        broad: bool = True,
        seed: int = 0,
    ) -> None:
        from lit_lowrank.datamodules import DIGIT_SUPERCLASSES, DigitsDataModule
        from lit_lowrank.datamodules.domain_shift import apply_shift

        if biased_group not in DIGIT_SUPERCLASSES:
            raise ValueError(f"`biased_group`={biased_group!r}, expected one of {list(DIGIT_SUPERCLASSES)}.")
        data = DigitsDataModule(source=source, seed=seed)
        data.setup("fit")
        x, y = data.train_set.tensors["x"], data.train_set.tensors["y"]
        if broad:
            clean = x * data.std + data.mean  # back to [0, 1] pixels for the shifts
            shifted = [apply_shift(clean, s, 1.0, seed=10_000 + seed + i)
                       for i, s in enumerate(("rotate", "rotate", "noise", "blur"))]
            x = torch.cat([x, *((v - data.mean) / data.std for v in shifted)])
            y = y.repeat(1 + len(shifted))
        f = digit_view(x, view)
        # one global scale, not per-dimension: near-constant border pixels would amplify noise
        mean, std = f.mean(0), f.std().expand(f.shape[1]).clone()
        f = (f - mean) / std
        prototypes = torch.stack([f[y == c].mean(0) for c in range(10)])
        bias = torch.zeros(10)
        bias[list(DIGIT_SUPERCLASSES[biased_group])] = class_bias
        super().__init__(prototypes, view, mean, std, scale, bias)
