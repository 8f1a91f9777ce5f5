"""Drafters that ship with the package: trained for SmolLM2-135M-Instruct, loaded by one call.

The files under ``lit_lowrank/decoding/weights/`` are safetensors (no pickle): the drafter's
weights in float16, its constructor arguments, the hash of the training settings that made
it (:func:`lit_lowrank.benchmarks.specblock.drafters.settings_key`) and its training metrics in
the metadata. The LM head of an EAGLE/SpecBlock drafter is the target's own frozen rows of
the draft vocabulary, so it is not stored: :func:`load_drafter` copies it from the target.

.. code-block:: python

    from lit_lowrank.decoding.shipped import load_drafter, specblock_hybrid
    from lit_lowrank.models.pretrained import load_smollm2

    model, tokenizer = load_smollm2()
    net = load_drafter("specblock", model)                 # BlockDrafterNet, ready for SpecBlockDrafter
    drafter = specblock_hybrid(model)                      # SpecBlock + prompt lookup, sized for this machine
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS_DIR = Path(__file__).with_name("weights")
SHIPPED = ("specblock", "eagle")


def shipped_path(name: str) -> Path:
    """The packaged file of drafter ``name`` (``"specblock"`` or ``"eagle"``)."""
    if name not in SHIPPED:
        raise ValueError(f"No shipped drafter {name!r}; expected one of {SHIPPED}.")
    return WEIGHTS_DIR / f"{name}-smollm2.safetensors"


def save_drafter(net: nn.Module, path: str | Path, *, key: str, info: dict[str, Any],
                 target_head: torch.Tensor | None = None) -> None:
    """Write ``net`` (a :class:`~lit_lowrank.models.spec_drafter.BlockDrafterNet`) as float16 safetensors.

    With ``target_head`` (the target's LM-head weight) and a drafter head equal to its draft-vocabulary
    rows, the head is left out and rebuilt from the target at load time.
    """
    from safetensors.torch import save_file

    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    head = "stored"
    if target_head is not None and torch.equal(state["head.weight"], target_head[state["draft_vocab"]].cpu()):
        del state["head.weight"]
        head = "target"
    tensors = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    meta = {"config": json.dumps(net.config), "key": key, "head": head, "info": json.dumps(info)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """``{"config", "key", "head", "info"}`` of a saved drafter (JSON fields decoded)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    if "config" not in meta:
        raise ValueError(f"{path}: not a lit_lowrank drafter file (no `config` metadata).")
    return {"config": json.loads(meta["config"]), "key": meta.get("key", ""), "head": meta.get("head", "stored"),
            "info": json.loads(meta.get("info", "{}"))}


def load_drafter_file(path: str | Path, model: nn.Module | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """A drafter saved by :func:`save_drafter` (float32), and its metadata; ``model`` supplies a left-out head."""
    from safetensors.torch import load_file

    from lit_lowrank.models.spec_drafter import BlockDrafterNet

    meta = read_metadata(path)
    state = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(str(path)).items()}
    net = BlockDrafterNet(**meta["config"])
    if meta["head"] == "target":
        if model is None:
            raise ValueError(f"{path}: the drafter's head is the target's; pass the target `model` to load it.")
        weight = model.get_output_embeddings().weight.detach().float().cpu()
        if weight.shape[0] != net.vocab_size:
            raise ValueError(f"{path}: drafter for a {net.vocab_size}-token vocabulary, target has {weight.shape[0]}.")
        state["head.weight"] = weight[state["draft_vocab"]]
    net.load_state_dict(state)
    return net.eval(), meta


def load_drafter(name: str = "specblock", model: nn.Module | None = None) -> nn.Module:
    """The shipped drafter ``name`` for SmolLM2-135M-Instruct (``model``: the target, for the head rows).

    .. code-block:: python

        net = load_drafter("specblock", model)
        engine = SpeculativeDecoder(model, SpecBlockDrafter(net, blocks=1), budget=16)
    """
    path = shipped_path(name)
    if not path.is_file():
        raise FileNotFoundError(
            f"The shipped drafter {path} is not in this installation. Build it once with "
            f"`python -c \"from lit_lowrank.benchmarks.specblock.drafters import ship_drafter; ship_drafter('{name}')\"` "
            "(trains it on SmolLM2's own answers if it is not cached), or load your own with BlockDrafterNet.load.")
    return load_drafter_file(path, model)[0]


def specblock_hybrid(model: nn.Module, prompt: torch.Tensor | None = None, blocks: int = 1,
                     model_budget: int = 16) -> Any:
    """SpecBlock (the shipped drafter) + prompt lookup in one tree, sized by the cost measured on this machine.

    ``prompt`` ``(T,)`` is used to measure the verification cost (a short default when ``None``).

    .. code-block:: python

        out = speculative_generate(model, input_ids, max_new_tokens=64, drafter=specblock_hybrid(model))
    """
    from lit_lowrank.decoding.cost import fit_verify_cost
    from lit_lowrank.decoding.drafters import SpecBlockDrafter
    from lit_lowrank.decoding.engine import TargetLM
    from lit_lowrank.decoding.hybrid import HybridDrafter, NgramDrafter

    net = load_drafter("specblock", model)
    probe = prompt if prompt is not None else torch.arange(1, 65)
    cost = fit_verify_cost(TargetLM(model), probe.flatten().to(next(model.parameters()).device))
    return HybridDrafter(SpecBlockDrafter(net, blocks=blocks), NgramDrafter(), cost=cost, model_budget=model_budget)
