"""Dashboards (#29): every task family's quickstart logs at least one image panel to an offline W&B
run, read back from the run itself; the run config carries the top-level ``method`` entry; the
figure helper writes to every logger (PNG next to a CSVLogger's metrics)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_lowrank.cli_lightning import LitLowRankCLI
from tests.test_wandb import _records  # the one offline run-file reader

#: the quickstart of each task family, and the image keys its first validation must log
QUICKSTARTS = {
    "classification": ("configs/quickstart.yaml", ["val/confusion"]),
    "graph": ("configs/graph/castor_csbm.yaml", ["val/confusion", "method/castor/router_mass"]),
    "diffusion": ("configs/diffusion/digits_ddpm.yaml", ["val/samples"]),
    "language_model": ("configs/language_model/lee_tiny_llama.yaml", ["val/loss_by_position"]),
    "tomography": ("configs/tomography/nn_qst_two_mode_cat.yaml", ["val/wigner"]),
    "rl": ("configs/rl/fb_temporal_gridworld.yaml", ["method/fb_temporal/zero_shot_returns"]),
    "fewshot": ("configs/fewshot/clip_lora_digits.yaml", ["val/confusion"]),
}


def read_run(run_dir: Path) -> tuple[dict, dict[str, list[Path]]]:
    """(config, {history key: image files}) of an offline W&B run directory."""
    config: dict = {}
    images: dict[str, list[Path]] = {}
    for record in _records(next(run_dir.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        items = record.config.update if kind == "config" else record.run.config.update if kind == "run" else []
        for item in items:
            config[item.key] = json.loads(item.value_json)
        if kind == "history":
            # an image panel arrives flattened: nested keys (<key>, "_type"), (<key>, "filenames"), ...
            fields: dict[str, dict] = {}
            for item in record.history.item:
                if len(item.nested_key) >= 2:
                    fields.setdefault("/".join(item.nested_key[:-1]), {})[item.nested_key[-1]] = \
                        json.loads(item.value_json)
                else:
                    value = json.loads(item.value_json)
                    if isinstance(value, dict):
                        fields[item.key] = value
            for key, value in fields.items():
                if "image" in str(value.get("_type", "")):
                    paths = value.get("filenames") or [value.get("path")]
                    images.setdefault(key, []).extend(run_dir / "files" / p for p in paths if p)
    return config, images


def _fit_offline(config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_root: Path) -> Path:
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    wandb.finish()  # never reuse a run another test left active
    try:
        _fit(config, tmp_path, repo_root)
    finally:
        wandb.finish()
    runs = list(tmp_path.rglob("offline-run-*"))
    assert len(runs) == 1, runs
    return runs[0]


def _fit(config: str, tmp_path: Path, repo_root: Path) -> None:
    LitLowRankCLI(args=[
        "fit", "--config", str(repo_root / config),
        "--trainer.max_epochs", "1", "--trainer.max_steps", "1", "--trainer.limit_train_batches", "1",
        "--trainer.limit_val_batches", "1", "--trainer.check_val_every_n_epoch", "1",
        "--trainer.val_check_interval", "1", "--trainer.num_sanity_val_steps", "0",
        "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger", "lightning.pytorch.loggers.WandbLogger",
        "--trainer.logger.init_args.project", "lit_lowrank_test",
        "--trainer.logger.init_args.save_dir", str(tmp_path),
    ])


def _read_until(run: Path, keys: list[str], seconds: float = 60.0) -> tuple[dict, dict[str, list[Path]]]:
    """``read_run`` until every key's image record is there (wandb-core may still be writing the file
    when ``wandb.finish`` returns)."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            config, images = read_run(run)
        except Exception:  # noqa: BLE001 - wandb-core may be mid-record (a truncated protobuf): read again
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
            continue
        if all(images.get(k) for k in keys) and "method" in config or time.monotonic() > deadline:
            return config, images
        time.sleep(1.0)


@pytest.mark.parametrize("family", sorted(QUICKSTARTS))
def test_quickstart_run_has_image_panels(family, tmp_path, monkeypatch, repo_root):
    config, keys = QUICKSTARTS[family]
    run = _fit_offline(config, tmp_path, monkeypatch, repo_root)
    run_config, images = _read_until(run, keys)
    from PIL import Image

    for key in keys:
        assert images.get(key), (key, sorted(images))
        for path in images[key]:
            width, height = Image.open(path).size
            assert width >= 200 and height >= 150, (key, width, height)  # a labelled figure, not 48x48 px
    assert "method" in run_config and "cli" in run_config
    if family == "graph":
        assert "castor" in run_config["method"], run_config["method"]


def test_figure_goes_to_every_logger_and_method_entry_names_the_methods(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from lit_lowrank.callbacks import STACR
    from lit_lowrank.core.figures import heatmap, log_figure, method_config, new_figure
    from lit_lowrank.datamodules import DigitsDataModule
    from lit_lowrank.tasks import ClassificationModule

    model = ClassificationModule("cnn_small", num_classes=10, in_chans=1)
    trainer = pl.Trainer(max_steps=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0,
                         logger=CSVLogger(tmp_path),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu")
    trainer.fit(model, datamodule=DigitsDataModule(batch_size=16))
    assert list((Path(trainer.logger.log_dir) / "images").glob("val_confusion_step*.png"))  # next to metrics.csv
    methods = method_config(pl.Trainer(callbacks=[STACR(rank=4)], logger=False), model)
    assert methods["stac_r"]["class"] == "lit_lowrank.callbacks.stac_r.STACR"
    fig, ax = new_figure()
    heatmap(ax, [[1.0, 0.0], [0.0, 1.0]], ["a", "b"], ["c", "d"])
    assert log_figure(None, "x", fig) == []  # no trainer: nothing written, no error


def test_acceptance_histogram_of_decode_stats():
    from lit_lowrank.core.figures import figure_to_array
    from lit_lowrank.decoding import DecodeStats

    stats = DecodeStats(new_tokens=9, rounds=4, accepted=[0, 2, 3, 0])
    fig = stats.acceptance_figure()
    assert stats.mean_acceptance_length == 2.25
    counts = [p.get_height() for p in fig.axes[0].patches]
    assert counts == [2, 0, 1, 1]  # lengths 1, 2, 3, 4
    assert figure_to_array(fig).shape[2] == 3
