"""Source-free adaptation data: MNIST rendered as 8x8 digits, the target's validation part,
and the cross-dataset second model trained on it."""

from __future__ import annotations

import torch

from lit_lowrank.datamodules import DigitsDataModule, ShiftedDigitsDataModule
from lit_lowrank.datamodules.domain_shift import mnist_as_digits8


def test_mnist_as_digits8_is_balanced_and_scaled():
    x, y = mnist_as_digits8()
    assert x.shape == (5000, 1, 8, 8) and y.shape == (5000,)
    assert float(x.min()) >= 0.0 and torch.allclose(x.amax(dim=(1, 2, 3)), torch.ones(5000))
    assert torch.equal(torch.bincount(y), torch.full((10,), 500))


def test_target_marks_the_images_of_the_source_validation_split():
    target = ShiftedDigitsDataModule(shift="rotate", seed=0, val_fraction=0.2, test_fraction=0.2)
    target.setup("fit")
    n = len(target.train_set.tensors["y"])
    assert target.is_validation.shape == (n,) and 0.4 < float(target.is_validation.float().mean()) < 0.6


def test_cross_dataset_model_transfers_to_sklearn_digits_and_caches(tmp_path, monkeypatch, one_thread):
    from lit_lowrank.models import CrossDatasetDigitClassifier

    monkeypatch.setenv("LIT_LOWRANK_CACHE", str(tmp_path))
    model = CrossDatasetDigitClassifier(seed=0, epochs=1)
    assert len(list((tmp_path / "safecut").glob("*.pt"))) == 1
    clean = DigitsDataModule(seed=0)
    clean.setup("fit")
    x, y = clean.test_set.tensors["x"], clean.test_set.tensors["y"]
    with torch.no_grad():
        acc = float((model(x).argmax(-1) == y).float().mean())
    assert acc > 0.5  # never saw a scikit-learn digit, far above chance (0.1)
    again = CrossDatasetDigitClassifier(seed=0, epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
