"""The Lightning half of ``lit-lowrank``: :class:`LitLowRankCLI` and its config saver.

Kept apart from :mod:`lit_lowrank.cli` so ``lit-lowrank methods`` and ``bench`` never
import Lightning. Short class names in YAML (``ClassificationModule``, ``SafeCut``)
resolve because :func:`import_named_components` imports exactly the modules that
define the names a command line or its config files mention (jsonargparse resolves
short names among the subclasses already imported).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from lit_lowrank.cli import EXTRA_COMMANDS

#: Packages whose classes a config may name by their short name.
COMPONENT_PACKAGES = ("callbacks", "tasks", "datamodules", "quant", "adapters", "mixins", "federated",
                      "decoding", "models")
_CLASS = re.compile(r"^class (\w+)\b", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_]\w*")


@lru_cache(maxsize=1)
def component_index() -> dict[str, str]:
    """Short class name -> the module defining it, read from the sources (nothing imported)."""
    root = Path(__file__).resolve().parent
    index: dict[str, str] = {}
    for package in COMPONENT_PACKAGES:
        for path in sorted((root / package).glob("*.py")):
            if path.name.startswith("_"):
                continue
            module = f"lit_lowrank.{package}.{path.stem}"
            for name in _CLASS.findall(path.read_text(encoding="utf-8")):
                index.setdefault(name, module)
    return index


def _config_texts(args: list[str]) -> list[str]:
    """The command line and the text of every config file it names (``--config x.yaml``)."""
    texts = list(args)
    for arg in args:
        value = arg.split("=", 1)[-1]
        if value.endswith((".yaml", ".yml", ".json")) and Path(value).is_file():
            texts.append(Path(value).read_text(encoding="utf-8"))
    return texts


def import_named_components(args: list[str]) -> list[str]:
    """Import the modules defining the short class names that ``args`` or their configs mention."""
    index = component_index()
    modules = sorted({index[w] for text in _config_texts(args) for w in _WORD.findall(text) if w in index})
    for module in modules:
        importlib.import_module(module)
    return modules


def error_summary(message: str) -> str:
    """One line naming the bad key of a jsonargparse error (its message nests the cause ~10 lines deep).

    ``Parser key "model": ... Problem with given class_path 'lit_lowrank.tasks.ClassificationModule':
    Option 'num_clases' is not accepted`` -> ``model.init_args.num_clases: not accepted by
    lit_lowrank.tasks.ClassificationModule``.
    """
    top = re.search(r'Parser key "([^"]+)"', message)
    key = top.group(1) if top else None
    classes = re.findall(r"Problem with given class_path '([^']+)'", message)
    option = re.search(r"Option '([^']+)' is not accepted", message) or re.search(
        r'Key "([^"]+)" is not expected', message) or re.search(r"[Uu]nrecognized arguments: (\S+)", message)
    if option:
        bad = option.group(1)
        path = f"{key}.init_args.{bad}" if key and classes else (f"{key}.{bad}" if key else bad)
        where = f" by {classes[-1]}" if classes else ""
        return f"{path}: not accepted{where}"
    unknown = re.search(r"Expected a dot import path string: (\w+)", message)
    if key and unknown:
        import difflib

        close = difflib.get_close_matches(unknown.group(1), list(component_index()), n=3)
        hint = f"; did you mean {' / '.join(close)}?" if close else ""
        return f"{key}: unknown class {unknown.group(1)!r}{hint}"
    import_error = re.search(r"[Ii]mport path ([^\s]+) does not|Unable to (?:import|resolve)[^\n]*'([^']+)'", message)
    if key and import_error:
        return f"{key}: {import_error.group(0).strip()}"
    reasons = [line.strip(" -") for line in message.splitlines()[1:]
               if line.strip() and not re.match(r"\s*(-\s*)?(Does not validate|Subtypes|Errors:|Given value|Expected a <class 'NoneType'>|Problem with given class_path)", line)]
    first = message.splitlines()[0] if message else ""
    if key:
        return f"{key}: {reasons[0] if reasons else first}"
    return first


class LitLowRankArgumentParser(LightningArgumentParser):
    """Prints the bad key on the error's first line, then jsonargparse's details (no 60-line usage)."""

    def error(self, message: str, ex: Exception | None = None):  # type: ignore[override]
        if not self.exit_on_error or not message:
            return super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {error_summary(message)}\n")
        sys.stderr.write("".join(f"  {line}\n" for line in message.splitlines()))
        sys.stderr.write(f"tip: accepted options: {prog} --help\n")
        self.exit(2)


class LitLowRankSaveConfig(SaveConfigCallback):
    """Saves ``config.yaml`` in the log dir, logs the top-level ``method`` entry (name and
    settings of every method in the run) to every logger, and, with a ``WandbLogger``, the
    whole config into the W&B run config (runs group and filter by ``method``)."""

    def save_config(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        import yaml

        from lit_lowrank.core.method_entry import log_method_entry

        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        # with the config's settings (a method callback may have written it from attributes already)
        methods = log_method_entry(trainer, pl_module, config, force=True) or {}
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.experiment.config.update({"cli": config, "method": methods}, allow_val_change=True)


class LitLowRankCLI(LightningCLI):
    """LightningCLI with lit_lowrank's defaults.

    ``auto_configure_optimizers=False``: task modules take ``optimizer`` /
    ``lr_scheduler`` callables, so optimizers are built after callbacks changed the
    model in ``setup``. Models and datamodules are given by (short) class path.
    """

    def __init__(self, args: Any = None, run: bool = True, **kwargs: Any) -> None:
        import_named_components([str(a) for a in (sys.argv[1:] if args is None else args)]
                                if not isinstance(args, dict) else [repr(args)])
        kwargs.setdefault("save_config_callback", LitLowRankSaveConfig)
        kwargs.setdefault("parser_class", LitLowRankArgumentParser)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_kwargs", {"epilog": EXTRA_COMMANDS, "formatter_class": argparse.RawDescriptionHelpFormatter})
        super().__init__(
            pl.LightningModule, pl.LightningDataModule,
            subclass_mode_model=True, subclass_mode_data=True,
            auto_configure_optimizers=False, args=args, run=run, **kwargs,
        )
