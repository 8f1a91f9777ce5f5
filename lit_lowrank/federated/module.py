"""The federated low-shot engine as a LightningModule: one training step = one FedAvg round.

``lit-lowrank fit`` drives the federation: the datamodule (:class:`~lit_lowrank.datamodules.flows.
FlowsDataModule` with ``rounds > 0``) yields round indices; in each step every client trains
the global encoder locally with its own Lightning ``Trainer`` (:meth:`FlowClient.fit`) and the
server applies the FedAvg update as a server-optimizer step on the pseudo-gradient
``w − avg(w_k)`` (FedOpt; SGD with ``lr = 1`` is exactly FedAvg, decided: this makes
``global_step`` count rounds and lets users swap in FedAdam-style server optimizers).
At the end of each validation epoch the clients send masked class moments (secure sum), the
server builds the prior bank and the few-shot episodes are scored; diagnostics are logged
under ``method/fed_lowshot/...``.

.. code-block:: python

    from lit_lowrank.datamodules.flows import FlowsDataModule
    from lit_lowrank.federated import FedLowShotModule

    module = FedLowShotModule(encoder="resnet1d", methods=["prior_bank", "prototype"], episodes=600)
    pl.Trainer(max_epochs=1).fit(module, datamodule=FlowsDataModule(rounds=5, num_clients=8, alpha=0.1))
    module.last_scores[("prior_bank", 1)]      # per-episode macro F1
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from lit_lowrank.core.logging import log_method
from lit_lowrank.federated.phrases import phrase_embeddings
from lit_lowrank.federated.server import (
    METHODS,
    build_prior_bank,
    evaluate_episodes,
    fedavg,
    make_clients,
    secure_sum_round,
)
from lit_lowrank.models.flow_encoders import build_flow_encoder
from lit_lowrank.ops.fed_lowshot.episodes import mean_ci

NAME = "fed_lowshot"


class FedLowShotModule(pl.LightningModule):
    """Federated representation learning + secure prior bank + episodic few-shot evaluation.

    Args:
        encoder: ``"mlp"`` or ``"resnet1d"``.
        feature_dim: embedding width ``d``.
        encoder_kwargs: extra encoder arguments.
        local_epochs: client epochs per round.
        client_batch_size, client_lr: local Adam training.
        methods: which of ``prior_bank``, ``prototype``, ``finetuned_head``, ``global_prior``,
            ``oracle_prior`` to score at validation.
        ways, shots, episodes, queries: episodic evaluation (``episodes`` per shot count; under
            ``fast_dev_run`` capped at 5, and clients train one local batch).
        kappa, nu0: NIW prior strengths; k, temperature: prior retrieval.
        gate_threshold: top phrase cosine at which the retrieved and global priors weigh equally
            (:func:`~lit_lowrank.ops.prior_bank.gated_prior`; ``None``: always trust the retrieval).
        classifier: ``"logistic"`` (a head on samples of the adapted Gaussians, the default) or ``"qda"``
            episode classifier for the prior-based methods.
        phrase_encoder: ``"minilm"`` (shipped sentence encoder) or ``"tfidf"``.
        optimizer: server optimizer factory on the pseudo-gradient (default ``SGD(lr=1)`` = FedAvg).
        seed: weight init and episode seed.

    .. code-block:: python

        module = FedLowShotModule(methods=["prior_bank", "prototype", "global_prior"])
    """

    def __init__(
        self,
        encoder: str = "mlp",
        feature_dim: int = 32,
        encoder_kwargs: dict | None = None,
        local_epochs: int = 1,
        client_batch_size: int = 64,
        client_lr: float = 1e-3,
        methods: list[str] | None = None,
        ways: int = 5,
        shots: list[int] | None = None,
        episodes: int = 600,
        queries: int = 15,
        kappa: float = 1.0,
        nu0: float | None = None,
        k: int = 2,
        temperature: float = 0.1,
        classifier: str = "logistic",
        phrase_encoder: str = "minilm",
        optimizer: OptimizerCallable | None = None,
        seed: int = 0,
        gate_threshold: float | None = 0.5,
    ) -> None:
        super().__init__()
        methods = list(methods) if methods is not None else ["prior_bank", "prototype"]
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            raise ValueError(f"FedLowShotModule: unknown `methods` {unknown}, expected among {list(METHODS)}")
        self.save_hyperparameters(ignore=["optimizer"])
        self.methods, self.shots = methods, list(shots) if shots is not None else [1, 5]
        self.optimizer_factory = optimizer
        self.automatic_optimization = False
        self.clients: list = []
        self.last_scores: dict[tuple[str, int], list[float]] = {}
        self.encoder: nn.Module | None = None
        self.head: nn.Module | None = None

    # ----------------------------------------------------------------- setup
    def _model_kwargs(self, dm) -> dict:
        h = self.hparams
        return {"encoder": h.encoder, "num_classes": len(dm.base_names), "in_features": dm.num_features,
                "feature_dim": h.feature_dim, "encoder_kwargs": h.encoder_kwargs or {}}

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if dm is None or not hasattr(dm, "client_data"):
            raise ValueError("FedLowShotModule needs a FlowsDataModule (with `rounds` > 0) as the datamodule")
        dm.setup(stage)
        if self.encoder is None:
            torch.manual_seed(self.hparams.seed)
            kw = self._model_kwargs(dm)
            # the same key layout as FlowClassifier ("encoder.*", "head.*"): states move freely
            self.encoder = build_flow_encoder(kw["encoder"], kw["in_features"], kw["feature_dim"],
                                              **kw["encoder_kwargs"])
            self.head = nn.Linear(kw["feature_dim"], kw["num_classes"])
        self.clients = make_clients(dm, self._model_kwargs(dm), self.hparams.client_batch_size,
                                    self.hparams.client_lr)

    def configure_optimizers(self):
        if self.optimizer_factory is not None:
            return self.optimizer_factory(self.parameters())
        return torch.optim.SGD(self.parameters(), lr=1.0)

    def global_state(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.state_dict().items()}

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))

    # ----------------------------------------------------------------- one round
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        round_idx = int(batch["round"][0]) + self.current_epoch * 1_000_003
        state = self.global_state()
        smoke = bool(self.trainer.fast_dev_run)  # a smoke run: one local batch per client
        updates = [c.fit(state, 1 if smoke else self.hparams.local_epochs, round_idx=round_idx,
                         limit_batches=1 if smoke else None) for c in self.clients]
        average = fedavg([u[0] for u in updates], [u[1] for u in updates])
        opt = self.optimizers()
        opt.zero_grad()
        sq = 0.0
        for name, p in self.named_parameters():
            p.grad = (p.detach() - average[name].to(p.dtype))  # FedOpt pseudo-gradient
            sq += float((p.grad**2).sum())
        opt.step()
        with torch.no_grad():  # buffers (BatchNorm statistics) are averaged, not optimised
            for name, b in self.named_buffers():
                b.copy_(average[name])
        log_method(self, NAME, "update_norm", sq**0.5)
        log_method(self, NAME, "clients", float(len(self.clients)))

    # ----------------------------------------------------------------- evaluation
    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        acc = (self(batch["x"]).argmax(1) == batch["y"]).float().mean()
        self.log("val/acc", acc, prog_bar=True)

    @torch.no_grad()
    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        h = self.hparams
        dm = self.trainer.datamodule
        state = self.global_state()
        total = secure_sum_round(self.clients, state)
        bank = build_prior_bank(total, dm.base_names, h.feature_dim, h.phrase_encoder)
        z = torch.cat([self.encoder(c) for c in dm.novel_x.split(4096)])
        episodes = min(h.episodes, 5) if self.trainer.fast_dev_run else h.episodes
        scores = evaluate_episodes(z, dm.novel_y, dm.novel_names, bank, phrase_embeddings(dm.novel_names,
                                   h.phrase_encoder), self.methods, h.ways, self.shots, episodes, h.queries, h.kappa,
                                   h.nu0, h.k, h.temperature, h.classifier, h.seed,
                                   gate_threshold=h.gate_threshold)
        self.last_scores = scores
        log_method(self, NAME, "bank_entries", float(len(bank.labels)), on_step=False, on_epoch=True)
        log_method(self, NAME, "bank_rows", float(bank.counts.sum()), on_step=False, on_epoch=True)
        log_method(self, NAME, "partition_tv", float(dm.partition_stats["mean_tv"]), on_step=False, on_epoch=True)
        for (method, shot), values in scores.items():
            mean, half = mean_ci(values)
            log_method(self, NAME, f"f1_{shot}shot/{method}", mean, on_step=False, on_epoch=True)
            log_method(self, NAME, f"f1_{shot}shot_ci/{method}", float(np.nan_to_num(half)), on_step=False,
                       on_epoch=True)
