"""Triton GEMV for SPHQuant's packed format (GPU decode path of ``SPHLinear``).

One program computes ``BLOCK_O`` outputs of one input row: it walks the row's 8-D vectors
``BLOCK_V`` at a time, reads each vector's ``8 + log2 K + b_r``-bit item through an 8-byte
window of the packed stream, splits it into signs / codeword index / radius code, gathers
the codeword from the fp16 codebook (at most 4096 x 8 x 2 B = 64 KiB, so it stays resident
in the SM's L1 / shared memory across the whole sweep), and accumulates
``rho_hat * <s * c_k, x_block>`` in float32. The dense weight never exists, in registers or
in memory.

Used for inputs with at most ``MAX_ROWS`` rows (decode-time GEMV / small batches); larger
inputs (prefill) take the tile-wise reference path. The CPU tests run this kernel through
Triton's interpreter (``TRITON_INTERPRET=1``); it was not benchmarked on a GPU here.

.. code-block:: python

    y = sph_matmul_triton(x, layer.packed, layer.codebook, layer.radius_min, layer.radius_step,
                          layer.out_features, layer.codebook_size, layer.radius_bits, layer.group_size)
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch
from torch import Tensor

MAX_ROWS = 8


@lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether Triton is importable (the GPU kernel needs it; the CPU path does not)."""
    return importlib.util.find_spec("triton") is not None


@lru_cache(maxsize=1)
def _kernel():  # noqa: ANN202 - built lazily: importing triton costs seconds
    import triton
    import triton.language as tl

    @triton.jit
    def sph_gemv_kernel(x_ptr, packed_ptr, codebook_ptr, rmin_ptr, rstep_ptr, y_ptr,
                        out_features, vectors, groups, vectors_per_group,
                        TOTAL_BITS: tl.constexpr, INDEX_BITS: tl.constexpr, RADIUS_BITS: tl.constexpr,
                        BLOCK_O: tl.constexpr, BLOCK_V: tl.constexpr):
        row = tl.program_id(1)
        offs_o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
        offs_d = tl.arange(0, 8)
        mask_o = offs_o < out_features
        acc = tl.zeros((BLOCK_O,), dtype=tl.float32)
        for v0 in range(0, vectors, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            mask_v = offs_v < vectors
            mask_ov = mask_o[:, None] & mask_v[None, :]
            item = offs_o[:, None].to(tl.int64) * vectors + offs_v[None, :]
            bit = item * TOTAL_BITS
            byte = bit >> 3
            word = tl.zeros((BLOCK_O, BLOCK_V), dtype=tl.int64)
            for b in tl.static_range(8):
                part = tl.load(packed_ptr + byte + b, mask=mask_ov, other=0).to(tl.int64)
                word = word | (part << (8 * b))
            word = word >> (bit & 7)
            signs = word & 255
            index = (word >> 8) & ((1 << INDEX_BITS) - 1)
            rcode = (word >> (8 + INDEX_BITS)) & ((1 << RADIUS_BITS) - 1)
            group = offs_v[None, :] // vectors_per_group
            gidx = offs_o[:, None] * groups + group
            rmin = tl.load(rmin_ptr + gidx, mask=mask_ov, other=0.0).to(tl.float32)
            rstep = tl.load(rstep_ptr + gidx, mask=mask_ov, other=0.0).to(tl.float32)
            rho = rmin + rstep * rcode.to(tl.float32)                                  # (O, V)
            code = tl.load(codebook_ptr + index[:, :, None] * 8 + offs_d[None, None, :],
                           mask=mask_ov[:, :, None], other=0.0).to(tl.float32)         # (O, V, 8)
            negative = (signs[:, :, None] >> offs_d[None, None, :]) & 1
            x = tl.load(x_ptr + row * vectors * 8 + offs_v[:, None] * 8 + offs_d[None, :],
                        mask=mask_v[:, None], other=0.0).to(tl.float32)                # (V, 8)
            signed_x = tl.where(negative == 1, -x[None, :, :], x[None, :, :])          # (O, V, 8)
            acc += tl.sum(rho * tl.sum(code * signed_x, axis=2), axis=1)
        tl.store(y_ptr + row * out_features + offs_o, acc, mask=mask_o)

    return sph_gemv_kernel


def sph_matmul_triton(x: Tensor, packed: Tensor, codebook: Tensor, radius_min: Tensor, radius_step: Tensor,
                      out_features: int, codebook_size: int, radius_bits: int, group_size: int,
                      block_o: int = 32, block_v: int = 16) -> Tensor:
    """``x (M, in) @ W^T`` decoded from the packed SPH format by the Triton kernel.

    Each input row decodes the weight again (a GEMV per row): meant for ``M <= MAX_ROWS``;
    ``SPHLinear`` sends larger inputs to its tile-wise path.
    """
    import triton

    m, in_features = x.shape
    vectors = in_features // 8

    index_bits = codebook_size.bit_length() - 1
    y = torch.empty(m, out_features, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(out_features, block_o), m)
    _kernel()[grid](x.contiguous(), packed, codebook.contiguous(), radius_min.contiguous(), radius_step.contiguous(),
                    y, out_features, vectors, radius_min.shape[1], group_size // 8,
                    TOTAL_BITS=8 + index_bits + radius_bits, INDEX_BITS=index_bits, RADIUS_BITS=radius_bits,
                    BLOCK_O=block_o, BLOCK_V=block_v)
    return y.to(x.dtype)
