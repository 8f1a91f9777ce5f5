"""PoLAR-VBLL against tuned Bayesian and non-Bayesian baselines: few labels, in-distribution and OOD.

Setting (embedded data, CPU): scikit-learn's 8x8 digits. A 64-128-128 MLP is **pretrained on half** of the
images of digits 5-9 (a 5-way head). The downstream task is 5-way classification of digits 0-4 from **few labels**:
per seed, ``labels_per_class`` training and as many *validation* images per digit are drawn; the test set is every
other 0-4 image and the OOD set the other half of digits 5-9 (never seen). The seed is the paired unit: it fixes
the labelled draw, the initialisations and every stochastic choice, identical across methods. Every method adapts
both hidden layers with rank-4 adapters on the frozen backbone and trains a new head on the same labels, same
steps, same optimiser (AdamW, full batch, lr 3e-3); every method's own knob is chosen per seed on the validation
split by NLL (never on test):

- ``lora_mle`` / ``polar_mle``: LoRA (PEFT) / PoLAR (+ landing) adapters + linear head, cross-entropy.
- ``temp_scaled``: ``lora_mle`` with a temperature fitted on the validation split (Guo et al. 2017).
- ``lora_laplace``: last-layer Laplace on ``lora_mle``'s features, done fairly: the head is the MAP *under the
  prior it is judged by* (:func:`~lit_lowrank.ops.laplace_ll.fit_last_layer_laplace`), the prior precision
  chosen on validation NLL (below); GLM probit predictive.
- ``mc_dropout``: LoRA with adapter dropout and dropout before the head, ``p ∈ {0.05, 0.1, 0.2}`` (validation),
  ``T`` stochastic forwards averaged.
- ``ensemble``: ``M`` ``lora_mle`` members (different initialisations and batch noise), averaged.
- ``polar_vbll``: PoLAR adapters + VBLL head. **Warm start**: the first ``WARM`` = 50 steps train the adapters
  and a linear head by MLE (as ``polar_mle``), then the head becomes a VBLL head whose posterior mean is that MLE
  head (:func:`~lit_lowrank.adapters.polar_vbll.apply_polar_vbll`) and the negative ELBO trains on, landing on,
  MC predictive on the head (one backbone forward). **Schedule** (METHODS.md §8 leaves it open) and
  ``prior_scale ∈ {1, 10, 100}`` are chosen together per seed on validation NLL among ``joint`` (everything, the
  remaining 250 steps), ``alternate_step`` (adapters / posterior every other step, same budget) and
  ``alternate_full`` (10-step phases, each block the full 250-step budget: 500 steps); each schedule at its own
  best prior scale is a row too (``polar_vbll[joint]`` ...).
- ``polar_vbll_no_epistemic`` (ablation, a competitor): the selected PoLAR-VBLL net with its head's ``q(W)``
  collapsed to the posterior mean (logit noise kept, :func:`without_epistemic`): what the weight posterior adds.
- ``lora_vbll`` (ablation, no claim): the same warm start and VBLL head on LoRA adapters at PoLAR-VBLL's chosen
  schedule — it separates what the VBLL head does from what the PoLAR adapters do.

Every knob by the same rule, validation NLL: temperature (``temp_scaled``), last-layer Laplace's prior precision
(the marginal likelihood's choice or ``{1, 10, 100, 1000}``, the MAP head under each), MC-dropout's ``p``,
PoLAR-VBLL's schedule and prior scale.

**Premises**: ``calibration_headroom`` (a temperature fitted on the *test* split lowers LoRA MLE's NLL: there is
miscalibration to remove) for the ECE/NLL claims against LoRA MLE; ``ood_signal`` (the distance to the nearest
training feature separates OOD digits better than LoRA MLE's max-softmax: the features carry the signal a Bayesian
head could expose) for the OOD claim. **Competitors**: temperature scaling and PoLAR-VBLL without its weight
posterior (for NLL and ECE), a 3-member ensemble (OOD), a reseeded LoRA MLE (accuracy).

Rows per (method, seed): accuracy, ECE (15 bins, torchmetrics), NLL, Brier, OOD AUROC (score ``1 − max p``),
backbone forwards per prediction and the chosen knob. Claims (paired over seeds, 95% t-intervals): PoLAR-VBLL has
lower ECE and NLL than LoRA MLE, lower NLL than last-layer Laplace, temperature scaling, MC-dropout and the
ensemble, higher OOD AUROC than LoRA MLE and higher accuracy than LoRA MLE. Controls: the uniform predictor
(every image 1/5 per class) must not beat LoRA MLE in NLL nor in OOD AUROC, and LoRA MLE with another seed (a
null) must not beat LoRA MLE in ECE.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.adapters.injector import inject_adapters
from lit_lowrank.adapters.polar_landing import apply_landing_
from lit_lowrank.adapters.polar_vbll import AlternatingSchedule, apply_polar_vbll, find_vbll_head
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, paired, premise
from lit_lowrank.models.small import MLP
from lit_lowrank.ops.calibration import OODAUROC, calibration_metrics, fit_temperature
from lit_lowrank.ops.laplace_ll import fit_last_layer_laplace

TARGET = r"backbone\.layers\.(0|2)$"
METHODS = ("lora_mle", "polar_mle", "temp_scaled", "lora_laplace", "mc_dropout", "ensemble", "polar_vbll", "lora_vbll")
HIDDEN, RANK, ALPHA, LR, CLASSES = 128, 4, 4.0, 3e-3, 5
PRIOR_SCALES: tuple[float, ...] = (1.0, 10.0, 100.0)
SCHEDULES: tuple[str, ...] = ("joint", "alternate_step", "alternate_full")
PRIOR_PRECISIONS: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0)  # last-layer Laplace's grid (plus marglik's)
STEPS, SEEDS = 300, {True: 5, False: 10}  # training steps per method; seeds per mode
WARM = 50  # MLE warm-start steps of the VBLL head (inside the budget)
DROPOUTS: tuple[float, ...] = (0.05, 0.1, 0.2)
PAPER = ("PoLAR-VBLL (arXiv 2604.03388): \"decisions typically suffer from overconfidence, particularly after "
         "parameter-efficient fine-tuning (PEFT) for downstream domain-specific tasks with limited data\"; "
         "\"Laplace approximation based post-hoc framework, which may yield suboptimal calibration\"; MC "
         "alternatives need \"multiple complete forward passes\"; \"effectiveness of PoLAR-VBLL in terms of "
         "generalization and uncertainty estimation on both in-distribution and out-of-distribution data\"")
CONTROL = "(control: must not hold) " + PAPER


class _Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.backbone = MLP(64, (HIDDEN, HIDDEN))
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.head = nn.Linear(HIDDEN, CLASSES)

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
    gen = torch.Generator().manual_seed(seed)  # the few labels (and the validation labels) change with the seed
    low = torch.nonzero(y < 5).squeeze(1)
    low = low[torch.randperm(len(low), generator=gen)]
    per_class = [low[y[low] == c] for c in range(CLASSES)]
    train = torch.cat([p[:labels_per_class] for p in per_class])
    val = torch.cat([p[labels_per_class:2 * labels_per_class] for p in per_class])
    test = low[~torch.isin(low, torch.cat([train, val]))]
    return {"pre_x": x[pre], "pre_y": y[pre] - 5, "x": x[train], "y": y[train], "val_x": x[val], "val_y": y[val],
            "test_x": x[test], "test_y": y[test], "ood_x": x[ood]}


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


def _polar_vbll(backbone, data, seed, steps, prior_scale: float, schedule: str = "joint",
                adapter: str = "polar") -> nn.Module:
    """Adapters + a linear head trained by MLE for ``WARM`` steps (the warm start), then the head becomes a VBLL
    head whose posterior mean is that MLE head and the negative ELBO trains on under ``schedule``:
    ``joint`` (everything, the rest of the budget), ``alternate_step`` (adapters / posterior every other step,
    same budget) or ``alternate_full`` (10-step phases, each block the full remaining budget: twice the steps)."""
    net = _fresh(backbone, seed)
    inject_adapters(net, method=adapter, target_modules=TARGET, rank=RANK, alpha=ALPHA)
    net.head.requires_grad_(True)  # the new head trains with the adapters in the warm start
    _fit(net, data, WARM, _ce, landing=adapter == "polar")
    net.train()
    apply_polar_vbll(net, num_train=len(data["y"]), adapter=None, head_kwargs={
        "predictive": "mc", "num_samples": 64, "parameterization": "diagonal", "prior_scale": prior_scale})
    head = find_vbll_head(net)
    phases = {"joint": None, "alternate_step": 1, "alternate_full": 10}[schedule]
    plan = None if phases is None else AlternatingSchedule([{"train": ["adapter"], "steps": phases},
                                                            {"train": ["head"], "steps": phases}])
    rest = (steps - WARM) * (2 if schedule == "alternate_full" else 1)

    def elbo(net_, x, y):
        return head.elbo_loss(net_.backbone(x), y)

    return _fit(net, data, rest, elbo, landing=adapter == "polar", schedule=plan)


def _scores(probs: Tensor, y: Tensor, ood_probs: Tensor) -> dict[str, float]:
    values = {k: float(v) for k, v in calibration_metrics(CLASSES)(probs, y).items()}
    auroc = OODAUROC()
    auroc.update(probs, False)
    auroc.update(ood_probs, True)
    return {**values, "ood_auroc": float(auroc.compute())}


def _nll(probs: Tensor, y: Tensor) -> float:
    return float(-probs.gather(1, y[:, None]).clamp_min(1e-12).log().mean())


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


Predictor = Callable[[Tensor], Tensor]


def without_epistemic(net: nn.Module) -> Predictor:
    """``net``'s predictive with its VBLL head's ``q(W)`` collapsed to the posterior mean (logit noise kept):
    compared with the full predictive, what the Bayesian posterior over the head's weights adds."""
    head = find_vbll_head(net)

    @torch.no_grad()
    def predict(x: Tensor) -> Tensor:
        saved = head.layer.W_logdiag.detach().clone()
        head.layer.W_logdiag.fill_(-30.0)  # weight std e^-30: the mean alone
        try:
            return _softmax(net, x)
        finally:
            head.layer.W_logdiag.copy_(saved)
    return predict


def _best_on_validation(candidates: dict[float, Predictor], data: dict[str, Tensor]) -> tuple[float, Predictor]:
    """The knob value whose predictor has the lowest validation NLL."""
    knob = min(candidates, key=lambda k: _nll(candidates[k](data["val_x"]), data["val_y"]))
    return knob, candidates[knob]


def _seed_rows(backbone: dict[str, Tensor], data: dict[str, Tensor], seed: int, steps: int, mc_samples: int,
               members: int) -> list[dict[str, Any]]:
    lora = _mle(backbone, data, seed, steps)
    polar = _mle(backbone, data, seed, steps, method="polar")
    predictors: dict[str, tuple[Predictor, int, Any]] = {
        "lora_mle": (lambda x: _softmax(lora, x), 1, None),
        "polar_mle": (lambda x: _softmax(polar, x), 1, None),
    }
    with torch.no_grad():
        temperature = fit_temperature(lora(data["val_x"]), data["val_y"])
    predictors["temp_scaled"] = (lambda x: (lora(x) / temperature).softmax(-1).detach(), 1, temperature)
    with torch.no_grad():
        train_feats = lora.backbone(data["x"])
    # last-layer Laplace: the prior precision chosen like every other knob, by validation NLL, among the
    # marginal likelihood's choice and a grid (the MAP head under each)
    laplaces = {}
    marglik, info = fit_last_layer_laplace(train_feats, data["y"], CLASSES)
    laplaces[float(info["prior_precision"])] = marglik
    for precision in PRIOR_PRECISIONS:
        laplaces[precision] = fit_last_layer_laplace(train_feats, data["y"], CLASSES, precision, optimize=False)[0]
    delta, laplace = _best_on_validation({d: (lambda x, f=f: f(lora.backbone(x).detach()).detach())
                                          for d, f in laplaces.items()}, data)
    predictors["lora_laplace"] = (laplace, 1, delta)
    drops = {p: _mle(backbone, data, seed, steps, dropout=p) for p in DROPOUTS}
    p, mc = _best_on_validation({p: (lambda x, n=n: _mc(n, x, mc_samples, seed)) for p, n in drops.items()}, data)
    predictors["mc_dropout"] = (mc, mc_samples, p)
    ensemble = [lora] + [_mle(backbone, data, 1000 * (m + 1) + seed, steps) for m in range(members - 1)]
    predictors["ensemble"] = (lambda x: torch.stack([_softmax(n, x) for n in ensemble]).mean(0), members, None)
    # PoLAR-VBLL: schedule and prior scale chosen together on validation NLL
    vblls = {(sched, s): _polar_vbll(backbone, data, seed, steps, s, sched) for sched in SCHEDULES
             for s in PRIOR_SCALES}
    (sched, s), vbll = _best_on_validation({k: (lambda x, n=n: _softmax(n, x)) for k, n in vblls.items()}, data)
    predictors["polar_vbll"] = (vbll, 1, (sched, s))
    predictors["polar_vbll_no_epistemic"] = (without_epistemic(vblls[sched, s]), 1, (sched, s))
    for name in SCHEDULES:  # each schedule at its own best prior scale (validation): the schedule comparison
        best, pred = _best_on_validation({k: (lambda x, n=n: _softmax(n, x)) for k, n in vblls.items()
                                          if k[0] == name}, data)
        predictors[f"polar_vbll[{name}]"] = (pred, 1, best)
    # ablation: the same VBLL head on LoRA adapters, at PoLAR-VBLL's chosen schedule, its own prior scale
    lora_vblls = {(sched, p): _polar_vbll(backbone, data, seed, steps, p, sched, adapter="lora") for p in PRIOR_SCALES}
    s, lora_vbll = _best_on_validation({k: (lambda x, n=n: _softmax(n, x)) for k, n in lora_vblls.items()}, data)
    predictors["lora_vbll"] = (lora_vbll, 1, s)
    # the premises' oracles: a temperature fitted on the *test* split (calibration headroom of LoRA MLE) and a
    # feature-space detector (distance to the nearest training feature: OOD signal in the features at all)
    with torch.no_grad():
        oracle_t = fit_temperature(lora(data["test_x"]), data["test_y"])
    predictors["oracle_temperature"] = (lambda x: (lora(x) / oracle_t).softmax(-1).detach(), 1, oracle_t)
    twin = _mle(backbone, data, seed + 5000, steps)
    predictors["lora_mle_twin"] = (lambda x: _softmax(twin, x), 1, None)
    predictors["uniform"] = (lambda x: torch.full((len(x), CLASSES), 1.0 / CLASSES), 0, None)
    rows = []
    for method, (predict, forwards, knob) in predictors.items():
        with torch.no_grad():
            scores = _scores(predict(data["test_x"]), data["test_y"], predict(data["ood_x"]))
        rows.append({"method": method, "seed": seed, **scores, "forwards": forwards,
                     "knob": list(knob) if isinstance(knob, tuple) else knob})
    with torch.no_grad():
        rows.append({"method": "feature_distance", "seed": seed, "ood_auroc": _distance_auroc(
            lora.backbone(data["x"]), lora.backbone(data["test_x"]), lora.backbone(data["ood_x"]))})
    return rows


def _distance_auroc(train: Tensor, test: Tensor, ood: Tensor) -> float:
    """OOD AUROC of the distance to the nearest training feature (the score is larger for OOD)."""
    from torchmetrics.functional.classification import binary_auroc

    scores = torch.cat([torch.cdist(test, train).min(1).values, torch.cdist(ood, train).min(1).values])
    labels = torch.cat([torch.zeros(len(test)), torch.ones(len(ood))]).long()
    return float(binary_auroc(scores, labels))


def run(quick: bool, seed: int) -> BenchmarkResult:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny MLP ops: a second thread only adds contention (no timing claim here)
    try:
        return _run(quick, seed)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, seed: int) -> BenchmarkResult:
    seeds = [seed + i for i in range(SEEDS[quick])]
    labels_per_class, steps = 10, STEPS
    mc_samples, members = (8, 3) if quick else (16, 5)
    rows: list[dict[str, Any]] = []
    backbone = None
    for s in seeds:
        data = _data(s, labels_per_class)
        if backbone is None:
            backbone = _pretrain(data, steps=300)
        rows += _seed_rows(backbone, data, s, steps, mc_samples, members)

    def pair(metric: str, a: str, b: str) -> dict[str, Any]:
        ours, base, units = paired(rows, metric, {"method": a}, {"method": b})
        return dict(values=ours, baseline=base, units=units)

    def lower(metric: str, base: str, label: str, name: str | None = None, requires: str | None = None,
              method: str = "polar_vbll", text: str | None = None) -> dict[str, Any]:
        return claim(text or f"PoLAR-VBLL {metric.upper()} below {label}", paper=PAPER,
                     quantity=f"{metric}({method}) − {metric}({base}), test split", **pair(metric, method, base),
                     target=0.0, op="<", name=name, requires=requires)

    premises = [
        premise("calibration_headroom", "a temperature fitted on the test split itself lowers LoRA MLE's NLL",
                needs="calibration claims need LoRA MLE to be miscalibrated (an oracle rescaling must help)",
                quantity="nll(LoRA MLE at the oracle temperature) − nll(LoRA MLE), test split",
                **pair("nll", "oracle_temperature", "lora_mle"), target=0.0, op="<"),
        premise("ood_signal", "the backbone features separate OOD digits better than LoRA MLE's max-softmax",
                needs="a Bayesian head on the features can only flag OOD inputs the features separate",
                quantity="OOD AUROC(distance to the nearest training feature) − OOD AUROC(LoRA MLE)",
                **pair("ood_auroc", "feature_distance", "lora_mle"), target=0.0, op=">"),
    ]
    claims = [
        lower("ece", "lora_mle", "LoRA MLE", name="ece_vs_lora", requires="calibration_headroom"),
        lower("nll", "lora_mle", "LoRA MLE", name="nll_vs_lora", requires="calibration_headroom"),
        lower("nll", "lora_laplace", "last-layer Laplace (MAP head, prior precision by validation NLL)"),
        lower("nll", "temp_scaled", "temperature-scaled LoRA MLE"),
        lower("nll", "mc_dropout", f"MC-dropout ({mc_samples} forwards)"),
        lower("nll", "ensemble", f"a {members}-member ensemble"),
        lower("nll", "polar_vbll_no_epistemic", "the same net with its weight posterior collapsed to the mean",
              name="posterior_helps", text="PoLAR-VBLL's weight posterior lowers its NLL (vs the same trained net "
              "with q(W) collapsed to its mean, logit noise kept)"),
        claim("PoLAR-VBLL separates OOD digits better than LoRA MLE", paper=PAPER,
              quantity="OOD AUROC(PoLAR-VBLL) − OOD AUROC(LoRA MLE), score 1 − max p",
              **pair("ood_auroc", "polar_vbll", "lora_mle"), target=0.0, op=">", name="ood_vs_lora",
              requires="ood_signal"),
        claim("PoLAR-VBLL generalises better than LoRA MLE (test accuracy)", paper=PAPER,
              quantity="acc(PoLAR-VBLL) − acc(LoRA MLE), fraction", **pair("acc", "polar_vbll", "lora_mle"),
              target=0.0, op=">", name="acc_vs_lora"),
    ]
    competitors = [
        competitor("nll_vs_lora", "temperature-scaled LoRA MLE has lower NLL than LoRA MLE", competitor="one "
                   "temperature fitted on the validation split", quantity="nll(temp_scaled) − nll(lora_mle)",
                   **pair("nll", "temp_scaled", "lora_mle"), target=0.0, op="<"),
        competitor("nll_vs_lora", "PoLAR-VBLL without its weight posterior has lower NLL than LoRA MLE",
                   competitor="the same trained PoLAR-VBLL with q(W) collapsed to its mean (logit noise kept): the "
                   "Bayesian part ablated", quantity="nll(polar_vbll_no_epistemic) − nll(lora_mle)",
                   **pair("nll", "polar_vbll_no_epistemic", "lora_mle"), target=0.0, op="<"),
        competitor("ece_vs_lora", "PoLAR-VBLL without its weight posterior has lower ECE than LoRA MLE",
                   competitor="the same trained PoLAR-VBLL with q(W) collapsed to its mean (logit noise kept): the "
                   "Bayesian part ablated", quantity="ece(polar_vbll_no_epistemic) − ece(lora_mle)",
                   **pair("ece", "polar_vbll_no_epistemic", "lora_mle"), target=0.0, op="<"),
        competitor("ece_vs_lora", "temperature-scaled LoRA MLE has lower ECE than LoRA MLE", competitor="one "
                   "temperature fitted on the validation split", quantity="ece(temp_scaled) − ece(lora_mle)",
                   **pair("ece", "temp_scaled", "lora_mle"), target=0.0, op="<"),
        competitor("ood_vs_lora", "a 3-member LoRA ensemble separates OOD digits better than LoRA MLE",
                   competitor="the ensemble (members' disagreement, 3 forwards)",
                   quantity="OOD AUROC(ensemble) − OOD AUROC(lora_mle)", **pair("ood_auroc", "ensemble", "lora_mle"),
                   target=0.0, op=">"),
        competitor("acc_vs_lora", "LoRA MLE with another seed is more accurate than LoRA MLE", competitor="a reseeded "
                   "LoRA MLE (the null)", quantity="acc(lora_mle_twin) − acc(lora_mle)",
                   **pair("acc", "lora_mle_twin", "lora_mle"), target=0.0, op=">"),
    ]
    controls = [
        claim("the uniform predictor has lower NLL than LoRA MLE", paper=CONTROL,
              quantity="nll(uniform) − nll(LoRA MLE), test split", **pair("nll", "uniform", "lora_mle"), target=0.0,
              op="<"),
        claim("the uniform predictor separates OOD digits better than LoRA MLE", paper=CONTROL,
              quantity="OOD AUROC(uniform) − OOD AUROC(LoRA MLE)", **pair("ood_auroc", "uniform", "lora_mle"),
              target=0.0, op=">"),
        claim("LoRA MLE with another seed has lower ECE than LoRA MLE (a null)", paper=CONTROL,
              quantity="ece(LoRA MLE, seed+5000) − ece(LoRA MLE), test split",
              **pair("ece", "lora_mle_twin", "lora_mle"), target=0.0, op="<"),
    ]
    summary = []
    for method in (*METHODS, *(f"polar_vbll[{k}]" for k in SCHEDULES), "polar_vbll_no_epistemic", "lora_mle_twin",
                   "uniform",
                   "oracle_temperature", "feature_distance"):
        mine = [r for r in rows if r["method"] == method]
        line: dict[str, Any] = {"method": method, "seeds": len(mine)}
        for key in ("acc", "ece", "nll", "brier", "ood_auroc"):
            if key not in mine[0]:
                continue
            line[key] = statistics.fmean(r[key] for r in mine)
            line[f"{key}_std"] = statistics.stdev(r[key] for r in mine) if len(mine) > 1 else 0.0
        line["forwards"] = mine[0].get("forwards")
        knobs = [r.get("knob") for r in mine if r.get("knob") is not None]
        name = {"temp_scaled": "T", "oracle_temperature": "T", "lora_laplace": "prior precision",
                "mc_dropout": "p"}.get(method, "(schedule, prior_scale)")
        line["knob"] = f"{name} " + ", ".join(
            "/".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in k) if isinstance(k, list)
            else f"{k:.3g}" for k in knobs) if knobs else ""
        summary.append(line)
    notes = {"labels_per_class": labels_per_class, "validation_per_class": labels_per_class, "steps": steps,
             "mc_dropout_samples": mc_samples, "ensemble_members": members, "id": "digits 0-4 (few labels)",
             "ood": "held-out half of digits 5-9", "pretrained_on": "other half of digits 5-9",
             "warm_start": f"{WARM} MLE steps (adapters + linear head) inside the {steps}-step budget, then the VBLL "
                           "head's posterior mean starts at that head",
             "knobs": {"polar_vbll": {"schedule": list(SCHEDULES), "prior_scale": list(PRIOR_SCALES)},
                       "mc_dropout": list(DROPOUTS), "temp_scaled": "temperature by validation NLL",
                       "lora_laplace": {"prior_precision": ["marginal likelihood", *PRIOR_PRECISIONS],
                                        "chosen": "by validation NLL, MAP head under each"}}}
    return BenchmarkResult(rows=rows, claims=claims, controls=controls, notes=notes, summary=summary,
                           premises=premises, competitors=competitors)
