"""The lit-lowrank command line: LightningCLI subcommands, bench, methods, clear errors."""

from __future__ import annotations

import pytest

from lit_lowrank.cli import LitLowRankCLI, main


def test_help_lists_extra_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "fit" in out and "bench NAME" in out and "methods" in out


def test_methods_prints_the_registry(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "stac_r" in out and "specdrop" in out and "implemented" in out


def test_print_config_resolves_short_names(capsys, repo_root):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--print_config", "--config", str(repo_root / "configs/quickstart.yaml")])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "class_path: lit_lowrank.tasks.ClassificationModule" in out
    assert "class_path: lit_lowrank.datamodules.DigitsDataModule" in out


def test_unknown_config_key_is_an_error(capsys, repo_root, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((repo_root / "configs/quickstart.yaml").read_text().replace("num_classes: 10", "num_clases: 10"))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(bad)])
    assert exit_info.value.code != 0
    assert "num_clases" in capsys.readouterr().err


def test_unknown_timm_name_is_a_clear_error(repo_root, tmp_path):
    with pytest.raises((ValueError, SystemExit)) as err:
        LitLowRankCLI(args=["fit", "--config", str(repo_root / "configs/quickstart.yaml"),
                            "--model.init_args.backbone", "resnet_does_not_exist",
                            "--trainer.default_root_dir", str(tmp_path)], run=False)
    if isinstance(err.value, ValueError):
        assert "resnet_does_not_exist" in str(err.value) and "backbone" in str(err.value)


def test_bench_list_and_unknown(capsys):
    assert main(["bench", "--list"]) == 0
    assert "overhead" in capsys.readouterr().out
    with pytest.raises(ValueError, match="Unknown benchmark 'nope'"):
        main(["bench", "nope"])


def test_fit_writes_csv_metrics(repo_root, tmp_path):
    cli = LitLowRankCLI(args=["fit", "--config", str(repo_root / "configs/quickstart.yaml"),
                              "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5",
                              "--trainer.limit_val_batches", "2",
                              "--trainer.logger.init_args.save_dir", str(tmp_path)])
    assert "val/acc" in cli.trainer.callback_metrics
    metrics = list(tmp_path.rglob("metrics.csv"))
    assert metrics and "val/acc" in metrics[0].read_text().splitlines()[0]
    assert list(tmp_path.rglob("config.yaml"))
