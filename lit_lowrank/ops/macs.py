"""The shared MAC counter (METHODS.md, "Shared definitions"): Linear and conv layers, counted from shapes.

Counts are analytic — ``in_features × out_features`` per output row for a Linear,
``C_in/groups × prod(kernel) × C_out`` per output position for a convolution —
taken from the shapes seen in one forward pass, never from wall time. Methods that
change how much of a layer runs (skipped layers, low-rank factors, fewer denoising
steps) report MACs from this counter so rows are comparable.

.. code-block:: python

    from lit_lowrank.ops.macs import count_macs, linear_macs

    total, per_module = count_macs(model, example_input)
    linear_macs(rows=seq_len, in_features=768, out_features=768)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["conv_macs", "count_macs", "linear_macs"]


def linear_macs(rows: int, in_features: int, out_features: int) -> int:
    """MACs of ``rows`` vectors through a dense ``in_features → out_features`` map (a low-rank pair is two maps)."""
    return int(rows) * int(in_features) * int(out_features)


def conv_macs(output_shape: tuple[int, ...] | torch.Size, in_channels: int, kernel_size: tuple[int, ...],
              groups: int = 1) -> int:
    """MACs of a convolution producing ``output_shape`` ``(N, C_out, *spatial)``."""
    n, c_out, *spatial = output_shape
    return int(n) * int(c_out) * math.prod(spatial) * (in_channels // groups) * math.prod(kernel_size)


def count_macs(model: nn.Module, *inputs: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
    """Run ``model(*inputs, **kwargs)`` once under ``no_grad`` and count Linear/conv MACs.

    Returns:
        ``(total, per_module)`` where ``per_module`` maps qualified module names to MACs (modules that ran
        several times are summed).
    """
    counts: dict[str, int] = {}
    handles = []

    def hook(name: str):
        def record(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
            if isinstance(module, nn.Linear):
                rows = output.numel() // module.out_features
                macs = linear_macs(rows, module.in_features, module.out_features)
            else:
                macs = conv_macs(output.shape, module.in_channels, module.kernel_size, module.groups)
            counts[name] = counts.get(name, 0) + macs
        return record

    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return sum(counts.values()), counts
