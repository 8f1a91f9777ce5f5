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

__all__ = ["apply_checkpointing", "galore_param_groups"]


def apply_checkpointing(model: nn.Module, target: str | Sequence[str]) -> list[str]:
    """Activation-checkpointing baseline: recompute the selected modules (e.g. transformer blocks) in backward.

    Each matched module's ``forward`` is wrapped in the *reentrant*
    :func:`torch.utils.checkpoint.checkpoint`: only the block inputs are saved (through the
    ordinary saved-tensor hooks, so :class:`~lit_lowrank.ops.saved_tensors.SavedTensorCounter`
    sees them), and the block's own saved tensors are created again during backward, inside
    the same hooks, so the counter measures the real peak (boundaries + one recomputed block).
    The non-reentrant variant keeps its inputs and recomputed tensors outside the hooks and
    would be under-counted. Keyword arguments (masks, rotary tables) are bound by
    ``functools.partial`` (they need no gradient). A call whose tensor inputs need no
    gradient, and every call outside training / without grad, runs the block plainly
    (reentrant checkpointing would drop its parameter gradients). Parameters and
    ``state_dict`` keys are unchanged; set ``module.stac_r_checkpoint = False`` to switch a block off.
    Returns the names of the wrapped modules (idempotent).

    .. code-block:: python

        names = apply_checkpointing(lm, target=r"layers\\.\\d+$")   # every GPT-NeoX block
    """
    names = []
    for name, module in find_modules(model, target):
        names.append(name)
        if getattr(module, "stac_r_checkpoint", None) is not None:
            continue
        module.stac_r_checkpoint = True
        module.forward = functools.partial(_checkpointed_forward, module, module.forward)
    return names


def _checkpointed_forward(module: nn.Module, forward: Any, *args: Any, **kwargs: Any) -> Any:
    needs_grad = any(isinstance(a, Tensor) and a.requires_grad for a in args)
    if not (module.stac_r_checkpoint and module.training and torch.is_grad_enabled() and needs_grad):
        return forward(*args, **kwargs)
    from torch.utils.checkpoint import checkpoint

    # a recomputed layer must not write a KV cache a second time in backward (HF layers take it as a kwarg)
    kwargs = {k: (None if k in _CACHE_KWARGS else v) for k, v in kwargs.items()}
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    return checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=True)


_CACHE_KWARGS = frozenset({"past_key_values", "past_key_value", "layer_past", "cache"})


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
