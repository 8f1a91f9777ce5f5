"""Few-shot datamodules: seeded N-shot sampling, held-out classes, and CoOp split files from a local root."""

from __future__ import annotations

import json

import pytest
import torch

from lit_lowrank.datamodules.fewshot import (
    COOP_DATASETS,
    CoOpFewShotDataModule,
    FewShotDigitsDataModule,
    collect,
    sample_few_shot,
)


def test_sample_few_shot_is_seeded_and_per_class():
    labels = [0] * 10 + [1] * 10 + [2] * 2
    a, b, c = sample_few_shot(labels, 3, 0), sample_few_shot(labels, 3, 0), sample_few_shot(labels, 3, 1)
    assert a == b and a != c
    assert [labels[i] for i in a] == [0, 0, 0, 1, 1, 1, 2, 2]  # a class with fewer items keeps all
    with pytest.raises(ValueError, match="shots"):
        sample_few_shot(labels, 0, 0)


def test_digits_novel_split():
    dm = FewShotDigitsDataModule(shots=2, seed=5)
    dm.setup("fit")
    assert dm.class_names == ["five", "six", "seven", "eight", "nine"]
    assert dm.prompts()[0] == "a photo of the digit five."
    xs, ys = collect(dm.support_dataloader())
    assert xs.shape == (10, 1, 28, 28) and torch.bincount(ys).tolist() == [2] * 5
    assert 0.0 <= float(xs.min()) and float(xs.max()) <= 1.0
    xt, yt = collect(dm.test_dataloader())
    xv, _ = collect(dm.val_dataloader())
    assert len(xv) == 5 * 50 and len(xt) == 5 * 150
    # support and query images are disjoint
    flat = lambda t: {tuple(r.tolist()) for r in t.flatten(1)[:, ::7]}  # noqa: E731
    assert not flat(xs) & flat(xt)
    other = FewShotDigitsDataModule(shots=2, seed=6)
    other.setup("fit")
    assert not torch.equal(collect(other.support_dataloader())[0], xs)
    base = FewShotDigitsDataModule(shots=1, classes="base")
    assert base.class_names == ["zero", "one", "two", "three", "four"]
    with pytest.raises(ValueError, match="classes"):
        FewShotDigitsDataModule(classes="unseen")


def _fixture(root, n_classes=3, per_class=4):
    from PIL import Image

    folder = root / "oxford_pets"
    (folder / "images").mkdir(parents=True)
    splits = {"train": [], "val": [], "test": []}
    for c in range(n_classes):
        for i in range(per_class):
            name = f"c{c}_{i}.jpg"
            Image.new("RGB", (40, 30), color=(40 * c, 10 * i, 0)).save(folder / "images" / name)
            split = "train" if i < 2 else ("val" if i == 2 else "test")
            splits[split].append([name, c, f"breed_{c}"])
    (folder / "split_zhou_OxfordPets.json").write_text(json.dumps(splits))


def test_coop_loader_on_a_tiny_fixture(tmp_path):
    _fixture(tmp_path)
    dm = CoOpFewShotDataModule(root=str(tmp_path), dataset="oxford_pets", shots=1, template="coop", image_size=32,
                               batch_size=4)
    dm.setup("fit")
    assert dm.class_names == ["breed_0", "breed_1", "breed_2"]
    assert dm.prompts() == [f"a photo of a breed {c}, a type of pet." for c in range(3)]
    xs, ys = collect(dm.support_dataloader())
    assert xs.shape == (3, 3, 32, 32) and sorted(ys.tolist()) == [0, 1, 2]
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape[1:] == (3, 32, 32)
    assert len(dm.test_set) == 3 and len(dm.val_set) == 3


def test_coop_loader_errors(tmp_path):
    assert len(COOP_DATASETS) == 11
    with pytest.raises(FileNotFoundError, match="dtd"):
        CoOpFewShotDataModule(root=str(tmp_path), dataset="dtd").setup("fit")
    (tmp_path / "eurosat").mkdir()
    with pytest.raises(FileNotFoundError, match="split_zhou_EuroSAT.json"):
        CoOpFewShotDataModule(root=str(tmp_path), dataset="eurosat").setup("fit")
    with pytest.raises(ValueError, match="dataset"):
        CoOpFewShotDataModule(root=str(tmp_path), dataset="cifar10")
