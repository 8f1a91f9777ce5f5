"""Issue #29 finding 10: every load of a user-supplied file refuses pickled code with a clear error."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from lit_lowrank.core.safe_load import UnsafeFileError, load_data_pickle, load_weights_file

MARK = "lit_lowrank_pwned"


def _pwn() -> None:
    os.environ[MARK] = "1"


class Payload:
    """A pickle that would run code on load (here: set an environment variable)."""

    def __reduce__(self):
        return (_pwn, ())


@pytest.fixture
def crafted(tmp_path):
    path = tmp_path / "shared.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "extra": Payload()}, path)
    yield path
    assert MARK not in os.environ, "the crafted file ran code"


def test_weights_file_refuses_pickled_code(crafted):
    with pytest.raises(UnsafeFileError, match=r"`weights_path`=.*shared.ckpt.*not unpickled.*state_dict"):
        load_weights_file(crafted, param="weights_path")


def test_weights_file_loads_lightning_checkpoints_and_safetensors(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel
    from safetensors.torch import save_file

    class WithHparams(BoringModel):
        def __init__(self, width: int = 32, name: str = "x") -> None:
            super().__init__()
            self.save_hyperparameters()

    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    model = WithHparams()
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "a.ckpt")  # a real Lightning checkpoint: optimizer, loops, hparams
    loaded = load_weights_file(tmp_path / "a.ckpt", param="p")
    assert loaded["hyper_parameters"] == {"width": 32, "name": "x"}
    assert all(torch.equal(loaded["state_dict"][k], v) for k, v in model.state_dict().items())
    save_file({"w": torch.zeros(3)}, str(tmp_path / "b.safetensors"))
    assert torch.equal(load_weights_file(tmp_path / "b.safetensors", param="p")["w"], torch.zeros(3))
    with pytest.raises(FileNotFoundError, match="`p`="):
        load_weights_file(tmp_path / "missing.pt", param="p")


def test_classification_weights_path_refuses(crafted):
    from lit_lowrank.tasks import ClassificationModule

    with pytest.raises(UnsafeFileError, match="weights_path"):
        ClassificationModule("mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64},
                             weights_path=str(crafted))


def test_camel_creator_checkpoint_refuses(crafted):
    from tests.tasks.test_camel import _module

    with pytest.raises(UnsafeFileError, match="creator_checkpoint"):
        _module(creator_checkpoint=str(crafted))


def test_drafter_load_refuses(tmp_path):
    from lit_lowrank.models.spec_drafter import BlockDrafterNet

    path = tmp_path / "drafter.pt"
    torch.save({"config": Payload(), "state_dict": {}}, path)
    with pytest.raises(UnsafeFileError, match="drafter.pt"):
        BlockDrafterNet.load(path)
    assert MARK not in os.environ


def test_cifar_pickle_reader_builds_arrays_only(tmp_path):
    good = {b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [1, 2]}
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps(good, protocol=2))
    with open(path, "rb") as handle:
        entry = load_data_pickle(handle, where="batch", encoding="latin1")
    assert entry[b"labels"] == [1, 2] and entry[b"data"].shape == (2, 3072)
    path.write_bytes(pickle.dumps({b"data": Payload()}))
    with open(path, "rb") as handle, pytest.raises(UnsafeFileError, match=r"batch asks to load tests\.core\.test_safe_load\._pwn.*refused"):
        load_data_pickle(handle, where="batch")
    assert MARK not in os.environ
