"""Source-free domain adaptation data: embedded shifted digits and real domain folders.

Protocol (as in SHOT and its successors): the source model is trained on the clean
source domain beforehand (:class:`~lit_lowrank.datamodules.DigitsDataModule`, same
``seed`` and fractions); adaptation sees the *unlabelled* target images and is
evaluated on the same target images (transductive). Batches still carry ``y`` so
evaluation can score them; a task module in target-adaptation mode never reads ``y``
in ``training_step`` (``ClassificationModule(supervised=False)``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lit_lowrank.datamodules._common import DictDataset, SplitDataModule, stratified_split
from lit_lowrank.datamodules._paths import require_path
from lit_lowrank.datamodules.images import _IMAGENET_STATS, DigitsDataModule

Shift = Literal["rotate", "noise", "invert", "blur", "rotate_noise"]
SHIFTS: tuple[str, ...] = ("rotate", "noise", "invert", "blur", "rotate_noise")


def apply_shift(images: Tensor, shift: str, severity: float = 1.0, seed: int = 0) -> Tensor:
    """Shift images ``(N, 1, H, W)`` with pixels in [0, 1]; seeded, returns a new tensor.

    ``rotate``: a random rotation of ±(20°..45°)·severity per image; ``noise``:
    additive Gaussian noise of std 0.35·severity, clipped to [0, 1]; ``invert``:
    ``1 − x`` blended with weight min(severity, 1); ``blur``: a Gaussian blur with σ =
    0.8·severity pixels; ``rotate_noise``: both.
    """
    if shift not in SHIFTS:
        raise ValueError(f"`shift`={shift!r}, expected one of {SHIFTS}.")
    if images.dim() != 4:
        raise ValueError(f"`images` must be (N, C, H, W), got shape {tuple(images.shape)}.")
    g = torch.Generator().manual_seed(seed)
    x = images.float()
    if shift in ("rotate", "rotate_noise"):
        magnitude = (20 + 25 * torch.rand(len(x), generator=g)) * severity
        sign = torch.randint(0, 2, (len(x),), generator=g) * 2 - 1
        theta = torch.deg2rad(magnitude * sign)
        cos, sin = theta.cos(), theta.sin()
        affine = torch.stack([torch.stack([cos, -sin, torch.zeros_like(cos)], 1),
                              torch.stack([sin, cos, torch.zeros_like(cos)], 1)], 1)
        grid = F.affine_grid(affine, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")
    if shift in ("noise", "rotate_noise"):
        x = (x + 0.35 * severity * torch.randn(x.shape, generator=g)).clamp(0, 1)
    if shift == "invert":
        w = min(severity, 1.0)
        x = (1 - w) * x + w * (1 - x)
    if shift == "blur":
        sigma = 0.8 * severity
        radius = max(1, math.ceil(2 * sigma))
        taps = torch.exp(-torch.arange(-radius, radius + 1).float() ** 2 / (2 * sigma**2))
        taps = taps / taps.sum()
        c = x.shape[1]
        x = F.conv2d(x, taps.view(1, 1, 1, -1).repeat(c, 1, 1, 1), padding=(0, radius), groups=c)
        x = F.conv2d(x, taps.view(1, 1, -1, 1).repeat(c, 1, 1, 1), padding=(radius, 0), groups=c)
    return x


class ShiftedDigitsDataModule(DigitsDataModule):
    """Target domain for source-free adaptation: the digits a source
    :class:`DigitsDataModule` (same ``source``, ``seed`` and fractions) did *not* train
    on, under a seeded shift, standardised with the *clean* training statistics so a
    source model sees them through its own preprocessing.

    Train, val and test loaders all iterate the shifted target images (transductive
    SFDA); only the train loader shuffles. ``is_validation`` ``(N,)`` marks the target
    images that came from the source split's validation fraction: a benchmark may read
    their labels to select hyperparameters and report accuracy on the others only.

    Args:
        shift: ``"rotate"``, ``"noise"``, ``"invert"``, ``"blur"`` or ``"rotate_noise"``.
        severity: shift strength (1.0 = the documented default magnitude).

    .. code-block:: python

        source = DigitsDataModule(seed=0)                  # train the source model here
        target = ShiftedDigitsDataModule(shift="rotate", seed=0)
        trainer.fit(ClassificationModule(..., supervised=False), datamodule=target)
    """

    def __init__(
        self,
        shift: Shift = "rotate",
        severity: float = 1.0,
        source: Literal["sklearn", "mnist5k"] = "sklearn",
        batch_size: int = 128,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        if shift not in SHIFTS:
            raise ValueError(f"`shift`={shift!r}, expected one of {SHIFTS}.")
        if severity <= 0:
            raise ValueError(f"`severity`={severity}, expected a positive number.")
        super().__init__(source, batch_size, val_fraction, test_fraction, seed, num_workers, normalize=True)
        self.shift, self.severity = shift, severity

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        super().setup(stage)  # clean splits and clean normalisation statistics
        images, labels = self._load()
        train, val, test = stratified_split(labels, (self.val_fraction, self.test_fraction), self.seed)
        target = np.sort(np.concatenate([val, test]))
        self.is_validation = torch.from_numpy(np.isin(target, val))
        x = apply_shift(torch.from_numpy(images[target]).unsqueeze(1), self.shift, self.severity, self.seed)
        x = (x - self.mean) / self.std
        y = torch.from_numpy(labels[target])
        self.train_set = DictDataset({"x": x, "y": y, "category": self.fine_to_coarse[y]})
        self.val_set = self.test_set = self.train_set


class DomainFolderDataModule(SplitDataModule):
    """Real SFDA benchmarks laid out as one ImageFolder per domain (Office-31,
    Office-Home, VisDA-2017, DomainNet): ``root/<domain>/<class>/*.jpg``.

    ``source_domain`` feeds source pre-training (``stage="source"``); the default
    target stage yields the unlabelled-for-training ``target_domain`` images, evaluated
    transductively. A missing folder raises an error naming the path expected.

    .. code-block:: python

        dm = DomainFolderDataModule("data/office31", source_domain="amazon", target_domain="webcam")
    """

    def __init__(
        self,
        root: str,
        source_domain: str,
        target_domain: str,
        stage: Literal["source", "target"] = "target",
        image_size: int = 224,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if stage not in ("source", "target"):
            raise ValueError(f"`stage`={stage!r}, expected 'source' or 'target'.")
        self.root, self.source_domain, self.target_domain, self.stage = root, source_domain, target_domain, stage
        self.image_size, self.batch_size, self.seed, self.num_workers = image_size, batch_size, seed, num_workers
        self.train_set = None

    @property
    def domain_dir(self) -> Path:
        domain = self.source_domain if self.stage == "source" else self.target_domain
        return Path(self.root) / domain

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_set is not None:
            return
        require_path(self.domain_dir, "root", f"one folder per class of domain '{self.domain_dir.name}'")
        from torchvision import transforms
        from torchvision.datasets import ImageFolder

        tf = transforms.Compose([
            transforms.Resize(self.image_size), transforms.CenterCrop(self.image_size), transforms.ToTensor(),
            transforms.Normalize(*_IMAGENET_STATS),
        ])
        folder = ImageFolder(str(self.domain_dir), transform=tf)
        self.class_names = folder.classes
        self.num_classes = len(folder.classes)
        self.train_set = self.val_set = self.test_set = _DictImages(folder)


class _DictImages(torch.utils.data.Dataset):
    """An ImageFolder as dict items ``{"x", "y"}``."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        x, y = self.folder[index]
        return {"x": x, "y": torch.tensor(y)}


def mnist_as_digits8() -> tuple[Tensor, Tensor]:
    """The 5,000 real MNIST digits rendered like scikit-learn's 8x8 digits: ``(5000, 1, 8, 8)``
    pixels in [0, 1] and ``(5000,)`` labels.

    Another dataset of the same ten classes (other writers, other scanning, other
    stroke widths): MNIST's central 20x20 box (where its digits are size-normalised),
    area-downsampled to 8x8 and scaled so each image's brightest pixel is 1, as
    scikit-learn's digits (4x4 block counts of a 32x32 bitmap, over 16) roughly are.
    The second model of :class:`~lit_lowrank.callbacks.SafeCut`'s benchmark trains on
    it: it never sees the scikit-learn digits nor any shift.
    """
    data = DigitsDataModule(source="mnist5k", normalize=False)
    images, labels = data._load()
    x = torch.from_numpy(images).unsqueeze(1)[:, :, 4:24, 4:24]
    x = F.interpolate(x, size=(8, 8), mode="area")
    x = x / x.amax(dim=(2, 3), keepdim=True).clamp_min(1e-6)
    return x, torch.from_numpy(labels)
