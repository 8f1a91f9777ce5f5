"""Stable diagnostic names: every method logs under ``method/<name>/...``.

Scalars and images never share a key (:func:`log_method` records the scalar keys a run used; an image logged under
one of them by :func:`~lit_lowrank.core.figures.log_figure` gets ``_figure`` appended), and a one-off measurement is
logged once, at the step it was measured (``once=True``), instead of again at every step.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning.pytorch as pl

#: Trainer attributes: the scalar keys logged through :func:`log_method`, the keys logged ``once``, the image keys.
SCALAR_KEYS_ATTR = "_lit_lowrank_scalar_keys"
ONCE_KEYS_ATTR = "_lit_lowrank_once_keys"
IMAGE_KEYS_ATTR = "_lit_lowrank_image_keys"
IMAGE_NAMES_ATTR = "_lit_lowrank_image_names"


def method_key(method: str, name: str) -> str:
    """``method/<method>/<name>``: the one naming scheme a W&B dashboard is built on."""
    if not method or "/" in method:
        raise ValueError(f"method name must be a non-empty string without '/', got {method!r}.")
    return f"method/{method}/{name}"


def _keys(trainer: Any, attr: str) -> set[str]:
    keys = getattr(trainer, attr, None)
    if keys is None:
        keys = set()
        setattr(trainer, attr, keys)
    return keys


def log_method(pl_module: "pl.LightningModule", method: str, name: str, value: Any, *, once: bool = False,
               **kwargs: Any) -> None:
    """Log ``value`` through the module's logger API under ``method/<method>/<name>``.

    Outside a trainer (plain PyTorch use) this is a no-op. ``once=True``: a one-off measurement (a calibration
    result, a measured peak) is written to the loggers the first time only, at the step it was measured, and
    never re-emitted (a value logged through ``self.log`` reappears at every later logging step); later calls with
    the same key and trainer are ignored. It also lands in ``trainer.callback_metrics``. Other keyword arguments go
    to ``LightningModule.log`` (``on_step``, ``on_epoch``, ``sync_dist``...).

    .. code-block:: python

        log_method(pl_module, "stac_r", "total_reduction", reduction, once=True)
    """
    trainer = getattr(pl_module, "_trainer", None)
    if trainer is None:
        return
    key = method_key(method, name)
    if once:
        done = _keys(trainer, ONCE_KEYS_ATTR)
        if key not in done:
            done.add(key)
            _log_now(trainer, key, value)
        return
    scalars = _keys(trainer, SCALAR_KEYS_ATTR)
    if key not in scalars:
        scalars.add(key)
        if key in _keys(trainer, IMAGE_KEYS_ATTR):
            warnings.warn(f"{key!r} is logged as a scalar after an image of the same name; W&B keeps one of them "
                          "per key. Log the figure under another name.", stacklevel=2)
    kwargs.setdefault("on_step", True)
    kwargs.setdefault("on_epoch", False)
    pl_module.log(key, value, **kwargs)


def _log_now(trainer: Any, key: str, value: Any) -> None:
    """Write one value straight to the loggers at this step (rank zero) and into ``callback_metrics``.

    Not through ``LightningModule.log``: Lightning re-emits a value logged with ``on_step=True`` at every later
    logging step until its result collection resets, which made one-off measurements look new every step.
    """
    import torch

    _keys(trainer, SCALAR_KEYS_ATTR).add(key)
    number = float(value.detach().float().mean()) if isinstance(value, torch.Tensor) else float(value)
    metrics = getattr(trainer, "callback_metrics", None)
    if isinstance(metrics, dict):
        metrics[key] = torch.tensor(number)
    if getattr(trainer, "is_global_zero", True):
        for logger in getattr(trainer, "loggers", []):
            logger.log_metrics({key: number}, step=int(getattr(trainer, "global_step", 0)))


def image_key(trainer: Any, key: str) -> str:
    """The key an image logged as ``key`` gets: ``key``, or ``key + "_figure"`` when a scalar already uses ``key``
    (W&B's summary and panels hold one value per key)."""
    names: dict[str, str] | None = getattr(trainer, IMAGE_NAMES_ATTR, None)
    if names is None:
        names = {}
        setattr(trainer, IMAGE_NAMES_ATTR, names)
    if key not in names:  # decided once per key, so a figure logged every epoch keeps one name
        scalars = set(getattr(trainer, SCALAR_KEYS_ATTR, None) or ())
        scalars.update(getattr(trainer, "callback_metrics", {}) or {})
        scalars.update(getattr(trainer, "logged_metrics", {}) or {})
        names[key] = f"{key}_figure" if key in scalars else key
        _keys(trainer, IMAGE_KEYS_ATTR).add(names[key])
    return names[key]
