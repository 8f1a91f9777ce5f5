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


#: Set to 1 to see jsonargparse's full message / the traceback under a config error's one line.
DEBUG_ENV = "LIT_LOWRANK_DEBUG"
_REASON_SKIP = re.compile(r"\s*-?\s*(Not a valid subclass|Expected a <class|Subclass types expect|- a class path|"
                          r"- a dict|Given value|Does not validate)")
_GROUP_OF_BASE = {"Callback": "trainer.callbacks", "LightningModule": "model", "LightningDataModule": "data",
                  "Logger": "trainer.logger"}


def _key_paths(config: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted path, last key)`` of every key in a nested config (lists indexed ``[i]``)."""
    out: list[tuple[str, str]] = []
    if isinstance(config, dict):
        for key, value in config.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.append((path, str(key)))
            out += _key_paths(value, path)
    elif isinstance(config, list):
        for i, value in enumerate(config):
            out += _key_paths(value, f"{prefix}[{i}]")
    return out


def instantiation_summary(message: str, config: dict[str, Any] | None = None) -> str:
    """One line for a component that refused its arguments when the CLI built it: ``<config key>: <reason>``.

    jsonargparse reports a constructor's error inside a union's "Errors:" list, with the whole config value and no
    key; the reason is the constructor's own message and the key is the config path of the name it quotes
    (``Unknown argument(s) ['kron_shapee'] ...`` -> ``trainer.callbacks[0].init_args.method_kwargs.kron_shapee``).
    """
    lines = message.splitlines()
    errors = [ln.strip()[2:].strip() for ln in lines if ln.strip().startswith("- ") and not _REASON_SKIP.match(ln)]
    reason = errors[0] if errors else (lines[0] if lines else "invalid configuration")
    key = None
    if config:
        quoted = [a or b for a, b in re.findall(r"'([A-Za-z_]\w*)'|`([A-Za-z_]\w*)`", reason)]
        paths = _key_paths(config)
        for word in quoted:
            found = [p for p, last in paths if last == word and ".init_args." in p] or \
                    [p for p, last in paths if last == word]
            if found:
                key = found[0]
                break
    if key is None:
        base = re.search(r"Subtypes: \[[^\]]*?\.(\w+)'>", message)
        key = _GROUP_OF_BASE.get(base.group(1), "config") if base else "config"
    return f"{key}: {reason}"


def _write_error(line: str, tip: str) -> None:
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.write(f"tip: {tip}\n")


class LitLowRankArgumentParser(LightningArgumentParser):
    """Prints one ``error:`` line naming the bad key (no 60-line usage, no nested union report).

    ``LIT_LOWRANK_DEBUG=1`` prints jsonargparse's full message under it."""

    def error(self, message: str, ex: Exception | None = None):  # type: ignore[override]
        if not self.exit_on_error or not message:
            return super().error(message, ex)
        import os

        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        if os.environ.get(DEBUG_ENV):
            sys.stderr.write("".join(f"  {line}\n" for line in message.splitlines()))
        _write_error(error_summary(message), f"accepted options: {prog} --help ({DEBUG_ENV}=1 for the details)")
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

    def instantiate_classes(self) -> None:
        """Build the components; a component that refuses its arguments is one ``error:`` line naming the key."""
        import os

        try:
            super().instantiate_classes()
        except (ValueError, TypeError, KeyError, FileNotFoundError) as err:
            if os.environ.get(DEBUG_ENV):
                raise
            config = self.config.get(self.subcommand) if self.subcommand else self.config
            plain = config.as_dict() if hasattr(config, "as_dict") else None
            _write_error(instantiation_summary(str(err), plain), f"{DEBUG_ENV}=1 shows the traceback")
            raise SystemExit(2) from None

    def _check_ckpt_path(self) -> None:
        """A bad ``--ckpt_path`` (missing, a folder, empty, truncated) is one ``error:`` line naming the path."""
        import os

        from lit_lowrank.core.safe_load import CorruptFileError, check_checkpoint_file

        subcommand = self.config.get("subcommand")
        path = (self.config.get(subcommand) or {}).get("ckpt_path") if subcommand else None
        if not path or path in ("last", "best", "hpc", "registry") or "://" in str(path) or \
                str(path).startswith("registry:"):
            return
        try:
            check_checkpoint_file(path, param="ckpt_path")
        except (FileNotFoundError, CorruptFileError) as err:
            if os.environ.get(DEBUG_ENV):
                raise
            _write_error(f"ckpt_path: {err}", "pass the path of a checkpoint written by Trainer.save_checkpoint")
            raise SystemExit(2) from None

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters right after parsing: check the file first
        self._check_ckpt_path()
        super()._parse_ckpt_path()
