"""SVDLinear: a Linear (or a conv) with a cached SVD whose active rank is switched between calls.

SARA (METHODS.md §17) keeps one SVD per layer and changes only how much of it runs:
``y = (x V_r)(U_r Σ_r)ᵀ + b``. At ``rank=None`` — and at any rank at or above the
break-even rank ``m n / (m + n)``, where the factor pair would cost more MACs than the
dense weight — the original layer runs unchanged, so full rank reproduces the original
outputs bit for bit. Every call adds its exact MACs (used, and what the dense layer
would have cost) to the layer's counters.

A ``k×k`` convolution (ungrouped, zero padding) is factored as the matrix ``C_out × C_in·k·k``
(its weight reshaped): at rank ``r`` it runs a ``k×k`` conv to ``r`` channels with ``Vᵀ_r`` (the
stride, padding and dilation of the original) and then a pointwise map with ``U_r Σ_r`` — the
same ``rows · r (m + n)`` MACs with ``rows`` = output pixels and ``n = C_in·k·k``.

.. code-block:: python

    layer = SVDLinear(nn.Linear(128, 128))
    layer.rank = 16          # two 128x16 products instead of one 128x128
    y = layer(x)
    layer.macs_used, layer.macs_dense
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.ops.lowrank import truncated_svd
from lit_lowrank.ops.macs import linear_macs
from lit_lowrank.ops.sara.rank import break_even_rank, factored_macs

__all__ = ["SVDLinear", "is_factorable_conv", "is_pointwise_conv"]


def is_pointwise_conv(module: nn.Module) -> bool:
    """A 2-D convolution that is a per-pixel Linear map (1×1 kernel, stride 1, no groups/padding/dilation)."""
    return (isinstance(module, nn.Conv2d) and tuple(module.kernel_size) == (1, 1) and tuple(module.stride) == (1, 1)
            and module.groups == 1 and tuple(module.padding) == (0, 0) and tuple(module.dilation) == (1, 1)
            and module.padding_mode == "zeros")


def is_factorable_conv(module: nn.Module) -> bool:
    """An ungrouped ``nn.Conv2d`` with zero padding: its weight is the matrix ``C_out × C_in·k·k``."""
    return isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"


class SVDLinear(nn.Module):
    """SVD-factored replacement of an ``nn.Linear`` or an ungrouped ``nn.Conv2d`` (1×1 or ``k×k``).

    The original layer is kept as ``base`` (its parameters are shared, not copied) so
    it can be restored and runs at full rank. The factors ``us = U Σ`` ``(m, c)`` and
    ``vh = Vᵀ`` ``(c, n)`` are buffers in the layer's dtype and device, computed once in
    float32 or wider (:func:`~lit_lowrank.ops.lowrank.truncated_svd`), and kept only up to
    ``c = cached_rank``, the largest rank below the break-even rank: any rank at or above it runs
    the dense ``base`` weight, so caching more would only add memory (full-rank ``U Σ`` and ``Vᵀ``
    are ``(m + n) k`` values on top of the ``m n`` weights, 1.5–2× the layer).
    ``singular`` ``(k,)`` (all ``k = min(m, n)`` values, cheap) feeds the LRAE.

    Attributes:
        rank: the active rank (``None`` = dense); set between forward calls.
        cached_rank: the largest rank that runs factored (``⌈m n / (m + n)⌉ − 1``, ≥ 0): the factors' width.
        macs_used / macs_dense: MACs accumulated since :meth:`reset_macs`.
        rows_seen: input rows of the last call (for MACs planning).
    """

    def __init__(self, layer: nn.Linear | nn.Conv2d) -> None:
        super().__init__()
        if isinstance(layer, nn.Linear):
            self.kind = "linear"
        elif is_pointwise_conv(layer):
            self.kind = "pointwise"
        elif is_factorable_conv(layer):
            self.kind = "conv"
        else:
            raise ValueError(f"SVDLinear wraps nn.Linear or an ungrouped zero-padded nn.Conv2d, got {layer!r}.")
        self.pointwise = self.kind == "pointwise"
        self.base = layer
        weight = layer.weight.detach().reshape(layer.weight.shape[0], -1)
        self.out_features, self.in_features = weight.shape
        self.full_rank = min(self.out_features, self.in_features)
        self.break_even = break_even_rank(self.out_features, self.in_features)
        self.cached_rank = max(0, min(self.full_rank, math.ceil(self.break_even) - 1))
        u, s, vh = truncated_svd(weight, self.full_rank)
        c = self.cached_rank
        self.register_buffer("us", (u[:, :c] * s[:c]).to(weight.dtype).contiguous(), persistent=False)
        self.register_buffer("vh", vh[:c].to(weight.dtype).contiguous(), persistent=False)
        self.register_buffer("singular", s, persistent=False)
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

    def _rows_in(self, x: Tensor) -> Tensor:
        """The layer's input as rows of ``in_features`` (a conv's input unfolded into its patches)."""
        if self.kind == "linear":
            return x
        if self.kind == "pointwise":
            return x.movedim(1, -1)
        conv = self.base
        patches = F.unfold(x, conv.kernel_size, conv.dilation, conv.padding, conv.stride)  # (N, C_in k k, L)
        return patches.transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        rank = self.rank
        if self.captured_inputs is not None:
            self.captured_inputs.append(self._rows_in(x).detach())
        if self.runs_dense(rank):
            y = self.base(x)
        elif self.kind == "conv":
            conv = self.base
            # slicing views of the cached factors: switching rank costs nothing
            basis = self.vh[:rank].reshape(rank, *conv.weight.shape[1:])
            h = F.conv2d(x, basis, None, conv.stride, conv.padding, conv.dilation)
            y = F.linear(h.movedim(1, -1), self.us[:, :rank], conv.bias).movedim(-1, 1)
        else:
            h = x.movedim(1, -1) if self.pointwise else x
            y = F.linear(F.linear(h, self.vh[:rank]), self.us[:, :rank], self.base.bias)
            y = y.movedim(-1, 1) if self.pointwise else y
        # rows = output vectors (for a strided / padded conv the output pixels, not input numel / n)
        rows = y.numel() // self.out_features
        self.rows_seen = rows
        self.macs_dense += linear_macs(rows, self.in_features, self.out_features)
        self.macs_used += factored_macs(rows, self.out_features, self.in_features,
                                        None if self.runs_dense(rank) else rank)
        return y

    def extra_repr(self) -> str:
        return (f"{self.kind} {self.in_features}->{self.out_features}, full_rank={self.full_rank}, "
                f"rank={self.rank}")
