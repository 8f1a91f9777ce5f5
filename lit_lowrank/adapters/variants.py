"""The table of LoRA-variant layers that :func:`~lit_lowrank.adapters.inject_adapters` can build.

A variant is one class ``XLinear(nn.Module, peft.tuners.lora.layer.LoraLayer)`` in its own file
``adapters/<name>.py`` whose last line registers it here. PEFT builds it through its custom-module mechanism
(``LoraConfig._register_custom_module({nn.Linear: XLinear})``), so ``save_pretrained``, ``merge_and_unload`` and
PEFT's state-dict helpers work on it like on a plain LoRA layer. The PEFT built-ins ``lora``, ``dora`` and ``lokr``
are not in this table: :mod:`lit_lowrank.adapters.injector` builds them from PEFT's own configs.

.. code-block:: python

    from lit_lowrank.adapters.variants import register_variant, get_variant

    class MyLinear(nn.Module, LoraLayer):
        ...

    register_variant("my_variant", MyLinear)
    assert get_variant("my_variant") is MyLinear
"""

from __future__ import annotations

import importlib

from torch import nn

#: Names the injector builds from PEFT's own configs (never in the variant table).
BUILTIN_METHODS: tuple[str, ...] = ("lora", "dora", "lokr")

#: Variant name -> the module that registers it, imported lazily by :func:`get_variant` so that
#: ``get_variant("sama")`` works without the caller importing ``lit_lowrank.adapters.sama`` first.
_KNOWN_MODULES: dict[str, str] = {
    "sds_lora": "lit_lowrank.adapters.sds_lora",
    "sama": "lit_lowrank.adapters.sama",
    "polar": "lit_lowrank.adapters.polar",
    "mora": "lit_lowrank.adapters.mora",
}

_VARIANTS: dict[str, type[nn.Module]] = {}


def register_variant(name: str, layer_cls: type[nn.Module], *, replace: bool = False) -> type[nn.Module]:
    """Register ``layer_cls`` as the LoRA variant ``name`` (the ``method=`` of the injector).

    Args:
        name: the method name, also the ``method/<name>/...`` logging prefix.
        layer_cls: a ``peft.tuners.lora.layer.LoraLayer`` subclass with the PEFT custom-module signature
            ``layer_cls(base_layer, adapter_name, config=..., r=..., lora_alpha=..., **method_kwargs)``.
        replace: overwrite an existing registration of a *different* class (re-registering the same class,
            as a module reload does, is always allowed).

    Returns:
        ``layer_cls`` (so it can be used as a decorator-like call at the end of a file).

    Raises:
        ValueError: ``name`` is a PEFT built-in, empty, or already taken by another class.
        TypeError: ``layer_cls`` is not a ``LoraLayer`` module class.

    .. code-block:: python

        register_variant("sds_lora", SDSLoraLinear)
    """
    from peft.tuners.lora.layer import LoraLayer

    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"`name`={name!r}: expected a non-empty string without '/'.")
    if name in BUILTIN_METHODS:
        raise ValueError(f"`name`={name!r} is a PEFT built-in method ({BUILTIN_METHODS}); choose another name.")
    if not (isinstance(layer_cls, type) and issubclass(layer_cls, nn.Module) and issubclass(layer_cls, LoraLayer)):
        raise TypeError(
            f"`layer_cls`={layer_cls!r}: expected a class deriving from torch.nn.Module and "
            "peft.tuners.lora.layer.LoraLayer."
        )
    existing = _VARIANTS.get(name)
    if existing is not None and not replace and _qualname(existing) != _qualname(layer_cls):
        raise ValueError(
            f"Variant {name!r} is already registered to {_qualname(existing)}; pass replace=True to overwrite it."
        )
    _VARIANTS[name] = layer_cls
    return layer_cls


def get_variant(name: str) -> type[nn.Module]:
    """The layer class registered as ``name`` (importing the project's own variant module on first use).

    Raises:
        KeyError: ``name`` is not a registered variant, listing the available ones.

    .. code-block:: python

        layer_cls = get_variant("sds_lora")
    """
    if name not in _VARIANTS and name in _KNOWN_MODULES:
        try:
            importlib.import_module(_KNOWN_MODULES[name])
        except ModuleNotFoundError as err:
            # only swallow "the variant's own file does not exist yet", never an import error inside it
            if err.name != _KNOWN_MODULES[name]:
                raise
    try:
        return _VARIANTS[name]
    except KeyError:
        raise KeyError(
            f"Unknown adapter variant {name!r}; registered variants: {available_variants()}, "
            f"PEFT built-ins: {list(BUILTIN_METHODS)}."
        ) from None


def available_variants() -> list[str]:
    """Names of the registered variants (the project's own ones are imported first).

    .. code-block:: python

        print(available_variants())   # ['polar', 'sama', 'sds_lora']
    """
    for name, module in _KNOWN_MODULES.items():
        if name not in _VARIANTS:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as err:
                if err.name != module:
                    raise
    return sorted(_VARIANTS)


def unregister_variant(name: str) -> None:
    """Remove ``name`` from the table (used by tests that register temporary variants)."""
    _VARIANTS.pop(name, None)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
