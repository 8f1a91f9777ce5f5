"""Every config under configs/ parses; every embedded-data config runs one step.

Configs under a ``real/`` folder need a local dataset or model: they are parsed only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_lowrank.cli import LitLowRankCLI, main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(REPO.glob("configs/**/*.yaml"))


def _id(path: Path) -> str:
    return str(path.relative_to(REPO / "configs"))


def test_configs_exist():
    assert (REPO / "configs" / "quickstart.yaml") in CONFIGS
    for task in ("classification", "language_model", "graph", "diffusion"):
        assert list((REPO / "configs" / task).glob("*.yaml")), task


@pytest.mark.parametrize("config", CONFIGS, ids=_id)
def test_config_parses(config, capsys):
    """Parsing validates every key and type against the classes' signatures (no instantiation)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--print_config", "--config", str(config)])
    assert exit_info.value.code == 0
    assert "class_path" in capsys.readouterr().out


@pytest.mark.parametrize("config", [c for c in CONFIGS if "real" not in c.parts], ids=_id)
def test_config_runs_one_step(config, tmp_path):
    cli = LitLowRankCLI(args=["fit", "--config", str(config), "--trainer.fast_dev_run", "1",
                              "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path)])
    assert cli.trainer.state.finished
    assert cli.trainer.global_step == 1
