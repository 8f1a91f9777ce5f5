"""SPHQuant with GPTQ/LDLQ-style block error feedback: quantize 8 input columns at a time and push
each 8-D vector's error onto the columns not yet quantized, weighted by the inverse Hessian.

Plain :func:`~lit_lowrank.ops.sphquant.sph_quantize` rounds every vector to its nearest code
independently; with calibration inputs ``X`` the layer's *output* error ``tr(E H E^T)``
(``H = X^T X``) is what matters, and GPTQ (Frantar et al., arXiv 2210.17323) lowers it by letting
later columns absorb earlier errors. A vector quantizer needs the block form of that update
(QuIP#'s BlockLDLQ, arXiv 2402.04396): with ``U`` the upper Cholesky factor of ``H^-1``, after
quantizing the columns ``b`` (one 8-D vector per row) with error ``E_b = W_b - Q_b``,

    W_rest <- W_rest - E_b U_bb^-1 U_b,rest,

which is the least-squares compensation of ``E_b`` by the remaining columns (exact for any
block, since the remaining columns' ``H^-1`` is ``U_FF^T U_FF``). Updates are applied lazily per
``block_size`` columns, as GPTQ does.

Radius scales per group: when the sweep reaches a radius group's first vector, the group's fp16
minimum and step are set from the **norms** of its (already error-updated) vectors. A vector's
least-squares radius ``<|v|, c_k> = ||v|| cos`` is at most its norm and within ~2% of it at
K >= 256, so the norm range is the radius range without a second codebook search per group
(which would double the sweep's dominant cost, the nearest-codeword search).

.. code-block:: python

    h = x.T @ x                                               # x: (tokens, in) calibration inputs
    codes = sph_quantize_feedback(w, h, codebook, radius_bits=4, group_size=128)
    w_hat = sph_dequantize(codes, codebook)                   # lower tr(E H E^T) than sph_quantize
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_lowrank.ops.quantization import num_groups
from lit_lowrank.ops.sphquant.codec import SPH_DIM, SPHCodes, assign_codewords, check_sph_format

#: Columns per lazy update of the sweep (GPTQ's default; a multiple of the vector dimension).
FEEDBACK_BLOCK = 128


def _radius_range(norms: Tensor, radius_bits: int) -> tuple[Tensor, Tensor]:
    """fp16-representable (minimum, step) of a group from its vectors' norms ``(..., n)``."""
    lo = norms.amin(-1).half().float()
    step = ((norms.amax(-1) - lo) / ((1 << radius_bits) - 1)).half().float()
    tiny = torch.finfo(torch.float16).tiny
    return lo, torch.where(step > 0, step, torch.full_like(step, tiny))


def inverse_hessian_factor(hessian: Tensor, damp: float = 0.01) -> tuple[Tensor, Tensor]:
    """Upper Cholesky factor ``U`` of ``(H + damp * mean(diag) I)^-1`` (batched ``(B, in, in)``) and the
    mask of dead inputs (zero diagonal: they never varied; GPTQ zeroes their weights)."""
    h = hessian.detach().float().clone()
    diag = torch.diagonal(h, dim1=-2, dim2=-1)
    dead = diag == 0
    diag[dead] = 1.0                                   # a view: writes into h
    eye = torch.eye(h.shape[-1], dtype=h.dtype, device=h.device)
    h += damp * diag.mean(-1)[:, None, None] * eye
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True), dead


def sph_feedback_sweep(w: Tensor, hessian: Tensor, codebook: Tensor, radius_bits: int, group_size: int = 128,
                       damp: float = 0.01, block_size: int = FEEDBACK_BLOCK) -> list[SPHCodes]:
    """:func:`sph_quantize_feedback` on a batch of independent problems ``w (B, out, in)``, ``hessian (B, in, in)``.

    One Python loop over the 8-column steps serves all ``B`` problems (layers of one shape), and
    each step's nearest-codeword search runs on all ``B * out`` vectors at once.

    Returns:
        one :class:`~lit_lowrank.ops.sphquant.SPHCodes` per problem.
    """
    if w.dim() != 3 or hessian.shape != (w.shape[0], w.shape[2], w.shape[2]):
        raise ValueError(f"`w` must be (B, out, in) and `hessian` (B, in, in); got {tuple(w.shape)} and "
                         f"{tuple(hessian.shape)}.")
    if block_size < SPH_DIM or block_size % SPH_DIM:
        raise ValueError(f"`block_size`={block_size}: expected a positive multiple of {SPH_DIM}.")
    if damp < 0:
        raise ValueError(f"`damp`={damp}: expected >= 0.")
    batch, out_features, in_features = w.shape
    codebook_size = codebook.shape[0]
    check_sph_format(codebook_size, radius_bits, group_size, in_features)
    cb = codebook.detach().float().to(w.device)
    u, dead = inverse_hessian_factor(hessian.to(w.device), damp)
    weight = w.detach().float().clone().masked_fill_(dead[:, None, :], 0.0)
    vectors, per_group = in_features // SPH_DIM, group_size // SPH_DIM
    groups = num_groups(vectors, per_group)
    signs = torch.zeros(batch, out_features, vectors, dtype=torch.long, device=w.device)
    index = torch.zeros_like(signs)
    radius_code = torch.zeros_like(signs)
    lo = torch.zeros(batch, out_features, groups, device=w.device)
    step = torch.ones_like(lo)
    bit = 1 << torch.arange(SPH_DIM, device=w.device)
    top = (1 << radius_bits) - 1
    for b0 in range(0, in_features, block_size):
        b1 = min(b0 + block_size, in_features)
        block = weight[..., b0:b1].clone()
        errors = torch.zeros_like(block)
        for j in range(0, b1 - b0, SPH_DIM):
            col, vec = b0 + j, (b0 + j) // SPH_DIM
            g = vec // per_group
            if vec % per_group == 0:   # the group's radius range, from the error-updated weights
                current = torch.cat([block[..., j:], weight[..., b1:]], dim=-1)[..., :group_size]
                lo[..., g], step[..., g] = _radius_range(
                    current.reshape(batch, out_features, -1, SPH_DIM).norm(dim=-1), radius_bits)
            v = block[..., j:j + SPH_DIM]                                          # (B, out, 8)
            mags = v.abs()
            directions = mags / mags.norm(dim=-1, keepdim=True).clamp_min(1e-30)
            k = assign_codewords(directions.reshape(-1, SPH_DIM), cb).view(batch, out_features)
            c = cb[k]
            code = torch.clamp(torch.round(((mags * c).sum(-1) - lo[..., g]) / step[..., g]), 0, top)
            q = torch.where(v < 0, -1.0, 1.0) * (lo[..., g] + step[..., g] * code)[..., None] * c
            signs[..., vec] = ((v < 0).long() * bit).sum(-1)
            index[..., vec], radius_code[..., vec] = k, code.long()
            # err U_bb = E_b: the block form of GPTQ's err = (w - q) / U_ii
            err = torch.linalg.solve_triangular(u[:, col:col + SPH_DIM, col:col + SPH_DIM], v - q, upper=True,
                                                left=False)
            block[..., j + SPH_DIM:] -= err @ u[:, col:col + SPH_DIM, col + SPH_DIM:b1]
            errors[..., j:j + SPH_DIM] = err
        weight[..., b1:] -= errors @ u[:, b0:b1, b1:]
    lo16, step16 = lo.half(), step.half()
    return [SPHCodes(signs[i], index[i], radius_code[i], lo16[i], step16[i], codebook_size, radius_bits, group_size)
            for i in range(batch)]


def sph_quantize_feedback(w: Tensor, hessian: Tensor, codebook: Tensor, radius_bits: int, group_size: int = 128,
                          damp: float = 0.01, block_size: int = FEEDBACK_BLOCK) -> SPHCodes:
    """SPH codes of ``w (out, in)`` with block error feedback (see the module docstring).

    Args:
        w: ``(out, in)`` weight (stacked rows of layers that read one input are fine).
        hessian: ``(in, in)`` ``X^T X`` (any positive scale) of the layer's calibration inputs.
        codebook: ``(K, 8)`` non-negative unit rows (pass the fp16-rounded codebook the layer stores).
        radius_bits, group_size: the format (as :func:`~lit_lowrank.ops.sphquant.sph_quantize`).
        damp: added to the Hessian's diagonal, as a fraction of its mean.
        block_size: columns per lazy update (any multiple of 8 gives the same codes up to rounding).

    .. code-block:: python

        codes = sph_quantize_feedback(layer.weight, h, codebook.half().float(), radius_bits=4, group_size=128)
    """
    if w.dim() != 2:
        raise ValueError(f"`w` must be a 2-D (out_features, in_features) weight, got shape {tuple(w.shape)}.")
    if hessian.shape != (w.shape[1], w.shape[1]):
        raise ValueError(f"`hessian` must be ({w.shape[1]}, {w.shape[1]}) for a weight of shape {tuple(w.shape)}, "
                         f"got {tuple(hessian.shape)}.")
    return sph_feedback_sweep(w[None], hessian[None], codebook, radius_bits, group_size, damp, block_size)[0]
