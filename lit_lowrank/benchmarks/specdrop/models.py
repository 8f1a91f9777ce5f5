"""The specdrop benchmark's data and networks: the hierarchical token task, the digits, and the
branch-bearing models each method is trained as (token MLPs with branches, a timm CNN with a tag embedding).

Read by :mod:`lit_lowrank.benchmarks.specdrop`; sizes and budgets live there.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor, nn

from lit_lowrank.mixins.specdrop import (
    SpecDropBranches,
    apply_specdrop,
    specdrop_category,
)

TOKENS = 4
D_MODEL, D_BRANCH = 16, 16
P_ACTIVE, P_INACTIVE = 1.0, 0.1
LORA_RANK = 4


# --------------------------------------------------------------------------- data


def make_hierarchical(
    seed: int,
    num_coarse: int = 20,
    num_fine: int = 5,
    per_class_train: int = 20,
    per_class_val: int = 10,
    per_class_test: int = 20,
    latent_dim: int = 8,
    input_dim: int = 32,
    hidden: int = 32,
    noise: float = 1.0,
    shared_transform: float = 0.8,
    category_offset: float = 0.0,
) -> dict[str, Any]:
    """The seeded hierarchical dataset: ``x_/y_/c_`` for ``train``, ``val`` and ``test``.

    Process (one ``torch.Generator`` seeded with ``seed``): fine prototypes
    ``mu_f ~ N(0, I_8)`` shared by all coarse categories; for each coarse ``c`` a
    transform ``T_c(z) = W2_c tanh(W1_c z + b_c) + o_c`` whose weights mix one component
    shared by every category with the category's own, ``W_c = sqrt(s) W_shared +
    sqrt(1 - s) W'_c`` (``s = shared_transform``; ``W1 ~ N(0, 1/8)`` (32x8),
    ``b ~ N(0, 0.25)``, ``W2 ~ N(0, 1/32)`` (32x32), the same variances as each part), and an
    offset ``o_c ~ N(0, category_offset^2 I)``; a sample of class ``(c, f)`` is
    ``T_c(mu_f + noise * eps)``, label ``5 c + f``. Classes are balanced in every split;
    inputs are standardised with the training split's statistics.

    Why ``s = 0.8`` and no offset (the default regime): the tag must carry information the
    input does not give cheaply, as a CIFAR-100 superclass does for images whose superclass
    shares their low-level statistics with others. With fully separate transforms plus an
    offset ``o_c ~ N(0, 0.25 I)`` (``shared_transform=0, category_offset=0.5``, the earlier
    regime) the category is read off the input by the shared stem, and routing by the true
    tag bought nothing (DeMix - No-Routing +0.0004, CI [-0.023, +0.024], 4 seeds). Mostly
    shared transforms put the 20 categories' clusters on top of one another, so that a
    category's fine classes must be told apart by its own (small) deviation from the shared
    map and the tag narrows 100 candidate classes to 5 (docs/methods/specdrop.md has the
    measured candidates).
    """
    if not 0.0 <= shared_transform <= 1.0:
        raise ValueError(f"`shared_transform`={shared_transform}, expected a fraction in [0, 1].")
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_fine, latent_dim, generator=g)

    def mixed(*shape: int, std: float) -> Tensor:
        own = torch.randn(num_coarse, *shape, generator=g) * std
        shared = torch.randn(*shape, generator=g) * std
        return math.sqrt(shared_transform) * shared + math.sqrt(1.0 - shared_transform) * own

    w1 = mixed(hidden, latent_dim, std=1 / math.sqrt(latent_dim))
    b1 = mixed(hidden, std=0.5)
    w2 = mixed(input_dim, hidden, std=1 / math.sqrt(hidden))
    offset = category_offset * torch.randn(num_coarse, input_dim, generator=g)

    def draw(per_class: int) -> tuple[Tensor, Tensor, Tensor]:
        coarse = torch.arange(num_coarse).repeat_interleave(num_fine * per_class)
        fine = torch.arange(num_fine).repeat_interleave(per_class).repeat(num_coarse)
        z = prototypes[fine] + noise * torch.randn(len(fine), latent_dim, generator=g)
        h = torch.tanh(torch.einsum("nhl,nl->nh", w1[coarse], z) + b1[coarse])
        x = torch.einsum("nih,nh->ni", w2[coarse], h) + offset[coarse]
        return x, coarse * num_fine + fine, coarse

    out: dict[str, Any] = {"num_classes": num_coarse * num_fine, "num_categories": num_coarse}
    for split, per_class in (("train", per_class_train), ("val", per_class_val), ("test", per_class_test)):
        out[f"x_{split}"], out[f"y_{split}"], out[f"c_{split}"] = draw(per_class)
    mean, std = out["x_train"].mean(0), out["x_train"].std(0)
    for split in ("train", "val", "test"):
        out[f"x_{split}"] = (out[f"x_{split}"] - mean) / std
    return out


def make_digits(seed: int, source: str = "sklearn", flatten: bool = True) -> dict[str, Any]:
    """Digits (standardised) with the three shape groups as tags; 60/15/25 train/val/test split."""
    from lit_lowrank.datamodules import DigitsDataModule

    dm = DigitsDataModule(source=source, val_fraction=0.15, test_fraction=0.25, seed=seed)
    dm.setup("fit")
    out: dict[str, Any] = {"num_classes": 10, "num_categories": dm.num_categories}
    for split, ds in (("train", dm.train_set), ("val", dm.val_set), ("test", dm.test_set)):
        t = ds.tensors
        out[f"x_{split}"] = t["x"].flatten(1) if flatten else t["x"]
        out[f"y_{split}"], out[f"c_{split}"] = t["y"], t["category"]
    return out


# --------------------------------------------------------------------------- token networks


def _mlp(d: int, h: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, d))


def _mlp_params(d: int, h: int) -> int:
    return 2 * d * h + h * h + 2 * h + d


def hydra_params(d: int, h: int, k: int, rank: int = LORA_RANK) -> int:
    """Parameters of the ``hydra_lora`` block: the MLP ``d -> h -> h -> d`` and, per Linear
    ``(i, o)``, a shared ``A`` (``i r``), ``K`` heads ``B`` (``K r o``) and a router (``i K + K``)."""
    layers = ((d, h), (h, h), (h, d))
    return _mlp_params(d, h) + sum(i * rank + k * rank * o + i * k + k for i, o in layers)


def _matched_width(target: int, count: Callable[[int], int]) -> int:
    return min(range(2, 512), key=lambda w: abs(count(w) - target))


class StemBranchesHead(nn.Module):
    """Shared stem -> ``T`` tokens -> residual mixing block -> mean pool -> LayerNorm -> head."""

    def __init__(self, in_dim: int, d: int, block: nn.Module, num_classes: int, num_categories: int = 0) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(in_dim, TOKENS * d), nn.GELU())
        self.block = block
        self.tag_embedding = nn.Embedding(num_categories, d) if num_categories else None
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, num_classes)
        self.d = d

    def forward(self, x: Tensor, category: Tensor | None = None) -> Tensor:
        tokens = self.stem(x).view(len(x), TOKENS, self.d)
        if self.tag_embedding is not None:
            tokens = tokens + self.tag_embedding(category)[:, None]
        with specdrop_category(self, category):
            tokens = tokens + self.block(tokens)
        return self.head(self.norm(tokens.mean(1)))


def _branch_options(method: str, k: int, cats: int, mapping: list[int] | None) -> tuple[str, dict[str, Any]]:
    # missing_category="uniform": the tag-free test-time merge (eval only; training always has tags)
    specdrop = {"p_active": P_ACTIVE, "p_inactive": P_INACTIVE, "category_to_branch": mapping,
                "missing_category": "uniform"}
    table: dict[str, tuple[str, dict[str, Any]]] = {
        "no_routing": ("no_routing", {}), "shared_expert": ("shared_expert", {}),
        "router_top1": ("router", {"router_top_k": 1}), "router_top2": ("router", {"router_top_k": 2}),
        "soft_moe": ("soft_moe", {}),
        "router_tagged": ("router", {"router_top_k": 2, "router_categories": cats}),
        "mod_squad": ("router", {"router_top_k": 2, "router_categories": cats, "mi_loss_weight": 0.01}),
        "demix": ("demix", {"category_to_branch": mapping}),
        "specdrop": ("specdrop", specdrop), "specdrop_scrambled": ("specdrop", specdrop),
        "specdrop_units": ("specdrop", specdrop),
    }
    return table[method]


def build_token_model(method: str, data: dict[str, Any], k: int, mapping: list[int] | None,
                      d: int = D_MODEL, h: int = D_BRANCH) -> StemBranchesHead:
    """The network of one row of a token task (see the module docstring)."""
    in_dim, classes, cats = data["x_train"].shape[1], data["num_classes"], data["num_categories"]
    target = k * _mlp_params(d, h)
    if method in ("dense", "dense_tagged"):
        width = _matched_width(target, lambda w: _mlp_params(d, w))
        return StemBranchesHead(in_dim, d, _mlp(d, width), classes, cats if method == "dense_tagged" else 0)
    if method == "hydra_lora":
        width = _matched_width(target, lambda w: hydra_params(d, w, k))
        block = _mlp(d, width)
        apply_specdrop(block, target=r"^(0|2|4)$", num_branches=k, merge="router", router_top_k=k,
                       branch_type="lora", lora_shared_A=True, lora_rank=LORA_RANK, lora_alpha=2.0 * LORA_RANK)
        block.requires_grad_(True)  # from scratch: the base layers train with the heads
        return StemBranchesHead(in_dim, d, block, classes)
    merge, options = _branch_options(method, k, cats, mapping)
    block = SpecDropBranches(_mlp(d, h), k, merge=merge, **options)
    return StemBranchesHead(in_dim, d, block, classes)


# --------------------------------------------------------------------------- timm network (mnist5k)


class TagEmbedding(nn.Module):
    """Adds a learned per-category vector to a conv stage's input channels, then runs the stage."""

    def __init__(self, stage: nn.Module, num_categories: int, channels: int) -> None:
        super().__init__()
        self.stage = stage
        self.embedding = nn.Embedding(num_categories, channels)
        nn.init.zeros_(self.embedding.weight)
        self.category: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        return self.stage(x + self.embedding(self.category)[:, :, None, None])


class TimmBranches(nn.Module):
    """``ClassificationModule`` with a timm backbone whose ``layer4`` is the branched stage."""

    def __init__(self, method: str, backbone: str, k: int, cats: int, mapping: list[int] | None) -> None:
        super().__init__()
        from lit_lowrank.tasks import ClassificationModule

        branches = None
        if method not in ("dense", "dense_tagged"):
            merge, options = _branch_options(method, k, cats, mapping)
            branches = {"target": r"backbone\.layer4$", "num_branches": k, "merge": merge, **options}
        self.module = ClassificationModule(backbone, num_classes=10, in_chans=1, branches=branches)
        self.tag: TagEmbedding | None = None
        if method == "dense_tagged":
            stage = self.module.backbone.layer4
            channels = next(m for m in stage.modules() if isinstance(m, nn.Conv2d)).in_channels
            self.tag = TagEmbedding(stage, cats, channels)
            self.module.backbone.layer4 = self.tag

    def forward(self, x: Tensor, category: Tensor | None = None) -> Tensor:
        if self.tag is not None:
            self.tag.category = category
        return self.module(x, category)
