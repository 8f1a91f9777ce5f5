"""Model-surgery helpers shared by every structural method.

Surgery happens in ``Callback.setup`` (before optimizers and before DDP/FSDP
wrapping), is idempotent (applying twice equals applying once), and is recorded
on the module so that a checkpoint can rebuild it: :func:`record_surgery` notes
*which functional form* was applied with *which arguments*;
:func:`save_surgery` writes those notes into a checkpoint and
:func:`rebuild_surgery` re-applies them before the state dict is loaded (task
modules do both in ``on_save_checkpoint`` / ``on_load_checkpoint``; a user's own
module adds the same two lines).

.. code-block:: python

    matches = find_modules(model, r"encoder\\.layer\\.\\d+\\.attention\\..*(query|value)$", types=nn.Linear)
    for name, linear in matches:
        if not is_replaced(linear):
            replace_module(model, name, mark_replaced(MyLayer(linear), "my_method"))
    record_surgery(model, "my_method", "my_pkg.apply_my_method", {"target": "..."})
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import nn

SURGERY_ATTR = "_lit_lowrank_surgery"
SURGERY_CHECKPOINT_KEY = "lit_lowrank_surgery"
_MARK_ATTR = "_lit_lowrank_method"


def find_modules(
    model: nn.Module,
    target: str | Sequence[str] | None = None,
    types: type | tuple[type, ...] | None = None,
    *,
    param: str = "target",
) -> list[tuple[str, nn.Module]]:
    """Modules of ``model`` whose qualified name matches ``target`` and type matches ``types``.

    Args:
        model: the module to search.
        target: a regular expression (``re.search`` on the qualified name), a list
            of exact names / suffixes (``"q_proj"`` matches ``"layers.0.attn.q_proj"``),
            or ``None`` for every module.
        types: keep only instances of these types.
        param: the user-facing parameter name used in the error message.

    Modules nested inside a module tagged by :func:`mark_replaced` are never
    returned, so a second application of a surgery sees only its own wrappers.

    Raises:
        ValueError: when nothing matches, naming the parameter, the value and a few
            of the module names that exist.
    """
    if target is None:
        def name_ok(name: str) -> bool:
            return True
    elif isinstance(target, str):
        try:
            pattern = re.compile(target)
        except re.error as err:
            raise ValueError(f"`{param}`={target!r} is not a valid regular expression: {err}.") from err

        def name_ok(name: str) -> bool:
            return pattern.search(name) is not None
    else:
        names = list(target)

        def name_ok(name: str) -> bool:
            return any(name == t or name.endswith("." + t) for t in names)

    # Modules inside a replaced module belong to the replacement (e.g. the original
    # Linear kept as ``.base``): matching them again would wrap twice.
    replaced = [n for n, m in model.named_modules() if n and is_replaced(m)]
    found = [
        (name, module)
        for name, module in model.named_modules()
        if name and name_ok(name) and (types is None or isinstance(module, types))
        and not any(name.startswith(r + ".") for r in replaced)
    ]
    if not found:
        # suggest only names this search can return (never the insides of a replaced module)
        candidates = [n for n, m in model.named_modules() if n and (types is None or isinstance(m, types))
                      and not any(n.startswith(r + ".") for r in replaced)]
        type_txt = "" if types is None else f" of type {_type_names(types)}"
        taken = [f"{n!r} is a {type(m).__name__} made by {getattr(m, _MARK_ATTR)!r}"
                 for n, m in model.named_modules() if n in replaced and name_ok(n)]
        why = (f" {'; '.join(taken[:3])}: this method cannot stack on that layer (see the composition matrix in "
               "the README)." if taken else "")
        raise ValueError(
            f"`{param}`={target!r} matches no module{type_txt} in {type(model).__name__}.{why} "
            f"Expected a regex or a list of names among: {_preview(candidates)}."
        )
    return found


def replace_module(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Replace the submodule at qualified ``name`` with ``new``; return the old one."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, new)
    return old


def mark_replaced(module: nn.Module, method: str) -> nn.Module:
    """Tag ``module`` as produced by ``method`` so a second application skips it."""
    setattr(module, _MARK_ATTR, method)
    return module


def is_replaced(module: nn.Module, method: str | None = None) -> bool:
    """Whether ``module`` was produced by surgery (by ``method`` when given)."""
    mark = getattr(module, _MARK_ATTR, None)
    return mark is not None and (method is None or mark == method)


def record_surgery(model: nn.Module, method: str, apply_fn: str | Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Record that ``apply_fn(model, **kwargs)`` was applied, once per (method, kwargs).

    ``apply_fn`` must be importable (a module-level function) so a checkpoint can
    name it; ``kwargs`` must be plain data (it goes into the checkpoint).
    """
    path = apply_fn if isinstance(apply_fn, str) else f"{apply_fn.__module__}.{apply_fn.__qualname__}"
    records: list[dict[str, Any]] = model.__dict__.setdefault(SURGERY_ATTR, [])
    entry = {"method": method, "apply_fn": path, "kwargs": dict(kwargs)}
    if entry not in records:
        records.append(entry)


def surgery_records(model: nn.Module) -> list[dict[str, Any]]:
    """The surgery applied to ``model``, in order (empty when none)."""
    return list(model.__dict__.get(SURGERY_ATTR, []))


def save_surgery(model: nn.Module, checkpoint: dict[str, Any]) -> None:
    """Write ``model``'s surgery records into ``checkpoint`` (call in ``on_save_checkpoint``)."""
    records = surgery_records(model)
    if records:
        checkpoint[SURGERY_CHECKPOINT_KEY] = records


def rebuild_surgery(model: nn.Module, checkpoint: dict[str, Any]) -> list[str]:
    """Re-apply the surgery recorded in ``checkpoint`` (call in ``on_load_checkpoint``).

    Returns the methods re-applied. Application is idempotent, so calling this on a
    module that already carries the surgery changes nothing.
    """
    applied = []
    for entry in checkpoint.get(SURGERY_CHECKPOINT_KEY, []):
        fn = import_object(entry["apply_fn"])
        fn(model, **entry["kwargs"])
        applied.append(entry["method"])
    return applied


def import_object(path: str) -> Any:
    """Import ``"package.module.name"`` (or ``"package.module:name"``)."""
    module_path, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep:
        raise ValueError(f"Expected a dotted path 'package.module.name', got {path!r}.")
    try:
        module = importlib.import_module(module_path)
    except ImportError:
        # nested attribute such as "pkg.module.Class.method"
        parent = import_object(module_path)
        return getattr(parent, attr)
    try:
        return getattr(module, attr)
    except AttributeError as err:
        raise ImportError(f"{module_path!r} has no attribute {attr!r} (from {path!r}).") from err


def _type_names(types: type | tuple[type, ...]) -> str:
    ts: Iterable[type] = types if isinstance(types, tuple) else (types,)
    return "/".join(t.__name__ for t in ts)


def _preview(names: list[str], n: int = 8) -> str:
    if not names:
        return "(none)"
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f", ... ({len(names)} in all)" if len(names) > n else "")
