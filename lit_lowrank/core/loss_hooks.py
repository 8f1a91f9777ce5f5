"""The loss-hook protocol: Lightning has no after-loss hook, so lit_lowrank defines one.

A task module (or any user LightningModule) calls :func:`apply_loss_hooks` once in
``training_step`` after computing its loss; every :class:`MethodCallback` on the
trainer may then add terms, reweight, or return the loss unchanged.

.. code-block:: python

    class MyModule(L.LightningModule):
        def training_step(self, batch, batch_idx):
            logits = self.net(batch["x"])
            loss = F.cross_entropy(logits, batch["y"])
            outputs = {"logits": logits}
            return apply_loss_hooks(self, batch, outputs, loss)
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

#: Names that ``outputs`` carries across tasks, so methods read them the same way.
OUTPUT_KEYS = ("logits", "features", "hidden_states", "category", "loss")


class MethodCallback(pl.Callback):
    """Base class of every lit_lowrank method that acts from outside a module.

    Subclasses override :meth:`on_loss` to change the training loss; they may use
    any other Lightning hook as usual (structural changes only in ``setup``).
    """

    #: Name used for diagnostics (``method/<name>/...``) and the registry.
    method_name: str = "method"

    def on_loss(
        self,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        batch: Any,
        outputs: dict[str, Any],
        loss: Tensor,
    ) -> Tensor:
        """Return the (possibly modified) training loss. Default: unchanged."""
        return loss

    def log_method(self, pl_module: "pl.LightningModule", name: str, value: Any, **kwargs: Any) -> None:
        """Log a diagnostic under the stable name ``method/<method_name>/<name>``."""
        from lit_lowrank.core.logging import log_method

        log_method(pl_module, self.method_name, name, value, **kwargs)


def require_outputs(outputs: dict[str, Any], keys: tuple[str, ...], method: str) -> None:
    """Raise a clear error when a module's ``outputs`` lack what a method reads."""
    missing = [k for k in keys if outputs.get(k) is None]
    if missing:
        raise ValueError(
            f"{method} needs outputs {list(keys)} from training_step (pass them to apply_loss_hooks); "
            f"missing {missing}."
        )


def method_callbacks(trainer: "pl.Trainer | None") -> list[MethodCallback]:
    """The trainer's :class:`MethodCallback` instances, in callback order."""
    if trainer is None:
        return []
    return [cb for cb in trainer.callbacks if isinstance(cb, MethodCallback)]


def apply_loss_hooks(pl_module: "pl.LightningModule", batch: Any, outputs: dict[str, Any], loss: Tensor) -> Tensor:
    """Pass ``loss`` through every method callback's ``on_loss`` and return the result.

    Args:
        pl_module: the module whose ``training_step`` is running. Outside a
            ``Trainer`` (plain PyTorch use) the loss is returned unchanged.
        batch: the batch as given to ``training_step``.
        outputs: named step outputs (``logits``, ``features``, ``hidden_states``,
            ``category``...) that methods may read.
        loss: the scalar task loss.
    """
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise ValueError(
            f"apply_loss_hooks: `loss` must be a scalar Tensor, got "
            f"{type(loss).__name__} with shape {tuple(getattr(loss, 'shape', ()))}."
        )
    if not isinstance(outputs, dict):
        raise TypeError(f"apply_loss_hooks: `outputs` must be a dict, got {type(outputs).__name__}.")
    trainer = getattr(pl_module, "_trainer", None)
    for callback in method_callbacks(trainer):
        new_loss = callback.on_loss(trainer, pl_module, batch, outputs, loss)
        if not isinstance(new_loss, torch.Tensor) or new_loss.dim() != 0:
            raise TypeError(
                f"{type(callback).__name__}.on_loss must return a scalar Tensor, got "
                f"{type(new_loss).__name__}{tuple(getattr(new_loss, 'shape', ()))}."
            )
        loss = new_loss
    return loss
