"""SVDLinear: a Linear (or 1×1 conv) with a cached SVD whose active rank is switched between calls.

SARA (METHODS.md §17) keeps one SVD per layer and changes only how much of it runs:
``y = (x V_r)(U_r Σ_r)ᵀ + b``. At ``rank=None`` — and at any rank at or above the
break-even rank ``m n / (m + n)``, where the factor pair would cost more MACs than the
dense weight — the original layer runs unchanged, so full rank reproduces the original
outputs bit for bit. Every call adds its exact MACs (used, and what the dense layer
would have cost) to the layer's counters.

.. code-block:: python

    layer = SVDLinear(nn.Linear(128, 128))
    layer.rank = 16          # two 128x16 products instead of one 128x128
    y = layer(x)
    layer.macs_used, layer.macs_dense
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.ops.lowrank import truncated_svd
from lit_lowrank.ops.macs import linear_macs
from lit_lowrank.ops.sara import break_even_rank, factored_macs

__all__ = ["SVDLinear", "is_pointwise_conv"]


def is_pointwise_conv(module: nn.Module) -> bool:
    """A 2-D convolution that is a per-pixel Linear map (1×1 kernel, stride 1, no groups/padding/dilation)."""
    return (isinstance(module, nn.Conv2d) and tuple(module.kernel_size) == (1, 1) and tuple(module.stride) == (1, 1)
            and module.groups == 1 and tuple(module.padding) == (0, 0) and tuple(module.dilation) == (1, 1)
            and module.padding_mode == "zeros")


class SVDLinear(nn.Module):
    """SVD-factored replacement of an ``nn.Linear`` or a pointwise ``nn.Conv2d``.

    The original layer is kept as ``base`` (its parameters are shared, not copied) so
    it can be restored and runs at full rank. The factors ``us = U Σ`` ``(m, k)`` and
    ``vh = Vᵀ`` ``(k, n)`` are buffers in the layer's dtype and device, computed once in
    float32 or wider (:func:`~lit_lowrank.ops.lowrank.truncated_svd`); ``singular`` ``(k,)``
    feeds the LRAE.

    Attributes:
        rank: the active rank (``None`` = dense); set between forward calls.
        macs_used / macs_dense: MACs accumulated since :meth:`reset_macs`.
        rows_seen: input rows of the last call (for MACs planning).
    """

    def __init__(self, layer: nn.Linear | nn.Conv2d) -> None:
        super().__init__()
        if isinstance(layer, nn.Linear):
            self.pointwise = False
        elif is_pointwise_conv(layer):
            self.pointwise = True
        else:
            raise ValueError(f"SVDLinear wraps nn.Linear or a 1x1 stride-1 nn.Conv2d, got {layer!r}.")
        self.base = layer
        weight = layer.weight.detach().reshape(layer.weight.shape[0], -1)
        self.out_features, self.in_features = weight.shape
        self.full_rank = min(self.out_features, self.in_features)
        u, s, vh = truncated_svd(weight, self.full_rank)
        self.register_buffer("us", (u * s).to(weight.dtype), persistent=False)
        self.register_buffer("vh", vh.to(weight.dtype), persistent=False)
        self.register_buffer("singular", s, persistent=False)
        self.break_even = break_even_rank(self.out_features, self.in_features)
        self.rank: int | None = None
        self.rows_seen = 0
        self.macs_used = 0
        self.macs_dense = 0
        #: when set to a list, each call appends its inputs (data-aware LRAE calibration)
        self.captured_inputs: list[Tensor] | None = None

    def runs_dense(self, rank: int | None) -> bool:
        """Whether ``rank`` runs the original layer (``None`` or not below the break-even rank)."""
        return rank is None or rank >= self.break_even

    def set_rank(self, rank: int | None) -> None:
        """Set the active rank, checking ``1 <= rank <= min(m, n)``."""
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)
                                 or not 1 <= rank <= self.full_rank):
            raise ValueError(f"rank must be None or an integer in [1, {self.full_rank}] for a "
                             f"{self.out_features}x{self.in_features} layer, got {rank!r}.")
        self.rank = rank

    def reset_macs(self) -> None:
        self.macs_used = self.macs_dense = 0

    def forward(self, x: Tensor) -> Tensor:
        rank = self.rank
        rows = x.numel() // self.in_features
        self.rows_seen = rows
        self.macs_dense += linear_macs(rows, self.in_features, self.out_features)
        self.macs_used += factored_macs(rows, self.out_features, self.in_features,
                                        None if self.runs_dense(rank) else rank)
        if self.captured_inputs is not None:
            self.captured_inputs.append((x.movedim(1, -1) if self.pointwise else x).detach())
        if self.runs_dense(rank):
            return self.base(x)
        h = x.movedim(1, -1) if self.pointwise else x
        # slicing views of the cached factors: switching rank costs nothing
        y = F.linear(F.linear(h, self.vh[:rank]), self.us[:, :rank], self.base.bias)
        return y.movedim(-1, 1) if self.pointwise else y

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, full_rank={self.full_rank}, rank={self.rank}"
