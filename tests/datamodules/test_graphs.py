"""GraphDataModule: stratified multi-split masks, embedded graphs, real-loader errors, a fake WebKB."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.utils import is_undirected

from lit_lowrank.datamodules.graphs import DROSOPHILA_CLASSES, GraphDataModule


def _setup(**kwargs):
    dm = GraphDataModule(**kwargs)
    dm.setup("fit")
    return dm


def test_csbm_masks_disjoint_covering_and_stratified():
    dm = _setup(name="csbm", num_nodes=500, num_features=20, phi=0.5, num_splits=4)
    data = dm.data
    assert (dm.num_features, dm.num_classes, dm.num_splits) == (20, 2, 4)
    for mask in (data.train_mask, data.val_mask, data.test_mask):
        assert mask.shape == (500, 4) and mask.dtype == torch.bool
    total = data.train_mask.long() + data.val_mask.long() + data.test_mask.long()
    assert torch.all(total == 1)  # every node in exactly one part, in every split
    for s in range(4):
        for c in range(2):
            members = data.y == c
            assert data.train_mask[members, s].sum() == round(0.6 * int(members.sum()))
            assert data.val_mask[members, s].sum() == round(0.2 * int(members.sum()))
    assert not torch.equal(data.train_mask[:, 0], data.train_mask[:, 1])


def test_splits_and_graph_are_seeded():
    a, b = _setup(name="csbm", num_nodes=300, seed=7).data, _setup(name="csbm", num_nodes=300, seed=7).data
    c = _setup(name="csbm", num_nodes=300, seed=8).data
    for key in ("x", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(a[key], b[key])
    assert not torch.equal(a.train_mask, c.train_mask)


def test_every_loader_yields_the_full_graph():
    dm = _setup(name="karate", num_splits=3)
    batches = [next(iter(loader())) for loader in (dm.train_dataloader, dm.val_dataloader, dm.test_dataloader)]
    assert all(batch is dm.data for batch in batches)
    assert len(dm.train_dataloader()) == 1
    assert dm.data.num_nodes == 34 and dm.num_classes == 4 and dm.data.train_mask.shape == (34, 3)


def test_drosophila_connectome():
    dm = _setup(name="drosophila")
    data = dm.data
    assert data.num_nodes == 209 and dm.num_classes == len(DROSOPHILA_CLASSES) == 4
    assert data.y.bincount().tolist() == [21, 101, 29, 58]  # I, K, O, P
    assert data.x.shape == (209, 34) and torch.allclose(data.x.mean(0), torch.zeros(34), atol=1e-4)
    assert is_undirected(data.edge_index) and torch.all(data.edge_weight > 0)
    assert data.edge_index.shape[1] == data.edge_weight.shape[0]
    assert int(data.edge_weight.sum()) == 2 * int(np.loadtxt(_drosophila_csv()).sum())


def _drosophila_csv():
    from lit_lowrank.datamodules._paths import package_file

    return package_file("graspologic", "datasets/drosophila/left_adjacency.csv")


def test_unknown_name_lists_supported_names():
    with pytest.raises(ValueError, match=r"name.*csbm.*cora.*roman-empire"):
        GraphDataModule(name="ogbn-arxiv")


def test_bad_phi_names_phi():
    with pytest.raises(ValueError, match="phi"):
        GraphDataModule(name="csbm", phi=2.0)


def test_real_dataset_without_data_names_root_path_and_download(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"root.*download=True"):
        _setup(name="cora")
    with pytest.raises(FileNotFoundError) as info:
        _setup(name="Roman-empire", root=str(tmp_path))
    message = str(info.value)
    assert "root" in message and str(tmp_path / "roman_empire" / "raw") in message and "download=True" in message


def _write_webkb(root, name="texas", n=12, f=5):
    raw = root / name / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    y = np.arange(n) % 3
    lines = ["node_id\tfeature\tlabel"] + [
        f"{i}\t{','.join(str(v) for v in rng.integers(0, 2, f))}\t{y[i]}" for i in range(n)
    ]
    (raw / "out1_node_feature_label.txt").write_text("\n".join(lines) + "\n")
    edges = ["node_id\tnode_id"] + [f"{i}\t{(i + 1) % n}" for i in range(n)]
    (raw / "out1_graph_edges.txt").write_text("\n".join(edges) + "\n")
    for s in range(10):
        masks = {k: np.zeros(n, dtype=bool) for k in ("train_mask", "val_mask", "test_mask")}
        np.savez(raw / f"{name}_split_0.6_0.2_{s}.npz", **masks)
    return y


def test_real_loader_reads_a_local_webkb_dataset(tmp_path):
    y = _write_webkb(tmp_path)
    dm = _setup(name="texas", root=str(tmp_path), num_splits=2)
    data = dm.data
    assert data.num_nodes == 12 and dm.num_features == 5 and dm.num_classes == 3
    assert torch.equal(data.y, torch.from_numpy(y))
    # Our stratified splits replace the file's (empty) ones: 60 % of each class of 4 nodes.
    assert data.train_mask.shape == (12, 2) and data.train_mask.sum(0).tolist() == [6, 6]


@pytest.mark.parametrize("name", ["csbm", "cora"])
def test_signature_parses_with_jsonargparse(name):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(GraphDataModule, "data")
    assert parser.parse_args([f"--data.name={name}"]).data.num_splits == 10
