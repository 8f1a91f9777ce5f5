"""Network-flow data for federated low-shot intrusion detection (METHODS.md §5).

- :func:`load_flow_csv`: CICIDS2017 (``MachineLearningCVE/*.csv``) and CICDDoS2019 flow CSVs
  from a local file or folder: the 78 CICFlowMeter features (:data:`FLOW_FEATURES`), column
  names stripped, ``inf``/``NaN``/non-numeric cells dropped with their rows, labels normalised
  to canonical names (:func:`normalize_label`), unknown labels dropped, kept as ``"Other"`` or
  raised on (``unknown_labels``).
- :func:`load_unsw_csv`: UNSW-NB15's partitioned sets (``UNSW_NB15_training-set.csv`` /
  ``UNSW_NB15_testing-set.csv``): the 39 numeric features (:data:`UNSW_FEATURES`), the
  ``attack_cat`` label (padded spellings and ``Backdoors`` normalised, empty = ``Normal``).
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
from typing import Any, Literal

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

#: The 39 numeric features of UNSW-NB15's training/testing-set CSVs (``id``, ``proto``, ``service``,
#: ``state``, ``attack_cat`` and ``label`` are not features).
UNSW_FEATURES: tuple[str, ...] = (
    "dur", "spkts", "dpkts", "sbytes", "dbytes", "rate", "sttl", "dttl", "sload", "dload", "sloss", "dloss",
    "sinpkt", "dinpkt", "sjit", "djit", "swin", "stcpb", "dtcpb", "dwin", "tcprtt", "synack", "ackdat", "smean",
    "dmean", "trans_depth", "response_body_len", "ct_srv_src", "ct_state_ttl", "ct_dst_ltm", "ct_src_dport_ltm",
    "ct_dst_sport_ltm", "ct_dst_src_ltm", "is_ftp_login", "ct_ftp_cmd", "ct_flw_http_mthd", "ct_src_ltm",
    "ct_srv_dst", "is_sm_ips_ports",
)
assert len(UNSW_FEATURES) == 39

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
    "unsw-nb15": {
        "Normal": "benign", "Generic": "generic", "Exploits": "exploit", "Fuzzers": "fuzzing", "DoS": "dos",
        "Reconnaissance": "scan", "Analysis": "scan", "Backdoor": "backdoor", "Shellcode": "exploit",
        "Worms": "worm",
    },
}
#: Default novel (few-shot) classes; the rest are base classes (encoder training + prior bank).
DEFAULT_NOVEL: dict[str, tuple[str, ...]] = {
    "cicids2017": ("DoS GoldenEye", "DoS Slowhttptest", "SSH-Patator", "Web Attack XSS", "DDoS"),
    "cicddos2019": ("DrDoS_SNMP", "DrDoS_SSDP", "UDP-lag", "MSSQL", "NetBIOS"),
}
DEFAULT_NOVEL["simulated"] = DEFAULT_NOVEL["cicids2017"]
DEFAULT_NOVEL["unsw-nb15"] = ("Analysis", "Backdoor", "Shellcode", "Worms", "Reconnaissance")
_UNSW_ALIASES = {re.sub(r"[^a-z0-9]+", "", k.lower()): k for k in LABEL_FAMILIES["unsw-nb15"]}
_UNSW_ALIASES.update({"backdoors": "Backdoor", "": "Normal"})

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


def _keep_rows(x: np.ndarray, raw: Any, canon: list[Any], known: np.ndarray, unknown_labels: str,
               report: dict[str, int], feats: list[np.ndarray], labels: list[Any], outside: str) -> None:
    """Append one file's finite rows with a known (or, with ``unknown_labels='other'``, any) label to
    ``feats`` / ``labels`` and count what was dropped; ``outside`` starts the error for unknown labels."""
    report["rows"] += len(x)
    finite = np.isfinite(x).all(1)  # inf, NaN and unparsable cells (-> NaN)
    if unknown_labels == "error" and not known.all():
        bad = sorted({str(v) for v, k in zip(raw, known) if not k})
        raise ValueError(f"{outside}: {bad[:5]}; pass unknown_labels='drop' or 'other'")
    if unknown_labels == "other":
        canon = [c if k else "Other" for c, k in zip(canon, known)]
        known = np.ones_like(known)
    report["dropped_nonfinite"] += int((~finite).sum())
    report["dropped_unknown"] += int((finite & ~known).sum())
    keep = finite & known
    feats.append(x[keep])
    labels.extend(c for c, k in zip(canon, keep) if k)


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
        known = np.array([c is not None and c in vocabulary for c in canon], dtype=bool)
        _keep_rows(x, frame["Label"].astype(str), canon, known, unknown_labels, report, feats, labels,
                   f"load_flow_csv: {file.name} has labels outside the {dataset} vocabulary")
    features = np.concatenate(feats) if feats else np.zeros((0, 78))
    report["kept"] = len(labels)
    return features, np.array(labels, dtype=object), report


def load_unsw_csv(
    path: str | Path, unknown_labels: Literal["drop", "other", "error"] = "drop", max_rows_per_file: int | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Read UNSW-NB15 partitioned-set CSVs into ``(N, 39)`` float64 features and canonical ``attack_cat`` labels.

    Args:
        path: a ``.csv`` file (``UNSW_NB15_training-set.csv``, ``UNSW_NB15_testing-set.csv``) or a
            folder of them.
        unknown_labels: rows whose category is not one of the ten UNSW-NB15 categories are dropped,
            kept as ``"Other"``, or raise ``ValueError``.
        max_rows_per_file: read at most this many rows of each file.

    Returns:
        features, labels and a report ``{"rows", "kept", "dropped_nonfinite", "dropped_unknown"}``.

    .. code-block:: python

        x, y, report = load_unsw_csv("~/data/UNSW-NB15/UNSW_NB15_training-set.csv")
    """
    import pandas as pd  # lazy: only the real-data path needs it

    if unknown_labels not in ("drop", "other", "error"):
        raise ValueError(f"load_unsw_csv: `unknown_labels`={unknown_labels!r}, expected 'drop', 'other' or 'error'")
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(
            f"load_unsw_csv: {str(root)!r} does not exist. Download the UNSW-NB15 partitioned sets "
            "(UNSW_NB15_training-set.csv / UNSW_NB15_testing-set.csv, UNSW Canberra: "
            "https://research.unsw.edu.au/projects/unsw-nb15-dataset) and pass the CSV file or its folder.")
    files = sorted(root.glob("*.csv")) if root.is_dir() else [root]
    if not files:
        raise FileNotFoundError(f"load_unsw_csv: no *.csv file in {str(root)!r}")
    feats, labels = [], []
    report = {"rows": 0, "kept": 0, "dropped_nonfinite": 0, "dropped_unknown": 0}
    for file in files:
        frame = pd.read_csv(file, nrows=max_rows_per_file, low_memory=False, encoding="latin-1")
        frame.columns = [str(c).strip().lower() for c in frame.columns]
        missing = [c for c in (*UNSW_FEATURES, "attack_cat") if c not in frame.columns]
        if missing:
            raise ValueError(f"load_unsw_csv: {file.name} lacks {len(missing)} expected columns, e.g. {missing[:5]}; "
                             "expected the 39 numeric UNSW-NB15 features and an 'attack_cat' column (the partitioned "
                             "training/testing-set layout)")
        x = frame[list(UNSW_FEATURES)].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
        raw = frame["attack_cat"].fillna("").astype(str)
        canon = [_UNSW_ALIASES.get(re.sub(r"[^a-z0-9]+", "", v.lower())) for v in raw]
        known = np.array([c is not None for c in canon], dtype=bool)
        _keep_rows(x, raw, canon, known, unknown_labels, report, feats, labels,
                   f"load_unsw_csv: {file.name} has categories outside UNSW-NB15's ten")
    features = np.concatenate(feats) if feats else np.zeros((0, len(UNSW_FEATURES)))
    report["kept"] = len(labels)
    return features, np.array(labels, dtype=object), report


#: Attack mechanisms of the CICIDS2017 labels (the ``"mechanisms"`` world of :func:`simulate_flows`):
#: what an attack does on the wire, one domain reading of the CIC documentation. The label
#: phrases (:data:`~lit_lowrank.federated.phrases.LABEL_PHRASES`) are written separately; nothing
#: makes their sentence-embedding similarity follow these vectors.
MECHANISMS: tuple[str, ...] = ("http", "tls", "flood", "slow", "many_sources", "login", "injection", "scan",
                               "command_control", "lateral", "benign")
LABEL_MECHANISMS: dict[str, tuple[str, ...]] = {
    "BENIGN": ("benign",), "DoS Hulk": ("http", "flood"), "DoS GoldenEye": ("http", "flood", "slow"),
    "DoS slowloris": ("http", "slow"), "DoS Slowhttptest": ("http", "slow"), "DDoS": ("flood", "many_sources"),
    "PortScan": ("scan",), "FTP-Patator": ("login",), "SSH-Patator": ("login", "tls"),
    "Bot": ("command_control",), "Web Attack Brute Force": ("http", "login"),
    "Web Attack XSS": ("http", "injection"), "Web Attack Sql Injection": ("http", "injection"),
    "Infiltration": ("lateral", "command_control"), "Heartbleed": ("tls",),
}
#: Data sources of :class:`FlowsDataModule`.
SOURCES: tuple[str, ...] = ("simulated", "cicids2017", "cicddos2019", "unsw-nb15")
#: Worlds of :func:`simulate_flows`.
WORLDS: tuple[str, ...] = ("mechanisms", "families", "leaky", "decoupled")


def simulate_flows(
    samples_per_class: int | dict[str, int] = 400, seed: int = 0, latent_dim: int = 12, world: str = "mechanisms",
    class_share: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """Simulated CICIDS-like flows: 15 labels, 78 positive heavy-tailed features.

    A class's latent code is ``z ~ N(m_c, L_c L_cᵀ + 0.05 I)``, mapped through a fixed random
    network to features ``expm1(|A z + 0.5 tanh(B z)|)·sign`` with multiplicative noise: positive
    counts/rates spanning orders of magnitude, as in CICFlowMeter output. ``world`` says how the
    class statistics relate to the labels (and so to their phrases):

    - ``"mechanisms"`` (default): ``m_c = √(1−s)·Σ_{a ∈ mech(c)} μ_a/√|mech(c)| + √s·ε_c`` and the
      covariance factor likewise, with :data:`LABEL_MECHANISMS` and ``s = class_share`` (0.5): half
      of a class's signature is its own. Labels sharing mechanisms have related statistics; a
      phrase retrieves a useful prior only if its embedding reflects shared mechanisms — the
      retrieval has to earn its gain, and no base class is a copy of a novel one;
    - ``"families"``: related attack classes are statistically close, as CICIDS2017's families are
      (its DoS variants share HTTP-flood flow shapes, its three web attacks are near-inseparable in
      flow features, FTP-/SSH-Patator differ mostly in port and timing): a class's signature is
      ``m_c = √(1−s)·m_family + √s·ε_c`` (and its covariance factor likewise) with the family of
      :data:`LABEL_FAMILIES` and ``s = class_share`` — family-mates share ``1−s`` of their
      statistics, classes without a family-mate (Bot, Infiltration, Heartbleed, PortScan) have
      only their own, so a retrieved prior helps only where a phrase finds a real relative;
    - ``"leaky"``: the classes of one attack family (:data:`LABEL_FAMILIES`) share the mean and
      covariance shape up to a small offset, and family-mates have near-identical phrases — the
      named upper bound where retrieval finds a near-copy by construction;
    - ``"decoupled"``: the mechanisms world with the mechanism sets permuted across labels by a
      fixed derangement — phrases carry no information about statistics (the null).

    The generator is fixed per world; ``seed`` draws the samples.

    .. code-block:: python

        x, y = simulate_flows(samples_per_class=200)     # (3000, 78), string labels
    """
    if world not in WORLDS:
        raise ValueError(f"simulate_flows: `world`={world!r}, expected one of {WORLDS}")
    if not 0.0 <= class_share <= 1.0:
        raise ValueError(f"simulate_flows: `class_share`={class_share!r}, expected in [0, 1]")
    structure = np.random.default_rng(2017)  # the world is fixed, the sample is seeded
    labels = list(LABEL_FAMILIES["cicids2017"])
    families = sorted(set(LABEL_FAMILIES["cicids2017"].values()))
    fam_mean = {f: structure.normal(0, 2.0, latent_dim) for f in families}
    fam_chol = {f: structure.normal(0, 1.0, (latent_dim, 3)) * 0.9 for f in families}
    offsets = {c: structure.normal(0, 0.9, latent_dim) for c in labels}
    a = structure.normal(0, 1.0 / np.sqrt(latent_dim), (78, latent_dim)) * 2.5
    b = structure.normal(0, 1.0 / np.sqrt(latent_dim), (78, latent_dim)) * 2.0
    mech = np.random.default_rng(2019)  # drawn after the leaky world's, which stays as it was
    mech_mean = {m: mech.normal(0, 2.0, latent_dim) for m in MECHANISMS}
    mech_chol = {m: mech.normal(0, 1.0, (latent_dim, 3)) * 0.9 for m in MECHANISMS}
    own_mean = {c: mech.normal(0, 2.0, latent_dim) for c in labels}
    own_chol = {c: mech.normal(0, 1.0, (latent_dim, 3)) * 0.9 for c in labels}
    related = np.random.default_rng(2021)  # the families world's signatures (other worlds unchanged)
    family_mean = {f: related.normal(0, 2.0, latent_dim) for f in families}
    family_chol = {f: related.normal(0, 1.0, (latent_dim, 3)) * 0.9 for f in families}
    assigned = {c: LABEL_MECHANISMS[c] for c in labels}
    if world == "decoupled":
        order = mech.permutation(len(labels))
        shifted = np.roll(order, 1)  # a derangement: no label keeps its own mechanisms
        assigned = {labels[i]: LABEL_MECHANISMS[labels[j]] for i, j in zip(order, shifted)}

    def class_stats(c: str) -> tuple[np.ndarray, np.ndarray]:
        if world == "leaky":
            fam = LABEL_FAMILIES["cicids2017"][c]
            return fam_mean[fam] + offsets[c], fam_chol[fam]
        w_own, w_shared = np.sqrt(class_share), np.sqrt(1.0 - class_share)
        if world == "families":
            fam = LABEL_FAMILIES["cicids2017"][c]
            return w_shared * family_mean[fam] + w_own * own_mean[c], w_shared * family_chol[fam] + w_own * own_chol[c]
        ms = assigned[c]
        shared_m = sum(mech_mean[m] for m in ms) / np.sqrt(len(ms))
        shared_l = sum(mech_chol[m] for m in ms) / np.sqrt(len(ms))
        return w_shared * shared_m + w_own * own_mean[c], w_shared * shared_l + w_own * own_chol[c]

    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in labels:
        mean, chol = class_stats(c)
        n = samples_per_class[c] if isinstance(samples_per_class, dict) else samples_per_class
        z = mean + rng.normal(size=(n, 3)) @ chol.T + 0.22 * rng.normal(size=(n, latent_dim))
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
        source: ``"simulated"`` (embedded), ``"cicids2017"``, ``"cicddos2019"`` or ``"unsw-nb15"`` (need ``root``).
        root: CSV file or folder for the real datasets.
        novel_classes: few-shot classes (``None``: :data:`DEFAULT_NOVEL`); all others are base.
        num_clients: clients of the Dirichlet partition.
        alpha: Dirichlet concentration (small = high skew).
        samples_per_class: simulated rows per class.
        world: how simulated class statistics relate to the labels (:func:`simulate_flows`):
            ``"mechanisms"``, ``"families"`` (related classes statistically close), ``"leaky"`` (upper
            bound) or ``"decoupled"`` (null).
        class_share: the class-own share ``s`` of a simulated class's statistics (``"mechanisms"``
            and ``"families"`` worlds; the rest is shared with its mechanisms or family).
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
        source: Literal["simulated", "cicids2017", "cicddos2019", "unsw-nb15"] = "simulated",
        root: str | None = None,
        novel_classes: list[str] | None = None,
        num_clients: int = 8,
        alpha: float = 0.3,
        samples_per_class: int = 400,
        world: str = "mechanisms",
        class_share: float = 0.5,
        max_rows_per_class: int | None = 5000,
        val_fraction: float = 0.1,
        client_id: int | None = None,
        rounds: int = 0,
        batch_size: int = 128,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"FlowsDataModule: `source`={source!r}, expected one of {SOURCES}")
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
        if world not in WORLDS:
            raise ValueError(f"FlowsDataModule: `world`={world!r}, expected one of {WORLDS}")
        if not 0.0 <= class_share <= 1.0:
            raise ValueError(f"FlowsDataModule: `class_share`={class_share!r}, expected in [0, 1]")
        self.world, self.class_share = world, class_share
        self.val_fraction, self.client_id, self.rounds = val_fraction, client_id, rounds
        self.batch_size, self.seed = batch_size, seed
        self._ready = False

    @property
    def num_features(self) -> int:
        return len(UNSW_FEATURES if self.source == "unsw-nb15" else FLOW_FEATURES)

    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        if self.source == "simulated":
            x, labels = simulate_flows(self.samples_per_class, seed=self.seed, world=self.world,
                                       class_share=self.class_share)
        elif self.source == "unsw-nb15":
            x, labels = load_unsw_csv(self.root)[:2]
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
        # the novel (rare-attack) rows are spread over the clients with the same skew: each client
        # adapts on its own few labelled flows and is scored on its own traffic
        self.novel_partitions = dirichlet_partition(self.novel_y.numpy(), self.num_clients, self.alpha,
                                                    seed=self.seed + 1, min_size=0)
        self._ready = True

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Base-train features and labels of client ``client``."""
        self.setup()
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client_data: `client`={client!r}, expected in [0, {self.num_clients})")
        idx = torch.as_tensor(self.partitions[client])
        return self.train_x[idx], self.train_y[idx]

    def client_novel(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Novel-class features and labels held by client ``client`` (its few-shot pool)."""
        self.setup()
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client_novel: `client`={client!r}, expected in [0, {self.num_clients})")
        idx = torch.as_tensor(self.novel_partitions[client])
        return self.novel_x[idx], self.novel_y[idx]

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
