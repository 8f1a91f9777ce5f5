"""SpecDrop vs dense, No-Routing (± shared expert), learned routers and Soft MoE at matched parameters.

Two tasks whose samples each carry one coarse category tag:

- ``hierarchical``: a generated dataset of 20 coarse x 5 fine classes. The five fine
  classes are Gaussian clusters around prototypes ``mu_f`` in an 8-d latent space,
  shared by every coarse category; coarse category ``c`` maps latents to the 32-d input
  through its own random nonlinear transform ``T_c(z) = W2_c tanh(W1_c z + b_c) + o_c``.
  The label is ``5 c + f``, the tag is ``c``. Reading ``f`` needs the inverse of the
  category's own transform, which is what a category-specialised branch can learn.
  Everything is drawn from ``torch.Generator().manual_seed(seed)`` (see
  :func:`make_hierarchical`).
- ``digits``: scikit-learn's 8x8 digits with the three shape groups of
  :data:`~lit_lowrank.datamodules.images.DIGIT_SUPERCLASSES` as tags.

Network (every method): a shared stem ``Linear -> GELU`` into ``T = 4`` tokens of width
``d``, one residual mixing block on the tokens, mean pooling, LayerNorm, a linear
head. The block is a dense MLP ``d -> H -> H -> d`` (``dense``) or
:class:`~lit_lowrank.mixins.specdrop.SpecDropBranches` over ``K`` MLPs
``d -> h -> h -> d`` with ``H`` chosen so the parameter counts match (the router and
Soft MoE add their ``d K`` routing parameters; every row reports its count). Rows:

- ``dense``; ``dense_tagged`` (dense plus a learned category embedding added to the
  tokens: the same tag information SpecDrop reads, given to a dense model: shown
  for context, not one of the paper's baselines);
- ``no_routing`` (``p_a = p_i``), ``shared_expert``, ``router_top1`` / ``router_top2``
  (softmax router + Switch load-balancing loss), ``soft_moe``;
- ``specdrop`` (``p_a = 1, p_i = 0.1``, ``K = #categories``) and ``specdrop_scrambled``
  (the same, trained and tested with tags drawn at random per sample: granularity
  alignment broken).

Each method trains with the same seeds, data order and optimiser. Specialisation is
the per-branch pruning sensitivity ``S[c, k]`` (accuracy drop on category ``c`` when
branch ``k`` is zeroed) on the test split, summarised as the fraction of strictly
diagonally dominant rows and the own-minus-other drop gap.

Claims (the paper's statements at this scale; differences are paired by seed, which
fixes the data, the initial stem and the batch order): SpecDrop's accuracy >= the
best learned-router baseline (top-1/top-2 router, Soft MoE) and > dense; SpecDrop's
sensitivity matrix is diagonally dominant (every branch row; with 20 categories on 5
branches the rows are averaged per branch, the per-category fraction is reported
beside it); with scrambled tags SpecDrop is within noise of No-Routing (the 95%
interval ``1.96 std / sqrt(n)`` of the paired difference covers 0).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.mixins.specdrop import (
    SpecDropBranches,
    ablate_branch,
    specdrop_aux_loss,
    specdrop_category,
)
from lit_lowrank.ops.specdrop import (
    diagonal_dominance,
    per_category_mean,
    sensitivity_matrix,
    specialization_gap,
)

TOKENS = 4
D_MODEL, D_BRANCH = 16, 16
P_ACTIVE, P_INACTIVE = 1.0, 0.1
ROUTER_BASELINES = ("router_top1", "router_top2", "soft_moe")


def make_hierarchical(
    seed: int,
    num_coarse: int = 20,
    num_fine: int = 5,
    per_class_train: int = 20,
    per_class_test: int = 20,
    latent_dim: int = 8,
    input_dim: int = 32,
    hidden: int = 32,
    noise: float = 1.0,
) -> dict[str, Tensor]:
    """The seeded hierarchical dataset: ``x_train, y_train, c_train, x_test, y_test, c_test``.

    Process (one ``torch.Generator`` seeded with ``seed``): fine prototypes
    ``mu_f ~ N(0, I_8)`` shared by all coarse categories; for each coarse ``c`` a
    transform with ``W1_c ~ N(0, 1/8)`` (32x8), ``b_c ~ N(0, 0.25)``, ``W2_c ~ N(0, 1/32)``
    (32x32) and an offset ``o_c ~ N(0, 0.25 I)``; a sample of class ``(c, f)`` is
    ``T_c(mu_f + noise * eps)``. Classes are balanced in both splits.
    """
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_fine, latent_dim, generator=g)
    w1 = torch.randn(num_coarse, hidden, latent_dim, generator=g) / math.sqrt(latent_dim)
    b1 = 0.5 * torch.randn(num_coarse, hidden, generator=g)
    w2 = torch.randn(num_coarse, input_dim, hidden, generator=g) / math.sqrt(hidden)
    offset = 0.5 * torch.randn(num_coarse, input_dim, generator=g)

    def draw(per_class: int) -> tuple[Tensor, Tensor, Tensor]:
        coarse = torch.arange(num_coarse).repeat_interleave(num_fine * per_class)
        fine = torch.arange(num_fine).repeat_interleave(per_class).repeat(num_coarse)
        z = prototypes[fine] + noise * torch.randn(len(fine), latent_dim, generator=g)
        h = torch.tanh(torch.einsum("nhl,nl->nh", w1[coarse], z) + b1[coarse])
        x = torch.einsum("nih,nh->ni", w2[coarse], h) + offset[coarse]
        return x, coarse * num_fine + fine, coarse

    x_train, y_train, c_train = draw(per_class_train)
    x_test, y_test, c_test = draw(per_class_test)
    mean, std = x_train.mean(0), x_train.std(0)
    return {"x_train": (x_train - mean) / std, "y_train": y_train, "c_train": c_train,
            "x_test": (x_test - mean) / std, "y_test": y_test, "c_test": c_test,
            "num_classes": num_coarse * num_fine, "num_categories": num_coarse}


def make_digits(seed: int) -> dict[str, Any]:
    """scikit-learn digits (flattened 8x8, standardised), tags = the three shape groups."""
    from lit_lowrank.datamodules import DigitsDataModule

    dm = DigitsDataModule(source="sklearn", val_fraction=0.0, test_fraction=0.3, seed=seed)
    dm.setup("fit")
    train, test = dm.train_set.tensors, dm.test_set.tensors
    return {"x_train": train["x"].flatten(1), "y_train": train["y"], "c_train": train["category"],
            "x_test": test["x"].flatten(1), "y_test": test["y"], "c_test": test["category"],
            "num_classes": 10, "num_categories": dm.num_categories}


def _mlp(d: int, h: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, d))


def _mlp_params(d: int, h: int) -> int:
    return 2 * d * h + h * h + 2 * h + d


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


def build(method: str, data: dict[str, Any], d: int, h: int, k: int,
          category_to_branch: list[int] | None = None) -> StemBranchesHead:
    """The network of one benchmark row (see the module docstring)."""
    in_dim, classes, cats = data["x_train"].shape[1], data["num_classes"], data["num_categories"]
    if method in ("dense", "dense_tagged"):
        target = k * _mlp_params(d, h)
        width = min(range(h, 8 * k * h), key=lambda w: abs(_mlp_params(d, w) - target))
        return StemBranchesHead(in_dim, d, _mlp(d, width), classes, cats if method == "dense_tagged" else 0)
    merges = {"no_routing": ("no_routing", {}), "shared_expert": ("shared_expert", {}),
              "router_top1": ("router", {"router_top_k": 1}), "router_top2": ("router", {"router_top_k": 2}),
              "soft_moe": ("soft_moe", {}),
              "specdrop": ("specdrop", {"p_active": P_ACTIVE, "p_inactive": P_INACTIVE,
                                        "category_to_branch": category_to_branch}),
              "specdrop_scrambled": ("specdrop", {"p_active": P_ACTIVE, "p_inactive": P_INACTIVE,
                                                  "category_to_branch": category_to_branch})}
    merge, options = merges[method]
    block = SpecDropBranches(_mlp(d, h), k, merge=merge, **options)
    return StemBranchesHead(in_dim, d, block, classes)


def _accuracy_per_sample(model: StemBranchesHead, x: Tensor, y: Tensor, c: Tensor) -> Tensor:
    with torch.no_grad():
        return (model(x, c).argmax(-1) == y).double()


def train_and_measure(method: str, data: dict[str, Any], seed: int, epochs: int, d: int, h: int, k: int,
                      category_to_branch: list[int] | None = None) -> dict[str, Any]:
    """Train one row's network and return accuracy, parameter count and specialisation."""
    torch.manual_seed(seed)
    model = build(method, data, d, h, k, category_to_branch)
    c_train, c_test = data["c_train"], data["c_test"]
    if method == "specdrop_scrambled":
        g = torch.Generator().manual_seed(10_000 + seed)
        c_train = torch.randint(0, data["num_categories"], c_train.shape, generator=g)
        c_test = torch.randint(0, data["num_categories"], c_test.shape, generator=g)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    steps_per_epoch = math.ceil(len(data["y_train"]) / 128)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=epochs * steps_per_epoch)
    order = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for index in torch.randperm(len(data["y_train"]), generator=order).split(128):
            logits = model(data["x_train"][index], c_train[index])
            loss = F.cross_entropy(logits, data["y_train"][index])
            aux = specdrop_aux_loss(model)
            loss = loss if aux is None else loss + aux
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
    model.eval()
    correct = _accuracy_per_sample(model, data["x_test"], data["y_test"], c_test)
    row = {"accuracy": float(correct.mean()), "params": sum(p.numel() for p in model.parameters())}
    if isinstance(model.block, SpecDropBranches):
        # Sensitivity per *true* category (the scrambled row is scored on the true groups too).
        cats = data["num_categories"]
        sums, counts = per_category_mean(correct, data["c_test"], cats)
        base = sums / counts
        ablated = []
        for branch in range(k):
            with ablate_branch(model, branch):
                s, _ = per_category_mean(_accuracy_per_sample(model, data["x_test"], data["y_test"], c_test),
                                         data["c_test"], cats)
            ablated.append(s / counts)
        matrix = sensitivity_matrix(base, torch.stack(ablated))
        row["diag_dominance"] = diagonal_dominance(matrix, category_to_branch)
        row["diag_dominance_per_category"] = diagonal_dominance(matrix, category_to_branch, per_category=True)
        row["specialization_gap"] = specialization_gap(matrix, category_to_branch)
    return row


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def run(quick: bool, seed: int) -> BenchmarkResult:
    # One thread: the networks are tiny (Python-overhead bound), and on a shared 2-core
    # machine two threads per op spin-wait far longer than they compute.
    torch.set_num_threads(1)
    seeds = [seed + i for i in range(3 if quick else 5)]
    epochs = 20 if quick else 60
    methods = ["dense", "dense_tagged", "no_routing", "shared_expert", "router_top1", "router_top2", "soft_moe",
               "specdrop", "specdrop_scrambled"]
    # hierarchical: 20 categories on K = 5 branches (categories 4b..4b+3 -> branch b);
    # digits: 3 shape groups on K = 3 branches.
    tasks: dict[str, dict[str, Any]] = {
        "hierarchical": {"make": make_hierarchical, "k": 5, "map": [c // 4 for c in range(20)]},
        "digits": {"make": make_digits, "k": 3, "map": None},
    }
    rows: list[dict[str, Any]] = []
    for task, cfg in tasks.items():
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        for s in seeds:
            data = cfg["make"](s)
            for method in methods:
                runs[method].append(train_and_measure(method, data, s, epochs, D_MODEL, D_BRANCH, cfg["k"], cfg["map"]))
        for method in methods:
            accs = [r["accuracy"] for r in runs[method]]
            mean, std = _mean_std(accs)
            row = {"task": task, "method": method, "acc_mean": mean, "acc_std": std,
                   "params": runs[method][0]["params"], "acc_per_seed": [round(a, 4) for a in accs]}
            for key in ("diag_dominance", "diag_dominance_per_category", "specialization_gap"):
                if key in runs[method][0]:
                    row[key] = statistics.fmean(r[key] for r in runs[method])
            rows.append(row)
    notes = {"seeds": seeds, "epochs": epochs, "p_active": P_ACTIVE, "p_inactive": P_INACTIVE, "tokens": TOKENS,
             "d_model": D_MODEL, "d_branch": D_BRANCH, "threads": 1}
    return BenchmarkResult(rows, _claims(rows), notes=notes)


def _paired(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """Mean of the per-seed differences ``a - b`` and its 95% half-width ``1.96 std / sqrt(n)``."""
    diffs = [x - y for x, y in zip(a["acc_per_seed"], b["acc_per_seed"])]
    mean, std = _mean_std(diffs)
    return mean, 1.96 * std / math.sqrt(len(diffs))


def _claims(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's claims at this scale, from paired (same seed, same data) differences."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        by = {r["method"]: r for r in rows if r["task"] == task}
        spec = by["specdrop"]
        best = max(ROUTER_BASELINES, key=lambda m: by[m]["acc_mean"])
        out.append(legacy_claim(f"{task}: SpecDrop accuracy >= best learned router ({best}), paired mean difference",
                         _paired(spec, by[best])[0], 0.0, ">="))
        out.append(legacy_claim(f"{task}: SpecDrop accuracy > dense, paired mean difference",
                         _paired(spec, by["dense"])[0], 0.0, ">"))
        out.append(legacy_claim(f"{task}: SpecDrop sensitivity matrix diagonally dominant (fraction of branch rows)",
                         spec["diag_dominance"], 1.0, ">="))
        diff, half_width = _paired(by["specdrop_scrambled"], by["no_routing"])
        out.append(legacy_claim(f"{task}: scrambled-tag SpecDrop within noise of No-Routing "
                         "(|paired diff| / 95% half-width; <= 1: the CI covers 0)",
                         abs(diff) / max(half_width, 1e-4), 1.0, "<="))
    return out
