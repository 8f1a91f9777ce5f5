"""W&B in offline mode: a fit through the CLI writes an offline run with metrics and config."""

from __future__ import annotations

from pathlib import Path

from lit_lowrank.cli import LitLowRankCLI


def _records(run_file: Path):
    """Protobuf ``Record`` messages of an offline ``run-<id>.wandb`` file.

    The file is a 7-byte header (``:W&B``, magic, version) followed by the LevelDB
    log format: 32 KiB blocks of chunks ``crc32c(4) length(2, LE) type(1) data``,
    type 1 = full record, 2/3/4 = first/middle/last piece. (wandb 0.31 ships no
    Python reader of its own.)
    """
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too short for a header: zero padding
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _finished_records(run_file: Path, timeout_s: float = 120.0) -> list:
    """The run file's records once wandb has written its final ``exit`` record (polled: wandb-core writes the file
    from its own process, so a read right after ``finish()`` returned could see it before the last flush)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = list(_records(run_file))
        except Exception:  # noqa: BLE001 - a record still being written (truncated protobuf): read again
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def _read_offline_run(run_file: Path) -> tuple[dict, list[dict]]:
    """(config, history rows) from a finished offline run file."""
    config: dict = {}
    history: list[dict] = []
    records = _finished_records(run_file)
    assert any(r.WhichOneof("record_type") == "exit" for r in records), "the offline run never finished"
    for record in records:
        kind = record.WhichOneof("record_type")
        # the config arrives as its own record or, when it was set before the run record was written, inside it
        if kind == "config":
            for item in record.config.update:
                config[item.key] = item.value_json
        elif kind == "run":
            for item in record.run.config.update:
                config[item.key] = item.value_json
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): item.value_json for item in record.history.item})
    return config, history


def test_wandb_offline_run_has_metrics_and_config(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cli = LitLowRankCLI(args=[
        "fit", "--config", str(repo_root / "configs/quickstart.yaml"),
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2",
        "--trainer.log_every_n_steps", "1", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger", "lightning.pytorch.loggers.WandbLogger",
        "--trainer.logger.init_args.project", "lit_lowrank_test",
        "--trainer.logger.init_args.save_dir", str(tmp_path),
    ])
    # finish *this* run (not whatever wandb.run is after earlier tests): it flushes and closes the run file
    cli.trainer.logger.experiment.finish()
    runs = list(tmp_path.rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs
    config, history = _read_offline_run(runs[0])
    assert "cli" in config and "ClassificationModule" in config["cli"]
    keys = set().union(*history)
    assert "train/loss" in keys and "val/acc" in keys


def _plain_stac_r_run(tmp_path, logger, max_steps: int = 4):
    """A plain-Python run (no CLI): a user's module, STAC-R and an AdapterInjector, the given logger."""
    import lightning.pytorch as pl

    from lit_lowrank.adapters import AdapterInjector
    from lit_lowrank.callbacks import STACR
    from lit_lowrank.datamodules import DigitsDataModule
    from tests.methods.plain import PlainUserClassifier

    callbacks = [AdapterInjector(method="lora", target_modules=["head"], rank=2),
                 STACR(rank=4, residual_density=0.05, bridge_every=2)]
    trainer = pl.Trainer(max_steps=max_steps, logger=logger, callbacks=callbacks, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         log_every_n_steps=1, accelerator="cpu", devices=1, default_root_dir=tmp_path)
    trainer.fit(PlainUserClassifier(), datamodule=DigitsDataModule(batch_size=32))
    return trainer


def test_plain_python_wandb_run_has_the_method_entry_and_distinct_image_keys(tmp_path, monkeypatch):
    """Issue #40 findings 2 and 3: a plain-Python WandbLogger run records which methods ran (and nothing else);
    STAC-R's SSP figure does not share its key with the SSP scalar; one-off measurements are logged once."""
    import json

    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(project="lit_lowrank_test", save_dir=str(tmp_path), log_model=False)
    _plain_stac_r_run(tmp_path, logger)
    logger.experiment.finish()
    [run] = list(tmp_path.rglob("offline-run-*/run-*.wandb"))
    config, history = _read_offline_run(run)
    methods = json.loads(config["method"])
    assert sorted(methods) == ["lora", "stac_r"], methods
    assert methods["stac_r"]["rank"] == 4 and methods["lora"]["rank"] == 2
    scalar_keys = {k for row in history for k, v in row.items() if not v.startswith("{")}
    image_keys = {k for row in history for k, v in row.items() if '"_type": "images/separated"' in v}
    assert "method/stac_r/ssp" in scalar_keys and "method/stac_r/ssp_figure" in image_keys, image_keys
    assert not scalar_keys & image_keys


def test_cli_method_entry_lists_methods_only(repo_root, tmp_path):
    """The CLI's `method` entry named the config saver (`lit_low_rank_save_config`) a method (finding 2)."""
    import yaml

    cli = LitLowRankCLI(args=[
        "fit", "--config", str(repo_root / "configs/classification/stac_r_digits.yaml"),
        "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.save_dir",
        str(tmp_path),
    ])
    hparams = yaml.safe_load((Path(cli.trainer.logger.log_dir) / "hparams.yaml").read_text())
    assert list(hparams["method"]) == ["stac_r"], hparams["method"]
