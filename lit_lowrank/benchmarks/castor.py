"""Castor vs fourteen node-classification baselines over the cSBM homophily sweep.

Graphs: :func:`~lit_lowrank.datamodules.csbm.contextual_sbm` at ``φ ∈ {−1, −0.5, 0, 0.5, 1}``
(one graph per ``φ``, seeded by ``seed``), each with ``S`` random stratified splits
(:func:`~lit_lowrank.datamodules.graphs.split_masks`, the sparse GPRGNN cSBM protocol:
``TRAIN_FRACTION``/``VAL_FRACTION``, the rest test).

Models (one recipe for all: Adam, lr 0.01, weight decay 5e-4, dropout 0.5, hidden 64,
full batch, test accuracy at the best validation epoch): ``castor`` (defaults), the
ablations ``castor_no_router`` (``router="global"``: one learned mix per hop for every
node) and ``castor_no_momentum`` (``momentum="none"``), and the baselines MLP, GCN, GAT,
APPNP, SGC, ChebNet, GCNII, FAGCN, MixHop, LINKX (PyG) and GPRGNN, BernNet, ChebNetII,
ACM-GCN (:mod:`lit_lowrank.models.graph_baselines`). ``--quick``: 400 nodes, 100
features, 5 splits, 60 epochs, the eight :data:`QUICK_BASELINES`; full: 2,000 nodes, 500
features, 10 splits, 300 epochs, all fourteen. Split ``s`` uses model seed
``seed + s`` for every model: comparisons are paired.

Rows: per model and ``φ``, mean ± std and the 95% interval ``1.96 std/√S`` of test
accuracy; the average rank (rank of the mean accuracy at each ``φ``, averaged over
``φ``; ablations are ranked among the baselines one at a time, so they never push
Castor down); router mass per primitive (low / high / identity) for Castor at each ``φ``,
split by node local homophily (< 0.5 vs ≥ 0.5).

Claims: Castor is top-3 at every ``φ`` and has the best average rank among Castor and
the baselines run; each ablation's average rank is worse than Castor's; Castor's
high-pass mass is larger at ``φ = −1`` than at ``φ = 1``.
"""

from __future__ import annotations

import inspect
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.datamodules.csbm import contextual_sbm, edge_homophily
from lit_lowrank.datamodules.graphs import split_masks
from lit_lowrank.models.castor import Castor
from lit_lowrank.ops.castor import router_mass_by_homophily
from lit_lowrank.ops.graph_propagation import local_homophily

PHIS = (-1.0, -0.5, 0.0, 0.5, 1.0)
TRAIN_FRACTION, VAL_FRACTION = 0.2, 0.2
HIDDEN, DROPOUT, LR, WEIGHT_DECAY = 64, 0.5, 0.01, 5e-4
CASTOR = "castor"
ABLATIONS = ("castor_no_router", "castor_no_momentum")
#: ``--quick`` (3 minutes on 2 shared cores) trains Castor, its ablations and these eight
#: baselines — the strongest of the fourteen on the sweep at full scale plus MLP and GCN;
#: the full run trains all fourteen.
QUICK_BASELINES = ("mlp", "gcn", "appnp", "gcnii", "gprgnn", "chebnetii", "acmgcn", "linkx")


def model_factories(num_nodes: int) -> dict[str, Callable[[int, int], nn.Module]]:
    """name -> ``fn(in_channels, out_channels)``; Castor, its ablations and the fourteen baselines."""
    import torch_geometric.nn.models as pyg

    from lit_lowrank.models import graph_baselines as ours

    common = dict(hidden_channels=HIDDEN, dropout=DROPOUT)
    return {
        CASTOR: lambda i, o: Castor(i, o, **common),
        "castor_no_router": lambda i, o: Castor(i, o, router="global", **common),
        "castor_no_momentum": lambda i, o: Castor(i, o, momentum="none", **common),
        "mlp": lambda i, o: pyg.MLP([i, HIDDEN, o], dropout=DROPOUT, norm=None),
        "gcn": lambda i, o: pyg.GCN(i, HIDDEN, 2, o, dropout=DROPOUT),
        "gat": lambda i, o: pyg.GAT(i, HIDDEN, 2, o, dropout=DROPOUT, heads=8),
        "appnp": lambda i, o: ours.APPNPNet(i, o, **common),
        "sgc": lambda i, o: ours.SGCNet(i, o, dropout=0.0),
        "chebnet": lambda i, o: ours.ChebNet(i, o, **common),
        "gcnii": lambda i, o: ours.GCNIINet(i, o, num_layers=8, **common),
        "fagcn": lambda i, o: ours.FAGCNNet(i, o, **common),
        "mixhop": lambda i, o: ours.MixHopNet(i, o, hidden_channels=66, dropout=DROPOUT),
        "linkx": lambda i, o: pyg.LINKX(num_nodes, i, HIDDEN, o, num_layers=1, dropout=DROPOUT),
        "gprgnn": lambda i, o: ours.GPRGNN(i, o, **common),
        "bernnet": lambda i, o: ours.BernNet(i, o, **common),
        "chebnetii": lambda i, o: ours.ChebNetII(i, o, **common),
        "acmgcn": lambda i, o: ours.ACMGCN(i, o, **common),
    }


def train_and_test(model: nn.Module, data: Data, split: int, epochs: int, eval_every: int = 5) -> float:
    """Full-batch training; test accuracy at the epoch of best validation accuracy."""
    train, val, test = data.train_mask[:, split], data.val_mask[:, split], data.test_mask[:, split]
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    takes_edges = "edge_index" in inspect.signature(model.forward).parameters
    run = (lambda: model(data.x, data.edge_index)) if takes_edges else (lambda: model(data.x))
    best_val, best_test = -1.0, 0.0
    for epoch in range(epochs):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(run()[train], data.y[train]).backward()
        optimizer.step()
        if (epoch + 1) % eval_every == 0:
            model.eval()
            with torch.no_grad():
                pred = run().argmax(1)
            val_acc = float((pred[val] == data.y[val]).float().mean())
            if val_acc > best_val:
                best_val, best_test = val_acc, float((pred[test] == data.y[test]).float().mean())
    return best_test


def _mean_ranks(acc: dict[str, dict[Any, float]], names: list[str],
                settings: tuple[Any, ...] = PHIS) -> tuple[dict[str, float], dict[str, dict]]:
    """Average over settings (φ or datasets) of each model's rank (1 = best, ties share the mean rank)."""
    ranks: dict[str, dict[Any, float]] = {n: {} for n in names}
    for phi in settings:
        values = sorted((acc[n][phi] for n in names), reverse=True)
        for n in names:
            better = sum(v > acc[n][phi] for v in values)
            tied = sum(v == acc[n][phi] for v in values)
            ranks[n][phi] = better + (tied + 1) / 2
    return {n: statistics.mean(ranks[n].values()) for n in names}, ranks


def run(quick: bool, seed: int) -> BenchmarkResult:
    torch.set_num_threads(1)  # tiny full-batch graphs: one thread is as fast and steadier on a shared machine
    num_nodes, num_features = (400, 100) if quick else (2000, 500)
    num_splits, epochs = (5, 60) if quick else (10, 300)
    factories = model_factories(num_nodes)
    if quick:
        factories = {n: f for n, f in factories.items() if n == CASTOR or n in ABLATIONS or n in QUICK_BASELINES}
    names = list(factories)
    accs: dict[str, dict[float, list[float]]] = {n: {phi: [] for phi in PHIS} for n in names}
    masses: dict[float, torch.Tensor] = {}
    homophily: dict[float, float] = {}
    seconds: dict[str, float] = dict.fromkeys(names, 0.0)
    betas: dict[float, list[float]] = {}
    for phi in PHIS:
        data = contextual_sbm(num_nodes, num_features, phi=phi, seed=seed)
        data.train_mask, data.val_mask, data.test_mask = split_masks(data.y, num_splits, TRAIN_FRACTION,
                                                                     VAL_FRACTION, seed)
        homophily[phi] = edge_homophily(data.edge_index, data.y)
        node_hom = local_homophily(data.edge_index, data.y)
        phi_mass = []
        for split in range(num_splits):
            for name in names:
                torch.manual_seed(seed + split)
                model = factories[name](num_features, 2)
                start = time.perf_counter()
                accs[name][phi].append(train_and_test(model, data, split, epochs))
                seconds[name] += time.perf_counter() - start
                if name == CASTOR:
                    model.eval()
                    with torch.no_grad():
                        model(data.x, data.edge_index)
                    phi_mass.append(router_mass_by_homophily(model.last_routes, node_hom, bins=2))
                    betas.setdefault(phi, []).append(model.betas().detach())
        masses[phi] = torch.stack(phi_mass).nanmean(0)
        betas[phi] = torch.stack(betas[phi]).mean(0).tolist()

    mean_acc = {n: {phi: statistics.mean(accs[n][phi]) for phi in PHIS} for n in names}
    main = [n for n in names if n not in ABLATIONS]
    avg_rank, ranks = _mean_ranks(mean_acc, main)
    for ablation in ABLATIONS:  # an ablation is ranked among the baselines in Castor's place
        others = [n for n in main if n != CASTOR] + [ablation]
        avg_rank[ablation] = _mean_ranks(mean_acc, others)[0][ablation]
        ranks[ablation] = _mean_ranks(mean_acc, others)[1][ablation]

    rows: list[dict[str, Any]] = []
    for name in sorted(names, key=lambda n: avg_rank[n]):
        row: dict[str, Any] = {"model": name, "avg_rank": round(avg_rank[name], 2)}
        for phi in PHIS:
            values = accs[name][phi]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            # mean ± std (the 95% interval of the mean is 1.96 std / sqrt(S), in the JSON)
            row[f"φ={phi:+.1f}"] = f"{statistics.mean(values):.3f}±{sd:.3f}"
            row[f"ci95_{phi:+.1f}"] = round(1.96 * sd / math.sqrt(len(values)), 4)
        row["train_s"] = round(seconds[name], 1)
        rows.append(row)
    for phi in PHIS:  # diagnostics rows reuse the φ columns: router mass low/high/id (mean of the 2 homophily bins)
        rows.append({"model": f"castor routes φ={phi:+.1f}", "avg_rank": "",
                     f"φ={phi:+.1f}": "/".join(f"{v:.2f}" for v in masses[phi].nanmean(0).tolist())})
    diagnostics = {
        str(phi): {"edge_homophily": round(homophily[phi], 3),
                   "route_mass_local_homophily_below_0.5": [round(v, 3) for v in masses[phi][0].tolist()],
                   "route_mass_local_homophily_at_least_0.5": [round(v, 3) for v in masses[phi][1].tolist()],
                   "beta_per_hop": [round(b, 3) for b in betas[phi]]}
        for phi in PHIS
    }

    high_mass = {phi: float(torch.nanmean(masses[phi][:, 1])) for phi in PHIS}
    worst_castor_rank = max(ranks[CASTOR].values())
    best_other = min(avg_rank[n] for n in main if n != CASTOR)
    claims = [
        legacy_claim("Castor in the top 3 at every φ (worst per-φ rank)", worst_castor_rank, 3.0, "<="),
        legacy_claim("Castor has the best average rank (Castor minus best baseline)", avg_rank[CASTOR] - best_other,
              0.0, "<"),
        legacy_claim("no-router ablation ranks worse than Castor (rank difference)",
              avg_rank["castor_no_router"] - avg_rank[CASTOR], 0.0, ">"),
        legacy_claim("no-momentum ablation ranks worse than Castor (rank difference)",
              avg_rank["castor_no_momentum"] - avg_rank[CASTOR], 0.0, ">"),
        legacy_claim("router high-pass mass grows as homophily falls (mass φ=-1 minus φ=+1)",
              high_mass[-1.0] - high_mass[1.0], 0.0, ">"),
    ]
    notes = {"num_nodes": num_nodes, "num_features": num_features, "splits": num_splits, "epochs": epochs,
             "train_fraction": TRAIN_FRACTION, "val_fraction": VAL_FRACTION,
             "high_pass_mass": {str(p): round(v, 4) for p, v in high_mass.items()}, "castor_diagnostics": diagnostics}
    return BenchmarkResult(rows, claims, notes)


def sweep(datasets: list[str], root: str | None = None, models: list[str] | None = None, num_splits: int = 10,
          epochs: int = 500, seed: int = 0, train_fraction: float = 0.6, val_fraction: float = 0.2,
          ) -> list[dict[str, Any]]:
    """Every model × dataset × split with the benchmark's recipe; rows sorted by average rank (printed too).

    Args:
        datasets: :class:`~lit_lowrank.datamodules.GraphDataModule` names (``cora``, ``chameleon``,
            ``roman-empire``, ..., or the embedded ``csbm``, ``karate``, ``drosophila``).
        root: the local PyG data folder for real datasets.
        models: names from :func:`model_factories` (default: all seventeen).

    .. code-block:: bash

        python -m lit_lowrank.benchmarks.castor --datasets cora,citeseer,chameleon,texas --root data/pyg
    """
    from lit_lowrank.datamodules.graphs import GraphDataModule

    start = time.perf_counter()
    accs: dict[str, dict[str, float]] = {}
    for dataset in datasets:
        data = GraphDataModule(dataset, root=root, num_splits=num_splits, train_fraction=train_fraction,
                               val_fraction=val_fraction, seed=seed).data
        factories = model_factories(data.num_nodes)
        names = models or list(factories)
        unknown = [n for n in names if n not in factories]
        if unknown:
            raise ValueError(f"models: unknown {unknown}; expected among {list(factories)}")
        for name in names:
            results = []
            for split in range(num_splits):
                torch.manual_seed(seed + split)
                model = factories[name](data.num_features, int(data.y.max()) + 1)
                results.append(train_and_test(model, data, split, epochs))
            accs.setdefault(name, {})[dataset] = statistics.mean(results)
            accs[name][f"{dataset}_std"] = statistics.stdev(results) if num_splits > 1 else 0.0
    names = list(accs)
    avg_rank, _ = _mean_ranks(accs, names, tuple(datasets))
    rows = [{"model": n, "avg_rank": round(avg_rank[n], 2),
             **{d: f"{accs[n][d]:.3f}±{accs[n][d + '_std']:.3f}" for d in datasets}}
            for n in sorted(names, key=avg_rank.__getitem__)]
    from lit_lowrank.benchmarks.harness import print_result

    print_result({"benchmark": "castor sweep", "quick": False, "device": "cpu", "rows": rows,
                  "seconds": round(time.perf_counter() - start, 1),
                  "claims": []})
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Castor and its baselines over datasets x splits (average rank).")
    parser.add_argument("--datasets", required=True, help="comma-separated GraphDataModule names")
    parser.add_argument("--root", default=None, help="local PyG data folder")
    parser.add_argument("--models", default=None, help="comma-separated model names (default: all)")
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sweep(args.datasets.split(","), args.root, args.models.split(",") if args.models else None, args.splits,
          args.epochs, args.seed)
