"""Shared pieces of the datamodules: a dict-of-tensors dataset, stratified splits, loaders."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset


class DictDataset(Dataset):
    """Rows of equally long tensors, returned as ``{key: tensor[i]}``.

    Args:
        tensors: name -> tensor, all with the same first dimension.
        transform: applied to ``item[transform_key]`` (per sample, so random
            augmentation differs between samples).
        transform_key: which entry the transform acts on.
    """

    def __init__(
        self,
        tensors: dict[str, Tensor],
        transform: Optional[Callable[[Tensor], Tensor]] = None,
        transform_key: str = "x",
    ) -> None:
        lengths = {name: len(t) for name, t in tensors.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"tensors: all entries need the same length, got {lengths}")
        self.tensors = tensors
        self.transform = transform
        self.transform_key = transform_key

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        item = {name: t[index] for name, t in self.tensors.items()}
        if self.transform is not None:
            item[self.transform_key] = self.transform(item[self.transform_key])
        return item

    def subset(self, indices: Sequence[int] | np.ndarray | Tensor, transform=None) -> "DictDataset":
        """Rows ``indices`` as a new dataset (copies the selected rows)."""
        index = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        return DictDataset({k: t[index] for k, t in self.tensors.items()}, transform, self.transform_key)


def check_fractions(**fractions: float) -> None:
    """Raise ``ValueError`` naming the parameters unless each is in [0, 1) and their sum < 1."""
    for name, value in fractions.items():
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name}: expected a fraction in [0, 1), got {value}")
    if sum(fractions.values()) >= 1.0:
        names = " + ".join(fractions)
        raise ValueError(f"{names}: must sum to < 1 to leave training data, got {sum(fractions.values())}")


def stratified_split(
    labels: np.ndarray | Tensor, fractions: Sequence[float], seed: int | Sequence[int]
) -> list[np.ndarray]:
    """Split indices per class: ``fractions[k]`` of each class to part ``k + 1``, the rest to part 0.

    Per-class rounding keeps every class in every part (GPRGNN-style random splits).
    Returns ``len(fractions) + 1`` sorted index arrays that are disjoint and cover
    ``range(len(labels))``.

    Example:
        .. code-block:: python

            train, val, test = stratified_split(y, (0.2, 0.2), seed=0)
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fractions) + 1)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        start = 0
        for k, fraction in enumerate(fractions):
            count = int(round(fraction * len(members)))
            parts[k + 1].append(members[start : start + count])
            start += count
        parts[0].append(members[start:])
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]


def make_loader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool,
    seed: int,
    num_workers: int = 0,
    collate_fn: Optional[Callable] = None,
) -> DataLoader:
    """A ``DataLoader`` whose shuffling is seeded, so two runs see the same batches."""
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        generator=generator,
        collate_fn=collate_fn,
        persistent_workers=num_workers > 0,
    )


class SplitDataModule(pl.LightningDataModule):
    """Loaders over ``train_set`` / ``val_set`` / ``test_set`` (``test_set`` falls back to
    ``val_set`` where a dataset has no separate test split), shuffled with a seeded
    generator. Subclasses set ``batch_size``, ``seed``, ``num_workers`` and the sets."""

    batch_size: int
    seed: int
    num_workers: int

    def train_dataloader(self) -> DataLoader:
        return make_loader(self.train_set, self.batch_size, True, self.seed, self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self.val_set, self.batch_size, False, self.seed, self.num_workers)

    def test_dataloader(self) -> DataLoader:
        test_set = getattr(self, "test_set", None)
        return make_loader(self.val_set if test_set is None else test_set, self.batch_size, False, self.seed,
                           self.num_workers)
