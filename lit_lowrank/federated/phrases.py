"""Label phrases and their cached sentence embeddings (the prior bank's keys).

Each canonical flow label has a short descriptive phrase (what the attack does), embedded
with the shipped all-MiniLM-L6-v2 (:func:`lit_lowrank.models.pretrained.encode_sentences`).
Where MiniLM is not installed, ``encoder="tfidf"`` uses TF-IDF character 3–5-grams of the
phrases (METHODS.md §5's fallback). Embeddings are cached in memory and on disk
(``$LIT_LOWRANK_CACHE/phrase_embeddings/<encoder>.npz``), so a federation pays MiniLM once.

.. code-block:: python

    from lit_lowrank.federated.phrases import phrase_embeddings

    keys = phrase_embeddings(["DoS Hulk", "SSH-Patator"])     # (2, 384), unit rows
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch

#: Canonical label -> descriptive phrase (unknown labels embed their own name).
LABEL_PHRASES: dict[str, str] = {
    "BENIGN": "benign normal network traffic",
    "DoS Hulk": "DoS Hulk HTTP flood denial of service attack",
    "DoS GoldenEye": "DoS GoldenEye HTTP keep-alive flood denial of service attack",
    "DoS slowloris": "DoS slowloris slow HTTP headers denial of service attack",
    "DoS Slowhttptest": "DoS slowhttptest slow HTTP body denial of service attack",
    "DDoS": "distributed denial of service DDoS flood attack from many hosts",
    "PortScan": "port scan network reconnaissance probing",
    "FTP-Patator": "FTP Patator brute force password login attack",
    "SSH-Patator": "SSH Patator brute force password login attack",
    "Bot": "botnet command and control traffic",
    "Web Attack Brute Force": "web attack brute force login on a web form",
    "Web Attack XSS": "web attack cross-site scripting XSS injection",
    "Web Attack Sql Injection": "web attack SQL injection into a web application",
    "Infiltration": "infiltration of the internal network after a compromise",
    "Heartbleed": "Heartbleed OpenSSL memory leak exploit",
    "DrDoS_DNS": "DNS reflection amplification DDoS attack",
    "DrDoS_LDAP": "LDAP reflection amplification DDoS attack",
    "DrDoS_MSSQL": "MSSQL reflection amplification DDoS attack",
    "DrDoS_NetBIOS": "NetBIOS reflection amplification DDoS attack",
    "DrDoS_NTP": "NTP reflection amplification DDoS attack",
    "DrDoS_SNMP": "SNMP reflection amplification DDoS attack",
    "DrDoS_SSDP": "SSDP reflection amplification DDoS attack",
    "DrDoS_UDP": "UDP flood DDoS attack",
    "Syn": "TCP SYN flood DDoS attack",
    "TFTP": "TFTP reflection amplification DDoS attack",
    "UDP-lag": "UDP lag flood DDoS attack",
    "WebDDoS": "web application layer DDoS attack",
    "Portmap": "portmap reflection DDoS attack",
    "LDAP": "LDAP exploitation DDoS attack",
    "MSSQL": "MSSQL exploitation DDoS attack",
    "NetBIOS": "NetBIOS exploitation DDoS attack",
    "UDP": "UDP flood DDoS attack",
    # UNSW-NB15 attack categories
    "Normal": "normal benign network traffic",
    "Generic": "generic attack on block ciphers with crafted inputs",
    "Exploits": "exploit of a known software vulnerability",
    "Fuzzers": "fuzzing a service with random malformed inputs to crash it",
    "DoS": "denial of service attack",
    "Reconnaissance": "reconnaissance scanning and probing of hosts",
    "Analysis": "analysis intrusions: port scans, spam and HTML file penetration",
    "Backdoor": "backdoor bypassing authentication for hidden remote access",
    "Shellcode": "shellcode payload injected through a vulnerability",
    "Worms": "self-replicating worm spreading to other hosts",
}


def label_phrase(label: str) -> str:
    """The descriptive phrase of a canonical label (the label itself when none is listed)."""
    return LABEL_PHRASES.get(label, label)


def _cache_file(encoder: str) -> Path:
    root = Path(os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank")
    if encoder == "tfidf":
        # TF-IDF's width and weights depend on the phrase vocabulary: the file names the vocabulary,
        # so adding phrases never mixes vectors of two vocabularies in one cache
        vocab = hashlib.sha1("\n".join(sorted(set(LABEL_PHRASES.values()))).encode()).hexdigest()[:10]
        return root / "phrase_embeddings" / f"tfidf-{vocab}.npz"
    return root / "phrase_embeddings" / f"{encoder}.npz"


_MEMORY: dict[str, dict[str, np.ndarray]] = {}


def _load_cache(encoder: str) -> dict[str, np.ndarray]:
    if encoder not in _MEMORY:
        path = _cache_file(encoder)
        _MEMORY[encoder] = {}
        if path.is_file():
            with np.load(path) as data:
                _MEMORY[encoder] = {str(p): v for p, v in zip(data["phrases"], data["vectors"])}
    return _MEMORY[encoder]


@lru_cache(maxsize=1)
def _tfidf():
    from sklearn.feature_extraction.text import TfidfVectorizer

    # fitted on the fixed phrase vocabulary, so a phrase's vector does not depend on the query set
    return TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5)).fit(sorted(set(LABEL_PHRASES.values())))


def _embed(phrases: tuple[str, ...], encoder: str) -> np.ndarray:
    cache = _load_cache(encoder)
    missing = sorted({p for p in phrases if p not in cache})
    if missing:
        if encoder == "minilm":
            from lit_lowrank.models.pretrained import encode_sentences

            vectors = encode_sentences(missing).numpy().astype(np.float32)
        else:
            mat = _tfidf().transform(missing).toarray()
            vectors = (mat / np.maximum(np.linalg.norm(mat, axis=1, keepdims=True), 1e-12)).astype(np.float32)
        cache.update(zip(missing, vectors))
        try:
            path = _cache_file(encoder)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
            names = sorted(cache)
            np.savez(tmp, phrases=np.array(names), vectors=np.stack([cache[n] for n in names]))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache only costs a re-encode
    return np.stack([cache[p] for p in phrases])


def phrase_embeddings(labels: Sequence[str], encoder: Literal["minilm", "tfidf"] = "minilm") -> torch.Tensor:
    """Unit-norm embeddings of the labels' phrases, ``(len(labels), E)``.

    Each phrase is embedded once and cached (memory and disk); TF-IDF is fitted on the fixed
    :data:`LABEL_PHRASES` vocabulary, so both encoders give a phrase the same vector in any call.

    .. code-block:: python

        emb = phrase_embeddings(base_labels + novel_labels, encoder="minilm")
    """
    if encoder not in ("minilm", "tfidf"):
        raise ValueError(f"phrase_embeddings: `encoder`={encoder!r}, expected 'minilm' or 'tfidf'")
    return torch.from_numpy(_embed(tuple(label_phrase(lab) for lab in labels), encoder).copy())
