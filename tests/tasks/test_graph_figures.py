"""Issue #40 finding 8: the graph quickstart logs labelled images, also when its validation never ran."""

from __future__ import annotations

import torch

from lit_lowrank.tasks.graph import local_homophily


def test_local_homophily_counts_same_label_neighbours():
    # 0 - 1 (same label), 0 - 2 (other label), node 3 isolated; both directions listed
    edge_index = torch.tensor([[0, 1, 0, 2], [1, 0, 2, 0]])
    y = torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(local_homophily(edge_index, y, 4), torch.tensor([0.5, 1.0, 0.0, 0.0]))


def test_graph_quickstart_logs_images_even_when_validation_never_ran(repo_root, tmp_path):
    from lit_lowrank.cli import LitLowRankCLI

    LitLowRankCLI(args=[
        "fit", "--config", str(repo_root / "configs/graph/csbm_gcn.yaml"), "--trainer.max_epochs", "3",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.init_args.save_dir", str(tmp_path), "--data.init_args.num_nodes", "200",
    ])
    names = sorted(p.name for p in tmp_path.rglob("images/*.png"))
    assert any(n.startswith("val_confusion") for n in names), names
    assert any(n.startswith("val_accuracy_by_homophily") for n in names), names
