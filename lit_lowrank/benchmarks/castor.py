"""Castor vs tuned node-classification baselines on graphs whose homophily varies across nodes.

**Graphs** (one per name, seeded by ``seed``; each with ``S`` random stratified splits; quick: the two
routing graphs ``periphery`` and ``regions``, full: all):

- ``periphery``: :func:`~lit_lowrank.datamodules.csbm.periphery_sbm` (600 nodes, two classes): a
  homophilous core (homophily 0.9 inside it) and a periphery (a third of the nodes) whose every edge goes
  to a core node of the other class. Every power of ``Â`` reads the other class at a periphery node and
  the own class at a core node, so no global filter serves both regions; a per-node operator (low-pass
  in the core, high-pass in the periphery) reads both.

- ``mixed`` (full run): :func:`~lit_lowrank.datamodules.csbm.mixed_csbm` with regimes
  ``φ = (−0.75, +0.75)`` (600 nodes, two classes): half the nodes live in a heterophilous, half in a
  homophilous neighbourhood; the regime is not in the features. ``Â²`` is low-pass in both regimes, so
  one global filter serves both (oracle − ChebNetII +0.010, CI −0.000 … +0.020, on 10 splits).
- ``regions``: :func:`~lit_lowrank.datamodules.csbm.regime_sbm` (600 nodes, **three** classes,
  homophily 0.05 in one region and 0.9 in the other). With two classes ``Â²`` is low-pass in both
  ``±φ`` regimes, so one global filter serves both; with three the heterophilous region's label
  signal sits at ``λ ≈ −½`` and the regions need different *operators*.
- ``csbm-0.5``, ``csbm+0.5`` (400 nodes; full: 2,000 and also ``φ ∈ {−1, 0, +1}`` and a
  three-regime mixture): the GPRGNN cSBM protocol, sparse splits (``20/20/60`` train/val/test).
- ``drosophila`` (the larva mushroom-body connectome graspologic ships, 209 neurons, 4 cell
  types; ``60/20/20``). KarateClub is not used: 34 nodes give a 7-node test split (accuracy in
  steps of 0.143, coarser than every effect sought here).

**Models**: Castor, its ablations ``castor_no_router`` (``router="global"``) and
``castor_no_momentum``, an A/A copy ``castor_aa`` (Castor with other initial weights and dropout
draws — the control), ``castor_oracle`` on the graphs with known regimes (:data:`ROUTING_GRAPHS`:
one learned mix per hop *per true regime*, the upper bound on what routing by regime can add),
and the baselines (quick: :data:`QUICK_BASELINES`, the two strongest global filters; full: all
fourteen and the no-momentum ablation), each with the architecture of its paper (:data:`PUBLISHED`).
Quick mode is sized to what 2 shared CPU cores finish: ~250 trainings.

**Tuning, the same for every model**: the grid (quick: lr 0.05 × weight decay 5e-4;
full: lr ∈ {0.002, 0.01, 0.05} × {0, 5e-4, 5e-3}) plus the model's published optimiser setting;
Castor's router temperature ``τ ∈ {0.05, 1}`` is on the grid as the baselines' propagation
learning rates are (under Adam ``τ`` scales the router's step). Every configuration runs on every
split (quick: 10, full: 20) for the same epoch budget (quick 64, full 400), test accuracy taken at
the epoch of best validation accuracy; the configuration is chosen per graph by validation
accuracy **pooled over all splits** (never test). Castor's no-momentum ablation and A/A copy reuse
Castor's chosen setting; the no-router ablation and the oracle are tuned on Castor's grid.
Castor's own "published" setting is its default (lr 0.01, weight decay 5e-4, ``τ = 0.05``).
Split ``s`` seeds every model alike (``seed + s``): comparisons are paired over splits.

**Premises**: oracle routes beat the best global filter (the model with the best validation
accuracy among the no-router ablation and every global-filter baseline) on each routing graph,
paired over splits, and pooled over the routing graphs (``routing_headroom``); Castor's momentum
moves off zero. **Claims**: best average rank and (with more than two baselines) top-3 on every
graph (paired bootstrap over splits); routing beats the no-router ablation on each routing graph;
the router puts more high-pass mass on heterophilous nodes; (full) momentum beats the no-momentum
ablation. **Competitor**
of the routing claims: the best global-filter baseline in Castor's place. **Controls**: Castor vs
its A/A copy; the router-mass gap with homophily permuted; (full) a graph-blind MLP above the
no-router ablation.

Training runs in :func:`~lit_lowrank.benchmarks._workers.map_jobs` workers (one thread each):
the graphs are small, so the benchmark is a few thousand independent full-batch trainings.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data

from lit_lowrank.benchmarks._workers import map_jobs
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, premise, statistic_claim
from lit_lowrank.datamodules.csbm import contextual_sbm, edge_homophily, mixed_csbm, periphery_sbm, regime_sbm
from lit_lowrank.datamodules.graphs import split_masks
from lit_lowrank.models.castor import Castor
from lit_lowrank.ops.castor import router_mass_by_homophily
from lit_lowrank.ops.graph_propagation import local_homophily

PHIS = (-1.0, -0.5, 0.0, 0.5, 1.0)
HIDDEN, DROPOUT = 64, 0.5
CASTOR = "castor"
NO_ROUTER, NO_MOMENTUM, ORACLE = "castor_no_router", "castor_no_momentum", "castor_oracle"
ABLATIONS = (NO_ROUTER, NO_MOMENTUM)
AA = "castor_aa"
#: Castor's models tuned on Castor's grid (τ included); the others of the family reuse Castor's setting.
CASTOR_TUNED = (CASTOR, NO_ROUTER, ORACLE)
TAUS = (0.05, 1.0)
QUICK_GRAPHS = ("periphery", "regions")
FULL_GRAPHS = ("periphery", "mixed", "regions", "mixed3", "csbm-1", "csbm-0.5", "csbm+0", "csbm+0.5", "csbm+1", "drosophila")
#: Graphs whose nodes' true regimes are known: the oracle router runs there, and the routing claims.
ROUTING_GRAPHS = ("periphery", "mixed", "regions")
#: ``--quick`` trains Castor, its no-router ablation, its A/A copy, the oracle and these two
#: baselines — the strongest global filters of the fourteen on cSBMs — on the two routing graphs;
#: the full run trains all fourteen, the no-momentum ablation and every graph.
QUICK_BASELINES = ("gprgnn", "chebnetii")
ALL_BASELINES = ("mlp", "gcn", "gat", "appnp", "sgc", "chebnet", "gcnii", "fagcn", "mixhop", "linkx", "gprgnn",
                 "bernnet", "chebnetii", "acmgcn")
#: Each model's published optimiser setting and architecture knobs (the papers' / authors' code
#: defaults for their main experiments). ``prop_*`` apply to :data:`PROPAGATION` parameters.
PUBLISHED: dict[str, dict[str, Any]] = {
    CASTOR: {"lr": 0.01, "weight_decay": 5e-4, "model": {"tau": 0.05}},
    "mlp": {"lr": 0.01, "weight_decay": 5e-4},
    "gcn": {"lr": 0.01, "weight_decay": 5e-4},                                        # Kipf & Welling 2017
    "gat": {"lr": 0.005, "weight_decay": 5e-4, "model": {"dropout": 0.6}},            # Veličković et al. 2018
    "appnp": {"lr": 0.01, "weight_decay": 5e-3, "model": {"K": 10, "alpha": 0.1}},    # Klicpera et al. 2019
    "sgc": {"lr": 0.2, "weight_decay": 5e-5},                                         # Wu et al. 2019
    "chebnet": {"lr": 0.01, "weight_decay": 5e-4},                                    # Defferrard et al. 2016
    "gcnii": {"lr": 0.01, "weight_decay": 5e-4, "prop_lr": 0.01, "prop_weight_decay": 0.01,
              "model": {"dropout": 0.6, "alpha": 0.1, "theta": 0.5}},                 # Chen et al. 2020
    "fagcn": {"lr": 0.01, "weight_decay": 1e-3, "model": {"eps": 0.3}},               # Bo et al. 2021
    "mixhop": {"lr": 0.01, "weight_decay": 5e-4},                                     # Abu-El-Haija et al. 2019
    "linkx": {"lr": 0.01, "weight_decay": 1e-3},                                      # Lim et al. 2021
    "gprgnn": {"lr": 0.05, "weight_decay": 5e-4, "prop_lr": 0.05, "prop_weight_decay": 0.0,
               "model": {"K": 10, "alpha": 0.1, "dprate": 0.5}},                      # Chien et al. 2021
    "bernnet": {"lr": 0.01, "weight_decay": 5e-4, "prop_lr": 0.01, "prop_weight_decay": 0.0,
                "model": {"K": 10, "dprate": 0.5}},                                   # He et al. 2021
    "chebnetii": {"lr": 0.01, "weight_decay": 5e-4, "prop_lr": 0.01, "prop_weight_decay": 5e-4,
                  "model": {"K": 10, "dprate": 0.5}},                                 # He et al. 2022
    "acmgcn": {"lr": 0.01, "weight_decay": 5e-4},                                     # Luan et al. 2022
}
#: Parameter-name prefixes of each model's propagation coefficients.
PROPAGATION: dict[str, tuple[str, ...]] = {
    CASTOR: ("router_", "beta_raw", "gamma"), "gprgnn": ("gamma",), "bernnet": ("theta",),
    "chebnetii": ("gamma",), "gcnii": ("convs.",),
}
#: Baselines that apply one filter to every node (a polynomial / fixed propagation of the graph): the
#: candidates for "the best global filter" of the oracle premise. LINKX, FAGCN, GAT, MixHop and
#: ACM-GCN adapt per node or per edge; MLP ignores the graph.
GLOBAL_FILTERS = ("gcn", "appnp", "sgc", "chebnet", "gcnii", "gprgnn", "bernnet", "chebnetii")


def _spec(name: str) -> str:
    """The model whose published setting and propagation parameters ``name`` uses."""
    return CASTOR if name.startswith(CASTOR) else name


def model_factories(num_nodes: int, groups: torch.Tensor | None = None) -> dict[str, Callable[..., nn.Module]]:
    """name -> ``fn(in_channels, out_channels, **model_kwargs)``: Castor, ablations, A/A, the oracle (when the
    nodes' true ``groups`` are given) and the baselines."""
    import torch_geometric.nn.models as pyg

    from lit_lowrank.models import graph_baselines as ours

    def castor(**fixed: Any) -> Callable[..., nn.Module]:
        return lambda i, o, **kw: Castor(i, o, hidden_channels=HIDDEN, **{"dropout": DROPOUT, **fixed, **kw})

    def with_defaults(cls: Callable[..., nn.Module], **defaults: Any) -> Callable[..., nn.Module]:
        return lambda i, o, **kw: cls(i, o, **{**defaults, **kw})

    common = {"hidden_channels": HIDDEN, "dropout": DROPOUT}
    oracle = {} if groups is None else {ORACLE: castor(router="oracle", groups=groups)}
    return {
        CASTOR: castor(),
        NO_ROUTER: castor(router="global"),
        NO_MOMENTUM: castor(momentum="none"),
        AA: castor(),
        **oracle,
        "mlp": lambda i, o, **kw: pyg.MLP([i, HIDDEN, o], dropout=kw.get("dropout", DROPOUT), norm=None),
        "gcn": lambda i, o, **kw: pyg.GCN(i, HIDDEN, 2, o, dropout=kw.get("dropout", DROPOUT)),
        "gat": lambda i, o, **kw: pyg.GAT(i, HIDDEN, 2, o, dropout=kw.get("dropout", DROPOUT), heads=8),
        "appnp": with_defaults(ours.APPNPNet, **common),
        "sgc": with_defaults(ours.SGCNet, dropout=0.0),
        "chebnet": with_defaults(ours.ChebNet, **common),
        "gcnii": with_defaults(ours.GCNIINet, num_layers=8, **common),
        "fagcn": with_defaults(ours.FAGCNNet, **common),
        "mixhop": with_defaults(ours.MixHopNet, hidden_channels=66, dropout=DROPOUT),
        "linkx": lambda i, o, **kw: pyg.LINKX(num_nodes, i, HIDDEN, o, num_layers=1,
                                              dropout=kw.get("dropout", DROPOUT)),
        "gprgnn": with_defaults(ours.GPRGNN, **common),
        "bernnet": with_defaults(ours.BernNet, **common),
        "chebnetii": with_defaults(ours.ChebNetII, **common),
        "acmgcn": with_defaults(ours.ACMGCN, **common),
    }


def tuning_grid(name: str, quick: bool) -> list[dict[str, Any]]:
    """The configurations tried for model ``name``: the shared grid plus its published setting.

    Castor's family (:data:`CASTOR_TUNED`) also tries every router temperature of :data:`TAUS`.
    """
    published = PUBLISHED[_spec(name)]
    lrs, decays = ((0.05,), (5e-4,)) if quick else ((0.002, 0.01, 0.05), (0.0, 5e-4, 5e-3))
    models = ([{**published.get("model", {}), "tau": tau} for tau in TAUS] if name in CASTOR_TUNED
              else [published.get("model", {})])
    grid = [{"lr": lr, "weight_decay": wd, "prop_weight_decay": 0.0, "model": model}
            for lr, wd, model in itertools.product(lrs, decays, models)]
    grid.append({"prop_weight_decay": 0.0, **published, "model": models[0], "published": True})
    out: list[dict[str, Any]] = []
    for cfg in grid:
        if all(_setting(o) != _setting(cfg) for o in out):
            out.append(cfg)
        elif cfg.get("published"):  # the published setting is also a grid point: mark it
            for o in out:
                if _setting(o) == _setting(cfg):
                    o["published"] = True
    return out


def _setting(config: dict[str, Any]) -> dict[str, Any]:
    """What a configuration trains with (an absent ``prop_lr`` is ``lr``): equal settings are tried once."""
    return {"prop_lr": config["lr"], **{k: v for k, v in config.items() if k != "published"}}


def make_optimizer(model: nn.Module, name: str, config: dict[str, Any]) -> torch.optim.Optimizer:
    """Adam with the propagation coefficients in their own group (own lr / weight decay)."""
    prefixes = PROPAGATION.get(_spec(name), ())
    prop = [p for n, p in model.named_parameters() if n.startswith(prefixes)] if prefixes else []
    ids = {id(p) for p in prop}
    rest = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": rest, "lr": config["lr"], "weight_decay": config["weight_decay"]}]
    if prop:
        groups.append({"params": prop, "lr": config.get("prop_lr", config["lr"]),
                       "weight_decay": config.get("prop_weight_decay", 0.0)})
    return torch.optim.Adam(groups)


def train_and_test(model: nn.Module, data: Data, split: int, epochs: int, optimizer: torch.optim.Optimizer | None = None,
                   eval_every: int = 5) -> tuple[float, float]:
    """Full-batch training; ``(best validation accuracy, test accuracy at that epoch)``."""
    train, val, test = data.train_mask[:, split], data.val_mask[:, split], data.test_mask[:, split]
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
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
    return best_val, best_test


@functools.lru_cache(maxsize=None)
def build_graph(name: str, quick: bool, seed: int, num_splits: int, root: str | None = None) -> Data:
    """Graph ``name`` (see the module docstring; any other name is a
    :class:`~lit_lowrank.datamodules.GraphDataModule` dataset under ``root``) with ``num_splits`` split masks.
    Graphs with known regimes carry ``regime``."""
    num_nodes, num_features = (400, 100) if quick else (2000, 500)
    fractions = (0.2, 0.2)
    if name == "mixed":  # 600 nodes in quick mode: 300 per regime for the per-node statistics
        data = mixed_csbm(max(num_nodes, 600), num_features, phis=(-0.75, 0.75), seed=seed)
    elif name == "periphery":
        data = periphery_sbm(max(num_nodes, 600), num_features, seed=seed)
    elif name == "regions":
        data = regime_sbm(max(num_nodes, 600), num_features, num_classes=3, homophily=(0.05, 0.9), seed=seed)
    elif name == "mixed3":
        data = mixed_csbm(num_nodes, num_features, phis=(-0.9, 0.0, 0.9), seed=seed)
    elif name.startswith("csbm") and name[4:] not in ("", "-"):
        data = contextual_sbm(num_nodes, num_features, phi=float(name[4:]), seed=seed)
    else:
        from lit_lowrank.datamodules.graphs import GraphDataModule

        data = GraphDataModule(name, root=root, num_splits=1, seed=seed).data
        data = Data(x=data.x, edge_index=data.edge_index, y=data.y)
        fractions = (0.6, 0.2)
    data.train_mask, data.val_mask, data.test_mask = split_masks(data.y, num_splits, *fractions, seed)
    return data


def _job(graph: str, name: str, config: dict[str, Any], split: int, quick: bool, seed: int, num_splits: int,
         epochs: int, root: str | None = None) -> dict[str, Any]:
    """One training of model ``name`` with ``config`` on ``split`` of ``graph``; Castor adds its router statistics."""
    torch.set_num_threads(1)
    data = build_graph(graph, quick, seed, num_splits, root)
    torch.manual_seed(seed + split + (1000 if name == AA else 0))
    factories = model_factories(data.num_nodes, getattr(data, "regime", None))
    model = factories[name](data.num_features, int(data.y.max()) + 1, **config.get("model", {}))
    val, test = train_and_test(model, data, split, epochs, make_optimizer(model, name, config))
    out: dict[str, Any] = {"graph": graph, "model": name, "split": split, "val_acc": val, "test_acc": test}
    if name == CASTOR:
        model.eval()
        with torch.no_grad():
            model(data.x, data.edge_index)
        node_hom = local_homophily(data.edge_index, data.y)
        mass = router_mass_by_homophily(model.last_routes, node_hom, bins=2)
        perm = torch.randperm(node_hom.numel(), generator=torch.Generator().manual_seed(seed + split))
        shuffled = router_mass_by_homophily(model.last_routes, node_hom[perm], bins=2)
        out.update({"high_mass_heterophilous": float(mass[0, 1]), "high_mass_homophilous": float(mass[1, 1]),
                    "high_mass_heterophilous_permuted": float(shuffled[0, 1]),
                    "high_mass_homophilous_permuted": float(shuffled[1, 1]),
                    "betas": [round(float(b), 3) for b in model.betas().detach()]})
    return out


def _mean_ranks(acc: dict[str, dict[Any, float]], names: list[str],
                settings: Sequence[Any] = PHIS) -> tuple[dict[str, float], dict[str, dict]]:
    """Average over settings (graphs) of each model's rank (1 = best, ties share the mean rank)."""
    ranks: dict[str, dict[Any, float]] = {n: {} for n in names}
    for phi in settings:
        values = sorted((acc[n][phi] for n in names), reverse=True)
        for n in names:
            better = sum(v > acc[n][phi] for v in values)
            tied = sum(v == acc[n][phi] for v in values)
            ranks[n][phi] = better + (tied + 1) / 2
    return {n: statistics.mean(ranks[n].values()) for n in names}, ranks


def models_for(graph: str, models: Sequence[str]) -> list[str]:
    """The models run on ``graph``: the oracle only where the true regimes are known."""
    return [m for m in models if m != ORACLE or graph in ROUTING_GRAPHS]


def tune_and_evaluate(graphs: Sequence[str], models: Sequence[str], quick: bool, seed: int, num_splits: int,
                      epochs: int, root: str | None = None, grid_quick: bool | None = None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, list[float]]]:
    """Run every configuration of every tuned model on every split; keep, per graph and model, the
    configuration with the best validation accuracy pooled over the splits.

    Castor's no-momentum ablation and A/A copy then run Castor's chosen setting. Returns the chosen
    configurations' per-(graph, model, split) rows, the chosen configurations, and every tried
    configuration's mean validation accuracy (``"graph/model": [...]`` in grid order).
    """
    grid_quick = quick if grid_quick is None else grid_quick
    reuse = (NO_MOMENTUM, AA)
    tried = {(g, m): tuning_grid(m, grid_quick) for g in graphs for m in models_for(g, models) if m not in reuse}
    jobs = [(g, m, cfg, s, quick, seed, num_splits, epochs, root) for (g, m), grid in tried.items() for cfg in grid
            for s in range(num_splits)]
    results = map_jobs(_job, jobs)
    by_config: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for job, result in zip(jobs, results):
        g, m, cfg = job[:3]
        by_config.setdefault((g, m, tried[(g, m)].index(cfg)), []).append(result)
    val_means = {f"{g}/{m}": [round(statistics.fmean(r["val_acc"] for r in by_config[(g, m, i)]), 4)
                              for i in range(len(grid))] for (g, m), grid in tried.items()}
    chosen = {key: grid[max(range(len(grid)), key=val_means[f"{key[0]}/{key[1]}"].__getitem__)]
              for key, grid in tried.items()}
    rows = [r for (g, m), cfg in chosen.items() for r in by_config[(g, m, tried[(g, m)].index(cfg))]]
    again = [(g, m, chosen[(g, CASTOR)], s, quick, seed, num_splits, epochs, root) for g in graphs for m in models
             if m in reuse for s in range(num_splits)]
    rows += map_jobs(_job, again)
    chosen.update({(g, m): chosen[(g, CASTOR)] for g in graphs for m in models if m in reuse})
    settings = {f"{g}/{m}": dict(cfg) for (g, m), cfg in chosen.items()}
    return sorted(rows, key=lambda r: (r["graph"], r["model"], r["split"])), settings, val_means


def best_global_filter(settings_val: dict[str, list[float]], graph: str, models: Sequence[str]) -> str:
    """The global filter (no-router ablation or a :data:`GLOBAL_FILTERS` baseline) with the best pooled
    validation accuracy on ``graph`` — chosen on validation, never test."""
    candidates = [m for m in models if m == NO_ROUTER or m in GLOBAL_FILTERS]
    return max(candidates, key=lambda m: max(settings_val[f"{graph}/{m}"]))


def claims_and_controls(rows: list[dict[str, Any]], graphs: Sequence[str], baselines: Sequence[str],
                        num_splits: int, quick: bool, best_global: dict[str, str]
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(claims, controls, premises, competitors)`` from the rows (paired over splits; ranks by paired
    bootstrap over splits). ``best_global``: per routing graph, the global filter chosen on validation."""
    main = [CASTOR, *baselines]
    acc = {(m, g): np.array([r["test_acc"] for r in rows if r["model"] == m and r["graph"] == g])
           for m in {r["model"] for r in rows} for g in graphs}
    routing = [g for g in ROUTING_GRAPHS if g in graphs]

    def split_values(model: str, graph: str) -> list[float]:
        return [float(v) for v in acc[(model, graph)]]

    def ranks_on(idx: np.ndarray) -> tuple[dict[str, float], dict[str, dict]]:
        return _mean_ranks({m: {g: float(acc[(m, g)][idx].mean()) for g in graphs} for m in main}, main, graphs)

    def margin(idx: np.ndarray) -> float:
        avg, _ = ranks_on(idx)
        return min(avg[m] for m in baselines) - avg[CASTOR]

    def worst(idx: np.ndarray) -> float:
        return max(ranks_on(idx)[1][CASTOR].values())

    splits = list(range(num_splits))
    premises = []
    for g in routing:
        premises.append(premise(
            f"oracle_routes_{g}", f"{g}: oracle routes (one learned mix per true regime) beat the best global filter "
            f"({best_global[g]}, chosen on validation)",
            needs="per-node routing has headroom over one filter shared by every node",
            quantity=f"test acc(Castor, oracle routes) - test acc({best_global[g]}), {g} graph, fraction",
            values=split_values(ORACLE, g), baseline=split_values(best_global[g], g), units=splits, unit="split",
            target=0.0, op=">"))
    if routing:
        pooled = [statistics.fmean(float(acc[(ORACLE, g)][s] - acc[(best_global[g], g)][s]) for g in routing)
                  for s in splits]
        premises.append(premise(
            "routing_headroom", f"oracle routes beat the best global filter, mean over the routing graphs {routing}",
            needs="per-node routing has headroom somewhere among the graphs", values=pooled, units=splits,
            unit="split", quantity="test acc(oracle) - test acc(best global filter), mean over routing graphs, fraction",
            target=0.0, op=">"))
    betas = [statistics.fmean(abs(b) for r in rows if r["model"] == CASTOR and r["split"] == s for b in r["betas"][1:])
             for s in splits]
    momentum = any(r["model"] == NO_MOMENTUM for r in rows)
    premises.append(premise("momentum_moves", "Castor's learned momentum moves off zero (mean |β_k|, k ≥ 1)",
                            needs="momentum can only matter where β is not ~0", quantity="mean |β_k| over hops and graphs",
                            values=betas, units=splits, unit="split", target=0.05, op=">"))
    requires = "routing_headroom" if routing else None
    paper = ("a single Castor instance ranks top-three on every dataset and achieves an average rank of 2.07, "
             "more than 3.5 ranks ahead of the next-best of fourteen baselines")
    n_base = len(baselines)
    claims = [
        statistic_claim(f"Castor has the best average rank among Castor and {n_base} tuned baselines",
                        paper=paper, quantity=f"avg rank(best baseline) - avg rank(Castor) over {len(graphs)} graphs, "
                                          "ranks (paired bootstrap over splits)",
                        n_units=num_splits, statistic=margin, target=0.0, op=">", unit="split", requires=requires),
    ]
    if len(main) > 3:  # among three models "top-3" cannot fail
        claims.append(statistic_claim("Castor ranks top-3 on every graph", paper=paper,
                                      quantity="worst per-graph rank of Castor (paired bootstrap over splits)",
                                      n_units=num_splits, statistic=worst, target=3.0, op="<=", unit="split",
                                      requires=requires))
    if not quick:
        claims.append(statistic_claim("Castor is more than 3.5 ranks ahead of the next-best baseline", paper=paper,
                                      quantity="avg rank(best baseline) - avg rank(Castor), ranks",
                                      n_units=num_splits, statistic=margin, target=3.5, op=">", unit="split",
                                      requires=requires))
    competitors, controls = [], []
    routing_paper = ("a router ... emits per-node mixing weights over low-pass, high-pass and identity (within a "
                     "graph, different nodes benefit from different mixtures)")
    for g in routing:
        claims.append(claim(
            f"{g}: per-node routing beats the no-router ablation", paper=routing_paper,
            quantity=f"test acc(Castor) - test acc(no-router ablation), {g} graph, fraction",
            values=split_values(CASTOR, g), baseline=split_values(NO_ROUTER, g), units=splits, unit="split",
            target=0.0, op=">", name=f"routing_{g}", requires=f"oracle_routes_{g}"))
        rival = best_global[g] if best_global[g] != NO_ROUTER else "chebnetii"
        competitors.append(competitor(
            f"routing_{g}", f"{g}: the best global-filter baseline ({rival}) beats the no-router ablation",
            competitor=f"{rival} (a global filter, no routing) in Castor's place",
            quantity=f"test acc({rival}) - test acc(no-router ablation), {g} graph, fraction",
            values=split_values(rival, g), baseline=split_values(NO_ROUTER, g), units=splits, unit="split",
            target=0.0, op=">"))
        controls.append(claim(
            f"A/A: Castor beats a copy of itself (other initial weights) on the {g} graph",
            paper="(control of the routing claim's paired test)",
            quantity=f"test acc(Castor) - test acc(Castor, other init), {g} graph, fraction",
            values=split_values(CASTOR, g), baseline=split_values(AA, g), units=splits, unit="split",
            target=0.0, op=">"))
    mass_paper = "different nodes benefit from different mixtures of low-pass smoothing, high-pass contrast and pass-through"
    for g in routing:
        castor_rows = sorted((r for r in rows if r["graph"] == g and r["model"] == CASTOR), key=lambda r: r["split"])
        mass_quantity = (f"router high-pass mass on nodes with local homophily < 0.5 minus on nodes >= 0.5, {g} graph, "
                         "mean over hops")
        claims.append(claim(f"{g}: the router sends more high-pass mass to heterophilous nodes than to homophilous ones",
                            paper=mass_paper, quantity=mass_quantity,
                            values=[r["high_mass_heterophilous"] for r in castor_rows],
                            baseline=[r["high_mass_homophilous"] for r in castor_rows], units=splits, unit="split",
                            target=0.0, op=">", requires=f"oracle_routes_{g}"))
        controls.append(claim(
            f"{g}: the router-mass gap with node homophily permuted across nodes",
            paper="(control of the router-mass claim: the statistic must not see structure in shuffled labels)",
            quantity=mass_quantity + ", homophily permuted",
            values=[r["high_mass_heterophilous_permuted"] for r in castor_rows],
            baseline=[r["high_mass_homophilous_permuted"] for r in castor_rows], units=splits, unit="split",
            target=0.0, op=">"))
    if momentum:  # the full run's ablation
        gain = [statistics.fmean(float(acc[(CASTOR, g)][s] - acc[(NO_MOMENTUM, g)][s]) for g in graphs)
                for s in splits]
        claims.append(claim(
            "momentum beats the no-momentum ablation (mean over graphs)",
            paper="a learnable per-hop coefficient determines how much of the most recent change is carried forward",
            quantity="test acc(Castor) - test acc(no-momentum ablation), mean over graphs, fraction",
            values=gain, units=splits, unit="split", target=0.0, op=">", requires="momentum_moves"))
    if routing and any(r["model"] == "mlp" for r in rows):
        # sensitivity: the routing claim's paired test on a gap known to be negative (a graph-blind MLP against the
        # no-router ablation); it must fail, or the splits cannot resolve such a gap
        g = routing[0]
        controls.append(claim(
            f"a graph-blind MLP beats the no-router ablation on the {g} graph",
            paper="(sensitivity control of the routing claim's paired test)",
            quantity=f"test acc(MLP) - test acc(no-router ablation), {g} graph, fraction",
            values=split_values("mlp", g), baseline=split_values(NO_ROUTER, g), units=splits, unit="split",
            target=0.0, op=">"))
    return claims, controls, premises, competitors


def summary_rows(rows: list[dict[str, Any]], graphs: Sequence[str], models: Sequence[str],
                 ranked: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, dict]]:
    """Per model: average rank (among ``ranked``) and ``mean±std`` test accuracy per graph."""
    acc = {(m, g): np.array([r["test_acc"] for r in rows if r["model"] == m and r["graph"] == g])
           for m in models for g in graphs}
    avg_rank, per_graph = _mean_ranks({m: {g: float(acc[(m, g)].mean()) for g in graphs} for m in ranked},
                                      list(ranked), graphs)
    out = []
    for m in sorted(models, key=lambda m: avg_rank.get(m, 99.0)):
        row: dict[str, Any] = {"model": m, "avg_rank": round(avg_rank[m], 2) if m in avg_rank else ""}
        for g in graphs:
            a = acc[(m, g)]
            row[g] = f"{a.mean():.3f}±{a.std(ddof=1):.3f}" if a.size > 1 else ""
        out.append(row)
    return out, per_graph


def run(quick: bool, seed: int) -> BenchmarkResult:
    graphs = QUICK_GRAPHS if quick else FULL_GRAPHS
    baselines = QUICK_BASELINES if quick else ALL_BASELINES
    models = [CASTOR, NO_ROUTER, AA, ORACLE, *baselines] + ([] if quick else [NO_MOMENTUM])
    num_splits, epochs = (10, 64) if quick else (20, 400)
    start = time.perf_counter()
    rows, settings, val_means = tune_and_evaluate(graphs, models, quick, seed, num_splits, epochs)
    seconds = time.perf_counter() - start
    routing = [g for g in ROUTING_GRAPHS if g in graphs]
    best_global = {g: best_global_filter(val_means, g, models) for g in routing}
    claims, controls, premises, competitors = claims_and_controls(rows, graphs, baselines, num_splits, quick,
                                                                  best_global)
    summary, per_graph = summary_rows(rows, graphs, models, [CASTOR, *baselines])
    aa_noise = {}
    for g in routing:
        diff = np.array([a["test_acc"] - b["test_acc"] for a, b in zip(
            sorted((r for r in rows if r["graph"] == g and r["model"] == CASTOR), key=lambda r: r["split"]),
            sorted((r for r in rows if r["graph"] == g and r["model"] == AA), key=lambda r: r["split"]))])
        aa_noise[g] = {"sd_per_split": round(float(diff.std(ddof=1)), 4),
                       "ci_half_width": round(float(1.96 * diff.std(ddof=1) / np.sqrt(diff.size)), 4)}
    notes = {
        "graphs": list(graphs), "splits": num_splits, "epochs": epochs, "train_seconds": round(seconds, 1),
        "chosen_settings": settings, "validation_means_per_config": val_means, "best_global_filter": best_global,
        "aa_noise": aa_noise,
        "edge_homophily": {g: round(edge_homophily(build_graph(g, quick, seed, num_splits).edge_index,
                                                   build_graph(g, quick, seed, num_splits).y), 3) for g in graphs},
        "castor_ranks_per_graph": per_graph[CASTOR],
        "castor_betas": {g: [r["betas"] for r in rows if r["graph"] == g and r["model"] == CASTOR][:3] for g in graphs},
    }
    return BenchmarkResult(rows, claims, controls, notes=notes, summary=summary, premises=premises,
                           competitors=competitors)


def sweep(datasets: list[str], root: str | None = None, models: list[str] | None = None, num_splits: int = 10,
          epochs: int = 500, seed: int = 0, quick_grid: bool = False) -> list[dict[str, Any]]:
    """Every model × dataset, each configuration on every split, chosen by pooled validation accuracy;
    rows by average rank (the real-data run of the paper's 14 benchmarks, e.g. on a GPU machine).

    Args:
        datasets: :class:`~lit_lowrank.datamodules.GraphDataModule` names (``cora``, ``chameleon``,
            ``roman-empire``, ..., or the embedded ``karate``, ``drosophila``), split ``60/20/20``.
        root: the local PyG data folder for real datasets.
        models: names from :func:`model_factories` (default: Castor and all fourteen baselines).
        quick_grid: the small tuning grid (lr ∈ {0.01, 0.05}) instead of the full one.

    .. code-block:: bash

        python -m lit_lowrank.benchmarks.castor --datasets cora,citeseer,chameleon,texas --root data/pyg
    """
    start = time.perf_counter()
    names = models or [CASTOR, *ALL_BASELINES]
    unknown = [n for n in names if n not in model_factories(2) or n in (AA, ORACLE)]
    if unknown:
        raise ValueError(f"models: unknown {unknown}; expected among {[m for m in model_factories(2) if m != AA]}")
    rows, _, _ = tune_and_evaluate(datasets, names, False, seed, num_splits, epochs, root=root, grid_quick=quick_grid)
    table, _ = summary_rows(rows, datasets, names, names)
    from rich.console import Console
    from rich.table import Table

    view = Table(title=f"castor sweep ({time.perf_counter() - start:.1f} s)")
    for col in table[0]:
        view.add_column(col)
    for row in table:
        view.add_row(*(str(v) for v in row.values()))
    Console().print(view)
    return table


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Castor and its baselines over datasets x splits (average rank).")
    parser.add_argument("--datasets", required=True, help="comma-separated GraphDataModule names")
    parser.add_argument("--root", default=None, help="local PyG data folder")
    parser.add_argument("--models", default=None, help="comma-separated model names (default: all)")
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick-grid", action="store_true", help="the small tuning grid")
    args = parser.parse_args()
    sweep(args.datasets.split(","), args.root, args.models.split(",") if args.models else None, args.splits,
          args.epochs, args.seed, quick_grid=args.quick_grid)
