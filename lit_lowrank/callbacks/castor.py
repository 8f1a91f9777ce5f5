"""CastorDiagnostics: log Castor's router mass against node local homophily, and β per hop."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from lit_lowrank.core.logging import log_method
from lit_lowrank.ops.castor import PRIMITIVES, router_mass_by_homophily
from lit_lowrank.ops.graph_propagation import local_homophily


def _castors(pl_module: "pl.LightningModule") -> list:
    # imported here: lit_lowrank.callbacks must not pull in the model zoo
    from lit_lowrank.models.castor import Castor

    return [m for m in pl_module.modules() if isinstance(m, Castor)]


class CastorDiagnostics(pl.Callback):
    """After each validation forward, log what every :class:`~lit_lowrank.models.Castor` in the module did.

    Keys (``method/castor/...``, epoch-level):

    - ``route/<primitive>``: mean router mass on ``low``, ``high``, ``identity`` (all hops, all nodes);
    - ``route_heterophilous/<primitive>`` and ``route_homophilous/<primitive>``: the same over
      nodes whose local homophily (fraction of same-label neighbours, from ``batch.y``) is
      below / at least 0.5 — the mass should move toward ``high`` on the first;
    - ``beta/hop<k>``: the momentum coefficient of hop ``k``.

    Requires batches with ``edge_index`` and ``y`` (``torch_geometric.data.Data``, as
    :class:`~lit_lowrank.datamodules.GraphDataModule` yields) and a module holding a
    ``Castor`` (e.g. ``NodeClassificationModule(model="castor")``); raises otherwise.

    .. code-block:: python

        model = NodeClassificationModule("castor", in_channels=100, num_classes=2)
        trainer = L.Trainer(max_epochs=100, callbacks=[CastorDiagnostics()])
        trainer.fit(model, datamodule=GraphDataModule("csbm", phi=-0.5))
    """

    figure_every_n_epochs: int = 1  # the router-mass figure every n validation epochs

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if not _castors(pl_module):
            raise ValueError(f"CastorDiagnostics: {type(pl_module).__name__} holds no Castor model "
                             "(build it with model='castor').")

    @override
    def on_validation_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if getattr(batch, "edge_index", None) is None or getattr(batch, "y", None) is None:
            raise ValueError("CastorDiagnostics: the batch needs `edge_index` and `y` (a torch_geometric Data).")
        homophily = local_homophily(batch.edge_index.cpu(), batch.y.cpu(), num_nodes=batch.y.numel())
        for castor in _castors(pl_module):
            for k, beta in enumerate(castor.betas().detach().tolist()):
                log_method(pl_module, "castor", f"beta/hop{k}", beta, on_step=False, on_epoch=True, batch_size=1)
            if castor.last_routes is None or castor.last_routes.shape[1] != homophily.numel():
                continue  # K = 0, or the model ran on another graph
            routes = castor.last_routes.float().cpu()
            mass = routes.mean((0, 1))
            by_bin = router_mass_by_homophily(routes, homophily, bins=2)
            for i, primitive in enumerate(PRIMITIVES):
                log_method(pl_module, "castor", f"route/{primitive}", float(mass[i]), on_step=False, on_epoch=True,
                           batch_size=1)
                for b, group in enumerate(("heterophilous", "homophilous")):
                    value = float(by_bin[b, i])
                    if value == value:  # skip empty bins (NaN)
                        log_method(pl_module, "castor", f"route_{group}/{primitive}", value,
                                   on_step=False, on_epoch=True, batch_size=1)
            self._log_route_figure(trainer, routes, by_bin)

    def _log_route_figure(self, trainer: "pl.Trainer", routes: Any, by_bin: Any) -> None:
        """Dashboard: router mass per hop and primitive, and by node homophily (labelled heatmaps)."""
        from lit_lowrank.core.figures import figure_due, heatmap, log_figure, new_figure

        if not figure_due(trainer, self.figure_every_n_epochs):
            return
        per_hop = routes.mean(1).numpy()  # (K, P)
        fig, (left, right) = new_figure(9.0, 1.6 + 0.35 * per_hop.shape[0], ncols=2)
        heatmap(left, per_hop, [f"hop {k}" for k in range(per_hop.shape[0])], list(PRIMITIVES), xlabel="primitive",
                ylabel="hop", title="Castor router mass per hop", colorbar_label="mean router probability")
        heatmap(right, by_bin.numpy(), ["heterophilous (h<0.5)", "homophilous (h>=0.5)"], list(PRIMITIVES),
                xlabel="primitive", title="router mass by node homophily", colorbar_label="mean router probability")
        log_figure(trainer, "method/castor/router_mass", fig)
