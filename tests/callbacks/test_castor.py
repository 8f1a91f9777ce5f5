"""CastorDiagnostics logs router mass by local homophily and β per hop under stable names."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.callbacks import CastorDiagnostics
from lit_lowrank.datamodules import GraphDataModule
from lit_lowrank.tasks import NodeClassificationModule


def _trainer(tmp_path, epochs=2):
    return pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, callbacks=[CastorDiagnostics()])


def test_diagnostics_keys_and_values(tmp_path):
    pl.seed_everything(0)
    data = GraphDataModule("csbm", phi=-1.0, num_nodes=200, num_features=20, num_splits=1)
    model = NodeClassificationModule("castor", in_channels=20, num_classes=2, model_kwargs={"K": 3},
                                     optimizer=lambda p: torch.optim.Adam(p, lr=0.01))
    trainer = _trainer(tmp_path)
    trainer.fit(model, datamodule=data)
    metrics = trainer.callback_metrics
    total = sum(float(metrics[f"method/castor/route/{p}"]) for p in ("low", "high", "identity"))
    assert total == pytest.approx(1.0, abs=1e-5)
    assert {f"method/castor/beta/hop{k}" for k in range(3)} <= set(metrics)
    # φ = −1: almost every node is heterophilous, so that bin is populated
    assert "method/castor/route_heterophilous/high" in metrics
    assert all(abs(float(metrics[f"method/castor/beta/hop{k}"])) < 0.9 for k in range(3))


def test_refuses_a_module_without_castor(tmp_path):
    data = GraphDataModule("karate", num_splits=1)
    model = NodeClassificationModule("GCN", in_channels=34, num_classes=4)
    with pytest.raises(ValueError, match="holds no Castor"):
        _trainer(tmp_path).fit(model, datamodule=data)
