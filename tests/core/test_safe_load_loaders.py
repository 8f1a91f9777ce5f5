"""Issue #40 finding 6: a crafted pickle through every public loader of a user-supplied file is refused.

Each loader gets a file whose unpickling would run code (here: set an environment variable); it must raise a
clear error (or PyTorch's weights-only refusal) and never run it. The model-file loaders of the speculative-decoding
drafters are covered in tests/core/test_safe_load.py and their own tests.
"""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from lit_lowrank.core.safe_load import UnsafeFileError
from tests.core.test_safe_load import MARK, Payload

REFUSED = (UnsafeFileError, pickle.UnpicklingError, ValueError)


@pytest.fixture
def crafted(tmp_path):
    path = tmp_path / "shared.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {}, "extra": Payload()}, path)
    yield path
    assert MARK not in os.environ, "a crafted file ran code"


def test_load_from_checkpoint_refuses(crafted):
    from lit_lowrank.tasks import ClassificationModule

    with pytest.raises(REFUSED):
        ClassificationModule.load_from_checkpoint(crafted)


def test_cli_ckpt_path_refuses_in_one_line(crafted, capsys, repo_root, tmp_path):
    from lit_lowrank.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(repo_root / "configs/quickstart.yaml"), "--ckpt_path", str(crafted),
              "--trainer.default_root_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: ckpt_path: `ckpt_path`=") and "not unpickled" in line, err


def test_trainer_fit_ckpt_path_refuses(crafted, tmp_path):
    import lightning.pytorch as pl

    from lit_lowrank.datamodules import DigitsDataModule
    from tests.methods.plain import PlainUserClassifier

    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=tmp_path)
    with pytest.raises(REFUSED):
        trainer.fit(PlainUserClassifier(), datamodule=DigitsDataModule(batch_size=16), ckpt_path=crafted)


def _peft_folder(tmp_path, payload_file: str):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 2, "lora_alpha": 2, "target_modules": ["0"], "task_type": None}))
    torch.save({"base_model.model.0.lora_A.weight": Payload()}, folder / payload_file)
    return folder


def test_load_peft_model_refuses_a_pickled_adapter_bin(tmp_path):
    from lit_lowrank.adapters import load_peft_model

    folder = _peft_folder(tmp_path, "adapter_model.bin")
    with pytest.raises(REFUSED):
        load_peft_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), folder)
    assert MARK not in os.environ


def test_load_adapters_reads_safetensors_only(tmp_path):
    from lit_lowrank.adapters import load_adapters

    folder = _peft_folder(tmp_path, "adapter_model.bin")
    with pytest.raises(FileNotFoundError, match="lit_lowrank_adapter.json"):
        load_adapters(torch.nn.Sequential(torch.nn.Linear(4, 4)), folder)
    assert MARK not in os.environ


def test_draft_vocab_file_refuses(tmp_path):
    from lit_lowrank.decoding.training import _draft_vocab_ids

    path = tmp_path / "vocab.pt"
    torch.save(Payload(), path)
    with pytest.raises(REFUSED):
        _draft_vocab_ids(str(path), vocab_size=100)
    assert MARK not in os.environ


def test_homodyne_npy_with_objects_refuses(tmp_path):
    from lit_lowrank.datamodules.homodyne import load_records

    path = tmp_path / "rows.npy"
    np.save(path, np.array([Payload()], dtype=object), allow_pickle=True)
    with pytest.raises(REFUSED, match="allow_pickle"):
        load_records(path)
    assert MARK not in os.environ


def test_exorl_episode_with_objects_refuses(tmp_path):
    from lit_lowrank.datamodules.replay import load_exorl

    path = tmp_path / "episode.npz"
    np.savez(path, observation=np.array([Payload()], dtype=object), action=np.zeros(1), reward=np.zeros(1),
             discount=np.ones(1))
    with pytest.raises(REFUSED, match="allow_pickle"):
        load_exorl(path)
    assert MARK not in os.environ
