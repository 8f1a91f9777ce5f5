"""NodeClassificationModule: PyG models by name, splits, clear errors."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.datamodules import GraphDataModule
from lit_lowrank.tasks import NodeClassificationModule


def _fit(model, data, tmp_path, epochs=60):
    trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, check_val_every_n_epoch=epochs)
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data, verbose=False)
    return trainer.callback_metrics


def test_gcn_beats_mlp_on_a_homophilous_csbm(tmp_path):
    """On φ = 1 (structure carries the label) GCN should beat a feature-only MLP."""
    pl.seed_everything(0)
    data = GraphDataModule("csbm", phi=1.0, num_nodes=500, num_features=50, num_splits=2)
    kwargs = dict(in_channels=50, num_classes=2, optimizer=lambda p: torch.optim.AdamW(p, lr=0.01))
    gcn = _fit(NodeClassificationModule("GCN", **kwargs), data, tmp_path)["test/acc"]
    pl.seed_everything(0)
    mlp = _fit(NodeClassificationModule("MLP", model_kwargs={"norm": None}, **kwargs), data, tmp_path)["test/acc"]
    assert gcn > 0.8 and gcn > mlp + 0.1, (gcn, mlp)


def test_split_selects_mask_column():
    data = GraphDataModule("karate", num_splits=3)
    data.setup("fit")
    graph = data.data
    model = NodeClassificationModule("GCN", in_channels=graph.num_features, num_classes=data.num_classes, split=2)
    assert torch.equal(model._mask(graph, "train"), graph.train_mask[:, 2])
    model.split = 3
    with pytest.raises(ValueError, match="`split`=3"):
        model._mask(graph, "train")


def test_feature_width_mismatch_is_named():
    data = GraphDataModule("karate")
    data.setup("fit")
    model = NodeClassificationModule("GCN", in_channels=7, num_classes=data.num_classes)
    with pytest.raises(ValueError, match="`in_channels`=7"):
        model.step(data.data, "train")


def test_unknown_model_lists_pyg_models():
    with pytest.raises(ValueError, match="'NotAGNN'.*GCN"):
        NodeClassificationModule("NotAGNN")
