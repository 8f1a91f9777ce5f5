"""Server side: FedAvg, secure summation of moments, the prior bank and episodic evaluation.

Shared by the in-process federation (:func:`run_federation`), the Lightning engine
(:class:`~lit_lowrank.federated.FedLowShotModule`) and the Flower ServerApp.

.. code-block:: python

    from lit_lowrank.federated.server import run_federation, evaluate_episodes

    result = run_federation(datamodule, rounds=5, local_epochs=1)
    scores = evaluate_episodes(result.novel_features(datamodule), datamodule.novel_y, datamodule.novel_names,
                               result.bank, result.novel_keys, episodes=600)
    # scores[("prior_bank", 1)] -> per-episode macro F1 (same episodes for every method)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from lit_lowrank.federated.client import FlowClassifier, FlowClient, unflatten_moments
from lit_lowrank.federated.phrases import phrase_embeddings
from lit_lowrank.ops.fed_lowshot.episodes import (
    finetuned_head_classify,
    gaussian_classify,
    macro_f1,
    prototype_classify,
    sample_episode,
    sampled_logistic_classify,
)
from lit_lowrank.ops.fed_lowshot.niw import moments_to_gaussian, niw_map
from lit_lowrank.ops.fed_lowshot.prior_bank import PriorBank, gated_prior, global_prior, retrieve_prior
from lit_lowrank.ops.fed_lowshot.secure_sum import FRAC_BITS, decode_fixed_point, sum_masked

#: Methods of :func:`evaluate_episodes`: the prior bank and its four baselines.
METHODS: tuple[str, ...] = ("prior_bank", "prototype", "finetuned_head", "global_prior", "oracle_prior")


def fedavg(states: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """Weighted average of client state dicts (integer buffers, e.g. BatchNorm counters, from client 0).

    .. code-block:: python

        new_global = fedavg([s0, s1], [120, 80])
    """
    if not states or len(states) != len(weights):
        raise ValueError(f"fedavg: {len(states)} states and {len(weights)} weights; need the same number >= 1")
    w = torch.as_tensor(weights, dtype=torch.float64)
    w = w / w.sum()
    out = {}
    for key, ref in states[0].items():
        if ref.is_floating_point():
            out[key] = sum(float(wi) * s[key].to(torch.float64) for wi, s in zip(w, states)).to(ref.dtype)
        else:
            out[key] = ref.clone()
    return out


def secure_sum_round(clients: Sequence[FlowClient], global_state: dict[str, Tensor],
                     frac_bits: int = FRAC_BITS) -> np.ndarray:
    """The server's view of the secure moment sum: relays public keys, sums masked vectors.

    The server never holds an unmasked client vector; the masks cancel in the sum.

    .. code-block:: python

        total = secure_sum_round(clients, global_state)     # float64 flat moments
    """
    publics = {c.client_id: c.public_key() for c in clients}  # round 1: advertise keys
    masked = [c.masked_moments(global_state, publics, frac_bits) for c in clients]  # round 2
    return decode_fixed_point(sum_masked(masked), frac_bits)


def build_prior_bank(total: np.ndarray, base_names: Sequence[str], feature_dim: int,
                     encoder: str = "minilm", ridge: float = 1e-4) -> PriorBank:
    """The server's prior bank from the summed flat moments of the base classes.

    .. code-block:: python

        bank = build_prior_bank(total, dm.base_names, feature_dim=32)
    """
    counts, sums, second = unflatten_moments(total, len(base_names), feature_dim)
    means, covs = moments_to_gaussian(counts, sums, second, ridge=ridge)
    keep = counts >= 2  # a class seen fewer than twice has no covariance: it cannot be a prior
    if not bool(keep.any()):
        raise ValueError("build_prior_bank: no base class has >= 2 rows across the clients")
    keys = phrase_embeddings(list(base_names), encoder)
    return PriorBank(keys=keys[keep], means=means[keep], covs=covs[keep], counts=counts[keep],
                     labels=[n for n, k in zip(base_names, keep.tolist()) if k])


@dataclass
class FederationResult:
    """What a finished federation hands to the few-shot stage.

    Attributes:
        state: the global :class:`FlowClassifier` state dict.
        model_kwargs: the model's constructor arguments.
        bank: the prior bank (base classes).
        total_moments: the securely summed flat moments.
        history: per-round diagnostics (``train_rows``, ``val_acc``).
    """

    state: dict[str, Tensor]
    model_kwargs: dict
    bank: PriorBank
    total_moments: np.ndarray
    history: list[dict[str, float]] = field(default_factory=list)

    def model(self) -> FlowClassifier:
        model = FlowClassifier(**self.model_kwargs)
        model.load_state_dict(self.state)
        return model.eval()

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        model = self.model()
        return torch.cat([model.features(c) for c in x.split(4096)])


@torch.no_grad()
def _val_acc(state: dict[str, Tensor], model_kwargs: dict, x: Tensor, y: Tensor) -> float:
    model = FlowClassifier(**model_kwargs)
    model.load_state_dict(state)
    model.eval()
    return float((model(x).argmax(1) == y).float().mean()) if len(y) else float("nan")


def make_clients(datamodule, model_kwargs: dict, batch_size: int = 64, lr: float = 1e-3) -> list[FlowClient]:
    """One :class:`FlowClient` per Dirichlet partition of a set-up :class:`FlowsDataModule`."""
    datamodule.setup()
    return [FlowClient(k, *datamodule.client_data(k), num_classes=len(datamodule.base_names),
                       model_kwargs=model_kwargs, batch_size=batch_size, lr=lr, seed=datamodule.seed)
            for k in range(datamodule.num_clients)]


def run_federation(datamodule, rounds: int = 5, local_epochs: int = 1, encoder: str = "mlp", feature_dim: int = 32,
                   encoder_kwargs: dict | None = None, batch_size: int = 64, lr: float = 1e-3,
                   phrase_encoder: str = "minilm", seed: int = 0) -> FederationResult:
    """The in-process federation: FedAvg rounds, then one secure moment round and the bank.

    Runs the same :class:`FlowClient` / server functions as the Flower apps, sequentially in
    this process (no Ray, no network).

    .. code-block:: python

        result = run_federation(FlowsDataModule(num_clients=8, alpha=0.1), rounds=5)
    """
    datamodule.setup()
    model_kwargs = {"encoder": encoder, "num_classes": len(datamodule.base_names),
                    "in_features": datamodule.num_features, "feature_dim": feature_dim,
                    "encoder_kwargs": encoder_kwargs or {}}
    torch.manual_seed(seed)
    state = FlowClassifier(**model_kwargs).state_dict()
    clients = make_clients(datamodule, model_kwargs, batch_size, lr)
    history = []
    for r in range(rounds):
        updates = [c.fit(state, local_epochs, round_idx=r) for c in clients]
        state = fedavg([u[0] for u in updates], [u[1] for u in updates])
        history.append({"round": r, "val_acc": _val_acc(state, model_kwargs, datamodule.val_x, datamodule.val_y)})
    total = secure_sum_round(clients, state)
    bank = build_prior_bank(total, datamodule.base_names, feature_dim, phrase_encoder)
    return FederationResult(state, model_kwargs, bank, total, history)


def _adapted(support: Tensor, s_y: Tensor, ways: int, priors: list[tuple[Tensor, Tensor]], kappa: float,
             nu0: float | None) -> tuple[Tensor, Tensor]:
    mus, sigmas = zip(*(niw_map(support[s_y == j], *priors[j], kappa=kappa, nu0=nu0) for j in range(ways)))
    return torch.stack(mus), torch.stack(sigmas)


#: Settings of :func:`evaluate_episodes` a method may override (``settings={method: {...}}``).
SETTINGS: tuple[str, ...] = ("kappa", "nu0", "k", "temperature", "gate_threshold", "gate_width", "classifier",
                             "num_samples", "head_steps", "head_lr", "head_weight_decay")
CLASSIFIERS: tuple[str, ...] = ("logistic", "qda")


def _priors(method: str, cfg: dict, bank: PriorBank, novel_keys: Tensor, classes: np.ndarray,
            oracle: dict[int, tuple[Tensor, Tensor]]) -> dict[int, tuple[Tensor, Tensor]]:
    """``{class: (μ₀, Σ₀)}`` of a prior-based method under its settings ``cfg``."""
    if method == "oracle_prior":
        return {int(c): oracle[int(c)] for c in classes}
    if method == "global_prior":
        glob = global_prior(bank)
        return {int(c): glob for c in classes}
    if cfg["gate_threshold"] is None:  # the ungated prior bank: always trust the top-k retrieval
        return {int(c): retrieve_prior(bank, novel_keys[int(c)], k=cfg["k"], temperature=cfg["temperature"])[:2]
                for c in classes}
    return {int(c): gated_prior(bank, novel_keys[int(c)], k=cfg["k"], temperature=cfg["temperature"],
                                threshold=cfg["gate_threshold"], width=cfg["gate_width"])[:2] for c in classes}


def evaluate_episodes(
    novel_z: Tensor, novel_y: Tensor, novel_names: Sequence[str], bank: PriorBank, novel_keys: Tensor,
    methods: Sequence[str] = METHODS, ways: int = 5, shots: Sequence[int] = (1, 5), episodes: int = 600,
    queries: int = 15, kappa: float = 1.0, nu0: float | None = None, k: int = 2, temperature: float = 0.1,
    classifier: str = "logistic", seed: int = 0, classes: Sequence[int] | None = None,
    oracle: dict[int, tuple[Tensor, Tensor]] | None = None, gate_threshold: float | None = 0.5,
    gate_width: float = 0.05, num_samples: int = 50, head_steps: int = 100, head_lr: float = 1.0,
    head_weight_decay: float = 1e-3, settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[tuple[str, int], list[float]]:
    """Per-episode macro F1 of each method on the same ``N``-way ``K``-shot episodes.

    Args:
        novel_z: ``(M, d)`` encoder features of the novel pool.
        novel_y: ``(M,)`` novel labels (indices into ``novel_names``).
        novel_names: novel label names (oracle priors and diagnostics).
        bank: base-class prior bank.
        novel_keys: ``(len(novel_names), E)`` phrase embeddings of the novel labels.
        methods: subset of :data:`METHODS`.
        ways, shots, episodes, queries: episode shape; every shot count uses its own
            ``episodes`` episodes, shared by all methods (paired comparison).
        kappa, nu0: NIW prior strengths (:func:`~lit_lowrank.ops.niw.niw_map`).
        k, temperature: retrieval (:func:`~lit_lowrank.ops.prior_bank.retrieve_prior`).
        gate_threshold, gate_width: the similarity gate of the prior bank
            (:func:`~lit_lowrank.ops.prior_bank.gated_prior`); ``gate_threshold=None`` always trusts
            the retrieval (the ungated bank).
        classifier: the episode-specific classifier of the prior-based methods: ``"logistic"`` (a
            softmax head trained on the support plus ``num_samples`` draws per adapted Gaussian, the
            abstract's "lightweight episode-specific classifiers") or ``"qda"`` (Gaussian log-likelihood).
        head_steps, head_lr, head_weight_decay: the ``finetuned_head`` baseline's training.
        seed: episode sampling seed.
        classes: the candidate classes of the episodes (default: every class in ``novel_y``).
        oracle: the oracle prior's ``{class: (mean, cov)}`` (default: the pool's own statistics).
        settings: per-method overrides of the settings above (:data:`SETTINGS`), e.g. the values each
            method's tuning chose: ``{"prior_bank": {"kappa": 4.0}, "finetuned_head": {"head_lr": 0.3}}``.

    .. code-block:: python

        scores = evaluate_episodes(z, y, names, bank, keys, methods=("prior_bank", "prototype"), episodes=100)
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"evaluate_episodes: unknown methods {unknown}, expected among {METHODS}")
    defaults = {"kappa": kappa, "nu0": nu0, "k": k, "temperature": temperature, "gate_threshold": gate_threshold,
                "gate_width": gate_width, "classifier": classifier, "num_samples": num_samples,
                "head_steps": head_steps, "head_lr": head_lr, "head_weight_decay": head_weight_decay}
    settings = dict(settings or {})
    for m, over in settings.items():
        bad = [key for key in over if key not in SETTINGS]
        if m not in METHODS or bad:
            raise ValueError(f"evaluate_episodes: `settings`[{m!r}] = {dict(over)}: methods must be among {METHODS} "
                             f"and keys among {SETTINGS}")
    cfgs = {m: {**defaults, **settings.get(m, {})} for m in methods}
    for m, cfg in cfgs.items():
        if cfg["classifier"] not in CLASSIFIERS:
            raise ValueError(f"evaluate_episodes: `classifier`={cfg['classifier']!r} ({m}), expected one of "
                             f"{CLASSIFIERS}")
    z = novel_z.to(torch.float64)
    y = np.asarray(novel_y)
    classes = np.unique(y) if classes is None else np.asarray(classes)
    if oracle is None and "oracle_prior" in methods:
        oracle = class_statistics(z, torch.as_tensor(y), classes)
    priors = {m: _priors(m, cfgs[m], bank, novel_keys, classes, oracle or {}) for m in methods
              if m not in ("prototype", "finetuned_head")}
    out: dict[tuple[str, int], list[float]] = {(m, s): [] for m in methods for s in shots}
    for s in shots:
        rng = np.random.default_rng(seed * 7919 + s)
        for e in range(episodes):
            s_idx, s_y, q_idx, q_y, chosen = sample_episode(y, classes, ways, s, queries, rng)
            sup, qry, sy = z[s_idx], z[q_idx], torch.as_tensor(s_y)
            for m in methods:
                cfg = cfgs[m]
                if m == "prototype":
                    pred = prototype_classify(qry, sup, sy, ways)
                elif m == "finetuned_head":
                    pred = finetuned_head_classify(qry, sup, sy, ways, steps=cfg["head_steps"], lr=cfg["head_lr"],
                                                   weight_decay=cfg["head_weight_decay"], seed=e)
                else:
                    mus, sigmas = _adapted(sup, sy, ways, [priors[m][int(c)] for c in chosen], cfg["kappa"],
                                           cfg["nu0"])
                    pred = (gaussian_classify(qry, mus, sigmas) if cfg["classifier"] == "qda"
                            else sampled_logistic_classify(qry, sup, sy, mus, sigmas, num_samples=cfg["num_samples"],
                                                           seed=e))
                out[(m, s)].append(macro_f1(pred, q_y, ways))
    return out


def class_statistics(z: Tensor, y: Tensor, classes: Sequence[int] | np.ndarray) -> dict[int, tuple[Tensor, Tensor]]:
    """``{class: (mean, covariance + 1e-4 I)}`` of features ``z (N, d)`` (the oracle prior's statistics)."""
    z = z.to(torch.float64)
    ridge = 1e-4 * torch.eye(z.shape[1], dtype=torch.float64)
    out = {}
    for c in classes:
        zc = z[torch.as_tensor(np.asarray(y) == int(c))]
        out[int(c)] = (zc.mean(0), torch.cov(zc.T) + ridge)
    return out


def evaluate_client_episodes(
    result: FederationResult, datamodule, novel_keys: Tensor, methods: Sequence[str] = METHODS, ways: int = 5,
    shots: Sequence[int] = (1, 5), episodes_per_client: int = 40, queries: int = 10, seed: int = 0,
    clients: Sequence[int] | None = None, **kwargs,
) -> dict[tuple[str, int], list[float]]:
    """Per-client episodes: each client adapts on its *own* novel rows and is scored on them.

    Client ``k`` holds the novel rows :meth:`~lit_lowrank.datamodules.flows.FlowsDataModule.client_novel`
    (Dirichlet-skewed like its base rows). Its episodes are ``min(ways, m_k)``-way, over the ``m_k``
    novel classes it holds at least ``max(shots) + queries`` rows of; clients with fewer than two
    such classes run none. Every method sees the same episodes (paired); the oracle prior uses the
    novel classes' statistics over all clients. Returns the per-episode macro F1 of every client,
    concatenated (``{(method, shots): [...]}``, the same order for every method). ``clients``
    restricts the evaluation to those clients (e.g. validation clients for tuning, the others for
    the test); ``kwargs`` go to :func:`evaluate_episodes` (settings, ``settings=`` per method).
    """
    z_all = result.features(datamodule.novel_x)
    oracle = class_statistics(z_all, datamodule.novel_y, np.unique(datamodule.novel_y.numpy()))
    out: dict[tuple[str, int], list[float]] = {(m, s): [] for m in methods for s in shots}
    need = max(shots) + queries
    for client in (range(datamodule.num_clients) if clients is None else clients):
        x_k, y_k = datamodule.client_novel(client)
        counts = np.bincount(y_k.numpy(), minlength=len(datamodule.novel_names))
        held = np.flatnonzero(counts >= need)
        if len(held) < 2:
            continue
        scores = evaluate_episodes(result.features(x_k), y_k, datamodule.novel_names, result.bank, novel_keys,
                                   methods, ways=min(ways, len(held)), shots=shots, episodes=episodes_per_client,
                                   queries=queries, seed=seed * 1009 + client, classes=held, oracle=oracle, **kwargs)
        for key, values in scores.items():
            out[key] += values
    return out
