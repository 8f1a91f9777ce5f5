"""Portable adapter folders: :func:`save_adapters` / :func:`load_adapters` / :func:`load_peft_model`.

A folder written by :func:`save_adapters` has PEFT's layout (``adapter_config.json``,
``adapter_model.safetensors`` with ``base_model.model.`` keys) plus ``lit_lowrank_adapter.json`` (which variant
built the layers). Targets and weight names are relative to the module passed to :func:`save_adapters`, so the
adapters injected into a LightningModule by :class:`~lit_lowrank.adapters.AdapterInjector` are saved for the
transformers model inside it with ``save_adapters(module.model, folder)`` and load into a bare copy of that model
with :func:`load_adapters`, :func:`load_peft_model` or ``PeftModel.from_pretrained`` (plain LoRA-weight variants).
The injection record follows the adapted layers: every layer carries the settings it was injected with, so a
submodule needs no record of its own.

.. code-block:: python

    trainer = pl.Trainer(callbacks=[AdapterInjector(method="lora", target_modules=["q_proj", "v_proj"], rank=8)])
    trainer.fit(module)                               # module.model is a transformers causal LM
    save_adapters(module.model, "out/adapter")        # targets named as in the bare model
    peft_model = load_peft_model(AutoModelForCausalLM.from_pretrained(path), "out/adapter")
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from lit_lowrank.adapters.injector import (
    _PEFT_PREFIX,
    EXTRA_WEIGHTS_FILE,
    RECORD_ATTR,
    VARIANT_FILE,
    _inject_records,
    _supported_types,
    adapter_layers,
    inject_adapters,
    named_adapter_layers,
    peft_config_for,
)
from lit_lowrank.adapters.variants import BUILTIN_METHODS, get_variant
from lit_lowrank.core.surgery import find_modules

__all__ = ["save_adapters", "load_adapters", "load_peft_model", "read_variant_info", "write_variant_info"]


def _inject_record(model: nn.Module, adapter_name: str) -> dict[str, Any]:
    """The first injection of ``adapter_name``, with ``modules_to_save`` of every later one added.

    Read from ``model``'s surgery records when it was the module injected into; otherwise (``model`` is a submodule
    of it, e.g. the transformers model inside a LightningModule) from the adapted layers inside ``model``, which
    carry the settings they were injected with.
    """
    records = _inject_records(model, adapter_name)
    if not records:
        records = [dict(r) for r in _layer_records(model, adapter_name)]
    if not records:
        raise ValueError(
            f"`adapter_name`={adapter_name!r}: {type(model).__name__} holds no adapter of that name injected by "
            "inject_adapters / AdapterInjector (pass the module the adapters were injected into, or a submodule "
            "holding adapted layers)."
        )
    record = records[0]
    keep: list[str] = []
    for r in records:
        m = r.get("modules_to_save")
        keep += [] if m is None else ([m] if isinstance(m, str) else list(m))
    record["modules_to_save"] = keep or None
    return record


def _layer_records(model: nn.Module, adapter_name: str) -> list[dict[str, Any]]:
    """The distinct injection records carried by ``model``'s adapted layers (in module order)."""
    found: list[dict[str, Any]] = []
    for layer in adapter_layers(model, adapter_name):
        record = getattr(layer, RECORD_ATTR, {}).get(adapter_name)
        if record is not None and record not in found:
            found.append(record)
    return found


def _saved_modules(model: nn.Module, modules_to_save: Any) -> list[tuple[str, nn.Module]]:
    """The ``modules_to_save`` found inside ``model`` (a submodule may hold none of them: they stay behind)."""
    if not modules_to_save:
        return []
    try:
        return find_modules(model, modules_to_save, param="modules_to_save")
    except ValueError:
        import warnings

        warnings.warn(f"save_adapters: `modules_to_save`={modules_to_save!r} is not inside the {type(model).__name__} "
                      "being saved; only its adapters are written (save the module that holds them to keep them).",
                      stacklevel=3)
        return []


def write_variant_info(folder: str | Path, method: str, method_kwargs: dict[str, Any] | None = None,
                       **inject_kwargs: Any) -> Path:
    """Write ``lit_lowrank_adapter.json`` into a PEFT folder so :func:`load_peft_model` can re-register the variant.

    Call it after ``PeftModel.save_pretrained(folder)`` when the model was built with :func:`peft_config_for`.

    .. code-block:: python

        peft_model.save_pretrained(folder)
        write_variant_info(folder, "sds_lora", {"basis": "qr"})
    """
    path = Path(folder) / VARIANT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"method": method, "method_kwargs": dict(method_kwargs or {}), **inject_kwargs},
                               indent=2, sort_keys=True))
    _mark_not_plain_lora(Path(folder), method)
    return path


#: ``init_lora_weights`` written into the ``adapter_config.json`` of a variant whose weights are not LoRA's.
_VARIANT_MARK = "lit_lowrank:{method}"
_VARIANT_MARK_TEXT = (" is a {method} adapter, not LoRA: plain PeftModel.from_pretrained would build LoRA layers and "
                      "ignore its weights. Load it with lit_lowrank.adapters.load_peft_model(base_model, folder)")


def _weights_are_loras(method: str) -> bool:
    """Whether ``method``'s saved weights *are* LoRA's (``lora_A`` / ``lora_B``, LoRA's forward for inference)."""
    if method in BUILTIN_METHODS:
        return True
    from peft.tuners.lora.layer import Linear as LoraLinear

    return issubclass(get_variant(method), LoraLinear)


def _mark_not_plain_lora(folder: Path, method: str) -> None:
    """Make plain ``PeftModel.from_pretrained`` fail loudly on a variant folder whose weights are not LoRA's.

    PEFT keeps the custom-module mapping on the config object, not in ``adapter_config.json``, so plain PEFT builds
    LoRA layers, warns about missing keys, and returns the base model's outputs (issue #29). Writing an
    ``init_lora_weights`` PEFT does not know makes its layer constructor raise ``ValueError: Unknown initialization
    init_lora_weights='lit_lowrank:sama ... load_peft_model ...'``; :func:`load_peft_model` reads the mark back.
    SDS-LoRA's weights are LoRA's (same forward), so its folders stay loadable as plain LoRA for inference.
    """
    config_path = folder / "adapter_config.json"
    if _weights_are_loras(method) or not config_path.is_file():
        return
    config = json.loads(config_path.read_text())
    mark = _VARIANT_MARK.format(method=method)
    config["init_lora_weights"] = mark + _VARIANT_MARK_TEXT.format(method=method)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))


def _marked_method(config: Any) -> str | None:
    """The variant named by :func:`_mark_not_plain_lora` in a loaded PEFT config (``None`` when unmarked)."""
    init = getattr(config, "init_lora_weights", None)
    if isinstance(init, str) and init.startswith("lit_lowrank:"):
        return init[len("lit_lowrank:"):].split(" ", 1)[0]
    return None


def read_variant_info(folder: str | Path) -> dict[str, Any]:
    """The content of ``lit_lowrank_adapter.json`` (``{}`` when the folder has none: a plain PEFT folder)."""
    path = Path(folder) / VARIANT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def save_adapters(model: nn.Module, folder: str | Path, adapter_name: str = "default") -> Path:
    """Save the adapters injected into ``model`` as a PEFT folder (+ which variant built them).

    The folder has PEFT's layout (``adapter_config.json``, ``adapter_model.safetensors`` with ``base_model.model.``
    keys), so ``PeftModel.from_pretrained`` reads it through :func:`load_peft_model`; :func:`load_adapters` injects
    it into a fresh copy of the base model in place. ``modules_to_save`` weights go to a side file.

    .. code-block:: python

        save_adapters(model, "out/adapter")
        fresh = load_adapters(build_base_model(), "out/adapter")
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record = _inject_record(model, adapter_name)
    names = [n for n, _ in named_adapter_layers(model, adapter_name)]
    method = record.pop("method")
    base_keys = ("target_modules", "rank", "alpha", "dropout", "train_bias", "adapter_name", "modules_to_save")
    inject = {k: record.pop(k) for k in base_keys if k in record}
    record.pop("submodule", None)
    # a fresh config naming the adapted layers relative to ``model`` (the injection's own config names them
    # relative to the module injected into, which a bare base model does not match)
    config = peft_config_for(method, names, rank=inject.get("rank", 8), alpha=inject.get("alpha"),
                             dropout=inject.get("dropout", 0.0), **record)
    config.save_pretrained(str(folder))
    with _peft_config_set(model, {adapter_name: config}):  # what PEFT's state-dict helper reads
        state = get_peft_model_state_dict(model, adapter_name=adapter_name)
    save_file({_PEFT_PREFIX + k: v.detach().contiguous() for k, v in state.items()},
              str(folder / "adapter_model.safetensors"))
    saved = _saved_modules(model, inject.get("modules_to_save"))
    if saved:
        adapter_ids = {id(p) for layer in adapter_layers(model) for attr in layer.adapter_layer_names
                       if isinstance(getattr(layer, attr, None), nn.Module) for p in getattr(layer, attr).parameters()}
        extra = {}
        for name, module in saved:
            for pname, p in module.named_parameters():
                if id(p) not in adapter_ids:
                    # base-model names (no PEFT ``base_layer`` level): loadable before the adapters are injected
                    extra[f"{name}.{pname}".replace(".base_layer.", ".")] = p.detach().contiguous()
        save_file(extra, str(folder / EXTRA_WEIGHTS_FILE))
    else:
        inject["modules_to_save"] = None
    # the exact names adapted, so loading adapts the same layers whatever the pattern would match elsewhere
    inject["target_modules"] = names
    write_variant_info(folder, method, record, **inject)
    return folder


@contextlib.contextmanager
def _peft_config_set(model: nn.Module, configs: dict[str, Any]) -> Iterator[None]:
    """``model.peft_config = configs`` for the block (restored, or removed when ``model`` had none)."""
    missing = object()
    previous = model.__dict__.get("peft_config", missing)
    model.__dict__["peft_config"] = configs
    try:
        yield
    finally:
        if previous is missing:
            del model.__dict__["peft_config"]
        else:
            model.__dict__["peft_config"] = previous


def load_adapters(model: nn.Module, folder: str | Path, adapter_name: str | None = None,
                  is_trainable: bool = True) -> nn.Module:
    """Inject the adapters saved by :func:`save_adapters` into ``model`` (in place) and load their weights.

    Args:
        model: a fresh copy of the base model the adapters were trained on.
        folder: the folder :func:`save_adapters` wrote.
        adapter_name: name to load under (default: the saved one).
        is_trainable: keep the adapters trainable; ``False`` freezes every parameter (inference).

    .. code-block:: python

        model = load_adapters(build_base_model(), "out/adapter")
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(folder)
    info = read_variant_info(folder)
    if not info:
        raise FileNotFoundError(
            f"`folder`={str(folder)!r} has no {VARIANT_FILE}; expected a folder written by save_adapters "
            "(use load_peft_model for a folder written by PeftModel.save_pretrained)."
        )
    name = adapter_name or info.get("adapter_name", "default")
    _load_extra(model, folder)
    inject_adapters(model, method=info["method"], target_modules=info["target_modules"], rank=info["rank"],
                    alpha=info.get("alpha"), dropout=info.get("dropout", 0.0), train_bias=info.get("train_bias", False),
                    modules_to_save=info.get("modules_to_save"), adapter_name=name, **info.get("method_kwargs", {}))
    state = load_file(str(folder / "adapter_model.safetensors"))
    state = {k[len(_PEFT_PREFIX):] if k.startswith(_PEFT_PREFIX) else k: v for k, v in state.items()}
    result = set_peft_model_state_dict(model, state, adapter_name=name)
    unexpected = [k for k in result.unexpected_keys if "lora" in k or "lokr" in k]
    if unexpected:
        raise RuntimeError(f"Adapter weights in {str(folder)!r} do not fit the model: unexpected keys {unexpected[:5]}.")
    if not is_trainable:
        model.requires_grad_(False)
    return model


def _load_extra(model: nn.Module, folder: Path) -> None:
    from safetensors.torch import load_file

    path = folder / EXTRA_WEIGHTS_FILE
    if path.is_file():
        extra = load_file(str(path))
        unknown = sorted(set(extra) - set(model.state_dict()))
        if unknown:
            raise RuntimeError(f"modules_to_save weights in {str(path)!r} do not fit the model: {unknown[:5]}.")
        model.load_state_dict(extra, strict=False)


def load_peft_model(base_model: nn.Module, folder: str | Path, method: str | None = None,
                    is_trainable: bool = False, **method_kwargs: Any) -> Any:
    """``PeftModel.from_pretrained`` that re-registers a variant layer first (plain PEFT folders pass through).

    PEFT saves a variant's weights like LoRA's but not the custom-module mapping (it lives on the config object,
    not in ``adapter_config.json``); this reads the variant from ``lit_lowrank_adapter.json`` (or ``method`` /
    ``method_kwargs``) and registers it on the loaded config before the layers are built.

    .. code-block:: python

        peft_model = load_peft_model(base_model, "out/adapter")
        merged = peft_model.merge_and_unload()
    """
    from peft import PeftConfig, PeftModel

    info = read_variant_info(folder)
    config = PeftConfig.from_pretrained(str(folder))
    marked = _marked_method(config)
    if marked is not None:
        config.init_lora_weights = True  # the variant layer initialises itself; the weights are loaded next
    method = method or info.get("method") or marked
    kwargs = {**info.get("method_kwargs", {}), **method_kwargs}
    _load_extra(base_model, Path(folder))
    if method is not None and method not in BUILTIN_METHODS:
        layer_cls = get_variant(method)
        factory = functools.partial(layer_cls, **kwargs) if kwargs else layer_cls
        config._register_custom_module({base: factory for base in _supported_types(method)})
    return PeftModel.from_pretrained(base_model, str(folder), config=config, is_trainable=is_trainable)


