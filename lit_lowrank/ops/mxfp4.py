"""MXFP4 (OCP Microscaling v1.0): blocks of 32 values along the last dimension share one E8M0
power-of-two scale; each value is an E2M1 float. 4 + 8/32 = 4.25 bits/weight.

Pure torch (no Lightning). The format, as implemented here:

- **Scale** (E8M0, 8 bits, bias 127): ``X = 2^(floor(log2(amax)) - 2)`` per block, ``amax`` the
  block's largest magnitude and 2 the exponent of E2M1's largest normal (6 = 1.5 * 2^2); the
  exponent is clamped to ``[-127, 127]`` (code 0 is ``2^-127``, a float32 subnormal, kept exact
  here — "subnormal scale"). An all-zero block gets the smallest scale (``2^-127``) and codes 0.
- **Elements** (E2M1, 4 bits = sign + 3-bit magnitude code): magnitudes
  ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` (codes 0..7 are exactly the E2M1 bit patterns). ``v / X`` is
  rounded to the nearest representable value, ties to the even code (IEEE round-to-nearest-even),
  and values beyond ±6 **saturate** to ±6 (OCP's conversion rule for FP4, which has no Inf/NaN).
  Because the scale floors ``log2(amax)``, ``amax / X`` lies in ``[4, 8)``: up to ``8`` before
  saturation, so the block maximum can lose up to 25% (this is the OCP / torchao "floor" mode).
- **NaN policy**: a block containing NaN or ±Inf gets the E8M0 NaN scale (code 255), and the
  whole block decodes to NaN (the OCP rule that the scale carries a block's non-finite state;
  E2M1 itself cannot encode NaN). Finite blocks are never affected by their neighbours.

The element rounding uses the piecewise-uniform structure of E2M1 (steps 0.5 on [0, 2), 1 on
[2, 4), 2 on [4, 6]) with ``torch.round`` (round half to even), which picks the even code at every
tie; the tests check it against a brute-force nearest-grid-point search over all 8 magnitudes
and against torchao's MX reference (``torchao.prototype.mx_formats.mx_tensor.to_mx``).

.. code-block:: python

    w = torch.randn(64, 256)
    codes, scales = mxfp4_encode(w)            # uint8 (64, 256) codes 0..15, uint8 (64, 8) E8M0 codes
    w_hat = mxfp4_decode(codes, scales)        # float32 (64, 256)
    w_qat = mxfp4_fake_quant(w)                # == w_hat in value; straight-through gradient
    mxfp4_bits(64, 256).bits_per_weight        # 4.25
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_lowrank.ops.quantization import BitsBreakdown, pack_fields, unpack_fields

__all__ = [
    "E2M1_GRID",
    "MX_BLOCK",
    "mxfp4_bits",
    "mxfp4_decode",
    "mxfp4_encode",
    "mxfp4_fake_quant",
    "mxfp4_pack",
    "mxfp4_quantize",
    "mxfp4_unpack",
    "round_to_e2m1",
]

#: Values per shared scale (OCP MX block size).
MX_BLOCK = 32
#: E2M1 magnitudes in code order (code = index; the sign is bit 3).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
#: floor(log2(E2M1_MAX)): the scale maps the block maximum's exponent onto this one.
E2M1_EMAX = 2
E8M0_BIAS = 127
E8M0_NAN = 255
ELEMENT_BITS = 4
SCALE_BITS = 8


def _check(x: Tensor, block_size: int) -> None:
    if not x.is_floating_point():
        raise ValueError(f"`x` must be a floating-point tensor, got dtype {x.dtype}.")
    if x.dim() < 1 or x.shape[-1] % block_size:
        raise ValueError(f"`x` has shape {tuple(x.shape)}: its last dimension must be a multiple of "
                         f"block_size={block_size} (MX blocks run along the input dimension).")


def round_to_e2m1(v: Tensor) -> Tensor:
    """Round (already scaled) values to the E2M1 grid: nearest, ties to even code, saturate at ±6.

    NaN stays NaN (the caller's block policy handles it). Float32 in, float32 out.

    .. code-block:: python

        round_to_e2m1(torch.tensor([0.25, 0.75, 2.5, 5.0, 7.0]))   # [0., 1., 2., 4., 6.]
    """
    a = v.abs().clamp(max=E2M1_MAX)
    # the grid is uniform on each binade: step 0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6]; torch.round
    # rounds halves to even, and an even multiple of the step is always an even E2M1 code
    q = torch.where(a < 2, torch.round(a * 2) / 2, torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))
    return torch.copysign(q, v)


def _block_exponents(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Unbiased scale exponent per block (int32, clamped to [-127, 127]) and the non-finite mask."""
    amax = blocks.abs().amax(-1)
    bad = ~torch.isfinite(amax)
    # frexp: amax = m * 2^e, m in [0.5, 1) -> floor(log2 amax) = e - 1 (exact, subnormals included)
    _, e = torch.frexp(torch.where(bad | (amax == 0), torch.ones_like(amax), amax))
    exp = (e - 1 - E2M1_EMAX).to(torch.int32)
    exp = torch.where(amax == 0, torch.full_like(exp, -E8M0_BIAS), exp)
    return exp.clamp(-E8M0_BIAS, E8M0_BIAS), bad


def _pow2(exp: Tensor) -> Tensor:
    # float64: 2^-127 is subnormal in float32 and ldexp there is exact anyway, but float64 keeps
    # the division v / 2^e exact for every finite float32 v
    return torch.ldexp(torch.ones_like(exp, dtype=torch.float64), exp.to(torch.float64))


def mxfp4_quantize(x: Tensor, block_size: int = MX_BLOCK) -> Tensor:
    """Quantize-dequantize ``x`` to MXFP4 (no gradient): the values a decoder would read.

    Args:
        x: float tensor ``(..., n)``, ``n`` a multiple of ``block_size``.
        block_size: values per shared scale (32 in OCP MX).

    Returns:
        Tensor of ``x``'s shape and dtype.

    .. code-block:: python

        w_hat = mxfp4_quantize(w)            # blocks of 32 along the last dimension
    """
    codes, scales = mxfp4_encode(x, block_size)
    return mxfp4_decode(codes, scales, block_size).to(x.dtype)


def mxfp4_encode(x: Tensor, block_size: int = MX_BLOCK) -> tuple[Tensor, Tensor]:
    """MXFP4 codes of ``x``.

    Returns:
        ``codes``: uint8 of ``x``'s shape, ``sign << 3 | magnitude_code`` (0..15);
        ``scales``: uint8 ``(..., n // block_size)`` E8M0 biased exponents (255 = NaN block).

    .. code-block:: python

        codes, scales = mxfp4_encode(torch.randn(8, 64))   # (8, 64), (8, 2)
    """
    _check(x, block_size)
    blocks = x.detach().float().reshape(*x.shape[:-1], -1, block_size)
    exp, bad = _block_exponents(blocks)
    scaled = (blocks.double() / _pow2(exp)[..., None]).float()
    scaled = torch.where(bad[..., None], torch.zeros_like(scaled), scaled)
    q = round_to_e2m1(scaled)
    # magnitude -> code: 0, .5, 1, 1.5 -> 0..3 (2q); 2, 3 -> 4, 5 (q + 2); 4, 6 -> 6, 7 (q/2 + 4)
    a = q.abs()
    mag = torch.where(a < 2, a * 2, torch.where(a < 4, a + 2, a / 2 + 4)).to(torch.uint8)
    sign = torch.signbit(q).to(torch.uint8)
    codes = (sign << 3 | mag).reshape(x.shape)
    scales = torch.where(bad, torch.full_like(exp, E8M0_NAN), exp + E8M0_BIAS).to(torch.uint8)
    return codes, scales


def mxfp4_decode(codes: Tensor, scales: Tensor, block_size: int = MX_BLOCK) -> Tensor:
    """Float32 values of MXFP4 ``codes`` (uint8 0..15) and E8M0 ``scales`` (uint8; 255 = NaN block).

    .. code-block:: python

        w_hat = mxfp4_decode(*mxfp4_encode(w))
    """
    if codes.shape[-1] != scales.shape[-1] * block_size:
        raise ValueError(f"`codes` {tuple(codes.shape)} and `scales` {tuple(scales.shape)} disagree for "
                         f"block_size={block_size}: expected codes.shape[-1] == scales.shape[-1] * block_size.")
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    c = codes.long()
    mag = grid[c & 7]
    val = torch.where((c & 8) > 0, -mag, mag).reshape(*codes.shape[:-1], -1, block_size)
    s = scales.long()
    scale = _pow2((s - E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS))
    scale = torch.where(s == E8M0_NAN, torch.full_like(scale, float("nan")), scale)
    return (val.double() * scale[..., None]).float().reshape(codes.shape)


class _FakeQuantSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, block_size: int) -> Tensor:  # type: ignore[override]
        return mxfp4_quantize(x, block_size)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad, None


def mxfp4_fake_quant(x: Tensor, block_size: int = MX_BLOCK) -> Tensor:
    """MXFP4 fake quantization with a straight-through gradient: ``x + (Q(x) - x).detach()``.

    The forward value is exactly :func:`mxfp4_quantize`; the gradient w.r.t. ``x`` is the identity
    (also beyond ±6·scale, i.e. no clipping mask: the block scale follows ``amax``, so only the
    block maximum can saturate).

    .. code-block:: python

        w = torch.randn(16, 64, requires_grad=True)
        (mxfp4_fake_quant(w) * g).sum().backward()   # w.grad == g
    """
    return _FakeQuantSTE.apply(x, block_size)


def mxfp4_bits(out_features: int, in_features: int, block_size: int = MX_BLOCK) -> BitsBreakdown:
    """Exact MXFP4 storage: 4 bits per value plus one 8-bit E8M0 scale per block (4.25 bits/weight at 32)."""
    n = out_features * in_features
    return BitsBreakdown(n, n * ELEMENT_BITS, (n // block_size) * SCALE_BITS)


def mxfp4_pack(x: Tensor, block_size: int = MX_BLOCK) -> tuple[Tensor, Tensor]:
    """Bit-exact MXFP4 storage of ``x``: (4-bit code stream, 8-bit scale stream), both uint8 via
    :func:`~lit_lowrank.ops.quantization.pack_fields` (two codes per byte, padding included).

    .. code-block:: python

        code_stream, scale_stream = mxfp4_pack(w)
        w_hat = mxfp4_unpack(code_stream, scale_stream, w.shape)
    """
    codes, scales = mxfp4_encode(x, block_size)
    return pack_fields([codes], [ELEMENT_BITS]), pack_fields([scales], [SCALE_BITS])


def mxfp4_unpack(code_stream: Tensor, scale_stream: Tensor, shape: tuple[int, ...] | torch.Size,
                 block_size: int = MX_BLOCK) -> Tensor:
    """Decode :func:`mxfp4_pack`'s streams back to float32 of ``shape``."""
    shape = tuple(shape)
    n = 1
    for d in shape:
        n *= d
    (codes,) = unpack_fields(code_stream, [ELEMENT_BITS], n)
    (scales,) = unpack_fields(scale_stream, [SCALE_BITS], n // block_size)
    return mxfp4_decode(codes.to(torch.uint8).reshape(shape),
                        scales.to(torch.uint8).reshape(*shape[:-1], -1), block_size)
