"""Stable diagnostic names: every method logs under ``method/<name>/...``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


def method_key(method: str, name: str) -> str:
    """``method/<method>/<name>``: the one naming scheme a W&B dashboard is built on."""
    if not method or "/" in method:
        raise ValueError(f"method name must be a non-empty string without '/', got {method!r}.")
    return f"method/{method}/{name}"


def log_method(pl_module: "pl.LightningModule", method: str, name: str, value: Any, **kwargs: Any) -> None:
    """Log ``value`` through the module's logger API under ``method/<method>/<name>``.

    Outside a trainer (plain PyTorch use) this is a no-op. Keyword arguments go to
    ``LightningModule.log`` (``on_step``, ``on_epoch``, ``sync_dist``...).
    """
    if getattr(pl_module, "_trainer", None) is None:
        return
    kwargs.setdefault("on_step", True)
    kwargs.setdefault("on_epoch", False)
    pl_module.log(method_key(method, name), value, **kwargs)
