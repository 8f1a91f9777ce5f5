"""Shared weight-quantization helpers: bit-exact packing, bits/weight accounting, group-wise
RTN, GPTQ and the randomized block-Hadamard rotation.

Pure torch (no Lightning). Every weight quantizer of the project builds on these so that
their formats and their bits/weight are counted the same way:

- :func:`pack_fields` / :func:`unpack_fields`: integer fields of fixed bit widths packed
  into one little-endian bit stream (no byte alignment per item, so the stored size is
  exactly ``N * sum(widths)`` bits plus a few padding bytes).
- :class:`BitsBreakdown`: payload, scale and shared (codebook) bits of a quantized tensor;
  ``bits_per_weight`` is what a table reports.
- :func:`rtn_quantize` / :func:`gptq_quantize`: group-wise asymmetric uniform quantization
  along the input dimension (fp16 minimum and step per group, ``bits``-bit codes), by
  round-to-nearest or by GPTQ's Hessian-aware column sweep (Frantar et al., 2022).
- :func:`hadamard_rotate`: ``x -> H_b diag(s) x / sqrt(b)`` in blocks of ``b`` (the largest
  power of two dividing the dimension), the rotation of QuaRot/QuIP#-style baselines.

.. code-block:: python

    w = torch.randn(512, 2048)
    q = rtn_quantize(w, bits=2, group_size=128)
    w_hat = uniform_dequantize(q)                 # (512, 2048)
    q.storage().bits_per_weight                   # 2.25 (2-bit codes + fp16 min and step per 128)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: Extra zero bytes kept after every packed stream: an unpacker reads each item through an
#: 8-byte window, so the last item's window must stay inside the buffer.
PACK_PADDING_BYTES = 8
FP16_BITS = 16
#: coarse step of the clipping search (see :func:`_group_params`)
CLIP_COARSE_STRIDE = 8


# ----------------------------------------------------------------------------- bit packing


def _check_widths(widths: list[int]) -> int:
    if not widths or any(int(w) < 1 for w in widths):
        raise ValueError(f"`widths`={widths!r}: expected a non-empty list of positive bit widths.")
    total = int(sum(widths))
    if total > 56:
        # the 8-byte read window holds 64 bits, of which up to 7 are the item's bit offset
        raise ValueError(f"`widths`={widths!r} sum to {total} bits per item; at most 56 are supported.")
    return total


def pack_fields(fields: list[Tensor], widths: list[int]) -> Tensor:
    """Pack per-item integer fields into one bit stream.

    Item ``n`` occupies bits ``[n*T, (n+1)*T)`` of the stream (``T = sum(widths)``), field
    ``f`` its bits ``[sum(widths[:f]), sum(widths[:f+1]))``, least significant bit first.

    Args:
        fields: integer tensors of the same number of elements ``N`` (any shape, flattened);
            field ``f`` must lie in ``[0, 2**widths[f])``.
        widths: bits per field (``sum(widths) <= 56``).

    Returns:
        ``uint8`` tensor of ``ceil(N*T/8) + PACK_PADDING_BYTES`` bytes.

    .. code-block:: python

        stream = pack_fields([signs, index, radius_code], [8, 6, 2])   # 16 bits per item
        signs2, index2, radius2 = unpack_fields(stream, [8, 6, 2], signs.numel())
    """
    total = _check_widths(widths)
    if len(fields) != len(widths):
        raise ValueError(f"pack_fields: {len(fields)} fields for {len(widths)} widths; expected one width per field.")
    count = fields[0].numel()
    device = fields[0].device
    bits = torch.empty(count, total, dtype=torch.uint8, device=device)
    offset = 0
    for f, (field, width) in enumerate(zip(fields, widths)):
        values = field.reshape(-1).long()
        if values.numel() != count:
            raise ValueError(f"pack_fields: field {f} has {values.numel()} items, field 0 has {count}.")
        if count and (int(values.min()) < 0 or int(values.max()) >= 1 << width):
            raise ValueError(f"pack_fields: field {f} has values outside [0, 2**{width}).")
        shifts = torch.arange(width, device=device)
        bits[:, offset : offset + width] = ((values[:, None] >> shifts) & 1).to(torch.uint8)
        offset += width
    flat = bits.reshape(-1)
    num_bytes = math.ceil(flat.numel() / 8)
    flat = torch.nn.functional.pad(flat, (0, num_bytes * 8 - flat.numel()))
    weights = (1 << torch.arange(8, device=device)).to(torch.int32)
    packed = (flat.view(-1, 8).to(torch.int32) * weights).sum(1).to(torch.uint8)
    return torch.nn.functional.pad(packed, (0, PACK_PADDING_BYTES))


def unpack_items(stream: Tensor, total_bits: int, start: int, stop: int) -> Tensor:
    """The raw ``total_bits``-bit words of items ``[start, stop)`` of a packed stream (int64).

    Only the bytes holding those items are read (a tile of a weight matrix decodes without
    unpacking the rest): they are spread to their bits once (one byte per bit) and each item's
    bits are summed into its word — a few bytes of traffic per item; gathering an 8-byte window
    per item was ~4x slower on SmolLM2's 106M 3-bit weights.
    """
    device = stream.device
    count = stop - start
    if count <= 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    bit_start = start * total_bits
    first, last = bit_start >> 3, (stop * total_bits + 7) >> 3
    shifts = torch.arange(8, device=device, dtype=torch.uint8)
    bits = ((stream[first:last, None] >> shifts) & 1).reshape(-1)        # little endian, as pack_fields writes
    skip = bit_start & 7
    bits = bits[skip: skip + count * total_bits].view(count, total_bits)
    word = torch.zeros(count, dtype=torch.int64, device=device)
    for b in range(total_bits):
        word |= bits[:, b].long() << b
    return word


def split_fields(words: Tensor, widths: list[int]) -> list[Tensor]:
    """Split raw item words (from :func:`unpack_items`) into their fields."""
    out, offset = [], 0
    for width in widths:
        out.append((words >> offset) & ((1 << width) - 1))
        offset += width
    return out


def unpack_fields(stream: Tensor, widths: list[int], count: int, start: int = 0) -> list[Tensor]:
    """Inverse of :func:`pack_fields` for items ``[start, start + count)``; int64 fields."""
    total = _check_widths(widths)
    needed = math.ceil((start + count) * total / 8) + PACK_PADDING_BYTES
    if stream.dtype != torch.uint8 or stream.dim() != 1 or stream.numel() < needed:
        raise ValueError(f"unpack_fields: `stream` must be a 1-D uint8 tensor of >= {needed} bytes for {start + count} "
                         f"items of {total} bits; got {stream.dtype} of shape {tuple(stream.shape)}.")
    return split_fields(unpack_items(stream, total, start, start + count), widths)


# ----------------------------------------------------------------------------- bits accounting


@dataclass(frozen=True)
class BitsBreakdown:
    """Exact storage of a quantized tensor (or a sum of them), in bits.

    Attributes:
        num_weights: weights represented.
        payload_bits: per-weight / per-vector codes (signs, indices, radius or level codes).
        scale_bits: per-group side information (scales, minima), fp16 each.
        shared_bits: data shared by many tensors (a codebook); counted once per model by
            :func:`~lit_lowrank.quant.linear.model_bits`.

    .. code-block:: python

        total = layer_a.storage() + layer_b.storage()
        print(total.bits_per_weight, total.bits_per_weight_with_shared)
    """

    num_weights: int
    payload_bits: int
    scale_bits: int
    shared_bits: int = 0

    @property
    def bits_per_weight(self) -> float:
        """(payload + scales) / weights: the per-layer rate (shared codebooks excluded)."""
        return (self.payload_bits + self.scale_bits) / max(self.num_weights, 1)

    @property
    def bits_per_weight_with_shared(self) -> float:
        """(payload + scales + shared) / weights."""
        return (self.payload_bits + self.scale_bits + self.shared_bits) / max(self.num_weights, 1)

    @property
    def bytes(self) -> float:
        """Total storage in bytes, shared data included."""
        return (self.payload_bits + self.scale_bits + self.shared_bits) / 8

    def __add__(self, other: BitsBreakdown) -> BitsBreakdown:
        return BitsBreakdown(self.num_weights + other.num_weights, self.payload_bits + other.payload_bits,
                             self.scale_bits + other.scale_bits, self.shared_bits + other.shared_bits)


# ----------------------------------------------------------------------------- groups


def num_groups(features: int, group_size: int) -> int:
    """Groups along a row of ``features`` weights; the last one may be shorter (ragged)."""
    return math.ceil(features / group_size)


def grouped(w: Tensor, group_size: int) -> Tensor:
    """``(out, in) -> (out, G, group_size)``; a ragged last group repeats its last real column.

    Repeating a real value (instead of zero padding) leaves the group's minimum and maximum
    unchanged, so padding never widens a group's range; callers crop the padding away.
    """
    out_features, in_features = w.shape
    pad = num_groups(in_features, group_size) * group_size - in_features
    if pad:
        w = torch.cat([w, w[:, -1:].expand(out_features, pad)], dim=1)
    return w.reshape(out_features, -1, group_size)


def _check_weight(w: Tensor, group_size: int, bits: int) -> None:
    if w.dim() != 2:
        raise ValueError(f"`w` must be a 2-D (out_features, in_features) weight, got shape {tuple(w.shape)}.")
    if group_size < 1:
        raise ValueError(f"`group_size`={group_size}: expected a positive integer.")
    if not 1 <= bits <= 8:
        raise ValueError(f"`bits`={bits}: expected 1..8.")


# ----------------------------------------------------------------------------- uniform (RTN / GPTQ)


@dataclass
class UniformCodes:
    """Group-wise asymmetric uniform codes: ``w_hat = minimum + step * code`` per group.

    Attributes:
        codes: ``(out, in)`` int64 in ``[0, 2**bits)``.
        minimum: ``(out, G)`` float16 group minima.
        step: ``(out, G)`` float16 group steps.
        bits, group_size: the format.
    """

    codes: Tensor
    minimum: Tensor
    step: Tensor
    bits: int
    group_size: int

    def storage(self) -> BitsBreakdown:
        """Exact storage: ``bits`` per weight plus two fp16 numbers per group."""
        return uniform_bits(*self.codes.shape, bits=self.bits, group_size=self.group_size)


def uniform_bits(out_features: int, in_features: int, bits: int, group_size: int) -> BitsBreakdown:
    """Storage of the group-wise uniform format (RTN / GPTQ / Hadamard + RTN).

    ``bits_per_weight = bits + 32 * ceil(in/g) / in`` (2 x fp16 per group): 2-bit g128 = 2.25.
    """
    n = out_features * in_features
    return BitsBreakdown(n, n * bits, out_features * num_groups(in_features, group_size) * 2 * FP16_BITS)


def _group_params(w_groups: Tensor, bits: int, clip_grid: int = 0, max_shrink: float = 0.8,
                  norm: float = 2.4, coarse_stride: int = CLIP_COARSE_STRIDE) -> tuple[Tensor, Tensor]:
    """fp16-representable (minimum, step) of asymmetric quantization, ``w_groups: (..., g)``.

    ``clip_grid = 0``: min-max. ``clip_grid = n > 0``: GPTQ's clipping search (IST-DASLab/gptq
    ``Quantizer(mse=True)``): the range ``[p lo, p hi]`` is shrunk towards zero over the grid
    ``p = 1 - i/n``, ``i = 0 .. max_shrink * n``, and each group keeps the ``p`` with the smallest
    ``sum |w_hat - w|^norm`` (GPTQ's published grid 100, max shrink 0.8, norm 2.4).

    The grid is searched coarse to fine: every ``coarse_stride``-th point first, then every point
    within ``coarse_stride - 1`` of each group's best coarse point (25 instead of 81 evaluations at
    the published grid; a test checks the error it reaches against the exhaustive search).
    ``coarse_stride=1`` is the exhaustive search.
    """
    lo = w_groups.amin(-1)
    hi = w_groups.amax(-1)
    lo16, step16 = _fp16_params(lo, hi, bits)
    if clip_grid <= 0:
        return lo16, step16
    last = int(max_shrink * clip_grid)
    best = _group_error(w_groups, lo16, step16, bits, norm)
    best_i = torch.zeros_like(best, dtype=torch.long)

    def consider(i: Tensor) -> None:
        nonlocal best, lo16, step16
        p = 1.0 - i.float() / clip_grid
        lo_p, step_p = _fp16_params(p * lo, p * hi, bits)
        err = _group_error(w_groups, lo_p, step_p, bits, norm)
        better = err < best
        best = torch.where(better, err, best)
        best_i.copy_(torch.where(better, i, best_i))
        lo16 = torch.where(better, lo_p, lo16)
        step16 = torch.where(better, step_p, step16)

    stride = max(1, int(coarse_stride))
    for i in range(stride, last + 1, stride):
        consider(torch.full_like(best_i, i))
    if stride > 1:
        centre = best_i.clone()
        for offset in range(-(stride - 1), stride):
            if offset:
                i = centre + offset
                valid = (i >= 0) & (i <= last)
                consider(torch.where(valid, i, centre))   # out-of-grid points re-evaluate the centre: no change
    return lo16, step16


def _fp16_params(lo: Tensor, hi: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    step = (hi - lo) / ((1 << bits) - 1)
    # the stored values are fp16: quantize with exactly what the decoder will read
    lo16 = lo.half().float()
    step16 = step.half().float()
    tiny = torch.finfo(torch.float16).tiny
    step16 = torch.where(step16 > 0, step16, torch.full_like(step16, tiny))
    return lo16, step16


def _group_error(w_groups: Tensor, lo: Tensor, step: Tensor, bits: int, norm: float) -> Tensor:
    """``sum |w_hat - w|^norm`` per group; ``|w_hat - w| = step |round(x) - x|`` with ``x = (w - lo) / step``
    (in-place ops: the clipping search evaluates this ~80 times per weight)."""
    x = (w_groups - lo[..., None]).div_(step[..., None])
    err = x.round().clamp_(0, (1 << bits) - 1).sub_(x).abs_().mul_(step[..., None])
    return err.pow_(norm).sum(-1)


def _round_codes(w: Tensor, lo: Tensor, step: Tensor, bits: int) -> Tensor:
    return torch.clamp(torch.round((w - lo) / step), 0, (1 << bits) - 1)


def rtn_quantize(w: Tensor, bits: int, group_size: int = 128, clip_grid: int = 0) -> UniformCodes:
    """Round-to-nearest, group-wise asymmetric quantization along the input dimension.

    Args:
        w: ``(out, in)`` weight.
        bits: code bits per weight (1..8).
        group_size: weights per group along a row (a ragged last group is allowed).
        clip_grid: 0 for min-max ranges, else the clipping-search grid (see :func:`gptq_quantize`).

    Returns:
        :class:`UniformCodes` (fp16 minimum and step per group).

    .. code-block:: python

        codes = rtn_quantize(torch.randn(64, 256), bits=3, group_size=128)
        w_hat = uniform_dequantize(codes)
    """
    _check_weight(w, group_size, bits)
    w = w.detach().float()
    groups = grouped(w, group_size)
    lo, step = _group_params(groups, bits, clip_grid)
    codes = _round_codes(groups, lo[..., None], step[..., None], bits).reshape(w.shape[0], -1)[:, : w.shape[1]]
    return UniformCodes(codes.long(), lo.half(), step.half(), bits, group_size)


def uniform_dequantize(q: UniformCodes, rows: slice | None = None) -> Tensor:
    """``minimum + step * code`` for all rows (or ``rows``), float32 ``(out, in)``."""
    rows = rows or slice(None)
    codes = q.codes[rows].float()
    index = torch.arange(codes.shape[1], device=codes.device) // q.group_size
    return q.minimum[rows].float()[:, index] + q.step[rows].float()[:, index] * codes


def gptq_quantize(w: Tensor, hessian: Tensor, bits: int, group_size: int = 128, damp: float = 0.01,
                  block_size: int = 128, clip_grid: int = 0) -> UniformCodes:
    """GPTQ: quantize columns one at a time and push each column's error onto the columns not
    yet quantized, weighted by the inverse Hessian (Frantar et al., arXiv 2210.17323).

    Same storage as :func:`rtn_quantize`; a group's minimum and step are set from the
    (already error-compensated) weights when the sweep reaches the group's first column.
    Columns are processed in natural order (no act-order) with lazy block updates.

    Args:
        w: ``(out, in)`` weight.
        hessian: ``(in, in)`` ``X^T X`` (any positive scale) of the layer's calibration inputs.
        bits, group_size: the format (as :func:`rtn_quantize`).
        damp: added to the diagonal, as a fraction of its mean (numerical stability).
        block_size: columns per lazy-update block.
        clip_grid: 0 for min-max group ranges; ``n > 0`` searches each group's range over ``n``
            shrink steps (GPTQ's ``--mse`` option; its published grid is 100) on the error-updated
            weights when the sweep reaches the group.

    Rows are independent given ``hessian``: layers that read the same input (q/k/v, gate/up)
    can be quantized in one call on their stacked rows.

    .. code-block:: python

        h = x.T @ x                                # x: (tokens, in) calibration inputs
        codes = gptq_quantize(w, h, bits=2, group_size=128)
    """
    _check_weight(w, group_size, bits)
    out_features, in_features = w.shape
    if hessian.shape != (in_features, in_features):
        raise ValueError(f"`hessian` must be ({in_features}, {in_features}) for a weight of shape {tuple(w.shape)}, "
                         f"got {tuple(hessian.shape)}.")
    codes, lo, step = gptq_sweep(w[None], hessian[None], bits, group_size, damp, block_size, clip_grid)
    return UniformCodes(codes[0], lo[0], step[0], bits, group_size)


def gptq_sweep(w: Tensor, hessian: Tensor, bits: int, group_size: int = 128, damp: float = 0.01,
               block_size: int = 128, clip_grid: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`gptq_quantize` on a batch of independent problems: ``w (B, out, in)``, ``hessian (B, in, in)``.

    One Python loop over the columns serves all ``B`` layers (the sweep's cost is mostly per-column
    overhead at these sizes), so quantizing the 30 layers of a model that share a shape costs about
    as much as one.

    Returns:
        ``codes (B, out, in)`` int64, ``minimum`` and ``step`` ``(B, out, G)`` float16.
    """
    if w.dim() != 3 or hessian.shape != (w.shape[0], w.shape[2], w.shape[2]):
        raise ValueError(f"`w` must be (B, out, in) and `hessian` (B, in, in); got {tuple(w.shape)} and "
                         f"{tuple(hessian.shape)}.")
    batch, out_features, in_features = w.shape
    weight = w.detach().float().clone()
    h = hessian.detach().float().clone()
    diag = torch.diagonal(h, dim1=-2, dim2=-1)
    dead = diag == 0
    diag[dead] = 1.0                                  # a view: writes into h
    weight.masked_fill_(dead[:, None, :], 0.0)
    eye = torch.eye(in_features, dtype=h.dtype, device=h.device)
    h += damp * diag.mean(-1)[:, None, None] * eye
    # upper Cholesky factor of H^-1: its rows give the error propagation of the column sweep
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    codes = torch.zeros_like(weight)
    groups = num_groups(in_features, group_size)
    lo = torch.zeros(batch, out_features, groups, device=w.device)
    step = torch.ones(batch, out_features, groups, device=w.device)
    for b0 in range(0, in_features, block_size):
        b1 = min(b0 + block_size, in_features)
        block = weight[..., b0:b1].clone()
        errors = torch.zeros_like(block)
        h_block = h_inv[:, b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            g = col // group_size
            if col % group_size == 0:
                current = torch.cat([block[..., i:], weight[..., b1:]], dim=-1)[..., : group_size]
                lo[..., g], step[..., g] = _group_params(current, bits, clip_grid)
            q = _round_codes(block[..., i], lo[..., g], step[..., g], bits)
            codes[..., col] = q
            err = (block[..., i] - (lo[..., g] + step[..., g] * q)) / h_block[:, i, i, None]
            block[..., i:].baddbmm_(err[..., None], h_block[:, i : i + 1, i:], alpha=-1)  # no temporary
            errors[..., i] = err
        weight[..., b1:] -= errors @ h_inv[:, b0:b1, b1:]
    return codes.long(), lo.half(), step.half()


# ----------------------------------------------------------------------------- Hadamard rotation


def hadamard_block_size(features: int, max_block: int = 4096) -> int:
    """Largest power of two dividing ``features`` (at most ``max_block``): 576 -> 64, 1536 -> 512."""
    if features < 1:
        raise ValueError(f"`features`={features}: expected a positive integer.")
    return min(features & -features, max_block)


def random_signs(features: int, seed: int, device: torch.device | str | None = None) -> Tensor:
    """``features`` random ±1 (float32) from ``seed``: the diagonal of a randomized Hadamard."""
    gen = torch.Generator().manual_seed(int(seed))
    return (torch.randint(0, 2, (features,), generator=gen) * 2 - 1).float().to(device)


def hadamard_rotate(x: Tensor, signs: Tensor, block: int) -> Tensor:
    """``R x`` along the last dimension, ``R = blockdiag(H_block) diag(signs) / sqrt(block)`` (orthogonal).

    A fast Walsh–Hadamard transform (``log2(block)`` butterfly passes). For a linear layer
    ``y = W x = (W R^T)(R x)``: quantize ``hadamard_rotate(W, signs, b)`` (rows of ``W`` are
    input-space vectors) and rotate inputs at run time — the overhead a rotation-based
    method pays on every call.

    .. code-block:: python

        signs = random_signs(576, seed=0)
        w_rot = hadamard_rotate(w, signs, block=hadamard_block_size(576))
        y = hadamard_rotate(x, signs, 64) @ w_rot.T      # == x @ w.T
    """
    features = x.shape[-1]
    if block < 1 or block & (block - 1) or features % block:
        raise ValueError(f"`block`={block}: expected a power of two dividing the last dimension ({features}).")
    if signs.shape != (features,):
        raise ValueError(f"`signs` must have shape ({features},), got {tuple(signs.shape)}.")
    lead = x.shape[:-1]
    y = (x * signs.to(x.dtype)).reshape(-1, features // block, block)
    h = 1
    while h < block:
        y = y.view(y.shape[0], y.shape[1], block // (2 * h), 2, h)
        a, b = y[:, :, :, 0], y[:, :, :, 1]
        y = torch.stack([a + b, a - b], dim=3)
        h *= 2
    return (y.reshape(*lead, features) / math.sqrt(block))


def rotate_hessian(hessian: Tensor, signs: Tensor, block: int) -> Tensor:
    """``R H R^T`` for the rotation of :func:`hadamard_rotate`: the Hessian of the rotated inputs ``R x``.

    A layer quantized in the rotated basis (``W R^T``, inputs ``R x``) sees ``E[(R x)(R x)^T] = R H R^T``.

    .. code-block:: python

        h_rot = rotate_hessian(x.T @ x, signs, block)       # == (R x)^T-stacked Gram matrix
    """
    if hessian.dim() != 2 or hessian.shape[0] != hessian.shape[1]:
        raise ValueError(f"`hessian` must be square (in, in), got shape {tuple(hessian.shape)}.")
    return hadamard_rotate(hadamard_rotate(hessian, signs, block).T.contiguous(), signs, block)


def relative_error(w: Tensor, w_hat: Tensor) -> float:
    """``||w_hat - w||_F^2 / ||w||_F^2`` (the relative weight MSE of the benchmark tables)."""
    return float((w_hat.float() - w.float()).pow(2).sum() / w.float().pow(2).sum().clamp_min(1e-30))
