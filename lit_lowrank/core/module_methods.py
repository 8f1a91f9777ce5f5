"""Methods inside a module's own forward (mixins), reached by task modules without naming them.

A mixin (SpecDrop's branches) changes a module's structure and needs three things from the
module that runs it, every step: the batch's tags during the forward, its auxiliary loss
added to the task loss, and its diagnostics logged. Task modules — ours and a user's — ask
for all three through generic calls, next to :func:`~lit_lowrank.core.apply_loss_hooks`:

.. code-block:: python

    from lit_lowrank.core import apply_module_method, log_module_methods, method_aux_loss, method_context

    class MyModule(L.LightningModule):
        def __init__(self, branches=None):
            super().__init__()
            self.net = ...
            if branches is not None:
                apply_module_method(self, "branches", branches)    # SpecDrop, recorded in hparams by the caller

        def training_step(self, batch, batch_idx):
            with method_context(self, batch):                       # tags reach the branches
                logits = self.net(batch["x"])
            loss = F.cross_entropy(logits, batch["y"])
            aux = method_aux_loss(self)                             # learned-router baselines
            return loss if aux is None else loss + aux

        def on_train_batch_end(self, outputs, batch, batch_idx):
            log_module_methods(self)

A mixin registers a :class:`ModuleMethod` when its module is imported; until then every call
is free. Deleting a mixin means deleting its files and its line in :data:`BUILDERS`.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor, nn

#: A task option naming a structure -> ``"module:function"`` that builds it (imported on first use).
BUILDERS: dict[str, str] = {"branches": "lit_lowrank.mixins.specdrop:apply_specdrop"}


class ModuleMethod(Protocol):
    """What a mixin does per batch for the module that holds it (each a no-op where it holds nothing)."""

    name: str

    def batch_context(self, module: "nn.Module", batch: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """The context the module's forward runs in (e.g. the batch's category tags set on the blocks)."""
        ...

    def aux_loss(self, module: "nn.Module") -> "Tensor | None":
        """The auxiliary loss of the last training forward, or ``None``."""
        ...

    def log_diagnostics(self, pl_module: Any) -> None:
        """Log the method's diagnostics under ``method/<name>/...``."""
        ...


_METHODS: dict[str, ModuleMethod] = {}


def register_module_method(method: ModuleMethod) -> ModuleMethod:
    """Make ``method`` part of :func:`method_context`, :func:`method_aux_loss` and :func:`log_module_methods`."""
    _METHODS[method.name] = method
    return method


def apply_module_method(module: "nn.Module", option: str, settings: Mapping[str, Any]) -> "nn.Module":
    """Build the structure a task option names (``"branches"`` -> SpecDrop) inside ``module``.

    Raises:
        ValueError: ``option`` is not a known structure.
        TypeError: ``settings`` is not a mapping of the builder's arguments.
    """
    if option not in BUILDERS:
        raise ValueError(f"`option`={option!r}: expected one of {sorted(BUILDERS)}.")
    if not isinstance(settings, Mapping):
        raise TypeError(f"`{option}` must be a mapping of options, got {type(settings).__name__}: {settings!r}.")
    path, name = BUILDERS[option].split(":")
    return getattr(importlib.import_module(path), name)(module, **settings)


@contextlib.contextmanager
def method_context(module: "nn.Module", batch: Mapping[str, Any]) -> Iterator[None]:
    """Run the enclosed forward of ``module`` inside every registered mixin's per-batch context."""
    with contextlib.ExitStack() as stack:
        for method in list(_METHODS.values()):
            stack.enter_context(method.batch_context(module, batch))
        yield


def method_aux_loss(module: "nn.Module") -> "Tensor | None":
    """The sum of the registered mixins' auxiliary losses of the last training forward, or ``None``."""
    losses = [loss for method in list(_METHODS.values()) if (loss := method.aux_loss(module)) is not None]
    if not losses:
        return None
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total


def log_module_methods(pl_module: Any) -> None:
    """Log every registered mixin's diagnostics for ``pl_module``."""
    for method in list(_METHODS.values()):
        method.log_diagnostics(pl_module)
