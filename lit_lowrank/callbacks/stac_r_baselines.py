"""The STAC-R benchmark's memory baselines as functions on any model: activation checkpointing and GaLore groups.

Kept apart from the callback (:mod:`lit_lowrank.callbacks.stac_r`): they are the baselines and
the "Turbo" composition STAC-R is compared against, usable without it.

.. code-block:: python

    from lit_lowrank.callbacks.stac_r_baselines import apply_checkpointing, galore_param_groups

    apply_checkpointing(lm, target=r"layers\.\d+$")                     # recompute every block in backward
    groups = galore_param_groups(lm, target=r"layers\.", rank=128)       # for galore_torch.GaLoreAdamW
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.core.surgery import find_modules

__all__ = ["CheckpointedModule", "apply_checkpointing", "galore_param_groups"]


def apply_checkpointing(model: nn.Module, target: str | Sequence[str]) -> list[str]:
    """Activation-checkpointing baseline: recompute the selected modules (e.g. transformer blocks) in backward.

    Each matched module is wrapped in a :class:`CheckpointedModule` (swapped into its parent, the
    way STAC-R swaps in its Linear layers), whose forward runs the block in the *reentrant*
    :func:`torch.utils.checkpoint.checkpoint`: only the block inputs are saved (through the
    ordinary saved-tensor hooks, so :class:`~lit_lowrank.ops.saved_tensors.SavedTensorCounter`
    sees them), and the block's own saved tensors are created again during backward, inside
    the same hooks, so the counter measures the real peak (boundaries + one recomputed block).
    The non-reentrant variant keeps its inputs and recomputed tensors outside the hooks and
    would be under-counted. Keyword arguments (masks, rotary tables) are bound by
    ``functools.partial`` (they need no gradient). A call whose tensor inputs need no
    gradient, and every call outside training / without grad, runs the block plainly
    (reentrant checkpointing would drop its parameter gradients). ``state_dict`` keys are
    unchanged (the wrapper removes its own level on save and adds it back on load); set
    ``stac_r_checkpoint = False`` on the wrapper or the block to switch a block off.
    Returns the names of the wrapped modules (idempotent).

    .. code-block:: python

        names = apply_checkpointing(lm, target=r"layers\\.\\d+$")   # every GPT-NeoX block
    """
    names, todo = [], []
    for name, module in find_modules(model, target):
        name = _unwrapped_name(model, name)
        if name in names:
            continue
        names.append(name)
        if getattr(module, "stac_r_checkpoint", None) is not None:  # a wrapper, or the block inside one
            continue
        parent_name, _, child = name.rpartition(".")
        todo.append((_unwrapped(model.get_submodule(parent_name)) if parent_name else model, child, module))
    for parent, child, module in todo:  # parents resolved first: a matched block may sit inside another
        module.stac_r_checkpoint = True
        if type(module).forward is not nn.Module.forward or "forward" in module.__dict__:
            setattr(parent, child, CheckpointedModule(module))  # a container (ModuleList) is never called: kept
    return names


class CheckpointedModule(nn.Module):
    """A block run under reentrant activation checkpointing while it trains (see :func:`apply_checkpointing`).

    The block is kept as ``.module``; attribute and index look-ups that the wrapper does not have
    reach the block (``wrapped[0]``, ``wrapped.attention``), and its ``state_dict`` keys are the
    block's own (the ``module.`` level is removed on save and added back on load, as
    ``torch.distributed``'s checkpoint wrapper does). Forward hooks on the block run again when it
    is recomputed in backward.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self._register_state_dict_hook(_drop_wrapper_prefix)
        self._register_load_state_dict_pre_hook(_add_wrapper_prefix, with_module=True)

    @property
    def stac_r_checkpoint(self) -> bool:
        """Whether the block is recomputed in backward (the flag lives on the block)."""
        return self.module.stac_r_checkpoint

    @stac_r_checkpoint.setter
    def stac_r_checkpoint(self, value: bool) -> None:
        self.module.stac_r_checkpoint = value

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        needs_grad = any(isinstance(a, Tensor) and a.requires_grad for a in args)
        if not (module.stac_r_checkpoint and module.training and torch.is_grad_enabled() and needs_grad):
            return module(*args, **kwargs)
        from torch.utils.checkpoint import checkpoint

        # a recomputed layer must not write a KV cache a second time in backward (HF layers take it as a kwarg)
        kwargs = {k: (None if k in _CACHE_KWARGS else v) for k, v in kwargs.items()}
        if kwargs.get("use_cache"):
            kwargs["use_cache"] = False
        return checkpoint(functools.partial(module, **kwargs), *args, use_reentrant=True)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)

    def __getitem__(self, key: Any) -> Any:
        return self.module[key]

    def __iter__(self) -> Any:
        return iter(self.module)


_CACHE_KWARGS = frozenset({"past_key_values", "past_key_value", "layer_past", "cache"})
_WRAPPED = "module."


def _drop_wrapper_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """``prefix + "module." + key`` -> ``prefix + key``, in order (the wrapper's keys are the last ones so far)."""
    inner = prefix + _WRAPPED
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)


def _add_wrapper_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """``prefix + key`` -> ``prefix + "module." + key`` before the block loads its keys."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[prefix + _WRAPPED + key[len(prefix):]] = state_dict.pop(key)


def _unwrapped(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, CheckpointedModule) else module


def _unwrapped_name(model: nn.Module, name: str) -> str:
    """``name`` without the ``module`` level of the wrappers along it (the block's name before wrapping)."""
    kept, current = [], model
    for part in name.split("."):
        if isinstance(current, CheckpointedModule) and part == "module":
            current = current.module
            continue
        current = current._modules[part]
        kept.append(part)
    return ".".join(kept)


def galore_param_groups(model: nn.Module, target: str | Sequence[str] | None = None, rank: int = 16,
                        update_proj_gap: int = 50, scale: float = 1.0, proj_type: str = "std") -> list[dict[str, Any]]:
    """Parameter groups for ``galore_torch.GaLoreAdamW``: the weights of the selected Linear layers are GaLore's.

    The "Turbo" composition of METHODS.md §11: STAC-R compresses what those layers *save*,
    GaLore what the optimizer *keeps* for them (its Adam moments live in a rank-``rank``
    projection of the gradient, ``(rank, n)`` instead of ``(m, n)``). Every other parameter
    (embeddings, norms, biases, the head) is an ordinary AdamW group.

    .. code-block:: python

        from galore_torch import GaLoreAdamW

        layers = apply_stac_r(lm, target=r"layers\\.", rank=16)
        opt = GaLoreAdamW(galore_param_groups(lm, target=r"layers\\.", rank=16), lr=2e-3)
    """
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"`rank`={rank!r}, expected a positive integer.")
    chosen = {id(m.weight) for _, m in find_modules(model, target, nn.Linear) if min(m.weight.shape) > rank}
    low = [p for p in model.parameters() if id(p) in chosen and p.requires_grad]
    rest = [p for p in model.parameters() if id(p) not in chosen and p.requires_grad]
    if not low:
        raise ValueError(f"`target`={target!r} leaves no Linear weight with both dimensions above rank={rank}.")
    return [{"params": rest}, {"params": low, "rank": rank, "update_proj_gap": update_proj_gap, "scale": scale,
                               "proj_type": proj_type}]
