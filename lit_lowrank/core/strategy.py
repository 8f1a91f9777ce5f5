"""Refuse, at ``setup``, a distributed strategy a method cannot support (as Lightning's SWA refuses FSDP).

The contract suite runs every fit-time method under 2-process CPU DDP and FSDP2 (``ModelParallelStrategy`` with
``fully_shard`` in ``configure_model``, ``tests/methods/test_distributed.py``). A method that cannot run under one
declares why in the registry (``MethodSpec.refuses``: strategy family -> reason) or, for a helper callback that is
no method of its own, in :data:`COMPONENT_REFUSALS`; :func:`check_strategy` raises
:class:`StrategyNotSupportedError` naming the component, the strategy and the reason. It runs in the ``setup`` of
every :class:`~lit_lowrank.core.MethodCallback` (automatically, before the subclass's own ``setup``), of
``AdapterInjector`` and ``PoLARLanding``, and checks every lit_lowrank component of the run at once; a run whose
components have no such ``setup`` is checked by the first :func:`~lit_lowrank.core.apply_loss_hooks` call, before
its first optimizer step.

.. code-block:: python

    from lit_lowrank.core.strategy import check_strategy

    def setup(self, trainer, pl_module, stage):
        check_strategy(trainer, pl_module)      # raises before any surgery on a strategy that cannot work
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: Strategy class name -> its family (the keys of ``MethodSpec.refuses``).
FAMILIES = {
    "DDPStrategy": "ddp", "DDPSpawnStrategy": "ddp",
    "FSDPStrategy": "fsdp", "ModelParallelStrategy": "fsdp", "DeepSpeedStrategy": "deepspeed",
}
#: How an error names each family.
FAMILY_NAMES = {"ddp": "DDP", "fsdp": "FSDP (FSDPStrategy / ModelParallelStrategy with fully_shard)",
                "deepspeed": "DeepSpeed"}
#: Helper callbacks (no registry line of their own) that cannot run under a strategy family, and why.
COMPONENT_REFUSALS: dict[str, dict[str, str]] = {
    "AdapterDiagnostics": {
        "fsdp": "its induced-update diagnostic differentiates the adapter with torch.func.jvp, which FSDP's "
                "sharded DTensor parameters do not support (aten._has_same_storage_numel); drop AdapterDiagnostics "
                "from a sharded run, or run it under DDP",
        "deepspeed": "it differentiates the adapter with torch.func.jvp on partitioned parameters",
    },
}


_CHECKED_ATTR = "_lit_lowrank_strategy_checked"


class StrategyNotSupportedError(RuntimeError):
    """A method was asked to run under a distributed strategy it cannot support."""


def strategy_family(trainer: "pl.Trainer | None") -> str | None:
    """``"ddp"``, ``"fsdp"``, ``"deepspeed"`` for a multi-process strategy of those families, else ``None``.

    A strategy is named by its class or one of its bases (a user's ``FSDPStrategy`` subclass is FSDP).
    """
    strategy = getattr(trainer, "strategy", None)
    if strategy is None:
        return None
    for cls in type(strategy).__mro__:
        family = FAMILIES.get(cls.__name__)
        if family is not None:
            return family
    return None


def _component_refusals() -> dict[str, tuple[str, dict[str, str]]]:
    """Class name -> (method name, its ``refuses``) for every registry component that refuses something."""
    from lit_lowrank.core.registry import all_methods

    found: dict[str, tuple[str, dict[str, str]]] = {}
    for spec in all_methods():
        if not spec.refuses:
            continue
        for component in [spec.component, *spec.extra.get("components", [])]:
            if component:
                found.setdefault(component.rsplit(".", 1)[-1], (spec.name, dict(spec.refuses)))
    for cls_name, refuses in COMPONENT_REFUSALS.items():
        found.setdefault(cls_name, (cls_name, refuses))
    return found


def _adapter_method_refusal(callback: Any) -> tuple[str, dict[str, str]] | None:
    """An ``AdapterInjector`` refuses what its variant's registry line refuses."""
    from lit_lowrank.core.registry import all_methods

    method = getattr(callback, "method", None)
    for spec in all_methods():
        if spec.name == method and spec.refuses:
            return spec.name, dict(spec.refuses)
    return None


def check_strategy(trainer: "pl.Trainer | None", pl_module: Any = None) -> None:
    """Raise :class:`StrategyNotSupportedError` when a lit_lowrank component of the run refuses its strategy.

    Checks every callback of ``trainer`` and the module's own method (a mixin's module class, e.g. a task module
    that is a registry component). A single-process run is never refused.
    """
    family = strategy_family(trainer)
    if family is None or getattr(trainer, _CHECKED_ATTR, None) is getattr(trainer, "strategy", None):
        return
    if family == "ddp" and getattr(trainer.strategy, "_ddp_kwargs", {}).get("find_unused_parameters"):
        family = "ddp_find_unused"  # what a "ddp" refusal asks for (unused parameters) is switched on
    refusals = _component_refusals()
    components = list(getattr(trainer, "callbacks", []) or [])
    if pl_module is not None:
        components.append(pl_module)
    for component in components:
        cls = type(component)
        entry = refusals.get(cls.__name__) if cls.__module__.startswith("lit_lowrank") else None
        if cls.__name__ == "AdapterInjector":
            entry = _adapter_method_refusal(component) or entry
        if entry is None or family not in entry[1]:
            continue
        method, reasons = entry
        raise StrategyNotSupportedError(
            f"{cls.__name__} ({method}) cannot run under {FAMILY_NAMES[family]} "
            f"({type(trainer.strategy).__name__}): {reasons[family]}. Run it on one device or under a strategy "
            f"it supports (the README's capability table lists them)."
        )
    setattr(trainer, _CHECKED_ATTR, trainer.strategy)
