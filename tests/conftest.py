"""Test hygiene: offline hubs, offline W&B, scratch inside the project, fixed threads."""

from __future__ import annotations

import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_SCRATCH = Path(os.environ.get("LIT_LOWRANK_SCRATCH", _ROOT / ".scratch"))
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_DIR": str(_SCRATCH / "wandb"),
    "WANDB_CACHE_DIR": str(_SCRATCH / "wandb-cache"),
    "WANDB_CONFIG_DIR": str(_SCRATCH / "wandb-config"),
    "WANDB_DATA_DIR": str(_SCRATCH / "wandb-data"),
    "HF_HOME": str(_SCRATCH / "hf"),
    "LIT_LOWRANK_CACHE": str(_SCRATCH / "cache"),
    "QUTIP_HOME": str(_SCRATCH / "qutip"),
    "PYTHONHASHSEED": "0",
}.items():
    os.environ.setdefault(key, value)
for key in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
    Path(os.environ[key]).mkdir(parents=True, exist_ok=True)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)

REPO_ROOT = _ROOT


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def one_thread():
    """Run a test on one torch thread: suites of many tiny ops are several times faster that way on 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
