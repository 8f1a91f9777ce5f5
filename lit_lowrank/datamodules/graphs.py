"""Full-batch node classification: cSBM, Karate, the Drosophila connectome, PyG benchmarks.

Every step yields the same single ``torch_geometric.data.Data`` graph with
``train_mask``, ``val_mask`` and ``test_mask`` of shape ``(N, num_splits)``: random,
seeded, per-class stratified splits (the GPRGNN protocol, 60/20/20 by default;
the test part is what train and val leave). Datasets' own public splits are not
used, so every dataset is evaluated the same way; pick split ``s`` with
``data.train_mask[:, s]``.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader
from torch_geometric.data import Data

from lit_lowrank.datamodules._common import check_fractions, stratified_split
from lit_lowrank.datamodules._paths import package_file, require_path
from lit_lowrank.datamodules.csbm import contextual_sbm

# name -> (torch_geometric.datasets class, its ``name`` argument, sub-root under ``root``,
#          raw folder under that sub-root). The raw folder is what PyG downloads into.
PYG_DATASETS: dict[str, tuple[str, Optional[str], str, str]] = {
    "cora": ("Planetoid", "Cora", "", "Cora/raw"),
    "citeseer": ("Planetoid", "CiteSeer", "", "CiteSeer/raw"),
    "pubmed": ("Planetoid", "PubMed", "", "PubMed/raw"),
    "computers": ("Amazon", "Computers", "", "Computers/raw"),
    "photo": ("Amazon", "Photo", "", "Photo/raw"),
    "chameleon": ("WikipediaNetwork", "chameleon", "", "chameleon/geom_gcn/raw"),
    "squirrel": ("WikipediaNetwork", "squirrel", "", "squirrel/geom_gcn/raw"),
    "actor": ("Actor", None, "actor", "raw"),  # Actor has no name argument: it lives in root/actor
    "cornell": ("WebKB", "cornell", "", "cornell/raw"),
    "texas": ("WebKB", "texas", "", "texas/raw"),
    "wisconsin": ("WebKB", "wisconsin", "", "wisconsin/raw"),
    "roman-empire": ("HeterophilousGraphDataset", "Roman-empire", "", "roman_empire/raw"),
    "amazon-ratings": ("HeterophilousGraphDataset", "Amazon-ratings", "", "amazon_ratings/raw"),
    "minesweeper": ("HeterophilousGraphDataset", "Minesweeper", "", "minesweeper/raw"),
    "tolokers": ("HeterophilousGraphDataset", "Tolokers", "", "tolokers/raw"),
    "questions": ("HeterophilousGraphDataset", "Questions", "", "questions/raw"),
}
EMBEDDED_GRAPHS = ("csbm", "karate", "drosophila")
SUPPORTED_GRAPHS = EMBEDDED_GRAPHS + tuple(PYG_DATASETS)

# Cell types of the Drosophila larva mushroom body (Eichler et al., Nature 2017).
DROSOPHILA_CLASSES = {
    "I": "MBIN (mushroom body input neuron)",
    "K": "KC (Kenyon cell)",
    "O": "MBON (mushroom body output neuron)",
    "P": "PN (projection neuron)",
}
DROSOPHILA_EMBED_DIM = 16


def single_graph_collate(batch: list[Data]) -> Data:
    """Collate for full-batch training: the loader's one item is the whole graph."""
    return batch[0]


def split_masks(y: torch.Tensor, num_splits: int, train_fraction: float, val_fraction: float, seed: int):
    """``(train, val, test)`` bool masks of shape ``(N, num_splits)``, stratified per class."""
    masks = torch.zeros(3, y.numel(), num_splits, dtype=torch.bool)
    for split in range(num_splits):
        test, train, val = stratified_split(y.numpy(), (train_fraction, val_fraction), seed=[seed, split])
        for k, part in enumerate((train, val, test)):
            masks[k, torch.from_numpy(part), split] = True
    return masks[0], masks[1], masks[2]


def _spectral_features(weights: torch.Tensor, dim: int) -> torch.Tensor:
    """Out/in adjacency spectral embedding of a directed weighted graph + log degrees, standardised."""
    u, s, vh = torch.linalg.svd(torch.log1p(weights))
    left, right = u[:, :dim] * s[:dim].sqrt(), vh[:dim].T * s[:dim].sqrt()
    # Singular vectors have arbitrary signs: make each one's largest entry positive (deterministic).
    sign = torch.sign(u[u[:, :dim].abs().argmax(0), torch.arange(dim)])
    left, right = left * sign, right * sign
    degrees = torch.stack([weights.sum(1), weights.sum(0)], dim=1).log1p()
    x = torch.cat([left, right, degrees], dim=1)
    return (x - x.mean(0)) / x.std(0).clamp_min(1e-8)


def load_drosophila() -> Data:
    """The left-hemisphere Drosophila larva mushroom-body connectome that graspologic ships.

    209 neurons, 7,425 directed weighted connections (synapse counts), 4 cell types
    (:data:`DROSOPHILA_CLASSES`, label order I, K, O, P). Edges are made undirected
    with ``edge_weight`` = synapses in both directions. Node features (34): the
    16-dim out- and in-adjacency spectral embedding of ``log1p(synapses)`` plus
    log weighted out/in degree, standardised.
    """
    folder = "datasets/drosophila"
    weights = torch.from_numpy(np.loadtxt(package_file("graspologic", f"{folder}/left_adjacency.csv"))).float()
    labels = package_file("graspologic", f"{folder}/left_cell_labels.csv").read_text().split()
    names = sorted(DROSOPHILA_CLASSES)
    y = torch.tensor([names.index(label) for label in labels], dtype=torch.long)
    symmetric = weights + weights.T
    edge_index = torch.nonzero(symmetric).T.contiguous()
    edge_weight = symmetric[edge_index[0], edge_index[1]]
    x = _spectral_features(weights, DROSOPHILA_EMBED_DIM)
    return Data(x=x, edge_index=edge_index, edge_weight=edge_weight, y=y)


class GraphDataModule(pl.LightningDataModule):
    """One graph, full batch, with ``num_splits`` random stratified train/val/test splits.

    Embedded (offline): ``"csbm"`` (:func:`~lit_lowrank.datamodules.csbm.contextual_sbm`
    with ``phi``, ``num_nodes``, ``num_features``; ``seed`` seeds the graph too),
    ``"karate"`` (PyG KarateClub, 34 nodes, 4 communities), ``"drosophila"``
    (:func:`load_drosophila`). Real (from ``root`` or downloaded with
    ``download=True``): ``cora``, ``citeseer``, ``pubmed`` (Planetoid), ``computers``,
    ``photo`` (Amazon), ``chameleon``, ``squirrel`` (WikipediaNetwork, geom-gcn),
    ``actor`` (read from ``root/actor``), ``cornell``, ``texas``, ``wisconsin`` (WebKB),
    ``roman-empire``, ``amazon-ratings``, ``minesweeper``, ``tolokers``, ``questions``.

    Each of train/val/test dataloaders yields the same ``Data`` (x, edge_index, y,
    masks ``(N, num_splits)``; ``edge_weight`` for drosophila).

    Example:
        .. code-block:: python

            dm = GraphDataModule(name="csbm", phi=-0.5, num_splits=10)
            dm.setup("fit")
            data = next(iter(dm.train_dataloader()))
            data.train_mask[:, 0]  # split 0: 60 % of each class
    """

    def __init__(
        self,
        name: str = "csbm",
        root: Optional[str] = None,
        phi: float = 0.0,
        num_nodes: int = 1000,
        num_features: int = 100,
        num_splits: int = 10,
        train_fraction: float = 0.6,
        val_fraction: float = 0.2,
        seed: int = 0,
        download: bool = False,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        key = name.lower().replace("_", "-")
        if key not in SUPPORTED_GRAPHS:
            raise ValueError(f"name: unknown graph {name!r}; supported: {', '.join(SUPPORTED_GRAPHS)}")
        check_fractions(train_fraction=train_fraction, val_fraction=val_fraction)
        if num_splits < 1:
            raise ValueError(f"num_splits: expected >= 1, got {num_splits}")
        if key == "csbm" and not -1.0 <= phi <= 1.0:
            raise ValueError(f"phi: expected a value in [-1, 1], got {phi}")
        self.save_hyperparameters()
        self.name = key
        self.root = root
        self.phi = phi
        self._num_nodes = num_nodes
        self._num_features = num_features
        self.num_splits = num_splits
        self.train_fraction = train_fraction
        self.val_fraction = val_fraction
        self.seed = seed
        self.download = download
        self.num_workers = num_workers

    def _raw_dir(self) -> Path:
        _, _, sub_root, raw = PYG_DATASETS[self.name]
        return Path(self.root or ".").expanduser() / sub_root / raw

    def _load_pyg(self) -> Data:
        import torch_geometric.datasets as pyg_datasets

        class_name, dataset_name, sub_root, _ = PYG_DATASETS[self.name]
        hint = "pass download=True to fetch it with torch_geometric"
        if self.root is None:
            raise FileNotFoundError(f"root: dataset {self.name!r} needs a data folder (root=None); {hint}")
        if not self.download:
            require_path(self._raw_dir(), "root", f"the raw files of {self.name!r} (PyG {class_name})", hint)
        kwargs: dict[str, Any] = {"root": str(Path(self.root).expanduser() / sub_root)}
        if dataset_name is not None:
            kwargs["name"] = dataset_name
        return getattr(pyg_datasets, class_name)(**kwargs)[0]

    def _load_graph(self) -> Data:
        if self.name == "csbm":
            return contextual_sbm(self._num_nodes, self._num_features, phi=self.phi, seed=self.seed)
        if self.name == "karate":
            from torch_geometric.datasets import KarateClub

            return KarateClub()[0]
        if self.name == "drosophila":
            return load_drosophila()
        return self._load_pyg()

    @cached_property
    def data(self) -> Data:
        """The graph with split masks (loaded on first access)."""
        graph = self._load_graph()
        y = graph.y.long().view(-1)
        out = Data(x=graph.x.float(), edge_index=graph.edge_index, y=y)
        if getattr(graph, "edge_weight", None) is not None:
            out.edge_weight = graph.edge_weight
        out.train_mask, out.val_mask, out.test_mask = split_masks(
            y, self.num_splits, self.train_fraction, self.val_fraction, self.seed
        )
        return out

    @property
    def num_features(self) -> int:
        return int(self.data.num_features)

    @property
    def num_classes(self) -> int:
        return int(self.data.y.max()) + 1

    def prepare_data(self) -> None:
        if self.download and self.name in PYG_DATASETS:
            self._load_pyg()

    def setup(self, stage: Optional[str] = None) -> None:
        self.data  # noqa: B018 - load once, here rather than in __init__

    def _loader(self) -> DataLoader:
        return DataLoader([self.data], batch_size=1, collate_fn=single_graph_collate, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()
