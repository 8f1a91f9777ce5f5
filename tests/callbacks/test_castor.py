"""CastorDiagnostics logs router mass by local homophily and β per hop under stable names."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.callbacks import CastorDiagnostics
from lit_lowrank.datamodules import GraphDataModule
from lit_lowrank.ops.graph_propagation import local_homophily
from lit_lowrank.tasks import NodeClassificationModule


def _trainer(tmp_path, epochs=2):
    return pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, callbacks=[CastorDiagnostics()])


def _fit(tmp_path, phi=0.0, **model_kwargs):
    pl.seed_everything(0)
    data = GraphDataModule("csbm", phi=phi, num_nodes=200, num_features=20, num_splits=1)
    model = NodeClassificationModule("castor", in_channels=20, num_classes=2, model_kwargs={"K": 3, **model_kwargs},
                                     optimizer=lambda p: torch.optim.Adam(p, lr=0.01))
    trainer = _trainer(tmp_path)
    trainer.fit(model, datamodule=data)
    return trainer, model, data


def test_logged_route_mass_is_the_models_by_homophily_bin(tmp_path):
    """The logged masses are the last validation forward's routes, split by each node's true local homophily."""
    trainer, model, data = _fit(tmp_path)
    metrics = trainer.callback_metrics
    castor = model.model
    routes = castor.last_routes.float()                                    # (K, N, 3) of the last validation pass
    graph = data.data
    homophily = local_homophily(graph.edge_index, graph.y, num_nodes=graph.y.numel())
    heterophilous = homophily < 0.5                                        # NaN (isolated) is in neither bin
    homophilous = homophily >= 0.5
    assert heterophilous.sum() > 0 and homophilous.sum() > 0
    for i, primitive in enumerate(("low", "high", "identity")):
        assert float(metrics[f"method/castor/route/{primitive}"]) == pytest.approx(float(routes[..., i].mean()), abs=1e-6)
        assert float(metrics[f"method/castor/route_heterophilous/{primitive}"]) == pytest.approx(
            float(routes[:, heterophilous, i].mean()), abs=1e-6)
        assert float(metrics[f"method/castor/route_homophilous/{primitive}"]) == pytest.approx(
            float(routes[:, homophilous, i].mean()), abs=1e-6)
    # nodes differ in their routes after training: the per-bin masses are not the overall mean
    assert float(routes[:, heterophilous, 1].mean()) != pytest.approx(float(routes[:, homophilous, 1].mean()), abs=1e-6)
    for k, beta in enumerate(castor.betas().tolist()):
        assert float(metrics[f"method/castor/beta/hop{k}"]) == pytest.approx(beta, abs=1e-6)
    assert any(abs(b) > 1e-4 for b in castor.betas().tolist())           # β_1, β_2 trained away from 0


def test_fixed_route_is_logged_as_all_mass_on_that_primitive(tmp_path):
    trainer, _, _ = _fit(tmp_path, router="high", momentum="none")
    metrics = trainer.callback_metrics
    assert float(metrics["method/castor/route/high"]) == pytest.approx(1.0)
    assert float(metrics["method/castor/route_homophilous/low"]) == pytest.approx(0.0)
    assert all(float(metrics[f"method/castor/beta/hop{k}"]) == 0.0 for k in range(3))


def test_refuses_a_module_without_castor(tmp_path):
    data = GraphDataModule("karate", num_splits=1)
    model = NodeClassificationModule("GCN", in_channels=34, num_classes=4)
    with pytest.raises(ValueError, match="holds no Castor"):
        _trainer(tmp_path).fit(model, datamodule=data)
