"""Image datamodules: embedded digits, CIFAR from fake python batches, ImageFolder from tiny PNGs."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from lit_lowrank.datamodules.images import (
    CIFAR10_SUPERCLASSES,
    CIFAR100_COARSE_NAMES,
    CIFAR100_FINE_TO_COARSE,
    DIGIT_SUPERCLASSES,
    CIFARDataModule,
    DigitsDataModule,
    ImageFolderDataModule,
)


def _all(dataset, key):
    return dataset.tensors[key]


# ---------------------------------------------------------------- digits

@pytest.mark.parametrize(("source", "size", "total"), [("sklearn", 8, 1797), ("mnist5k", 28, 5000)])
def test_digits_batches_and_attributes(source, size, total):
    dm = DigitsDataModule(source=source, batch_size=32)
    # Attributes exist before setup (LightningCLI links them at instantiation).
    assert (dm.num_classes, dm.num_categories, dm.in_chans, dm.image_size) == (10, 3, 1, size)
    assert dm.category_names == ["loops", "strokes", "curves"]
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"x", "y", "category"}
    assert batch["x"].shape == (32, 1, size, size) and batch["x"].dtype == torch.float32
    assert batch["y"].dtype == torch.long and batch["category"].dtype == torch.long
    assert sum(len(s) for s in (dm.train_set, dm.val_set, dm.test_set)) == total


def test_digit_categories_follow_superclasses():
    assert sorted(d for group in DIGIT_SUPERCLASSES.values() for d in group) == list(range(10))
    dm = DigitsDataModule()
    assert dm.fine_to_coarse.tolist() == [0, 1, 2, 2, 1, 2, 0, 1, 0, 0]
    dm.setup()
    for part in (dm.train_set, dm.val_set, dm.test_set):
        assert torch.equal(_all(part, "category"), dm.fine_to_coarse[_all(part, "y")])


def test_digit_splits_disjoint_covering_stratified_and_seeded():
    def split_images(seed):
        dm = DigitsDataModule(seed=seed, normalize=False)
        dm.setup()
        return dm, [_all(s, "x").flatten(1) for s in (dm.train_set, dm.val_set, dm.test_set)]

    dm, parts = split_images(0)
    sizes = [len(p) for p in parts]
    assert sum(sizes) == 1797 and abs(sizes[1] / 1797 - 0.2) < 0.01 and abs(sizes[2] / 1797 - 0.2) < 0.01
    for part in (dm.train_set, dm.val_set, dm.test_set):  # every class in every split
        assert torch.bincount(_all(part, "y"), minlength=10).min() > 0
    _, again = split_images(0)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    _, other = split_images(1)
    assert not torch.equal(parts[1], other[1])


def test_digits_normalize_uses_train_statistics():
    dm = DigitsDataModule(normalize=True)
    dm.setup()
    x = _all(dm.train_set, "x")
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3
    raw = DigitsDataModule(normalize=False)
    raw.setup()
    assert float(_all(raw.train_set, "x").min()) == 0.0 and float(_all(raw.train_set, "x").max()) == 1.0


def test_digits_shuffle_is_seeded():
    first = []
    for _ in range(2):
        dm = DigitsDataModule(seed=3)
        dm.setup()
        first.append(next(iter(dm.train_dataloader()))["y"])
    assert torch.equal(first[0], first[1])


def test_digits_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="source"):
        DigitsDataModule(source="emnist")
    with pytest.raises(ValueError, match="val_fraction"):
        DigitsDataModule(val_fraction=0.6, test_fraction=0.5)


# ---------------------------------------------------------------- CIFAR

def _write_cifar100(root, n_train=60, n_test=20):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    table = np.asarray(CIFAR100_FINE_TO_COARSE)
    for name, n in (("train", n_train), ("test", n_test)):
        fine = rng.integers(0, 100, n)
        entry = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"fine_labels": fine.tolist(), b"coarse_labels": table[fine].tolist()}
        (folder / name).write_bytes(pickle.dumps(entry))
    (folder / "meta").write_bytes(pickle.dumps({b"coarse_label_names": list(CIFAR100_COARSE_NAMES)}))
    return folder


def _write_cifar10(root, n_per_batch=8):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {b"data": rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, n_per_batch).tolist()}
        (folder / name).write_bytes(pickle.dumps(entry))
    return folder


def test_cifar100_fine_to_coarse_has_five_classes_per_superclass():
    counts = np.bincount(CIFAR100_FINE_TO_COARSE, minlength=20)
    assert len(CIFAR100_FINE_TO_COARSE) == 100 and (counts == 5).all()


def test_cifar100_reads_fine_and_coarse_labels(tmp_path):
    folder = _write_cifar100(tmp_path)
    dm = CIFARDataModule(root=str(tmp_path), variant=100, batch_size=8, val_fraction=0.2)
    assert (dm.num_classes, dm.num_categories, dm.in_chans, dm.image_size) == (100, 20, 3, 32)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == (8, 3, 32, 32) and batch["x"].dtype == torch.float32
    assert torch.equal(batch["category"], dm.fine_to_coarse[batch["y"]])
    assert len(dm.train_set) + len(dm.val_set) == 60 and len(dm.test_set) == 20
    # Evaluation transform = scale to [0, 1] and normalise, nothing random.
    raw = pickle.loads((folder / "test").read_bytes())
    first = torch.from_numpy(raw[b"data"][0].reshape(3, 32, 32)).float() / 255
    mean, std = torch.tensor([0.5071, 0.4865, 0.4409]), torch.tensor([0.2673, 0.2564, 0.2762])
    expected = (first - mean[:, None, None]) / std[:, None, None]
    assert torch.allclose(dm.test_set[0]["x"], expected, atol=1e-5)
    assert dm.test_set[0]["category"] == raw[b"coarse_labels"][0]


def test_cifar10_category_is_vehicles_vs_animals(tmp_path):
    _write_cifar10(tmp_path)
    dm = CIFARDataModule(root=str(tmp_path), variant=10, batch_size=4, val_fraction=0.0, augment=False)
    assert dm.category_names == ["vehicles", "animals"] and dm.num_categories == 2
    dm.setup()
    assert len(dm.train_set) == 40 and len(dm.test_set) == 8
    y, cat = dm.train_set.tensors["y"], dm.train_set.tensors["category"]
    vehicles = torch.isin(y, torch.tensor(CIFAR10_SUPERCLASSES["vehicles"]))
    assert torch.equal(cat, (~vehicles).long())


def test_cifar_missing_root_names_root_path_and_download(tmp_path):
    dm = CIFARDataModule(root=str(tmp_path / "nowhere"), variant=100)
    with pytest.raises(FileNotFoundError) as info:
        dm.setup()
    message = str(info.value)
    assert "root" in message and str(tmp_path / "nowhere" / "cifar-100-python") in message
    assert "download=True" in message


# ---------------------------------------------------------------- ImageFolder

def _write_image_tree(root):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("car", "cat", "dog"):
            (root / split / cls).mkdir(parents=True)
            for i in range(2):
                pixels = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"{i}.png")


def test_image_folder_with_superclass_map(tmp_path):
    _write_image_tree(tmp_path)
    mapping = tmp_path / "super.json"
    mapping.write_text(json.dumps({"cat": "animal", "dog": "animal", "car": "vehicle"}))
    dm = ImageFolderDataModule(root=str(tmp_path), superclass_map=str(mapping), image_size=16, batch_size=6)
    assert dm.class_names == ["car", "cat", "dog"] and dm.num_classes == 3
    assert dm.category_names == ["animal", "vehicle"] and dm.fine_to_coarse.tolist() == [1, 0, 0]
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == (6, 3, 16, 16) and batch["x"].dtype == torch.float32
    assert torch.equal(batch["category"], dm.fine_to_coarse[batch["y"]])
    val = next(iter(dm.test_dataloader()))
    assert val["x"].shape == (6, 3, 16, 16) and sorted(val["y"].tolist()) == [0, 0, 1, 1, 2, 2]


def test_image_folder_without_map_uses_classes_as_categories(tmp_path):
    _write_image_tree(tmp_path)
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=8)
    assert dm.category_names == ["car", "cat", "dog"] and dm.fine_to_coarse.tolist() == [0, 1, 2]


def test_image_folder_errors(tmp_path):
    _write_image_tree(tmp_path)
    mapping = tmp_path / "partial.json"
    mapping.write_text(json.dumps({"cat": "animal", "dog": "animal"}))
    with pytest.raises(ValueError, match=r"car.*partial\.json"):
        ImageFolderDataModule(root=str(tmp_path), superclass_map=str(mapping)).setup()
    with pytest.raises(FileNotFoundError, match="root"):
        ImageFolderDataModule(root=str(tmp_path / "missing")).setup()
    with pytest.raises(FileNotFoundError, match="superclass_map"):
        ImageFolderDataModule(root=str(tmp_path), superclass_map=str(tmp_path / "no.json")).setup()


@pytest.mark.parametrize("cls", [DigitsDataModule, CIFARDataModule, ImageFolderDataModule])
def test_signature_parses_with_jsonargparse(cls):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(cls, "data")
    cfg = parser.parse_args(["--data.root=/tmp/x"] if cls is not DigitsDataModule else [])
    assert cfg.data.batch_size > 0


def test_stratified_split_is_disjoint_covering_and_per_class():
    from lit_lowrank.datamodules._common import stratified_split

    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    train, val, test = stratified_split(labels, (0.2, 0.1), seed=0)
    joined = np.concatenate([train, val, test])
    assert len(joined) == 100 and set(joined.tolist()) == set(range(100))
    assert np.bincount(labels[val]).tolist() == [2, 4, 6, 8]
    assert np.bincount(labels[test]).tolist() == [1, 2, 3, 4]
    assert all(np.array_equal(a, b) for a, b in zip(stratified_split(labels, (0.2, 0.1), 0), (train, val, test)))
