"""The run's ``method`` entry: name and settings of every method in a run, in the logger's hyperparameters.

Every run that uses a lit_lowrank method writes ``{"method": {name: {"class": ..., settings}}}`` into each of its
loggers' hyperparameters (W&B config, CSV ``hparams.yaml``, TensorBoard hparams), so runs group and filter by
method — through the CLI (settings are the config's ``init_args``) or plain Python (settings are the callback's
public attributes / the module's hyperparameters). :func:`log_method_entry` is called once per trainer by the first
lit_lowrank component that runs: a :class:`~lit_lowrank.core.MethodCallback`'s ``setup``, ``AdapterInjector``'s
``setup``, the first :func:`~lit_lowrank.core.apply_loss_hooks`, a task module's ``on_fit_start``; the CLI's
config saver writes it again with the config's settings.

Methods are: :class:`~lit_lowrank.core.MethodCallback` subclasses (a user's own too), registry components (callbacks, the module
itself, mixin layers inside it), ``AdapterInjector`` (named by its variant: ``sama``, ``polar``...) and
lit_lowrank callbacks with a ``method_name``. Nothing else (no config saver, no progress bar, no diagnostics-only
callback).

.. code-block:: python

    trainer = pl.Trainer(logger=WandbLogger(project="p"), callbacks=[STACR(rank=8)])
    trainer.fit(module)     # the W&B run config has method: {stac_r: {class: ..., rank: 8, ...}}
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl

_LOGGED_ATTR = "_lit_lowrank_method_entry"
#: Callbacks that are methods without being a MethodCallback or a registry component.
_METHOD_CLASSES = ("AdapterInjector",)


def _init_args(config: Any, cls: type) -> dict[str, Any] | None:
    """``init_args`` of the first entry of a CLI config whose ``class_path`` names ``cls``."""
    if isinstance(config, dict):
        path = config.get("class_path")
        if isinstance(path, str) and path.rsplit(".", 1)[-1] == cls.__name__:
            return dict(config.get("init_args") or {})
        children = config.values()
    elif isinstance(config, list):
        children = config
    else:
        return None
    for child in children:
        found = _init_args(child, cls)
        if found is not None:
            return found
    return None


def _plain(value: Any) -> Any:
    """JSON-friendly settings: numbers, strings, lists, dicts; anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value) if not callable(value) else getattr(value, "__name__", repr(value))


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def method_config(trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                  config: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{method name: {"class": ..., settings}}`` for every lit_lowrank method in a run (see the module docstring).

    Settings are the CLI ``init_args`` when ``config`` is given, else the module's hyperparameters / the callback's
    public attributes (numbers, strings, lists and dicts of them).
    """
    from lit_lowrank.core.loss_hooks import MethodCallback
    from lit_lowrank.core.registry import all_methods

    by_class = {}
    for spec in all_methods():
        for component in [spec.component, *spec.extra.get("components", [])]:
            if component:
                by_class.setdefault(component.rsplit(".", 1)[-1], spec.name)
    found: dict[str, Any] = {}

    def settings(obj: Any) -> dict[str, Any]:
        args = _init_args(config, type(obj)) if config is not None else None
        if args is None:
            hparams = getattr(obj, "hparams", None)
            args = dict(hparams) if hparams else {
                k: v for k, v in vars(obj).items()
                if not k.startswith("_") and isinstance(v, (bool, int, float, str, list, tuple, dict, type(None)))
                and len(repr(v)) < 2000}
        return {"class": f"{type(obj).__module__}.{type(obj).__name__}", **_plain(args)}

    for callback in getattr(trainer, "callbacks", []):
        cls = type(callback)
        own_name = getattr(callback, "method_name", None)
        ours = cls.__module__.startswith("lit_lowrank")
        # a user's own MethodCallback is a method too; other classes count when they are lit_lowrank's
        is_method = isinstance(callback, MethodCallback) or (ours and (
            cls.__name__ in by_class or cls.__name__ in _METHOD_CLASSES or own_name not in (None, "method")))
        if not is_method:
            continue
        entry = settings(callback)
        name = by_class.get(cls.__name__) or own_name
        if cls.__name__ == "AdapterInjector":
            name = str(entry.get("method") or getattr(callback, "method", "lora"))
        if not name or name == "method" or name in found:  # two components of one method: the class tells them
            name = getattr(callback, "method_entry_name", None) or _snake(cls.__name__)
        found[name] = entry
    module_name = by_class.get(type(pl_module).__name__)
    if module_name:
        found[module_name] = settings(pl_module)
    for module in pl_module.modules():
        name = by_class.get(type(module).__name__)
        if name and name not in found and module is not pl_module:
            found[name] = {"class": f"{type(module).__module__}.{type(module).__name__}"}
    return found


def log_method_entry(trainer: "pl.Trainer | None", pl_module: "pl.LightningModule",
                     config: dict[str, Any] | None = None, force: bool = False) -> dict[str, Any] | None:
    """Write the run's ``method`` entry into every logger's hyperparameters, once per trainer.

    ``force`` writes it again (the CLI, with its config's settings). Returns the entry, or ``None`` when it was
    already written or the trainer has no logger. A logger that cannot take hyperparameters warns; the run goes on.
    """
    if trainer is None or (getattr(trainer, _LOGGED_ATTR, False) and not force):
        return None
    loggers = [lg for lg in getattr(trainer, "loggers", []) if type(lg).__name__ != "DummyLogger"]
    if not loggers:
        return None
    methods = method_config(trainer, pl_module, config)
    setattr(trainer, _LOGGED_ATTR, True)
    for logger in loggers:
        try:
            logger.log_hyperparams({"method": methods})
        except Exception as error:  # a logger without hparams support must not stop the run
            warnings.warn(f"{type(logger).__name__} did not log the run's `method` entry: {error}", stacklevel=2)
    return methods
