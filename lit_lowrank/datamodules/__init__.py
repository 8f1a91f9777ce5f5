"""LightningDataModules: each has an embedded offline default and a real loader.

Image batches: ``{"x", "y", "category"}``; packed LM batches: ``{"input_ids", "labels",
"position_ids", "doc_ids", "category"}``; text classification: ``{"x",
"attention_mask", "y"}``; graphs: one full-batch ``torch_geometric.data.Data``.

Names are imported on first use, so ``from lit_lowrank.datamodules import
DigitsDataModule`` does not pay torch_geometric's import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from lit_lowrank.datamodules.csbm import contextual_sbm, edge_homophily
    from lit_lowrank.datamodules.graphs import GraphDataModule, load_drosophila
    from lit_lowrank.datamodules.images import (
        CIFAR10_SUPERCLASSES,
        CIFAR100_COARSE_NAMES,
        DIGIT_SUPERCLASSES,
        CIFARDataModule,
        DigitsDataModule,
        ImageFolderDataModule,
    )
    from lit_lowrank.datamodules.text import PackedTextDataModule, TextClassificationDataModule
    from lit_lowrank.datamodules.tokenizers import ByteTokenizer, get_tokenizer

_EXPORTS = {
    "contextual_sbm": "csbm",
    "edge_homophily": "csbm",
    "GraphDataModule": "graphs",
    "load_drosophila": "graphs",
    "CIFAR10_SUPERCLASSES": "images",
    "CIFAR100_COARSE_NAMES": "images",
    "DIGIT_SUPERCLASSES": "images",
    "CIFARDataModule": "images",
    "DigitsDataModule": "images",
    "HomodyneDataModule": "homodyne",
    "FewShotDigitsDataModule": "fewshot",
    "CoOpFewShotDataModule": "fewshot",
    "ImageFolderDataModule": "images",
    "MNISTDataModule": "mnist",
    "PackedTextDataModule": "text",
    "ReplayDataModule": "replay",
    "TextClassificationDataModule": "text",
    "ShiftedDigitsDataModule": "domain_shift",
    "DomainFolderDataModule": "domain_shift",
    "apply_shift": "domain_shift",
    "ByteTokenizer": "tokenizers",
    "get_tokenizer": "tokenizers",
}
__all__ = [
    "ReplayDataModule",
    "FewShotDigitsDataModule",
    "CoOpFewShotDataModule",
    "HomodyneDataModule",
    "MNISTDataModule",
    "ShiftedDigitsDataModule",
    "DomainFolderDataModule",
    "apply_shift",
    "ByteTokenizer",
    "CIFAR100_COARSE_NAMES",
    "CIFAR10_SUPERCLASSES",
    "CIFARDataModule",
    "DIGIT_SUPERCLASSES",
    "DigitsDataModule",
    "GraphDataModule",
    "ImageFolderDataModule",
    "PackedTextDataModule",
    "TextClassificationDataModule",
    "contextual_sbm",
    "edge_homophily",
    "get_tokenizer",
    "load_drosophila",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
