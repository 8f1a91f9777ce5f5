"""LightningDataModules: each has an embedded offline default and a real loader.

Image batches: ``{"x", "y", "category"}``; packed LM batches: ``{"input_ids", "labels",
"position_ids", "doc_ids", "category"}``; text classification: ``{"x",
"attention_mask", "y"}``; graphs: one full-batch ``torch_geometric.data.Data``.

Names are imported on first use, so ``from lit_lowrank.datamodules import
DigitsDataModule`` does not pay torch_geometric's import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.datamodules.csbm import contextual_sbm, edge_homophily  # noqa: F401
    from lit_lowrank.datamodules.domain_shift import (  # noqa: F401
        DomainFolderDataModule,
        ShiftedDigitsDataModule,
        apply_shift,
    )
    from lit_lowrank.datamodules.fewshot import CoOpFewShotDataModule, FewShotDigitsDataModule  # noqa: F401
    from lit_lowrank.datamodules.graphs import GraphDataModule, load_drosophila  # noqa: F401
    from lit_lowrank.datamodules.homodyne import HomodyneDataModule  # noqa: F401
    from lit_lowrank.datamodules.images import (  # noqa: F401
        CIFAR10_SUPERCLASSES,
        CIFAR100_COARSE_NAMES,
        DIGIT_SUPERCLASSES,
        CIFARDataModule,
        DigitsDataModule,
        ImageFolderDataModule,
    )
    from lit_lowrank.datamodules.mnist import MNISTDataModule  # noqa: F401
    from lit_lowrank.datamodules.replay import ReplayDataModule  # noqa: F401
    from lit_lowrank.datamodules.text import PackedTextDataModule, TextClassificationDataModule  # noqa: F401
    from lit_lowrank.datamodules.tokenizers import ByteTokenizer, get_tokenizer  # noqa: F401

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
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, {k: f"{__name__}.{v}" for k, v in _EXPORTS.items()}, globals())
