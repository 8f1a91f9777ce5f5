"""The real MNIST loader (torchvision, local root) in the digits datamodule's shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lit_lowrank.datamodules.images import DigitsDataModule


class MNISTDataModule(DigitsDataModule):
    """The 70,000 MNIST digits from a local torchvision root (28x28, pixels in [0, 1]).

    Same batches as :class:`DigitsDataModule` (``x`` ``(B, 1, 28, 28)``, ``y``, ``category``),
    same seeded stratified splits over the pooled train+test images; its embedded
    stand-in is ``DigitsDataModule(source="mnist5k")`` (5,000 real MNIST digits).

    Args:
        root: the folder holding ``MNIST/raw/`` (torchvision layout).
        download: let torchvision download into ``root`` (needs a network).
        Other arguments: as :class:`DigitsDataModule`.

    .. code-block:: python

        dm = MNISTDataModule(root="/data/torchvision", batch_size=128)
        dm.setup("fit")   # FileNotFoundError naming the path when MNIST is absent
    """

    def __init__(self, root: str, batch_size: int = 128, val_fraction: float = 0.1, test_fraction: float = 0.1,
                 seed: int = 0, num_workers: int = 0, normalize: bool = True, download: bool = False) -> None:
        super().__init__(source="mnist5k", batch_size=batch_size, val_fraction=val_fraction,
                         test_fraction=test_fraction, seed=seed, num_workers=num_workers, normalize=normalize)
        self.root = root
        self.download = download

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        from torchvision.datasets import MNIST

        try:
            parts = [MNIST(self.root, train=train, download=self.download) for train in (True, False)]
        except RuntimeError as err:  # torchvision: "Dataset not found. You can use download=True ..."
            raise FileNotFoundError(
                f"`root`={self.root!r}: MNIST not found (expected {Path(self.root) / 'MNIST' / 'raw'} with the "
                "train/t10k idx files); pass download=True where a network exists") from err
        images = np.concatenate([p.data.numpy() for p in parts]).astype(np.float32) / 255.0
        labels = np.concatenate([p.targets.numpy() for p in parts]).astype(np.int64)
        return images, labels
