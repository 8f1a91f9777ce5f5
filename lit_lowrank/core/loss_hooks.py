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

import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from typing_extensions import override

#: Names that ``outputs`` carries across tasks, so methods read them the same way.
OUTPUT_KEYS = ("logits", "features", "hidden_states", "category", "loss")

#: Trainer attribute holding the batch counter of the last ``apply_loss_hooks`` call.
_CALLED_ATTR = "_lit_lowrank_loss_hooks_batch"


class LossHookWarning(UserWarning):
    """A method that changes the loss ran on a module whose ``training_step`` never called ``apply_loss_hooks``."""


class MethodCallback(pl.Callback):
    """Base class of every lit_lowrank method that acts from outside a module.

    Subclasses override :meth:`on_loss` to change the training loss; they may use
    any other Lightning hook as usual (structural changes only in ``setup``; a subclass
    that overrides ``on_before_backward`` calls ``super().on_before_backward(...)``).

    A subclass that overrides :meth:`on_loss` checks, before each backward, that the
    module's ``training_step`` called :func:`apply_loss_hooks` in that step: if not, the
    method has no effect, and it warns once (:class:`LossHookWarning`) naming the fix —
    or raises when ``strict`` is true (``callback.strict = True``, or on the class).
    """

    #: Name used for diagnostics (``method/<name>/...``) and the registry.
    method_name: str = "method"
    #: Raise (instead of warning once) when ``on_loss`` is overridden but never reached in a training step.
    strict: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every method refuses a strategy it cannot support before its own setup runs (issue #40): the subclass's
        # ``setup`` is wrapped once, so a method that overrides ``setup`` without calling super() is covered too.
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("setup")
        if own is not None and not getattr(own, "_lit_lowrank_checks_strategy", False):
            cls.setup = _with_strategy_check(own)

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        from lit_lowrank.core.method_entry import log_method_entry
        from lit_lowrank.core.strategy import check_strategy

        check_strategy(trainer, pl_module)
        log_method_entry(trainer, pl_module)  # the run's `method` entry in the loggers' hyperparameters

    @override
    def on_before_backward(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", loss: Tensor) -> None:
        check_loss_hooks_called(self, trainer, pl_module)

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


def _with_strategy_check(setup: Any) -> Any:
    import functools

    @functools.wraps(setup)
    def checked(self: Any, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> Any:
        from lit_lowrank.core.method_entry import log_method_entry
        from lit_lowrank.core.strategy import check_strategy

        check_strategy(trainer, pl_module)
        log_method_entry(trainer, pl_module)
        return setup(self, trainer, pl_module, stage)

    checked._lit_lowrank_checks_strategy = True  # type: ignore[attr-defined]
    return checked


MethodCallback.setup._lit_lowrank_checks_strategy = True  # type: ignore[attr-defined]


def require_outputs(outputs: dict[str, Any], keys: tuple[str, ...], method: str) -> None:
    """Raise a clear error when a module's ``outputs`` lack what a method reads."""
    missing = [k for k in keys if outputs.get(k) is None]
    if missing:
        raise ValueError(
            f"{method} needs outputs {list(keys)} from training_step (pass them to apply_loss_hooks); "
            f"missing {missing}."
        )


def _batch_counter(trainer: "pl.Trainer") -> int | None:
    """How many training batches the fit loop has started (``None`` outside ``fit``)."""
    try:
        return int(trainer.fit_loop.epoch_loop.batch_progress.total.ready)
    except AttributeError:
        return None


def check_loss_hooks_called(callback: MethodCallback, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
    """Warn once (raise when ``callback.strict``) if ``callback`` overrides ``on_loss`` but this training step
    never called :func:`apply_loss_hooks` — the method would silently do nothing."""
    if type(callback).on_loss is MethodCallback.on_loss or not trainer.training:
        return
    counter = _batch_counter(trainer)
    if counter is None or getattr(trainer, _CALLED_ATTR, None) == counter:
        return
    name = type(callback).__name__
    message = (
        f"{name} changes the training loss in `on_loss`, but {type(pl_module).__name__}.training_step did not call "
        f"`apply_loss_hooks` in this step, so {name} has no effect on training. Add "
        "`loss = apply_loss_hooks(self, batch, outputs, loss)` (from lit_lowrank.core) to training_step before "
        "returning the loss."
    )
    if getattr(callback, "strict", False):
        raise RuntimeError(message)
    if not getattr(callback, "_loss_hook_warned", False):
        callback._loss_hook_warned = True
        warnings.warn(message + f" (Set `strict = True` on {name} to make this an error.)", LossHookWarning,
                      stacklevel=2)


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
    if trainer is not None:
        setattr(trainer, _CALLED_ATTR, _batch_counter(trainer))
        from lit_lowrank.core.method_entry import log_method_entry
        from lit_lowrank.core.strategy import check_strategy

        check_strategy(trainer, pl_module)  # components without a checked setup (once per trainer)
        log_method_entry(trainer, pl_module)  # a mixin or a module of its own: once per trainer
    for callback in method_callbacks(trainer):
        new_loss = callback.on_loss(trainer, pl_module, batch, outputs, loss)
        if not isinstance(new_loss, torch.Tensor) or new_loss.dim() != 0:
            raise TypeError(
                f"{type(callback).__name__}.on_loss must return a scalar Tensor, got "
                f"{type(new_loss).__name__}{tuple(getattr(new_loss, 'shape', ()))}."
            )
        loss = new_loss
    return loss
