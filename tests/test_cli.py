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


def _run(code: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:lit_lowrank", "-c", code],
                          capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def test_methods_and_bench_list_do_not_import_lightning():
    out = _run("import sys; from lit_lowrank.cli import main; main(['methods']); main(['bench', '--list']); "
               "print('LOADED', sorted(m for m in ('lightning', 'torch_geometric', 'peft', 'transformers', "
               "'diffusers') if m in sys.modules))")
    assert "stac_r" in out and "overhead" in out
    assert "LOADED []" in out


def test_short_names_import_only_the_modules_they_name(repo_root):
    out = _run("import sys; from lit_lowrank.cli_lightning import import_named_components; "
               f"print(import_named_components(['fit', '--config', {str(repo_root / 'configs/quickstart.yaml')!r}])); "
               "print('LOADED', sorted(m for m in ('torch_geometric', 'peft', 'diffusers') if m in sys.modules))")
    assert "lit_lowrank.tasks.classification" in out and "lit_lowrank.datamodules.images" in out
    assert "LOADED []" in out


def test_component_index_finds_every_config_class(repo_root):
    import re

    from lit_lowrank.cli_lightning import component_index

    index = component_index()
    names = {m for path in repo_root.glob("configs/**/*.yaml")
             for m in re.findall(r"class_path:\s*([A-Za-z_]\w*)\s*$", path.read_text(), re.MULTILINE)}
    assert names and not names - set(index), names - set(index)


def test_config_error_names_the_key_on_its_first_line(capsys, repo_root, tmp_path):
    bad = tmp_path / "bad.yaml"
    quick = (repo_root / "configs/quickstart.yaml").read_text()
    bad.write_text(quick.replace("num_classes: 10", "num_clases: 10"))
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(bad)])
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: model.init_args.num_clases") and "ClassificationModule" in first
    bad.write_text(quick.replace("ClassificationModule", "ClassificatonModule"))
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(bad)])
    first = capsys.readouterr().err.splitlines()[0]
    assert "ClassificatonModule" in first and "did you mean ClassificationModule" in first


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def test_misspelt_method_kwargs_key_is_one_error_line(capsys, repo_root, tmp_path):
    """Issue #40 finding 5: an AdapterInjector refusing its `method_kwargs` came inside an 82-line double
    traceback; now it is one line naming the key's config path."""
    bad = tmp_path / "bad.yaml"
    text = (repo_root / "configs/classification/sama_digits_mlp.yaml").read_text()
    bad.write_text(text.replace("        alpha: 8\n", "        alpha: 8\n        method_kwargs: {kron_shapee: 2}\n"))
    with pytest.raises(SystemExit) as exit_info:
        LitLowRankCLI(args=["--config", str(bad), "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    line = _one_error_line(err)
    assert line.startswith("error: trainer.callbacks[0].init_args.method_kwargs.kron_shapee: Unknown argument(s) "
                           "['kron_shapee'] for adapter method 'sama'"), line
    assert len(err.splitlines()) <= 2, err


def test_component_value_error_names_its_key(capsys, repo_root, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((repo_root / "configs/classification/sama_digits_mlp.yaml").read_text().replace(
        "        rank: 4\n", "        rank: 0\n"))
    with pytest.raises(SystemExit):
        LitLowRankCLI(args=["--config", str(bad), "--trainer.default_root_dir", str(tmp_path)], run=False)
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: trainer.callbacks[0].init_args.rank: `rank`=0: expected a positive integer"), line


@pytest.mark.parametrize("kind", ["missing", "folder", "empty", "truncated", "not_torch"])
def test_bad_checkpoint_path_names_the_path(kind, capsys, repo_root, tmp_path):
    """Finding 5: a truncated checkpoint gave `OSError: [Errno 22] Invalid argument` with no path."""
    import torch

    path = tmp_path / "model.ckpt"
    if kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
        path.write_bytes(path.read_bytes()[:2000])
    elif kind == "not_torch":
        path.write_text("epoch: 3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(repo_root / "configs/quickstart.yaml"), "--ckpt_path", str(path),
              "--trainer.default_root_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: ckpt_path: `ckpt_path`=") and str(path) in line, line
    assert {"missing": "does not exist", "folder": "is a folder", "empty": "is empty", "truncated": "truncated",
            "not_torch": "not a PyTorch checkpoint"}[kind] in line
