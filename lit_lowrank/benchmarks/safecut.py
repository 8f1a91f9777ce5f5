"""SafeCut vs source-only, SHOT, one-way distillation and naive mutual exchange, with a
second model that is genuinely complementary and a shift where SHOT alone stalls.

Setting (every unit is one seed ``s``; every method sees the same units):

- **source model**: ``cnn_small`` trained on the clean scikit-learn digits of
  ``DigitsDataModule(seed=s)`` (6 epochs, AdamW 3e-3);
- **target**: the digits the source never trained on, rotated
  (:class:`~lit_lowrank.datamodules.ShiftedDigitsDataModule`; quick: severity 1.5, i.e.
  30-67 degrees, where SHOT gains a few points in its first epoch and then stalls);
- **second model** (the paper's zero-shot ViL model): ``cnn_small`` trained on *another
  dataset of the same classes* — the 5,000 real MNIST digits rendered as 8x8
  (:class:`~lit_lowrank.models.CrossDatasetDigitClassifier`). It never sees a scikit-learn
  digit or a rotation; it is better than the source model on some classes (2, 3, 5, 8)
  and worse on others (1, 7, 9), the regime the paper's mutual correction needs.

Methods: ``source_only``; ``shot`` (IM + centroid pseudo-labels); ``one_way`` (the frozen
second model teaches the adapted one everywhere, DIFO-style); ``naive`` (both teach each
other everywhere); ``safecut`` (the gate, each model's labels scored on the kNN graph of
its own features, ``graph_features="own"``, the callback's default). Each is run on the
same learning-rate grid and its rate selected by the mean accuracy on the target images
that came from the source split's *validation* fraction (their labels are read only for
that); accuracy is reported on the other target images (the test part). Adaptation is
transductive (every target image, unlabelled, is adapted on), as in SHOT.

SafeCut's graph choices (the card's question: which graph can the gate trust?) run at
SafeCut's selected rate: ``both`` (one shared graph on both models' features),
``first`` (the adapted model's own features: its labels look reliable by construction),
``frozen`` (a frozen copy of the source backbone: a shared graph adaptation never moves).

Claims (paired by seed, 95% t intervals): the gated cross-supervision is a net-positive
correction signal, over both directions (gate-weighted fixes minus breaks over fixes
plus breaks, summed over training; a gate blind to which model is right scores 0 in
expectation) and into the adapted source model alone; SafeCut's adapted model is more
accurate than SHOT's (published: frozen hypothesis head, as every method here), one-way
distillation's and naive exchange's.

Premises (the conditions the mechanism needs here): for the correction claims, the local cut
statistic separates right from wrong labels (mean z of wrong labels above that of right
labels, both models, over SafeCut's training; labels read for evaluation only); for each
accuracy claim, an **oracle gate** (the same run, but the model whose label is right teaches
the one whose label is wrong, read from the labels, weight 1) beats that baseline: mutual
correction has headroom over it. Competitor of each accuracy claim: the **shuffled gate**
(SafeCut with its cut statistics dealt out at random across samples and models: the same
strengths, a coin-flip direction) in SafeCut's place — what the exchange alone buys.

Controls (must not hold): the same gate with its cut statistics shuffled across the
samples and the two models of each batch (its direction becomes a fair coin) claims a
net-positive correction; SafeCut with a second model whose labels are permuted (its
predictions cyclically shifted: a labelling the cut statistic cannot tell from the right
one, since it is invariant to renaming classes) claims a net-positive correction of the
adapted model, and claims to beat SHOT. (Over both directions the permuted run *is*
net-positive: the adapted model's right labels correct the permuted model.)
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lit_lowrank.benchmarks._workers import map_jobs, workers
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, paired, premise
from lit_lowrank.callbacks import SHOT, SafeCut
from lit_lowrank.datamodules import DigitsDataModule, ShiftedDigitsDataModule
from lit_lowrank.models import CrossDatasetDigitClassifier
from lit_lowrank.ops.cut_statistic import CutStatistic
from lit_lowrank.tasks import ClassificationModule

TUNED = ("shot", "one_way", "naive", "safecut")
GRAPH_VARIANTS = ("both", "first", "frozen")
CONTROLS = ("control_shuffled_gate", "control_permuted_second")
ORACLE = "oracle_gate"
NAMES = {"shot": "SHOT", "one_way": "one-way distillation", "naive": "naive exchange"}
PAPER_NET = ("this reliability-gated mechanism guarantees a net-positive correction signal; selectively "
             "amplifying true corrections while suppressing miscorrections on a per-sample basis")
PAPER_ACC = {
    "shot": "single-model approaches rely on self-refinement, they are inherently susceptible to confirmation bias "
            "and struggle to correct their own systematic errors ... SafeCut achieves state-of-the-art performance",
    "one_way": "these approaches operate in a largely unidirectional paradigm, using the ViL model primarily to "
               "supervise the source-pretrained model ... SafeCut achieves state-of-the-art performance",
    "naive": "naively exchanging predictions risks propagating errors across models ... SafeCut achieves "
             "state-of-the-art performance",
}


@dataclass(frozen=True)
class Settings:
    seeds: int
    shifts: tuple[tuple[str, float], ...]
    lrs: tuple[float, ...]
    epochs: int = 4
    source_epochs: int = 6
    batch_size: int = 128
    graph_variants: tuple[str, ...] = GRAPH_VARIANTS


QUICK = Settings(seeds=6, shifts=(("rotate", 1.5),), lrs=(1e-3, 3e-3), graph_variants=())
FULL = Settings(seeds=10, shifts=(("rotate", 1.0), ("rotate", 1.5), ("rotate_noise", 1.0)), lrs=(3e-4, 1e-3, 3e-3))


class OracleGateSafeCut(SafeCut):
    """Premise (an upper bound of any gate): the model whose label is right teaches the one whose
    label is wrong, weight 1; nobody is taught where both are right or both wrong. Reads the
    target labels (``batch["y"]``), so it is a measurement of headroom, never a method."""

    def reliability(self, batch: Any, feats_a: Tensor, feats_b: Tensor, labels_a: Tensor, labels_b: Tensor,
                    num_classes: int) -> tuple[CutStatistic, CutStatistic]:
        z_a, z_b = super().reliability(batch, feats_a, feats_b, labels_a, labels_b, num_classes)
        y = batch["y"]
        # z = -10 for a right label, +10 for a wrong one: the gate's strength tanh(20 / gap_scale) is 1
        oracle = lambda labels: torch.where(labels == y, -10.0, 10.0).to(z_a.z.dtype)  # noqa: E731
        return (CutStatistic(oracle(labels_a), z_a.cut, z_a.expected, z_a.z_global),
                CutStatistic(oracle(labels_b), z_b.cut, z_b.expected, z_b.z_global))


class ShuffledGateSafeCut(SafeCut):
    """Control: SafeCut whose cut statistics are shuffled across the samples *and* the two
    models of each batch (the ``2B`` local z's pooled and dealt out again), so the gate
    keeps its distribution of strengths but its direction is a fair coin on every sample.

    (Shuffling across samples only would keep the gate's overall direction mix — mostly
    one model teaching the other — and its net correction would then be that mix times
    the teacher's average edge, not zero.)"""

    def __init__(self, *args: Any, shuffle_seed: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._generator = torch.Generator().manual_seed(shuffle_seed)

    def reliability(self, batch: Any, feats_a: Tensor, feats_b: Tensor, labels_a: Tensor, labels_b: Tensor,
                    num_classes: int) -> tuple[CutStatistic, CutStatistic]:
        z_a, z_b = super().reliability(batch, feats_a, feats_b, labels_a, labels_b, num_classes)
        n = labels_a.numel()
        pooled = torch.cat([z_a.z, z_b.z])
        dealt = pooled[torch.randperm(2 * n, generator=self._generator).to(pooled.device)]
        return (CutStatistic(dealt[:n], z_a.cut, z_a.expected, z_a.z_global),
                CutStatistic(dealt[n:], z_b.cut, z_b.expected, z_b.z_global))


class PermutedLabels(nn.Module):
    """Control: a classifier whose class outputs are cyclically shifted (class c reported as c+1)."""

    def __init__(self, model: nn.Module, num_classes: int = 10) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("perm", (torch.arange(num_classes) - 1) % num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        return self.model.forward_features(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)[:, self.perm]


def _trainer(epochs: int, callbacks: list[pl.Callback]) -> pl.Trainer:
    return pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, accelerator="cpu", devices=1,
                      callbacks=callbacks)


@torch.no_grad()
def _predict(model: nn.Module, x: Tensor) -> Tensor:
    model.eval()
    return model(x).argmax(-1)


def _source_state(seed: int, epochs: int) -> dict[str, Tensor]:
    pl.seed_everything(seed, verbose=False)
    model = ClassificationModule("cnn_small", num_classes=10, in_chans=1,
                                 optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3))
    _trainer(epochs, []).fit(model, datamodule=DigitsDataModule(seed=seed))
    return copy.deepcopy(model.state_dict())


def _callbacks(method: str, second: nn.Module, source: ClassificationModule, lr: float, seed: int) -> list[pl.Callback]:
    if method == "source_only":
        return []
    if method == "shot":
        return [SHOT()]
    if method in ("one_way", "naive"):
        return [SafeCut(second, mode=method, second_lr=lr)]
    if method == "safecut":
        return [SafeCut(second, second_lr=lr)]
    if method in GRAPH_VARIANTS:
        encoder = copy.deepcopy(source.backbone) if method == "frozen" else None
        return [SafeCut(second, graph_features=method, graph_encoder=encoder, second_lr=lr)]
    if method == "control_shuffled_gate":
        return [ShuffledGateSafeCut(second, second_lr=lr, shuffle_seed=seed)]
    if method == ORACLE:
        return [OracleGateSafeCut(second, second_lr=lr)]
    if method == "control_permuted_second":
        return [SafeCut(PermutedLabels(second), second_lr=lr)]
    raise ValueError(f"unknown method {method!r}")


def adapt(method: str, state: dict[str, Tensor], second0: nn.Module, target: ShiftedDigitsDataModule, lr: float,
          seed: int, epochs: int) -> dict[str, Any]:
    """Adapt one copy of the source model with ``method``; accuracies on the target's val and test parts."""
    pl.seed_everything(seed, verbose=False)
    model = ClassificationModule("cnn_small", num_classes=10, in_chans=1, supervised=False,
                                 optimizer=lambda p: torch.optim.AdamW(p, lr=lr))
    model.load_state_dict(state)
    second = copy.deepcopy(second0)
    callbacks = _callbacks(method, second, model, lr, seed)
    if callbacks:
        model.train()  # Lightning keeps the mode a module is in at fit start
        _trainer(epochs, callbacks).fit(model, datamodule=target)
    x, y, val = target.train_set.tensors["x"], target.train_set.tensors["y"], target.is_validation
    right = _predict(model, x) == y
    second_right = _predict(second, x) == y  # the control's wrapper permutes this model's outputs
    test = ~val
    row: dict[str, Any] = {"val_acc": float(right[val].float().mean()), "test_acc": float(right[test].float().mean()),
                           "second_test_acc": float(second_right[test].float().mean()),
                           "test_acc_per_class": [round(float(right[test & (y == c)].float().mean()), 4)
                                                  for c in range(10)],
                           "second_test_acc_per_class": [round(float(second_right[test & (y == c)].float().mean()), 4)
                                                         for c in range(10)]}
    gate = next((cb for cb in callbacks if isinstance(cb, SafeCut)), None)
    if gate is not None:
        c = gate.counts
        row.update(net_correction=gate.net_correction(), net_correction_first=gate.net_correction("first"),
                   z_separation=gate.z_separation(),
                   fixes_to_first=c["corrections"],
                   breaks_to_first=c["miscorrections"], fixes_to_second=c["corrections_to_second"],
                   breaks_to_second=c["miscorrections_to_second"])
    return row


def _select(rows: list[dict[str, Any]], shift: str, method: str, lrs: tuple[float, ...]) -> float:
    """The learning rate with the best mean validation accuracy over seeds."""
    def score(lr: float) -> float:
        return statistics.fmean(r["val_acc"] for r in rows if r["shift"] == shift and r["method"] == method
                                and r["lr"] == lr)
    return max(lrs, key=score)


def _prepare(seed: int, source_epochs: int) -> dict[str, Tensor]:
    """A worker job: train the seed's source model and its second model (cached on disk)."""
    CrossDatasetDigitClassifier(seed=seed)
    return _source_state(seed, source_epochs)


def _row(cfg: Settings, shift: str, severity: float, method: str, lr: float, seed: int,
         state: dict[str, Tensor]) -> dict[str, Any]:
    """A worker job: one adaptation run, as a row."""
    target = ShiftedDigitsDataModule(shift=shift, severity=severity, seed=seed, batch_size=cfg.batch_size)
    target.setup("fit")
    name = shift if severity == 1.0 else f"{shift}@{severity:g}"
    return {"shift": name, "method": method, "lr": lr, "seed": seed,
            **adapt(method, state, CrossDatasetDigitClassifier(seed=seed), target, lr, seed, cfg.epochs)}


def run(quick: bool, seed: int) -> BenchmarkResult:
    # One torch thread per process, two worker processes: the nets are tiny and
    # Python-bound; a second thread per op mostly spin-waits.
    torch.set_num_threads(1)
    cfg = QUICK if quick else FULL
    seeds = [seed + i for i in range(cfg.seeds)]
    states = dict(zip(seeds, map_jobs(_prepare, [(s, cfg.source_epochs) for s in seeds])))
    jobs = [(cfg, shift, severity, method, lr, s, states[s]) for s in seeds for shift, severity in cfg.shifts
            for method, lrs in (("source_only", (0.0,)), *((m, cfg.lrs) for m in TUNED)) for lr in lrs]
    rows: list[dict[str, Any]] = map_jobs(_row, jobs)
    shifts = list(dict.fromkeys(r["shift"] for r in rows))
    selected = {(sh, m): _select(rows, sh, m, cfg.lrs) for sh in shifts for m in TUNED}
    for row in rows:
        row["selected"] = row["method"] == "source_only" or selected[(row["shift"], row["method"])] == row["lr"]
    jobs = [(cfg, shift, severity, method, selected[(shift if severity == 1.0 else f"{shift}@{severity:g}",
                                                      "safecut")], s, states[s])
            for s in seeds for shift, severity in cfg.shifts for method in (*cfg.graph_variants, ORACLE, *CONTROLS)]
    rows += [{**row, "selected": True} for row in map_jobs(_row, jobs)]
    claims, controls, premises, competitors = _claims(rows)
    # the paper's regime: the second model (before adaptation) better than SHOT's adapted model on some classes
    regime = {}
    for shift in dict.fromkeys(r["shift"] for r in rows):
        for s in seeds:
            first = next(r for r in rows if r["shift"] == shift and r["seed"] == s and r["method"] == "source_only")
            shot = next(r for r in rows if r["shift"] == shift and r["seed"] == s and r["method"] == "shot"
                        and r["selected"])
            regime[f"{shift}/seed{s}"] = [c for c in range(10) if first["second_test_acc_per_class"][c]
                                          > shot["test_acc_per_class"][c]]
    notes = {"classes_where_second_beats_shot": regime, "seeds": seeds, "shifts": [list(x) for x in cfg.shifts],
             "lr_grid": list(cfg.lrs),
             "selected_lr": {f"{sh}/{m}": lr for (sh, m), lr in selected.items()}, "epochs": cfg.epochs,
             "source_epochs": cfg.source_epochs, "batch_size": cfg.batch_size,
             "workers": f"{workers()} processes x 1 torch thread",
             "graph_variants": list(cfg.graph_variants),
             "second_model": "cnn_small trained 4 epochs on the 5,000 MNIST digits rendered as 8x8",
             "second_model_val_acc": {s: round(CrossDatasetDigitClassifier(seed=s).val_acc, 4) for s in seeds}}
    return BenchmarkResult(rows, claims, controls, notes, summary=_summary(rows), premises=premises,
                           competitors=competitors)


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = dict.fromkeys((r["shift"], r["method"]) for r in rows if r["selected"])
    for shift, method in keys:
        rs = [r for r in rows if r["selected"] and r["shift"] == shift and r["method"] == method]
        acc = [r["test_acc"] for r in rs]
        entry = {"shift": shift, "method": method, "lr": rs[0]["lr"], "test_acc": statistics.fmean(acc),
                 "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                 "second_test_acc": statistics.fmean(r["second_test_acc"] for r in rs)}
        if "net_correction" in rs[0]:
            entry["net_correction"] = statistics.fmean(r["net_correction"] for r in rs)
            firsts = [r["net_correction_first"] for r in rs if r["net_correction_first"] == r["net_correction_first"]]
            entry["net_correction_first"] = statistics.fmean(firsts) if firsts else float("nan")
            entry["z_separation"] = statistics.fmean(r["z_separation"] for r in rs)
            for key in ("fixes_to_first", "breaks_to_first", "fixes_to_second", "breaks_to_second"):
                entry[key] = sum(r[key] for r in rs)
        out.append(entry)
    return out


def _claims(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], ...]:
    """Claims, controls, premises and competitors from the selected rows (paired by seed)."""
    chosen = [r for r in rows if r["selected"]]
    claims, controls, premises, competitors = [], [], [], []
    net_quantity = ("gate-weighted (fixes - breaks) / (fixes + breaks) of the cross-labels, both directions, "
                    "summed over training steps; fraction in [-1, 1]")
    first_quantity = ("gate-weighted (fixes - breaks) / (fixes + breaks) of the cross-labels taught to the adapted "
                      "source model, summed over training steps; fraction in [-1, 1]")
    acc_quantity = "test acc({}) - test acc({}) of the adapted source model, fraction"
    for shift in dict.fromkeys(r["shift"] for r in chosen):
        def values(method: str, metric: str = "net_correction") -> tuple[list[float], list[Any]]:
            got = {r["seed"]: r[metric] for r in chosen if r["shift"] == shift and r["method"] == method}
            keys = sorted(got)
            return [got[k] for k in keys], keys

        def versus(method: str, base: str) -> tuple[list[float], list[float], list[Any]]:
            return paired(chosen, "test_acc", {"shift": shift, "method": method}, {"shift": shift, "method": base})

        separation, seeds = values("safecut", "z_separation")
        premises.append(premise(
            f"{shift}/z_separates", f"{shift}: the local cut statistic ranks right labels as more reliable than wrong "
            "ones", needs="the gate can only send right labels if low z marks right labels",
            quantity="mean local z of wrong labels - mean local z of right labels, both models, over SafeCut's "
                     "training (labels read for evaluation only), z units", values=separation, units=seeds,
            target=0.0, op=">"))
        net, seeds = values("safecut")
        claims.append(claim(f"{shift}: the gated cross-supervision is a net-positive correction signal",
                            paper=PAPER_NET, quantity=net_quantity, values=net, units=seeds, target=0.0, op=">",
                            name=f"{shift}/net", requires=f"{shift}/z_separates"))
        net_first, seeds = values("safecut", "net_correction_first")
        claims.append(claim(f"{shift}: net-positive correction of the adapted source model", paper=PAPER_NET,
                            quantity=first_quantity, values=net_first, units=seeds, target=0.0, op=">",
                            name=f"{shift}/net_first", requires=f"{shift}/z_separates"))
        for base in ("shot", "one_way", "naive"):
            oracle, theirs, units = versus(ORACLE, base)
            premises.append(premise(
                f"{shift}/oracle_over_{base}", f"{shift}: an oracle gate (the right model teaches the wrong one) "
                f"above {NAMES[base]}", needs="mutual correction has headroom over the baseline in this regime",
                quantity=acc_quantity.format("oracle gate", base), values=oracle, baseline=theirs, units=units,
                target=0.0, op=">"))
            ours, theirs, units = versus("safecut", base)
            claims.append(claim(f"{shift}: SafeCut's adapted model above {NAMES[base]}", paper=PAPER_ACC[base],
                                quantity=acc_quantity.format("SafeCut", base), values=ours, baseline=theirs,
                                units=units, target=0.0, op=">", name=f"{shift}/above_{base}",
                                requires=f"{shift}/oracle_over_{base}"))
            shuffled, theirs, units = versus("control_shuffled_gate", base)
            competitors.append(competitor(
                f"{shift}/above_{base}", f"{shift}: SafeCut with a shuffled gate above {NAMES[base]}",
                competitor="the gate's cut statistics shuffled across samples and models (same strengths, "
                           "coin-flip direction)", quantity=acc_quantity.format("shuffled gate", base),
                values=shuffled, baseline=theirs, units=units, target=0.0, op=">"))
        shuffled, seeds = values("control_shuffled_gate")
        controls.append(claim(f"{shift}: a gate with cut statistics shuffled across samples and models is a "
                              "net-positive correction signal", paper=PAPER_NET, quantity=net_quantity, values=shuffled,
                              units=seeds, target=0.0, op=">"))
        permuted, seeds = values("control_permuted_second", "net_correction_first")
        controls.append(claim(f"{shift}: with a label-permuted second model, net-positive correction of the adapted "
                              "source model", paper=PAPER_NET, quantity=first_quantity, values=permuted, units=seeds,
                              target=0.0, op=">"))
        ours, theirs, units = versus("control_permuted_second", "shot")
        controls.append(claim(f"{shift}: SafeCut with a label-permuted second model above SHOT",
                              paper=PAPER_ACC["shot"], quantity=acc_quantity.format("permuted", "SHOT"), values=ours,
                              baseline=theirs, units=units, target=0.0, op=">"))
    return claims, controls, premises, competitors
