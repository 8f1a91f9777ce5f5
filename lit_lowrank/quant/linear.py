"""The quantized-linear wrapper every weight quantizer shares, and model-level bits accounting.

A :class:`QuantizedLinear` stores only a packed format in buffers (no float weight). On the CPU
it multiplies with its weight decoded once and cached (``cache_decoded=True``, the default: dense
speed after the first call, the dense weight's memory), or, with the cache off
(:func:`set_decode_cache`), by decoding one tile of output rows at a time on every call, so the
dense weight is never materialised (peak extra memory: one ``tile_rows x in_features`` tile).
GPU subclasses route to a fused kernel that decodes from the packed stream. A subclass says how
to decode rows (:meth:`QuantizedLinear.decode_rows`), what its exact storage is
(:meth:`QuantizedLinear.storage`) and, optionally, how inputs are transformed first
(:meth:`QuantizedLinear.prepare_input`, e.g. a Hadamard rotation). The state dict holds the
packed buffers, so ``save`` / ``load`` round-trip the quantized model exactly.

.. code-block:: python

    layer = SPHLinear.from_linear(linear, codebook, radius_bits=4, group_size=128)
    y = layer(x)                                  # decodes tile by tile
    model_bits(model).bits_per_weight_with_shared # over every quantized layer, codebooks once
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.ops.quantization import BitsBreakdown

#: Weights decoded per tile of the reference (CPU) GEMM: ~256 KiB of float32.
TILE_WEIGHTS = 1 << 16


class QuantizedLinear(nn.Module):
    """Base of weight-only quantized ``nn.Linear`` replacements (``y = x W^T + b``).

    Subclasses register their packed buffers and implement :meth:`decode_rows` and
    :meth:`storage`. ``bias`` stays float32 (a buffer: quantized layers are not trained).

    Args:
        in_features, out_features: the shape of the replaced Linear.
        bias: the replaced Linear's bias (copied) or ``None``.
        tile_rows: output rows decoded per tile (default: ``TILE_WEIGHTS / in_features``).

    .. code-block:: python

        class MyQuantLinear(QuantizedLinear):
            def decode_rows(self, start, stop): ...       # (stop - start, in_features) float32
            def storage(self): ...                        # BitsBreakdown
    """

    #: Weight-side shared buffers that transformers' ``save_pretrained`` may store once (see
    #: :mod:`lit_lowrank.quant.pretrained`); a subclass sharing a codebook names it here.
    _tied_weights_keys: dict[str, str] | None = None

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None = None,
                 tile_rows: int | None = None, cache_decoded: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.tile_rows = int(tile_rows or max(1, TILE_WEIGHTS // self.in_features))
        self.cache_decoded = bool(cache_decoded)
        self._decoded: tuple[Any, Tensor] | None = None  # (buffer versions, dense weight): not a buffer, never saved
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def decode_rows(self, start: int, stop: int) -> Tensor:
        """Weights of output rows ``[start, stop)``: ``(stop - start, in_features)`` float32."""
        raise NotImplementedError

    def storage(self) -> BitsBreakdown:
        """Exact storage of the packed format (shared data such as codebooks as ``shared_bits``)."""
        raise NotImplementedError

    def shared_tensors(self) -> list[Tensor]:
        """Buffers shared with other layers (counted once by :func:`model_bits`)."""
        return []

    def prepare_input(self, x: Tensor) -> Tensor:
        """Transform inputs before the product (identity; a rotation-based format overrides it)."""
        return x

    def dequantize(self) -> Tensor:
        """The full dense weight ``(out, in)`` (for tests and analysis; the forward never builds it)."""
        return torch.cat([self.decode_rows(s, min(s + self.tile_rows, self.out_features))
                          for s in range(0, self.out_features, self.tile_rows)])

    def _buffer_key(self) -> tuple[Any, ...]:
        return tuple((name, b.data_ptr(), b._version, b.device) for name, b in self.named_buffers(recurse=False)
                     if b is not None and name != "bias")

    def decoded_weight(self) -> Tensor:
        """The dense weight, decoded once and kept until a format buffer changes (``load_state_dict``,
        ``.to()``): the CPU product's cache when ``cache_decoded`` (costs the dense float32 weight's memory)."""
        key = self._buffer_key()
        cached = self._decoded
        stale = cached is None or cached[0] != key or (torch.is_inference(cached[1])
                                                       and not torch.is_inference_mode_enabled())
        if stale:
            with torch.no_grad():
                cached = (key, self.dequantize())
            self._decoded = cached
        return cached[1]  # type: ignore[index]

    def clear_decoded(self) -> None:
        """Drop the decoded-weight cache (the memory returns to the packed size)."""
        self._decoded = None

    def matmul_reference(self, x: Tensor) -> Tensor:
        """``x (M, in) @ W^T`` on the CPU: with the decoded weight cached once (``cache_decoded``, the
        default), else decoding ``tile_rows`` rows at a time on every call (peak extra memory one tile)."""
        if self.cache_decoded:
            return x @ self.decoded_weight().to(x.dtype).T
        out = x.new_empty(x.shape[0], self.out_features)
        for start in range(0, self.out_features, self.tile_rows):
            stop = min(start + self.tile_rows, self.out_features)
            out[:, start:stop] = x @ self.decode_rows(start, stop).to(x.dtype).T
        return out

    def matmul(self, x: Tensor) -> Tensor:
        """``x (M, in) @ W^T``; subclasses route GPU inputs to a fused kernel."""
        return self.matmul_reference(x)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__}: input's last dimension is {x.shape[-1]}, expected "
                             f"in_features={self.in_features}.")
        lead = x.shape[:-1]
        flat = self.prepare_input(x.reshape(-1, self.in_features))
        y = self.matmul(flat)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        s = self.storage()
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, bits_per_weight={s.bits_per_weight:.4g}")


def set_decode_cache(model: nn.Module, enabled: bool) -> int:
    """Turn the CPU decoded-weight cache of every quantized layer on or off (off also frees it);
    returns the number of layers.

    .. code-block:: python

        set_decode_cache(model, False)     # packed-size memory, every CPU forward decodes its tiles
    """
    layers = quantized_layers(model)
    for layer in layers.values():
        layer.cache_decoded = bool(enabled)
        if not enabled:
            layer.clear_decoded()
    return len(layers)


def quantized_layers(model: nn.Module) -> dict[str, QuantizedLinear]:
    """Every :class:`QuantizedLinear` of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}


def model_bits(model: nn.Module) -> BitsBreakdown:
    """Storage of all quantized layers of ``model``; a shared buffer (codebook) counts once.

    .. code-block:: python

        bits = model_bits(model)
        print(f"{bits.bits_per_weight:.3f} bits/weight, {bits.bits_per_weight_with_shared:.3f} with codebooks")
    """
    total = BitsBreakdown(0, 0, 0, 0)
    seen: set[Any] = set()
    for layer in quantized_layers(model).values():
        s = layer.storage()
        shared = 0
        keys = [(t.data_ptr(), t.numel()) for t in layer.shared_tensors()]
        if not keys or any(k not in seen for k in keys):  # per-layer side data, or a codebook not yet counted
            shared = s.shared_bits
            seen.update(keys)
        total = total + BitsBreakdown(s.num_weights, s.payload_bits, s.scale_bits, shared)
    return total


def buffer_bytes(layer: nn.Module, exclude_shared: bool = True) -> int:
    """Bytes actually held by a quantized layer's format buffers (bias and shared buffers excluded).

    Compare with ``storage()``: the difference is only the packing padding.
    """
    shared = {t.data_ptr() for t in layer.shared_tensors()} if exclude_shared and isinstance(layer, QuantizedLinear) \
        else set()
    return sum(b.numel() * b.element_size() for name, b in layer.named_buffers(recurse=False)
               if b is not None and name != "bias" and b.data_ptr() not in shared)
