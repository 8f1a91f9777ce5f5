"""Inject LoRA-family adapters into any model: the functional form, the Lightning callback, save/load helpers.

``inject_adapters(model, method=..., target_modules=..., rank=...)`` wraps the matching layers of ``model`` *in
place* with PEFT tuner layers: PEFT's own ``lora`` / ``dora`` (``LoraConfig(use_dora=True)``) / ``lokr``
(``LoKrConfig``) layers, or a registered variant (``sds_lora``, ``sama``, ``polar``, ... see
:mod:`lit_lowrank.adapters.variants`) dispatched through PEFT's custom-module mechanism.

Why PEFT's ``inject_adapter_in_model`` and not ``get_peft_model``: ``get_peft_model`` returns a ``PeftModel``
wrapper (``base_model.model.<...>`` parameter names, its own ``forward`` signature and a transformers-oriented
``PreTrainedModel`` contract). Injecting in place keeps the user's object (a plain ``nn.Module``, a timm model, a
transformers model or a whole ``LightningModule``) the object its code already calls, with its own ``forward`` and
parameter names; only the targeted children change. The adapter layers are the same PEFT classes either way, so
PEFT's state-dict, merge and ``PeftModel.from_pretrained`` machinery still applies (:func:`save_adapters`,
:func:`load_adapters`, :func:`load_peft_model`, :func:`merge_adapters`).

Target matching follows the project's :func:`~lit_lowrank.core.find_modules` (not PEFT's): a string is a regular
expression searched in the qualified module name, a list holds exact names or dotted suffixes. The names found are
handed to PEFT as one exact (escaped, anchored) pattern, so PEFT adapts exactly the modules reported here.

.. code-block:: python

    from lit_lowrank.adapters import AdapterInjector, inject_adapters

    model = inject_adapters(model, method="sds_lora", target_modules=["query", "value"], rank=8, alpha=16)
    trainer = pl.Trainer(callbacks=[AdapterInjector(method="lora", target_modules=r"layer\\.\\d+\\.fc", rank=4,
                                                    modules_to_save=["head"])])
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from lit_lowrank.adapters.variants import BUILTIN_METHODS, available_variants, get_variant
from lit_lowrank.core.surgery import find_modules, mark_replaced, record_surgery, save_surgery, surgery_records

#: File written next to PEFT's ``adapter_config.json``: which variant (and its kwargs) built the layers.
VARIANT_FILE = "lit_lowrank_adapter.json"
#: Weights of ``modules_to_save`` (trained whole, not adapted) written by :func:`save_adapters`.
EXTRA_WEIGHTS_FILE = "lit_lowrank_modules_to_save.safetensors"
_INJECT_FN = "lit_lowrank.adapters.injector.inject_adapters"
#: Attribute of an adapted layer: ``{adapter_name: the injection record}`` (the record follows the layer, so
#: ``save_adapters`` works on any submodule holding adapted layers).
RECORD_ATTR = "lit_lowrank_inject_record"
_PEFT_PREFIX = "base_model.model."


def _supported_types(method: str) -> tuple[type, ...]:
    """Base-layer types each method can wrap (what PEFT's dispatchers / the variant layer accept)."""
    if method in ("lora", "dora"):
        types: list[type] = [nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding]
        try:  # GPT-2 style transposed linear
            from transformers.pytorch_utils import Conv1D

            types.append(Conv1D)
        except ImportError:  # pragma: no cover - transformers is a dependency
            pass
        return tuple(types)
    if method == "lokr":
        return (nn.Linear, nn.Conv1d, nn.Conv2d)
    # Variants are Linear layers by contract; a layer class may widen this with ``supported_base_types``.
    return tuple(getattr(get_variant(method), "supported_base_types", (nn.Linear,)))


def _rank_limit(layer: nn.Module) -> int | None:
    """min(in, out) of the matrix the adapter updates; ``None`` for layer types without one."""
    if isinstance(layer, nn.Linear):
        return min(layer.in_features, layer.out_features)
    if isinstance(layer, nn.modules.conv._ConvNd):
        fan_in = layer.in_channels // layer.groups * math.prod(layer.kernel_size)
        return min(layer.out_channels, fan_in)
    if isinstance(layer, nn.Embedding):
        return min(layer.num_embeddings, layer.embedding_dim)
    weight = getattr(layer, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return min(weight.shape)
    return None


def _tuner_adapters(module: nn.Module) -> set[str]:
    """Adapter names a PEFT tuner layer carries."""
    names: set[str] = set()
    for attr in getattr(module, "adapter_layer_names", ()):
        container = getattr(module, attr, None)
        if isinstance(container, (nn.ModuleDict, nn.ParameterDict)):
            names.update(container.keys())
    return names


def _validate(method: str, rank: int, alpha: float | None, dropout: float) -> None:
    if not isinstance(method, str) or (method not in BUILTIN_METHODS and method not in available_variants()):
        raise ValueError(
            f"`method`={method!r} is not a known adapter method; expected one of "
            f"{list(BUILTIN_METHODS) + available_variants()} (register more with "
            "lit_lowrank.adapters.register_variant)."
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"`rank`={rank!r}: expected a positive integer.")
    if alpha is not None and (not isinstance(alpha, (int, float)) or alpha <= 0):
        raise ValueError(f"`alpha`={alpha!r}: expected a positive number or None (= rank).")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"`dropout`={dropout!r}: expected a probability in [0, 1).")


#: Arguments the injector passes itself (never ``method_kwargs``) and PEFT's layer bookkeeping.
_OWN_ARGS = frozenset({"self", "base_layer", "adapter_name", "config", "r", "lora_alpha", "lora_dropout"})
_BUILTIN_OWN = {"lora": {"r", "lora_alpha", "lora_dropout", "target_modules", "use_dora"},
                "dora": {"r", "lora_alpha", "lora_dropout", "target_modules", "use_dora"},
                "lokr": {"r", "alpha", "rank_dropout", "target_modules"}}
#: Arguments users pass to the injector that belong to another component of the method.
_MISPLACED = {"polar": {"lam": "PoLARLanding(lam=...)", "safe_radius": "PoLARLanding(safe_radius=...)"}}


def method_kwarg_names(method: str) -> list[str]:
    """The method's own arguments that ``inject_adapters(..., **method_kwargs)`` accepts (sorted).

    Built-ins: the fields of PEFT's ``LoraConfig`` / ``LoKrConfig`` not set by the injector itself; variants: the
    keyword arguments of the layer's constructor besides PEFT's (``r``, ``lora_alpha``, ``lora_dropout``, ...).

    .. code-block:: python

        method_kwarg_names("sds_lora")   # ['basis', 'rank_tol']
    """
    import dataclasses
    import inspect

    if method in BUILTIN_METHODS:
        from peft import LoKrConfig, LoraConfig

        cls = LoKrConfig if method == "lokr" else LoraConfig
        own = _BUILTIN_OWN[method] | {"task_type", "peft_type", "auto_mapping", "peft_version", "inference_mode",
                                      "base_model_name_or_path", "revision"}
        return sorted(f.name for f in dataclasses.fields(cls) if f.name not in own)
    names: list[str] = []
    for klass in get_variant(method).__mro__:  # a subclass may forward **kwargs to its parent's named arguments
        init = klass.__dict__.get("__init__")
        if init is None or klass.__module__.startswith(("peft.", "torch.")):
            continue
        for param in inspect.signature(init).parameters.values():
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and param.name not in _OWN_ARGS:
                names.append(param.name)
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return sorted(set(names))


def check_method_kwargs(method: str, method_kwargs: dict[str, Any]) -> None:
    """Raise a ``TypeError`` naming every unknown method argument and the accepted ones.

    PEFT's layers take ``**kwargs`` and would otherwise drop a misspelled argument (``basiss="qr"``) silently.
    """
    accepted = method_kwarg_names(method)
    unknown = sorted(k for k in method_kwargs if k not in accepted)
    if not unknown:
        return
    hints = [f"`{k}` belongs to {_MISPLACED[method][k]}" for k in unknown if k in _MISPLACED.get(method, {})]
    raise TypeError(
        f"Unknown argument(s) {unknown} for adapter method {method!r}; it accepts {accepted or 'no own arguments'} "
        f"besides rank, alpha, dropout, target_modules, train_bias, modules_to_save and adapter_name."
        + (" " + "; ".join(hints) + "." if hints else "")
    )


def peft_config_for(
    method: str,
    target_modules: str | list[str],
    rank: int = 8,
    alpha: float | None = None,
    dropout: float = 0.0,
    **method_kwargs: Any,
) -> Any:
    """The PEFT config that builds ``method``'s layers (the variant registered as a custom module).

    Use it with ``peft.get_peft_model`` when you want PEFT's ``PeftModel`` wrapper yourself; ``target_modules``
    is passed to PEFT unchanged (PEFT's matching rules). ``alpha=None`` means ``alpha = rank`` (scaling 1).

    .. code-block:: python

        peft_model = peft.get_peft_model(model, peft_config_for("sds_lora", ["q", "v"], rank=8))
        peft_model.save_pretrained(folder)
        write_variant_info(folder, "sds_lora")
    """
    from peft import LoKrConfig, LoraConfig

    check_method_kwargs(method, method_kwargs)
    alpha = rank if alpha is None else alpha
    if method == "lokr":
        # LoKr has no input dropout: ``dropout`` maps to its rank dropout (dropped rows of the update).
        return LoKrConfig(r=rank, alpha=alpha, rank_dropout=dropout, target_modules=target_modules, **method_kwargs)
    if method in ("lora", "dora"):
        return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                          use_dora=method == "dora", **method_kwargs)
    layer_cls = get_variant(method)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules)
    # PEFT calls custom_cls(target, adapter_name, config=config, **peft_kwargs); partial binds the method's own.
    factory = functools.partial(layer_cls, **method_kwargs) if method_kwargs else layer_cls
    config._register_custom_module({base: factory for base in _supported_types(method)})
    return config


def inject_adapters(
    model: nn.Module,
    method: str = "lora",
    target_modules: str | Sequence[str] | None = None,
    rank: int = 8,
    alpha: float | None = None,
    dropout: float = 0.0,
    train_bias: bool = False,
    modules_to_save: str | Sequence[str] | None = None,
    adapter_name: str = "default",
    submodule: str | None = None,
    **method_kwargs: Any,
) -> nn.Module:
    """Wrap the layers of ``model`` matching ``target_modules`` with ``method``'s adapter, in place.

    Idempotent: layers that already carry ``adapter_name`` are left alone, so applying twice equals applying once
    (a second ``setup``, a resume, a rebuild from a checkpoint of an already adapted module). Afterwards only the
    adapter parameters are trainable, plus the base biases of the adapted layers (``train_bias``) and every
    parameter of the modules matching ``modules_to_save`` (same matching rules; trained whole, not copied). The
    application is recorded with :func:`~lit_lowrank.core.record_surgery`, so a task module's
    ``load_from_checkpoint`` rebuilds it before loading the weights.

    Args:
        model: any ``nn.Module`` (plain, timm, transformers, a whole ``LightningModule``).
        method: ``"lora"``, ``"dora"``, ``"lokr"`` (PEFT's layers) or a registered variant name.
        target_modules: regex searched in qualified names, or a list of exact names / dotted suffixes.
        rank: adapter rank ``r`` (must not exceed min(in, out) of any targeted layer).
        alpha: LoRA alpha; the update is scaled by ``alpha / rank``. ``None`` = ``rank``.
        dropout: input dropout of the adapter branch (LoKr: rank dropout).
        train_bias: also train the biases of the adapted layers.
        modules_to_save: modules trained in full besides the adapters (e.g. a new classification head).
        adapter_name: PEFT adapter name.
        submodule: inject into ``model.get_submodule(submodule)`` (e.g. ``"model"``, the transformers model inside a
            LightningModule): targets and ``modules_to_save`` are named relative to it, and the record on ``model``
            rebuilds it from a checkpoint.
        **method_kwargs: passed to PEFT's config (built-ins) or bound to the variant layer's constructor.

    Returns:
        ``model`` itself (mutated).

    Raises:
        ValueError: unknown ``method``; ``target_modules`` missing or matching no supported layer (the message lists
            candidate names); ``rank`` larger than a targeted layer allows (names the layer, rank and limit); a
            targeted layer already carrying a *different* adapter.

    .. code-block:: python

        mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        inject_adapters(mlp, method="sds_lora", target_modules=["0"], rank=4, alpha=8, modules_to_save=["2"])
    """
    from peft import inject_adapter_in_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    _validate(method, rank, alpha, dropout)
    check_method_kwargs(method, method_kwargs)
    if submodule:
        return _inject_into_submodule(model, submodule, method=method, target_modules=target_modules, rank=rank,
                                      alpha=alpha, dropout=dropout, train_bias=train_bias,
                                      modules_to_save=modules_to_save, adapter_name=adapter_name, **method_kwargs)
    if target_modules is None or (not isinstance(target_modules, str) and len(target_modules) == 0):
        raise ValueError("`target_modules` is required: a regex or a list of module names to adapt.")
    target = target_modules if isinstance(target_modules, str) else list(target_modules)
    types = _supported_types(method)
    matches = find_modules(model, target, types + (BaseTunerLayer,), param="target_modules")
    fresh: list[tuple[str, nn.Module]] = []
    for name, module in matches:
        if isinstance(module, BaseTunerLayer):
            carried = _tuner_adapters(module)
            if adapter_name in carried:
                _check_same_settings(name, module, adapter_name, method, rank, alpha, method_kwargs)
                continue  # already injected with the same settings: idempotence
            raise ValueError(
                f"`target_modules`={target_modules!r} matches {name!r}, which already carries adapters "
                f"{sorted(carried)}; inject_adapters does not stack a second adapter on one layer."
            )
        fresh.append((name, module))
    for name, module in fresh:
        limit = _rank_limit(module)
        if limit is not None and rank > limit:
            raise ValueError(
                f"`rank`={rank} is larger than layer {name!r} ({type(module).__name__} {_shape_txt(module)}) allows: "
                f"expected rank <= min(in, out) = {limit}."
            )
    if fresh:
        exact = "^(?:" + "|".join(re.escape(n) for n, _ in fresh) + ")$"
        config = peft_config_for(method, exact, rank=rank, alpha=alpha, dropout=dropout, **method_kwargs)
        with _mesh_hidden(model):
            inject_adapter_in_model(config, model, adapter_name=adapter_name)
        for name, _ in fresh:
            layer = model.get_submodule(name)
            # tag for find_modules (its base layer is never matched again) and for the diagnostics' method name
            mark_replaced(layer, method)
            layer.lit_lowrank_adapter_method = method
            layer.lit_lowrank_adapter_settings = _settings(method, rank, alpha, method_kwargs)
    _set_trainable(model, target, adapter_name, train_bias, modules_to_save)
    record = {
        "method": method, "target_modules": target, "rank": rank, "alpha": alpha, "dropout": dropout,
        "train_bias": train_bias, "adapter_name": adapter_name,
        "modules_to_save": None if modules_to_save is None else (
            modules_to_save if isinstance(modules_to_save, str) else list(modules_to_save)),
        **method_kwargs,
    }
    for name, _ in fresh:
        layer = model.get_submodule(name)
        layer.__dict__.setdefault(RECORD_ATTR, {})[adapter_name] = record
    if not fresh and _inject_records(model, adapter_name):
        return model  # a repeated application: the first record already rebuilds this structure
    record_surgery(model, method, _INJECT_FN, record)
    return model


def _inject_into_submodule(model: nn.Module, submodule: str, **kwargs: Any) -> nn.Module:
    """:func:`inject_adapters` on ``model.get_submodule(submodule)``, recorded on ``model`` for its checkpoints."""
    try:
        inner = model.get_submodule(submodule)
    except AttributeError as err:
        children = [n for n, _ in model.named_children()]
        raise ValueError(f"`submodule`={submodule!r} is not a submodule of {type(model).__name__}; expected one of "
                         f"{children} (or a dotted path inside them).") from err
    inject_adapters(inner, **kwargs)
    record = {**kwargs, "modules_to_save": kwargs.get("modules_to_save"), "submodule": submodule}
    if isinstance(record["modules_to_save"], tuple):
        record["modules_to_save"] = list(record["modules_to_save"])
    if isinstance(record["target_modules"], tuple):
        record["target_modules"] = list(record["target_modules"])
    record_surgery(model, kwargs["method"], _INJECT_FN, record)
    return model


@contextlib.contextmanager
def _mesh_hidden(model: nn.Module) -> Iterator[None]:
    """Hide a LightningModule's device mesh from PEFT while it injects.

    Under ``ModelParallelStrategy`` (FSDP2 / tensor parallel) Lightning sets ``pl_module._device_mesh`` before the
    callbacks' ``setup``. PEFT takes any ``_device_mesh`` on the model it injects into for a transformers
    tensor-parallel plan and reads ``model.config``, which a LightningModule does not have (``AttributeError``).
    Lightning's mesh is not such a plan: the user's ``configure_model`` shards the adapted layers afterwards.
    """
    mesh = model.__dict__.get("_device_mesh")
    if mesh is None or hasattr(model, "config"):
        yield
        return
    model.__dict__["_device_mesh"] = None
    try:
        yield
    finally:
        model.__dict__["_device_mesh"] = mesh


def _settings(method: str, rank: int, alpha: float | None, method_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What makes two injections the same adapter (compared on re-injection)."""
    return {"method": method, "rank": rank, "alpha": rank if alpha is None else alpha, **method_kwargs}


def _check_same_settings(name: str, layer: nn.Module, adapter_name: str, method: str, rank: int,
                         alpha: float | None, method_kwargs: dict[str, Any]) -> None:
    """Re-injecting ``adapter_name`` is idempotent only with the settings it was injected with (as SpecDrop)."""
    wanted = _settings(method, rank, alpha, method_kwargs)
    have = getattr(layer, "lit_lowrank_adapter_settings", None)
    if have is None:  # injected by PEFT directly: compare what PEFT records
        ranks = getattr(layer, "r", {})
        have = {"rank": ranks.get(adapter_name)} if isinstance(ranks, dict) else {}
        wanted = {k: wanted[k] for k in have}
    if have != wanted:
        raise ValueError(
            f"`target_modules` layer {name!r} already carries adapter {adapter_name!r} injected with {have}; "
            f"cannot re-inject it with {wanted}. Use another `adapter_name`, or build the model afresh."
        )


def _set_trainable(model: nn.Module, target: Any, adapter_name: str, train_bias: bool,
                   modules_to_save: str | Sequence[str] | None) -> None:
    """Adapters trainable, everything else frozen unless asked (PEFT froze the rest on the first injection)."""
    for layer in adapter_layers(model, adapter_name):
        for attr in layer.adapter_layer_names:
            container = getattr(layer, attr, None)
            if isinstance(container, (nn.ModuleDict, nn.ParameterDict)) and adapter_name in container:
                item = container[adapter_name]
                for p in item.parameters() if isinstance(item, nn.Module) else [item]:
                    p.requires_grad_(True)
        if train_bias:
            bias = getattr(layer.get_base_layer(), "bias", None)
            if isinstance(bias, nn.Parameter):
                bias.requires_grad_(True)
    if modules_to_save:
        keep = modules_to_save if isinstance(modules_to_save, str) else list(modules_to_save)
        for _, module in find_modules(model, keep, param="modules_to_save"):
            module.requires_grad_(True)


def _shape_txt(module: nn.Module) -> str:
    weight = getattr(module, "weight", None)
    return f"weight {tuple(weight.shape)}" if isinstance(weight, torch.Tensor) else ""


def adapter_layers(model: nn.Module, adapter_name: str | None = None) -> Iterator[nn.Module]:
    """The PEFT tuner layers inside ``model`` (carrying ``adapter_name`` when given).

    .. code-block:: python

        n = sum(1 for _ in adapter_layers(model))
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer) and (adapter_name is None or adapter_name in _tuner_adapters(module)):
            yield module


def named_adapter_layers(model: nn.Module, adapter_name: str | None = None) -> Iterator[tuple[str, nn.Module]]:
    """``(qualified name, tuner layer)`` pairs inside ``model``."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer) and (adapter_name is None or adapter_name in _tuner_adapters(module)):
            yield name, module


def adapter_method(model: nn.Module, adapter_name: str = "default") -> str | None:
    """The method that injected ``adapter_name`` into ``model`` (from the surgery records or the layers)."""
    for entry in reversed(surgery_records(model)):
        if entry["apply_fn"] == _INJECT_FN and entry["kwargs"].get("adapter_name", "default") == adapter_name:
            return entry["kwargs"]["method"]
    for layer in adapter_layers(model, adapter_name):
        return getattr(layer, "lit_lowrank_adapter_method", None)
    return None


def merge_adapters(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and put the plain base layer back (PEFT's ``merge_and_unload``).

    .. code-block:: python

        deployed = merge_adapters(model)   # same outputs, no adapter layers left
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer) and name:
            module.merge()
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    return model


# ---------------------------------------------------------------- save / load


def _inject_records(model: nn.Module, adapter_name: str) -> list[dict[str, Any]]:
    return [dict(e["kwargs"]) for e in surgery_records(model)
            if e["apply_fn"] == _INJECT_FN and e["kwargs"].get("adapter_name", "default") == adapter_name]


# ---------------------------------------------------------------- the callback


class AdapterInjector(pl.Callback):
    """Inject adapters into the LightningModule in ``setup`` (before the optimizer exists).

    Targets are named relative to the LightningModule (e.g. ``r"backbone\\..*\\.fc1"``). Idempotent: a second
    ``setup`` (validate after fit, a resume) changes nothing. Only adapter parameters are trainable unless
    ``train_bias`` / ``modules_to_save`` ask for more. The injection is recorded on the module and written into
    every checkpoint, so ``YourModule.load_from_checkpoint`` rebuilds it when the module's ``on_load_checkpoint``
    calls :func:`~lit_lowrank.core.rebuild_surgery` (the task modules of lit_lowrank do; a user's module adds that
    one line). The callback holds no state of its own: its arguments are its whole configuration.

    Args:
        method, target_modules, rank, alpha, dropout, train_bias, modules_to_save, adapter_name, submodule: as in
            :func:`inject_adapters`. With ``submodule="model"`` targets are named inside ``pl_module.model``; either
            way ``save_adapters(pl_module.model, folder)`` writes a folder that loads into a bare copy of that model.
        method_kwargs: the method's own arguments (YAML-friendly form); ``**kwargs`` are merged into it.

    .. code-block:: python

        injector = AdapterInjector(method="sds_lora", target_modules=["query", "value"], rank=8, alpha=16,
                                   modules_to_save=["head"])
        pl.Trainer(callbacks=[injector]).fit(module, datamodule=data)
    """

    def __init__(
        self,
        method: str = "lora",
        target_modules: str | list[str] | None = None,
        rank: int = 8,
        alpha: float | None = None,
        dropout: float = 0.0,
        train_bias: bool = False,
        modules_to_save: str | list[str] | None = None,
        adapter_name: str = "default",
        method_kwargs: dict[str, Any] | None = None,
        submodule: str | None = None,
        **kwargs: Any,
    ) -> None:
        _validate(method, rank, alpha, dropout)
        if target_modules is None:
            raise ValueError("`target_modules` is required: a regex or a list of module names to adapt.")
        self.method, self.target_modules, self.rank, self.alpha = method, target_modules, rank, alpha
        self.dropout, self.train_bias, self.modules_to_save = dropout, train_bias, modules_to_save
        self.adapter_name, self.submodule = adapter_name, submodule
        self.method_kwargs = {**(method_kwargs or {}), **kwargs}
        check_method_kwargs(method, self.method_kwargs)

    @property
    def state_key(self) -> str:
        return self._generate_state_key(method=self.method, adapter_name=self.adapter_name)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from lit_lowrank.core.strategy import check_strategy

        check_strategy(trainer, pl_module)  # before any surgery: a strategy a component of the run cannot support
        from lit_lowrank.core.method_entry import log_method_entry

        log_method_entry(trainer, pl_module)
        inject_adapters(pl_module, method=self.method, target_modules=self.target_modules, rank=self.rank,
                        alpha=self.alpha, dropout=self.dropout, train_bias=self.train_bias,
                        modules_to_save=self.modules_to_save, adapter_name=self.adapter_name,
                        submodule=self.submodule, **self.method_kwargs)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # a user's module may not write the records itself; writing them twice is harmless (same list)
        save_surgery(pl_module, checkpoint)


# the save / load half lives in portable.py; its public names stay importable from here
from lit_lowrank.adapters.portable import (  # noqa: E402
    load_adapters,
    load_peft_model,
    read_variant_info,
    save_adapters,
    write_variant_info,
)
