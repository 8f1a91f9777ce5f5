"""Network-flow data for federated low-shot intrusion detection (METHODS.md §5).

- :func:`load_flow_csv`: CICIDS2017 (``MachineLearningCVE/*.csv``) and CICDDoS2019 flow CSVs
  from a local file or folder: the 78 CICFlowMeter features (:data:`FLOW_FEATURES`), column
  names stripped, ``inf``/``NaN``/non-numeric cells dropped with their rows, labels normalised
  to canonical names (:func:`normalize_label`), unknown labels dropped, kept as ``"Other"`` or
  raised on (``unknown_labels``).
- :func:`simulate_flows`: the embedded default: 15 CICIDS-like labels in 9 attack families
  (flows of one family share a latent signature and covariance shape), mapped through a
  fixed random network to 78 positive, heavy-tailed "flow" features.
- :class:`FlowsDataModule`: base/novel class split, ``sign·log1p|x|`` then z-scoring (with
  base-train statistics), Dirichlet non-IID partition of the base-train rows over clients.
  Batches are ``{"x": (B, 78), "y": (B,)}``; with ``rounds > 0`` the train loader yields the
  round indices ``{"round": r}`` that drive :class:`~lit_lowrank.federated.FedLowShotModule`.

.. code-block:: python

    from lit_lowrank.datamodules.flows import FlowsDataModule

    dm = FlowsDataModule(source="simulated", num_clients=8, alpha=0.3)
    dm.setup()
    x, y = dm.client_data(0)                  # one client's base-class rows
    novel_x, novel_y = dm.novel_x, dm.novel_y  # the few-shot pool
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader

from lit_lowrank.datamodules._common import DictDataset
from lit_lowrank.ops.dirichlet_partition import dirichlet_partition, partition_statistics

#: The 78 CICFlowMeter features of the CICIDS2017 MachineLearningCVE CSVs (names stripped).
FLOW_FEATURES: tuple[str, ...] = (
    "Destination Port", "Flow Duration", "Total Fwd Packets", "Total Backward Packets",
    "Total Length of Fwd Packets", "Total Length of Bwd Packets", "Fwd Packet Length Max",
    "Fwd Packet Length Min", "Fwd Packet Length Mean", "Fwd Packet Length Std", "Bwd Packet Length Max",
    "Bwd Packet Length Min", "Bwd Packet Length Mean", "Bwd Packet Length Std", "Flow Bytes/s",
    "Flow Packets/s", "Flow IAT Mean", "Flow IAT Std", "Flow IAT Max", "Flow IAT Min", "Fwd IAT Total",
    "Fwd IAT Mean", "Fwd IAT Std", "Fwd IAT Max", "Fwd IAT Min", "Bwd IAT Total", "Bwd IAT Mean",
    "Bwd IAT Std", "Bwd IAT Max", "Bwd IAT Min", "Fwd PSH Flags", "Bwd PSH Flags", "Fwd URG Flags",
    "Bwd URG Flags", "Fwd Header Length", "Bwd Header Length", "Fwd Packets/s", "Bwd Packets/s",
    "Min Packet Length", "Max Packet Length", "Packet Length Mean", "Packet Length Std",
    "Packet Length Variance", "FIN Flag Count", "SYN Flag Count", "RST Flag Count", "PSH Flag Count",
    "ACK Flag Count", "URG Flag Count", "CWE Flag Count", "ECE Flag Count", "Down/Up Ratio",
    "Average Packet Size", "Avg Fwd Segment Size", "Avg Bwd Segment Size", "Fwd Header Length.1",
    "Fwd Avg Bytes/Bulk", "Fwd Avg Packets/Bulk", "Fwd Avg Bulk Rate", "Bwd Avg Bytes/Bulk",
    "Bwd Avg Packets/Bulk", "Bwd Avg Bulk Rate", "Subflow Fwd Packets", "Subflow Fwd Bytes",
    "Subflow Bwd Packets", "Subflow Bwd Bytes", "Init_Win_bytes_forward", "Init_Win_bytes_backward",
    "act_data_pkt_fwd", "min_seg_size_forward", "Active Mean", "Active Std", "Active Max", "Active Min",
    "Idle Mean", "Idle Std", "Idle Max", "Idle Min",
)
assert len(FLOW_FEATURES) == 78

#: Canonical label -> attack family, per dataset.
LABEL_FAMILIES: dict[str, dict[str, str]] = {
    "cicids2017": {
        "BENIGN": "benign", "DoS Hulk": "dos", "DoS GoldenEye": "dos", "DoS slowloris": "slow_dos",
        "DoS Slowhttptest": "slow_dos", "DDoS": "dos", "PortScan": "scan", "FTP-Patator": "brute_force",
        "SSH-Patator": "brute_force", "Bot": "bot", "Web Attack Brute Force": "web",
        "Web Attack XSS": "web", "Web Attack Sql Injection": "web", "Infiltration": "infiltration",
        "Heartbleed": "heartbleed",
    },
    "cicddos2019": {
        "BENIGN": "benign", "DrDoS_DNS": "reflection", "DrDoS_LDAP": "reflection", "DrDoS_MSSQL": "reflection",
        "DrDoS_NetBIOS": "reflection", "DrDoS_NTP": "reflection", "DrDoS_SNMP": "reflection",
        "DrDoS_SSDP": "reflection", "DrDoS_UDP": "udp_flood", "Syn": "syn_flood", "TFTP": "reflection",
        "UDP-lag": "udp_flood", "WebDDoS": "web", "Portmap": "reflection", "LDAP": "reflection",
        "MSSQL": "reflection", "NetBIOS": "reflection", "UDP": "udp_flood",
    },
}
#: Default novel (few-shot) classes; the rest are base classes (encoder training + prior bank).
DEFAULT_NOVEL: dict[str, tuple[str, ...]] = {
    "cicids2017": ("DoS GoldenEye", "DoS Slowhttptest", "SSH-Patator", "Web Attack XSS", "DDoS"),
    "cicddos2019": ("DrDoS_SNMP", "DrDoS_SSDP", "UDP-lag", "MSSQL", "NetBIOS"),
}
DEFAULT_NOVEL["simulated"] = DEFAULT_NOVEL["cicids2017"]

_ALIASES = {  # lower-cased, separators collapsed -> canonical
    **{re.sub(r"[^a-z0-9]+", "", k.lower()): k for fam in LABEL_FAMILIES.values() for k in fam},
    "webattackbruteforce": "Web Attack Brute Force", "webattacksqlinjection": "Web Attack Sql Injection",
    "webattackxss": "Web Attack XSS", "normal": "BENIGN", "udplag": "UDP-lag",
}


def normalize_label(raw: str) -> str | None:
    """Canonical label name, or ``None`` when the label is unknown.

    Handles the CICIDS2017 quirks: surrounding spaces, the mangled dash in ``"Web Attack � Brute
    Force"``, case (``"DoS slowloris"``) and ``"-"``/``"_"`` spellings.

    .. code-block:: python

        normalize_label(" Web Attack \\ufffd XSS")   # 'Web Attack XSS'
    """
    key = re.sub(r"[^a-z0-9]+", "", str(raw).lower())
    return _ALIASES.get(key)


def load_flow_csv(
    path: str | Path,
    dataset: Literal["cicids2017", "cicddos2019"] = "cicids2017",
    unknown_labels: Literal["drop", "other", "error"] = "drop",
    max_rows_per_file: int | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Read flow CSVs into ``(N, 78)`` float64 features and canonical string labels.

    Args:
        path: a ``.csv`` file or a folder (all ``*.csv`` inside, sorted).
        dataset: which label vocabulary to normalise to.
        unknown_labels: rows whose label is not in the vocabulary are dropped, kept as
            ``"Other"``, or raise ``ValueError``.
        max_rows_per_file: read at most this many rows of each file (quick looks).

    Returns:
        features, labels and a report ``{"rows", "kept", "dropped_nonfinite", "dropped_unknown"}``.

    Raises:
        FileNotFoundError: the path does not exist or holds no CSV (says where to get the data).
        ValueError: a file lacks some of the 78 feature columns or the ``Label`` column.

    .. code-block:: python

        x, y, report = load_flow_csv("~/data/CICIDS2017/MachineLearningCVE")
    """
    import pandas as pd  # lazy: only the real-data path needs it

    if dataset not in LABEL_FAMILIES:
        raise ValueError(f"load_flow_csv: `dataset`={dataset!r}, expected one of {sorted(LABEL_FAMILIES)}")
    if unknown_labels not in ("drop", "other", "error"):
        raise ValueError(f"load_flow_csv: `unknown_labels`={unknown_labels!r}, expected 'drop', 'other' or 'error'")
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(
            f"load_flow_csv: {str(root)!r} does not exist. Download {dataset.upper()} flow CSVs (CIC, University of "
            "New Brunswick: https://www.unb.ca/cic/datasets/) and pass the CSV file or its folder as `root`.")
    files = sorted(root.glob("*.csv")) if root.is_dir() else [root]
    if not files:
        raise FileNotFoundError(f"load_flow_csv: no *.csv file in {str(root)!r}")
    vocabulary = LABEL_FAMILIES[dataset]
    feats, labels = [], []
    report = {"rows": 0, "kept": 0, "dropped_nonfinite": 0, "dropped_unknown": 0}
    for file in files:
        frame = pd.read_csv(file, nrows=max_rows_per_file, low_memory=False, encoding="latin-1")
        frame.columns = [str(c).strip() for c in frame.columns]
        missing = [c for c in (*FLOW_FEATURES, "Label") if c not in frame.columns]
        if missing:
            raise ValueError(f"load_flow_csv: {file.name} lacks {len(missing)} expected columns, e.g. {missing[:5]}; "
                             f"expected the 78 CICFlowMeter features of {dataset} and a 'Label' column")
        x = frame[list(FLOW_FEATURES)].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
        canon = [normalize_label(v) for v in frame["Label"].astype(str)]
        report["rows"] += len(frame)
        finite = np.isfinite(x).all(1)  # inf, NaN and unparsable cells (-> NaN)
        known = np.array([c is not None and c in vocabulary for c in canon], dtype=bool)
        if unknown_labels == "error" and not known.all():
            bad = sorted({str(v) for v, k in zip(frame["Label"], known) if not k})
            raise ValueError(f"load_flow_csv: {file.name} has labels outside the {dataset} vocabulary: {bad[:5]}; "
                             "pass unknown_labels='drop' or 'other'")
        if unknown_labels == "other":
            canon = [c if k else "Other" for c, k in zip(canon, known)]
            known = np.ones_like(known)
        report["dropped_nonfinite"] += int((~finite).sum())
        report["dropped_unknown"] += int((finite & ~known).sum())
        keep = finite & known
        feats.append(x[keep])
        labels.extend(c for c, k in zip(canon, keep) if k)
    features = np.concatenate(feats) if feats else np.zeros((0, 78))
    report["kept"] = len(labels)
    return features, np.array(labels, dtype=object), report


def simulate_flows(
    samples_per_class: int | dict[str, int] = 400, seed: int = 0, latent_dim: int = 12
) -> tuple[np.ndarray, np.ndarray]:
    """Simulated CICIDS-like flows: 15 labels in 9 families, 78 positive heavy-tailed features.

    A class's latent code is ``z ~ N(m_family + δ_class, L_family L_familyᵀ + 0.05 I)``: the
    classes of a family share the signature and the covariance *shape* (so a family-mate's
    statistics are an informative prior), with class offsets large enough to separate them.
    Features are ``expm1(|A z + 0.5 tanh(B z)|)·sign`` plus multiplicative noise: positive
    counts/rates spanning orders of magnitude, as in CICFlowMeter output. The generator (A, B,
    family structure) is fixed; ``seed`` draws the samples.

    .. code-block:: python

        x, y = simulate_flows(samples_per_class=200)     # (3000, 78), string labels
    """
    structure = np.random.default_rng(2017)  # the world is fixed, the sample is seeded
    labels = list(LABEL_FAMILIES["cicids2017"])
    families = sorted(set(LABEL_FAMILIES["cicids2017"].values()))
    fam_mean = {f: structure.normal(0, 2.0, latent_dim) for f in families}
    fam_chol = {f: structure.normal(0, 1.0, (latent_dim, 3)) * 0.9 for f in families}
    offsets = {c: structure.normal(0, 0.9, latent_dim) for c in labels}
    a = structure.normal(0, 1.0 / np.sqrt(latent_dim), (78, latent_dim)) * 2.5
    b = structure.normal(0, 1.0 / np.sqrt(latent_dim), (78, latent_dim)) * 2.0
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in labels:
        fam = LABEL_FAMILIES["cicids2017"][c]
        n = samples_per_class[c] if isinstance(samples_per_class, dict) else samples_per_class
        z = (fam_mean[fam] + offsets[c] + rng.normal(size=(n, 3)) @ fam_chol[fam].T
             + 0.22 * rng.normal(size=(n, latent_dim)))
        h = z @ a.T + 0.5 * np.tanh(z @ b.T)
        x = np.expm1(np.abs(h) * 1.5) * np.sign(h) * np.exp(0.1 * rng.normal(size=h.shape))
        xs.append(x)
        ys += [c] * n
    return np.concatenate(xs), np.array(ys, dtype=object)


def log_scale(x: np.ndarray) -> np.ndarray:
    """``sign(x)·log1p(|x|)``: flow counts and rates span many orders of magnitude."""
    return np.sign(x) * np.log1p(np.abs(x))


class FlowsDataModule(pl.LightningDataModule):
    """Flows with a base/novel split and Dirichlet client partitions.

    Args:
        source: ``"simulated"`` (embedded), ``"cicids2017"`` or ``"cicddos2019"`` (needs ``root``).
        root: CSV file or folder for the real datasets.
        novel_classes: few-shot classes (``None``: :data:`DEFAULT_NOVEL`); all others are base.
        num_clients: clients of the Dirichlet partition.
        alpha: Dirichlet concentration (small = high skew).
        samples_per_class: simulated rows per class.
        max_rows_per_class: subsample each class of the real data to at most this many rows.
        val_fraction: base rows held out for validation of the encoder.
        client_id: ``None`` trains on all base-train rows, ``k`` on client ``k``'s rows.
        rounds: ``> 0`` makes the train loader yield ``rounds`` round indices (federated engine).
        batch_size: rows per batch.
        seed: seeds the simulation, splits and partition.

    .. code-block:: python

        dm = FlowsDataModule(source="cicids2017", root="~/data/CICIDS2017/MachineLearningCVE")
    """

    def __init__(
        self,
        source: Literal["simulated", "cicids2017", "cicddos2019"] = "simulated",
        root: str | None = None,
        novel_classes: list[str] | None = None,
        num_clients: int = 8,
        alpha: float = 0.3,
        samples_per_class: int = 400,
        max_rows_per_class: int | None = 5000,
        val_fraction: float = 0.1,
        client_id: int | None = None,
        rounds: int = 0,
        batch_size: int = 128,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if source not in ("simulated", "cicids2017", "cicddos2019"):
            raise ValueError(f"FlowsDataModule: `source`={source!r}, expected 'simulated', 'cicids2017' or "
                             "'cicddos2019'")
        if source != "simulated" and root is None:
            raise ValueError(f"FlowsDataModule: `source`={source!r} reads local CSVs; pass `root` (a CSV file or "
                             "folder), or use source='simulated' for the embedded flows")
        if not 0 <= val_fraction < 1:
            raise ValueError(f"FlowsDataModule: `val_fraction`={val_fraction!r}, expected in [0, 1)")
        if client_id is not None and not 0 <= client_id < num_clients:
            raise ValueError(f"FlowsDataModule: `client_id`={client_id!r}, expected in [0, {num_clients})")
        self.source, self.root = source, root
        self.novel_names = list(novel_classes) if novel_classes is not None else list(DEFAULT_NOVEL[source])
        self.num_clients, self.alpha = num_clients, alpha
        self.samples_per_class, self.max_rows_per_class = samples_per_class, max_rows_per_class
        self.val_fraction, self.client_id, self.rounds = val_fraction, client_id, rounds
        self.batch_size, self.seed = batch_size, seed
        self._ready = False

    @property
    def num_features(self) -> int:
        return len(FLOW_FEATURES)

    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        if self.source == "simulated":
            x, labels = simulate_flows(self.samples_per_class, seed=self.seed)
        else:
            x, labels = load_flow_csv(self.root, dataset=self.source)[:2]
        rng = np.random.default_rng(self.seed)
        if self.max_rows_per_class is not None:
            keep = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[: self.max_rows_per_class]
                                   for c in np.unique(labels)])
            x, labels = x[np.sort(keep)], labels[np.sort(keep)]
        present = set(labels.tolist())
        missing = [c for c in self.novel_names if c not in present]
        if missing:
            raise ValueError(f"FlowsDataModule: novel classes {missing} have no rows; present: {sorted(present)}")
        # base classes come from the public vocabulary (not from what this copy of the data holds), so
        # every client and the server agree on the label indices; absent classes have zero rows
        vocabulary = LABEL_FAMILIES["cicids2017" if self.source == "simulated" else self.source]
        self.base_names = sorted(c for c in vocabulary if c not in self.novel_names)
        if len([c for c in self.base_names if c in present]) < 2:
            raise ValueError(f"FlowsDataModule: need >= 2 base classes with rows, got {sorted(present)}")
        x = log_scale(x)
        is_novel = np.isin(labels, self.novel_names)
        is_base = np.isin(labels, self.base_names)
        base_x, base_lab = x[is_base], labels[is_base]
        base_y = np.array([self.base_names.index(c) for c in base_lab])
        perm = rng.permutation(len(base_y))
        n_val = int(round(self.val_fraction * len(base_y)))
        val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        # z-scoring with base-train statistics only: novel rows must not leak into preprocessing
        self.mean = base_x[train_idx].mean(0)
        self.std = base_x[train_idx].std(0) + 1e-6

        def scale(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor((a - self.mean) / self.std, dtype=torch.float32)

        self.train_x, self.train_y = scale(base_x[train_idx]), torch.as_tensor(base_y[train_idx])
        self.val_x, self.val_y = scale(base_x[val_idx]), torch.as_tensor(base_y[val_idx])
        self.novel_x = scale(x[is_novel])
        self.novel_y = torch.as_tensor([self.novel_names.index(c) for c in labels[is_novel]])
        self.partitions = dirichlet_partition(self.train_y.numpy(), self.num_clients, self.alpha, seed=self.seed,
                                              min_size=max(1, min(10, len(train_idx) // (4 * self.num_clients))))
        self.partition_stats = partition_statistics(self.train_y.numpy(), self.partitions)
        self._ready = True

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Base-train features and labels of client ``client``."""
        self.setup()
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client_data: `client`={client!r}, expected in [0, {self.num_clients})")
        idx = torch.as_tensor(self.partitions[client])
        return self.train_x[idx], self.train_y[idx]

    def train_dataloader(self) -> DataLoader:
        self.setup()
        if self.rounds > 0:
            return DataLoader(DictDataset({"round": torch.arange(self.rounds)}), batch_size=1)
        x, y = (self.train_x, self.train_y) if self.client_id is None else self.client_data(self.client_id)
        return DataLoader(DictDataset({"x": x, "y": y}), batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(DictDataset({"x": self.val_x, "y": self.val_y}), batch_size=4096)
