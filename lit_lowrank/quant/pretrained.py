"""Save a quantized transformers model with ``save_pretrained`` and reload it with one call.

The quantizers (:func:`~lit_lowrank.quant.quantize_sph`, :func:`~lit_lowrank.quant.quantize_uniform`)
record their surgery (which layers, which format) in ``model.config.lit_lowrank_surgery`` when the
model is a transformers ``PreTrainedModel``, so ``config.json`` carries it. The packed codes, group
scales and the shared SPH codebook (stored once) go to ``model.safetensors`` like any buffer.
:func:`load_quantized` builds the architecture from the config, re-creates the quantized layers'
empty shells (one shared codebook per quantizer call), loads the state dict into them and ties
the LM head, so the reloaded model's logits equal the saved model's exactly.

.. code-block:: python

    from lit_lowrank.quant import load_quantized, quantize_sph

    quantize_sph(model, codebook_size=4096, radius_bits=4, group_size=128, calibration=batches)
    model.save_pretrained("smollm2-sph-w3")                   # safetensors + config.json
    model = load_quantized("smollm2-sph-w3")                  # the same logits
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from lit_lowrank.core.surgery import SURGERY_CHECKPOINT_KEY, rebuild_surgery, record_surgery, surgery_records

#: The ``config.json`` entry holding the surgery records.
CONFIG_KEY = "lit_lowrank_surgery"


def record_in_config(model: nn.Module) -> bool:
    """Copy ``model``'s surgery records into ``model.config`` (transformers models only); True if written."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        return False
    setattr(config, CONFIG_KEY, surgery_records(model))
    return True


def load_quantized(path: str | os.PathLike, model_class: Any = None, **config_kwargs: Any) -> nn.Module:
    """Reload a model saved with ``save_pretrained`` after a lit_lowrank quantizer (eval mode, float32).

    Args:
        path: the folder ``save_pretrained`` wrote (``config.json`` + ``*.safetensors``).
        model_class: the transformers class to build (default ``AutoModelForCausalLM``).
        config_kwargs: passed to ``AutoConfig.from_pretrained``.

    Raises:
        ValueError: when ``config.json`` carries no quantization record, or the weights lack keys
            the rebuilt model needs (other than tied ones).

    .. code-block:: python

        model = load_quantized("smollm2-sph-w3")
        logits = model(input_ids).logits
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(path)
    config = AutoConfig.from_pretrained(folder, local_files_only=True, **config_kwargs)
    records = getattr(config, CONFIG_KEY, None)
    if not records:
        raise ValueError(f"{folder / 'config.json'} has no {CONFIG_KEY!r} entry: expected a model quantized by "
                         "lit_lowrank (quantize_sph / quantize_uniform) and saved with save_pretrained.")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {folder}; save with save_pretrained(safe_serialization=True).")
    model = (model_class or AutoModelForCausalLM).from_config(config)
    rebuild_surgery(model, {SURGERY_CHECKPOINT_KEY: records})
    for entry in records:   # the reloaded model carries its surgery like the saved one (a second save works)
        record_surgery(model, entry["method"], entry["apply_fn"], entry["kwargs"])
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    shared_codebook = any(k.endswith(".codebook") for k in state)
    # a shared codebook is stored once: the other layers' entries point at the same tensor, loaded in place
    bad = [k for k in missing if k not in tied and not (k.endswith(".codebook") and shared_codebook)]
    if bad or unexpected:
        raise ValueError(f"{folder}: the saved weights do not fit the rebuilt model: missing {bad[:4]}, "
                         f"unexpected {list(unexpected)[:4]}.")
    model.tie_weights()
    return model.eval()
