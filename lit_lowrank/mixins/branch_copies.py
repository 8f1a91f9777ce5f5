"""How SpecDrop's branches are built: LoRA deltas around a frozen Linear, or re-drawn copies of a module.

Used by :class:`~lit_lowrank.mixins.specdrop.SpecDropBranches`; a branch copy must not equal
branch 0 (under No-Routing identical copies would stay identical), so each copy's weights are
drawn afresh from the module's own initialisation.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor, nn


class LoRABranch(nn.Module):
    """One low-rank branch ``delta(x) = B A x * alpha / r`` (``lora_A`` Kaiming, ``lora_B`` zero).

    Shapes: ``x: (..., in_features)`` -> ``(..., out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float,
                 dtype: torch.dtype | None = None, device: torch.device | None = None) -> None:
        super().__init__()
        if not 1 <= rank <= min(in_features, out_features):
            raise ValueError(f"`lora_rank`={rank!r}: expected 1 <= rank <= min({in_features}, {out_features}).")
        self.lora_A = nn.Linear(in_features, rank, bias=False, dtype=dtype, device=device)
        self.lora_B = nn.Linear(rank, out_features, bias=False, dtype=dtype, device=device)
        self.scaling = alpha / rank
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.lora_B(self.lora_A(x)) * self.scaling


def _permute_entries(module: nn.Module) -> None:
    """Shuffle the entries of every parameter tensor of a branch copy.

    For a freshly initialised module (i.i.d. entries per tensor, as every standard init
    draws them) this is an independent draw from exactly the module's own initialisation
    (Kaiming-normal convolutions stay Kaiming-normal; ones and zeros stay ones and zeros).
    """
    with torch.no_grad():
        for param in module.parameters():
            flat = param.reshape(-1)
            param.copy_(flat[torch.randperm(flat.numel(), device=flat.device)].view_as(param))


def _reinitialise(module: nn.Module) -> None:
    """Fresh weights from each submodule's ``reset_parameters()`` (PyTorch's default init)."""
    uncovered = []
    for name, sub in module.named_modules():
        if hasattr(sub, "reset_parameters"):
            sub.reset_parameters()
        elif any(True for _ in sub.parameters(recurse=False)):
            uncovered.append(name or type(sub).__name__)
    if uncovered:
        warnings.warn(
            f"SpecDrop init='reset': submodules {uncovered} have parameters but no reset_parameters(); "
            "their branch copies keep the original values.", stacklevel=3,
        )


def _infer_in_features(module: nn.Module) -> int | None:
    for sub in module.modules():
        for attr in ("in_features", "in_channels"):
            value = getattr(sub, attr, None)
            if isinstance(value, int):
                return value
    return None
