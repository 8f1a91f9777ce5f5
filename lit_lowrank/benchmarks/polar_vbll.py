"""PoLAR-VBLL vs MLE fine-tuning, last-layer Laplace, MC-dropout and a deep ensemble: few labels, ID + OOD.

Setting (embedded data, CPU): scikit-learn's 8x8 digits. A 64-128-128 MLP is **pretrained on half** of
the images of digits 5-9 (a 5-way head, full-batch AdamW). The downstream task is 5-way classification of
digits 0-4 from **few labels** (``labels_per_class`` per digit, drawn per seed); the in-distribution (ID)
test set is every other 0-4 image, the out-of-distribution (OOD) set is the *other* half of digits 5-9
(never seen in pretraining or fine-tuning). Every method adapts both hidden layers with rank-4 adapters on the
frozen pretrained backbone and trains a new head on the same labelled subset, same steps, same optimiser
(AdamW, full batch):

- ``lora_mle`` / ``polar_mle``: LoRA (PEFT) / PoLAR (+ landing) adapters + linear head, cross-entropy.
- ``lora_laplace``: the ``lora_mle`` model + a post-hoc last-layer Laplace (laplace-torch: full GGN,
  prior precision by marginal likelihood, GLM probit predictive).
- ``mc_dropout``: LoRA with adapter dropout and dropout before the head (p = 0.1), prediction averages
  ``T`` stochastic forwards.
- ``ensemble``: ``M`` ``lora_mle`` models (different adapter/head initialisations and batch noise), averaged.
- ``polar_vbll``: PoLAR adapters + VBLL head (:func:`~lit_lowrank.adapters.polar_vbll.apply_polar_vbll`),
  negative ELBO, alternating phases (adapters / posterior), landing, MC predictive on the head
  (one backbone forward).

Rows per method (mean and std over seeds; the seeds fix the labelled subset and the initialisations, paired
across methods): ID accuracy, ECE (15 bins, torchmetrics), NLL, Brier, OOD AUROC (score ``1 - max p``) and
**inference forwards per prediction** (backbone forwards). Claims computed from the rows: PoLAR-VBLL has
lower ECE and NLL than LoRA MLE and PoLAR MLE at similar accuracy (within 3 points of LoRA MLE), one
forward per prediction against ``T`` / ``M`` for MC-dropout / the ensemble, and lower ECE than
last-layer Laplace.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.adapters.injector import inject_adapters
from lit_lowrank.adapters.polar_landing import apply_landing_
from lit_lowrank.adapters.polar_vbll import AlternatingSchedule, apply_polar_vbll, find_vbll_head
from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.models.small import MLP
from lit_lowrank.ops.calibration import OODAUROC, calibration_metrics
from lit_lowrank.ops.laplace_ll import fit_last_layer_laplace

TARGET = r"backbone\.layers\.(0|2)$"
METHODS = ("lora_mle", "polar_mle", "lora_laplace", "mc_dropout", "ensemble", "polar_vbll")
HIDDEN, RANK, ALPHA, LR = 128, 4, 4.0, 3e-3
#: VBLL prior variance multiplier (vbll: prior_scale * 2 / d). Chosen once among {1, 10, 100} (and kl_scale 0.1,
#: head-first phases, joint training) on tuning seed 99, which no benchmark seed uses: with 50 labels the default
#: prior (variance 2/d) shrinks the posterior mean so much that the predictive is underconfident.
PRIOR_SCALE = 100.0


class _Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.backbone = MLP(64, (HIDDEN, HIDDEN))
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.head = nn.Linear(HIDDEN, 5)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.drop(self.backbone(x)))


def _data(seed: int, labels_per_class: int) -> dict[str, Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    gen = torch.Generator().manual_seed(1234)  # the pretraining / OOD split is fixed across seeds
    high = torch.nonzero(y >= 5).squeeze(1)
    high = high[torch.randperm(len(high), generator=gen)]
    pre, ood = high[: len(high) // 2], high[len(high) // 2:]
    gen = torch.Generator().manual_seed(seed)  # the few labels change with the seed
    low = torch.nonzero(y < 5).squeeze(1)
    low = low[torch.randperm(len(low), generator=gen)]
    train = torch.cat([low[y[low] == c][:labels_per_class] for c in range(5)])
    test = low[~torch.isin(low, train)]
    return {"pre_x": x[pre], "pre_y": y[pre] - 5, "x": x[train], "y": y[train], "test_x": x[test],
            "test_y": y[test], "ood_x": x[ood]}


def _pretrain(data: dict[str, Tensor], steps: int) -> dict[str, Tensor]:
    torch.manual_seed(0)
    net = _Net()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(net(data["pre_x"]), data["pre_y"]).backward()
        opt.step()
    return {k: v for k, v in net.state_dict().items() if k.startswith("backbone.")}


def _fresh(backbone: dict[str, Tensor], seed: int, dropout: float = 0.0) -> _Net:
    torch.manual_seed(seed)
    net = _Net(dropout)
    net.load_state_dict(backbone, strict=False)  # a new head (seeded), the pretrained backbone
    return net


def _fit(net: nn.Module, data: dict[str, Tensor], steps: int, loss_fn, landing: bool = False,
         schedule: AlternatingSchedule | None = None) -> nn.Module:
    if schedule is not None:
        schedule.resolve(net)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    net.train()
    for step in range(steps):
        if schedule is not None:
            schedule.apply_phase(schedule.phase_at(step))
        opt.zero_grad(set_to_none=True)
        loss_fn(net, data["x"], data["y"]).backward()
        if landing:
            apply_landing_(net, 5e-3)
        opt.step()
    net.eval()
    return net


def _ce(net: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(net(x), y)


def _mle(backbone, data, seed, steps, method="lora", dropout=0.0) -> nn.Module:
    net = _fresh(backbone, seed, dropout)
    inject_adapters(net, method=method, target_modules=TARGET, rank=RANK, alpha=ALPHA, dropout=dropout,
                    modules_to_save=["head"])
    return _fit(net, data, steps, _ce, landing=method == "polar")


def _polar_vbll(backbone, data, seed, steps, phase_steps: int) -> nn.Module:
    net = _fresh(backbone, seed)
    apply_polar_vbll(net, num_train=len(data["y"]), target_modules=TARGET, rank=RANK, alpha=ALPHA,
                     head_kwargs={"predictive": "mc", "num_samples": 64, "parameterization": "diagonal",
                                  "prior_scale": PRIOR_SCALE})
    schedule = AlternatingSchedule([{"train": ["adapter"], "steps": phase_steps},
                                    {"train": ["head"], "steps": phase_steps}])
    head = find_vbll_head(net)

    def elbo(net_, x, y):
        return head.elbo_loss(net_.backbone(x), y)

    return _fit(net, data, steps, elbo, landing=True, schedule=schedule)


def _scores(probs: Tensor, y: Tensor, ood_probs: Tensor, forwards: int) -> dict[str, float]:
    values = {k: float(v) for k, v in calibration_metrics(5)(probs, y).items()}
    auroc = OODAUROC()
    auroc.update(probs, False)
    auroc.update(ood_probs, True)
    return {**values, "ood_auroc": float(auroc.compute()), "forwards": forwards}


@torch.no_grad()
def _softmax(net: nn.Module, x: Tensor) -> Tensor:
    return net(x).softmax(-1)


@torch.no_grad()
def _mc(net: nn.Module, x: Tensor, samples: int, seed: int) -> Tensor:
    torch.manual_seed(seed)
    net.train()  # dropout on
    probs = torch.stack([net(x).softmax(-1) for _ in range(samples)]).mean(0)
    net.eval()
    return probs


def run(quick: bool, seed: int) -> BenchmarkResult:
    torch.set_num_threads(2)
    seeds = [seed + i for i in range(5 if quick else 10)]
    labels_per_class = 10
    steps = 300
    mc_samples, members = (8, 3) if quick else (16, 5)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    backbone = None
    for s in seeds:
        data = _data(s, labels_per_class)
        if backbone is None:
            backbone = _pretrain(data, steps=300)
        lora = _mle(backbone, data, s, steps)
        evals = {"lora_mle": (lora, 1)}
        for name, (net, fw) in evals.items():
            results[name].append(_scores(_softmax(net, data["test_x"]), data["test_y"],
                                         _softmax(net, data["ood_x"]), fw))
        polar = _mle(backbone, data, s, steps, method="polar")
        results["polar_mle"].append(_scores(_softmax(polar, data["test_x"]), data["test_y"],
                                            _softmax(polar, data["ood_x"]), 1))
        with torch.no_grad():
            feats = {k: lora.backbone(data[k]) for k in ("x", "test_x", "ood_x")}
        predict = fit_last_layer_laplace(lora.head, feats["x"], data["y"])  # marglik tuning needs autograd
        results["lora_laplace"].append(_scores(predict(feats["test_x"]), data["test_y"], predict(feats["ood_x"]), 1))
        drop = _mle(backbone, data, s, steps, dropout=0.1)
        results["mc_dropout"].append(_scores(_mc(drop, data["test_x"], mc_samples, s), data["test_y"],
                                             _mc(drop, data["ood_x"], mc_samples, s), mc_samples))
        ensemble = [lora] + [_mle(backbone, data, 1000 * (m + 1) + s, steps) for m in range(members - 1)]
        results["ensemble"].append(_scores(
            torch.stack([_softmax(n, data["test_x"]) for n in ensemble]).mean(0), data["test_y"],
            torch.stack([_softmax(n, data["ood_x"]) for n in ensemble]).mean(0), members))
        vbll = _polar_vbll(backbone, data, s, steps, phase_steps=10)
        results["polar_vbll"].append(_scores(_softmax(vbll, data["test_x"]), data["test_y"],
                                             _softmax(vbll, data["ood_x"]), 1))

    def mean(method: str, key: str) -> float:
        return statistics.mean(r[key] for r in results[method])

    rows: list[dict[str, Any]] = []
    for method in METHODS:
        row: dict[str, Any] = {"method": method}
        for key in ("acc", "ece", "nll", "brier", "ood_auroc"):
            row[key] = mean(method, key)
            row[f"{key}_std"] = statistics.pstdev(r[key] for r in results[method])
        row["forwards"] = results[method][0]["forwards"]
        row["seeds"] = len(seeds)
        rows.append(row)

    claims = [
        legacy_claim("PoLAR-VBLL ECE < LoRA MLE ECE", mean("polar_vbll", "ece") - mean("lora_mle", "ece"), 0.0, "<"),
        legacy_claim("PoLAR-VBLL ECE < PoLAR MLE ECE", mean("polar_vbll", "ece") - mean("polar_mle", "ece"), 0.0, "<"),
        legacy_claim("PoLAR-VBLL NLL < LoRA MLE NLL", mean("polar_vbll", "nll") - mean("lora_mle", "nll"), 0.0, "<"),
        legacy_claim("PoLAR-VBLL NLL < PoLAR MLE NLL", mean("polar_vbll", "nll") - mean("polar_mle", "nll"), 0.0, "<"),
        legacy_claim("similar accuracy: PoLAR-VBLL acc >= LoRA MLE acc - 0.03",
              mean("polar_vbll", "acc") - mean("lora_mle", "acc"), -0.03, ">="),
        legacy_claim("one backbone forward per prediction (PoLAR-VBLL)", rows[-1]["forwards"], 1, "<="),
        legacy_claim("MC-dropout / ensemble need several forwards (min of the two)",
              min(rows[METHODS.index("mc_dropout")]["forwards"], rows[METHODS.index("ensemble")]["forwards"]), 2,
              ">="),
        legacy_claim("PoLAR-VBLL ECE < last-layer Laplace ECE",
              mean("polar_vbll", "ece") - mean("lora_laplace", "ece"), 0.0, "<"),
    ]
    notes = {"labels_per_class": labels_per_class, "steps": steps, "mc_dropout_samples": mc_samples,
             "ensemble_members": members, "id": "digits 0-4 (few labels)", "ood": "held-out half of digits 5-9",
             "pretrained_on": "other half of digits 5-9"}
    return BenchmarkResult(rows=rows, claims=claims, notes=notes)
