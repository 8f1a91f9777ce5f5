"""``lit-lowrank``: LightningCLI (fit/validate/test/predict) plus ``bench`` and ``methods``.

.. code-block:: bash

    lit-lowrank fit --config configs/quickstart.yaml
    lit-lowrank fit --config configs/quickstart.yaml --trainer.logger lightning.pytorch.loggers.WandbLogger
    lit-lowrank bench overhead --quick --json out.json
    lit-lowrank methods
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

EXTRA_COMMANDS = """extra commands:
  bench NAME [--quick] [--json PATH] [--seed N] [--strict]   run a method's benchmark (`bench --list`)
  bench --table [--check]                          README/card tables from docs/results/*.json
  methods [--markdown]                             print the method registry as a table
"""


def _import_components() -> None:
    """Import our modules so short class names (``ClassificationModule``,
    ``DigitsDataModule``, every callback) resolve in YAML configs."""
    import importlib

    # submodules explicitly: jsonargparse resolves short names among *imported* subclasses
    for name in ("callbacks", "tasks", "datamodules.images", "datamodules.text", "datamodules.graphs",
                 "datamodules.domain_shift", "quant", "adapters",
                 "datamodules.prompts", "datamodules.homodyne", "datamodules.mnist", "datamodules.fewshot", "datamodules.replay"):
        importlib.import_module(f"lit_lowrank.{name}")


class LitLowRankSaveConfig(SaveConfigCallback):
    """Saves ``config.yaml`` in the log dir and, with a ``WandbLogger``, into the W&B run config."""

    def save_config(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                import yaml

                config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
                logger.experiment.config.update({"cli": config}, allow_val_change=True)


class LitLowRankCLI(LightningCLI):
    """LightningCLI with lit_lowrank's defaults.

    ``auto_configure_optimizers=False``: task modules take ``optimizer`` /
    ``lr_scheduler`` callables, so optimizers are built after callbacks changed the
    model in ``setup``. Models and datamodules are given by (short) class path.
    """

    def __init__(self, args: Any = None, run: bool = True, **kwargs: Any) -> None:
        _import_components()
        kwargs.setdefault("save_config_callback", LitLowRankSaveConfig)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_kwargs", {"epilog": EXTRA_COMMANDS, "formatter_class": argparse.RawDescriptionHelpFormatter})
        super().__init__(
            pl.LightningModule, pl.LightningDataModule,
            subclass_mode_model=True, subclass_mode_data=True,
            auto_configure_optimizers=False, args=args, run=run, **kwargs,
        )


def _bench(argv: list[str]) -> int:
    from lit_lowrank.benchmarks.harness import available_benchmarks, run_benchmark

    parser = argparse.ArgumentParser(prog="lit-lowrank bench", description="Run a method's benchmark.")
    parser.add_argument("name", nargs="?", help="benchmark name (lit_lowrank/benchmarks/<name>.py)")
    parser.add_argument("--quick", action="store_true", help="the small version: < 3 minutes on 2 CPU cores")
    parser.add_argument("--json", metavar="PATH", help="write the contract JSON (rows, claims, controls) here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the available benchmarks")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when the run is invalid (no control, or a control holds)")
    parser.add_argument("--table", action="store_true",
                        help="regenerate the README's and the cards' tables from docs/results/*.json")
    parser.add_argument("--check", action="store_true", help="with --table: only report the files that differ")
    parser.add_argument("--root", metavar="PATH", help="with --table: the checkout (default: found from the cwd)")
    ns = parser.parse_args(argv)
    if ns.table:
        from pathlib import Path

        from lit_lowrank.benchmarks._tables import repo_root, sync_tables

        changed = sync_tables(repo_root(Path(ns.root) if ns.root else None), check=ns.check)
        verb = "differ from docs/results" if ns.check else "rewritten"
        print("\n".join(f"{f}: {verb}" for f in changed) or "tables up to date")
        return 1 if (ns.check and changed) else 0
    if ns.list or ns.name is None:
        print("\n".join(available_benchmarks()))
        return 0 if ns.list else 2
    result = run_benchmark(ns.name, quick=ns.quick, seed=ns.seed, json_path=ns.json)
    return 1 if ns.strict and not result["valid"] else 0


def _methods(argv: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    from lit_lowrank.core.registry import methods_markdown, methods_table

    if argv == ["--markdown"]:
        print(methods_markdown())
        return 0
    if argv:
        print("usage: lit-lowrank methods [--markdown]", file=sys.stderr)
        return 2
    rows = methods_table()
    table = Table(title="lit_lowrank methods")
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*row.values())
    Console().print(table)
    return 0


def main(argv: list[str] | None = None) -> int | None:
    """Entry point of the ``lit-lowrank`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # Lightning 2.6 on torch 2.14 warns about a pytree API it still uses; not actionable here.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    if argv and argv[0] == "methods":
        return _methods(argv[1:])
    LitLowRankCLI(args=argv)
    return None


if __name__ == "__main__":
    sys.exit(main())
