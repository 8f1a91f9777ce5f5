"""Packed MXFP4 ``nn.Linear`` replacement on the shared :class:`~lit_lowrank.quant.linear.QuantizedLinear`.

The storage path of the MXFP4 format (the QAT path is :mod:`lit_lowrank.quant.moe`'s fake
quantization): 4-bit E2M1 codes and 8-bit E8M0 block scales packed bit-exactly with
:func:`~lit_lowrank.ops.quantization.pack_fields`, decoded one tile of rows at a time by the
CPU reference kernel; ``storage()`` is exactly 4.25 bits/weight. The GPU W4A8 serving kernel
is not part of this project (see ``docs/methods/moe_quant.md``).

.. code-block:: python

    layer = MXFP4Linear.from_linear(linear)     # buffers only, no float weight
    y = layer(x)                                # == x @ mxfp4_quantize(linear.weight).T + b
"""

from __future__ import annotations

from torch import Tensor, nn

from lit_lowrank.ops.mxfp4 import ELEMENT_BITS, MX_BLOCK, SCALE_BITS, mxfp4_bits, mxfp4_decode, mxfp4_pack
from lit_lowrank.ops.quantization import BitsBreakdown, unpack_fields
from lit_lowrank.quant.linear import QuantizedLinear


class MXFP4Linear(QuantizedLinear):
    """An ``nn.Linear`` stored as packed MXFP4 (blocks of ``block_size`` along the input dimension).

    Args:
        in_features, out_features, bias, tile_rows: as :class:`QuantizedLinear`.
        block_size: MX block size (``in_features`` must be a multiple).

    .. code-block:: python

        q = MXFP4Linear.from_linear(nn.Linear(256, 64))
        q.storage().bits_per_weight      # 4.25
    """

    def __init__(self, in_features: int, out_features: int, bias: Tensor | None = None, block_size: int = MX_BLOCK,
                 tile_rows: int | None = None) -> None:
        super().__init__(in_features, out_features, bias, tile_rows)
        if in_features % block_size:
            raise ValueError(f"MXFP4Linear: in_features={in_features} is not a multiple of block_size={block_size}.")
        self.block_size = int(block_size)
        self.register_buffer("codes", None)
        self.register_buffer("scales", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, block_size: int = MX_BLOCK) -> MXFP4Linear:
        """Quantize ``linear.weight`` to packed MXFP4 (round-to-nearest-even, saturating)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias, block_size)
        layer.codes, layer.scales = mxfp4_pack(linear.weight.detach().float(), block_size)
        return layer.to(linear.weight.device)

    def decode_rows(self, start: int, stop: int) -> Tensor:
        per_row = self.in_features // self.block_size
        (codes,) = unpack_fields(self.codes, [ELEMENT_BITS], (stop - start) * self.in_features,
                                 start=start * self.in_features)
        (scales,) = unpack_fields(self.scales, [SCALE_BITS], (stop - start) * per_row, start=start * per_row)
        return mxfp4_decode(codes.view(stop - start, self.in_features), scales.view(stop - start, per_row),
                            self.block_size)

    def storage(self) -> BitsBreakdown:
        return mxfp4_bits(self.out_features, self.in_features, self.block_size)
