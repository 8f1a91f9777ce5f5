"""Client side of the federation, shared by the in-process federation and the Flower ClientApp.

A client holds its base-class flow rows. It (1) trains the global encoder + base head
locally with a Lightning ``Trainer`` (FedAvg's local step), (2) computes its class-wise
moments ``(n_c, Σz, Σzzᵀ)`` in the global encoder's feature space and (3) sends them only
masked (:mod:`lit_lowrank.ops.fed_lowshot.secure_sum` in process; Flower's ``secaggplus_mod`` on the
Flower path).

.. code-block:: python

    from lit_lowrank.federated.client import FlowClassifier, FlowClient

    client = FlowClient(client_id=0, x=x0, y=y0, num_classes=10)
    state, n = client.fit(global_state, local_epochs=1)
    flat = client.moment_vector(global_state)            # counts | sums | second moments
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lit_lowrank.datamodules._common import DictDataset
from lit_lowrank.models.flow_encoders import build_flow_encoder
from lit_lowrank.ops.fed_lowshot.niw import class_moments
from lit_lowrank.ops.fed_lowshot.secure_sum import FRAC_BITS, dh_keypair, encode_fixed_point, mask_vector, shared_seed


class FlowClassifier(pl.LightningModule):
    """Flow encoder + linear base-class head, trained with cross-entropy (one client's model).

    Args:
        encoder: ``"mlp"`` or ``"resnet1d"`` (:func:`~lit_lowrank.models.flow_encoders.build_flow_encoder`).
        num_classes: base classes.
        in_features: flow features (78).
        feature_dim: embedding width ``d`` (moments are ``d × d``).
        encoder_kwargs: extra encoder arguments.
        optimizer: optimizer factory (default Adam, lr 1e-3).

    .. code-block:: python

        model = FlowClassifier("mlp", num_classes=10)
        z = model.features(torch.randn(4, 78))
    """

    def __init__(self, encoder: str = "mlp", num_classes: int = 10, in_features: int = 78, feature_dim: int = 32,
                 encoder_kwargs: dict | None = None, optimizer: OptimizerCallable | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.encoder = build_flow_encoder(encoder, in_features, feature_dim, **(encoder_kwargs or {}))
        self.head = nn.Linear(feature_dim, num_classes)
        self.optimizer_factory = optimizer

    def features(self, x: Tensor) -> Tensor:
        return self.encoder(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = nn.functional.cross_entropy(self(batch["x"]), batch["y"].long())
        self.log("train/loss", loss, on_step=True, prog_bar=False)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        acc = (self(batch["x"]).argmax(1) == batch["y"]).float().mean()
        self.log("val/acc", acc)

    def configure_optimizers(self):
        if self.optimizer_factory is not None:
            return self.optimizer_factory(self.parameters())
        return torch.optim.Adam(self.parameters(), lr=1e-3)


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence the per-fit Lightning banners of many short client fits."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda", "lightning.fabric")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def moment_layout(num_classes: int, feature_dim: int) -> tuple[int, int, int]:
    """Sizes of the flat moment vector's three blocks: counts, sums, second moments."""
    return num_classes, num_classes * feature_dim, num_classes * feature_dim * feature_dim


def flatten_moments(counts: Tensor, sums: Tensor, second: Tensor) -> np.ndarray:
    """``counts | sums | second`` as one float64 vector (the secure-sum payload)."""
    return np.concatenate([counts.numpy().ravel(), sums.numpy().ravel(), second.numpy().ravel()])


def unflatten_moments(flat: np.ndarray, num_classes: int, feature_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`flatten_moments`."""
    a, b, c = moment_layout(num_classes, feature_dim)
    if flat.size != a + b + c:
        raise ValueError(f"unflatten_moments: vector of {flat.size} entries, expected {a + b + c} for "
                         f"{num_classes} classes of width {feature_dim}")
    t = torch.as_tensor(np.asarray(flat, dtype=np.float64))
    return t[:a], t[a:a + b].reshape(num_classes, feature_dim), t[a + b:].reshape(num_classes, feature_dim,
                                                                                 feature_dim)


class FlowClient:
    """One federation participant (raw rows never leave it).

    Args:
        client_id: this client's id (orders the pairwise masks).
        x: ``(N, 78)`` standardised base-class flows.
        y: ``(N,)`` base-class labels.
        num_classes: base classes.
        model_kwargs: :class:`FlowClassifier` arguments (shared by all clients and the server).
        batch_size: local batch size.
        lr: local Adam learning rate.
        seed: seeds local shuffling.

    .. code-block:: python

        client = FlowClient(0, x, y, num_classes=10, model_kwargs={"encoder": "resnet1d"})
    """

    def __init__(self, client_id: int, x: Tensor, y: Tensor, num_classes: int, model_kwargs: dict | None = None,
                 batch_size: int = 64, lr: float = 1e-3, seed: int = 0) -> None:
        self.client_id, self.x, self.y = client_id, x, y
        self.num_classes = num_classes
        self.model_kwargs = {"num_classes": num_classes, **(model_kwargs or {})}
        self.batch_size, self.lr, self.seed = batch_size, lr, seed
        self._secret: int | None = None

    def model(self, state: dict[str, Tensor] | None = None) -> FlowClassifier:
        model = FlowClassifier(**self.model_kwargs, optimizer=lambda p: torch.optim.Adam(p, lr=self.lr))
        if state is not None:
            model.load_state_dict(state)
        return model

    def fit(self, global_state: dict[str, Tensor], local_epochs: int = 1, round_idx: int = 0,
            limit_batches: int | None = None) -> tuple[dict[str, Tensor], int]:
        """FedAvg's local step: ``local_epochs`` of Lightning training from the global weights.

        ``limit_batches`` caps the batches per epoch (smoke runs). Returns the new state dict and
        the number of local rows (the FedAvg weight).
        """
        model = self.model(global_state)
        loader = DataLoader(DictDataset({"x": self.x, "y": self.y}), batch_size=self.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(self.seed * 100003 + round_idx * 101 + self.client_id))
        with quiet_lightning():
            trainer = pl.Trainer(max_epochs=local_epochs, accelerator="cpu", devices=1, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                 num_sanity_val_steps=0, limit_val_batches=0, deterministic=False,
                                 limit_train_batches=limit_batches if limit_batches is not None else 1.0)
            trainer.fit(model, train_dataloaders=loader)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, len(self.y)

    @torch.no_grad()
    def moments(self, global_state: dict[str, Tensor], clip: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Class-wise ``(n_c, Σz, Σzzᵀ)`` of the local rows under the global encoder.

        ``clip`` bounds every feature to ``±clip`` first (SecAgg+ needs public value bounds).
        """
        model = self.model(global_state).eval()
        z = torch.cat([model.features(chunk) for chunk in self.x.split(4096)]) if len(self.x) else \
            torch.zeros(0, model.hparams.feature_dim)
        if clip is not None:
            z = z.clamp(-clip, clip)
        return class_moments(z, self.y, self.num_classes)

    def moment_vector(self, global_state: dict[str, Tensor]) -> np.ndarray:
        return flatten_moments(*self.moments(global_state))

    # --- in-process secure aggregation (pairwise masks) ---------------------------------
    def public_key(self) -> int:
        """Round 1: a fresh Diffie-Hellman key pair; only the public half leaves the client."""
        self._secret, public = dh_keypair()
        return public

    def masked_moments(self, global_state: dict[str, Tensor], peer_publics: dict[int, int],
                       frac_bits: int = FRAC_BITS) -> np.ndarray:
        """Round 2: the moment vector in fixed point plus the pairwise masks (mod 2⁶⁴)."""
        if self._secret is None:
            raise RuntimeError("FlowClient.masked_moments: call public_key() first (round 1 of the secure sum)")
        seeds = {j: shared_seed(self._secret, pub) for j, pub in peer_publics.items() if j != self.client_id}
        masked = mask_vector(encode_fixed_point(self.moment_vector(global_state), frac_bits), self.client_id, seeds)
        self._secret = None  # one key per aggregation: reusing masks would leak differences
        return masked
