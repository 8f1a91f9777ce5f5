"""What a W4A8 MoE serving path and its baselines need beside MXFP4 (pure torch, no Lightning):

- :func:`fp8_act_fake_quant`: FP8 E4M3 activations with one scale per token (``amax / 448``), the
  "A8" of W4A8 serving (MXFP4 weights x FP8 activations), with a straight-through gradient.
- :func:`mxfp8_quantize`: MXFP8 weights (E4M3 elements, E8M0 scale ``2^(floor(log2 amax) - 8)`` per
  block of 32, saturating at ±448): 8.25 bits/weight, the higher-precision format an equal-bits
  mixed-precision baseline keeps its most loaded experts in.
- :func:`gptq_mxfp4`: GPTQ (Frantar et al., arXiv 2210.17323) onto the MXFP4 grid — columns in
  order, each block's E8M0 scale set from the (error-updated) weights when the sweep reaches the
  block's first column, the rounding error pushed onto the later columns through the inverse
  Hessian (the GPTQ-MXFP4 baseline of MoE quantization papers). Its output is MXFP4-representable
  (RTN-MXFP4 returns it unchanged), so it can replace an expert's weights and be served as MXFP4.

.. code-block:: python

    x8 = fp8_act_fake_quant(hidden)                          # per-token E4M3
    w8 = mxfp8_quantize(w)                                   # (..., n) blocks of 32
    w4 = gptq_mxfp4(w[None], (x.T @ x)[None])[0]             # (out, in) on the MXFP4 grid
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_lowrank.ops.mxfp4 import E2M1_EMAX, E8M0_BIAS, MX_BLOCK, round_to_e2m1

#: Largest finite E4M3 (OCP "fn" variant) and its exponent.
E4M3_MAX = 448.0
E4M3_EMAX = 8


def _to_e4m3(v: Tensor) -> Tensor:
    """Round to E4M3 (nearest, ties to even; torch's cast), saturating at ±448 instead of NaN."""
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


class _ActQuantSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        xf = x.float()
        scale = (xf.abs().amax(-1, keepdim=True) / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny)
        return (_to_e4m3(xf / scale) * scale).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        return grad


def fp8_act_fake_quant(x: Tensor) -> Tensor:
    """Per-token (last dimension) FP8 E4M3 fake quantization of activations, straight-through gradient.

    .. code-block:: python

        fp8_act_fake_quant(torch.tensor([[1.0, 0.3, -2.0]]))   # the row's max maps to 448
    """
    if not x.is_floating_point():
        raise ValueError(f"`x` must be a floating-point tensor, got dtype {x.dtype}.")
    return _ActQuantSTE.apply(x)


def mxfp8_quantize(x: Tensor, block_size: int = MX_BLOCK) -> Tensor:
    """MXFP8 (E4M3) quantize-dequantize along the last dimension: 8 + 8/32 = 8.25 bits/weight.

    .. code-block:: python

        w8 = mxfp8_quantize(w)          # relative error ~2^-4 of MXFP4's
    """
    if x.shape[-1] % block_size:
        raise ValueError(f"`x` has shape {tuple(x.shape)}: its last dimension must be a multiple of "
                         f"block_size={block_size}.")
    blocks = x.detach().float().reshape(*x.shape[:-1], -1, block_size)
    amax = blocks.abs().amax(-1, keepdim=True)
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    exp = (e - 1 - E4M3_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS).double()
    scale = torch.ldexp(torch.ones_like(exp), exp)
    q = (_to_e4m3((blocks.double() / scale).float()).double() * scale).float()
    return q.reshape(x.shape).to(x.dtype)


def _mx_scale(block: Tensor) -> Tensor:
    """E8M0 scale ``2^(floor(log2 amax) - 2)`` per row of ``block (..., n)`` (float32; zero rows get 2^-127)."""
    amax = block.abs().amax(-1)
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    exp = torch.where(amax > 0, e - 1 - E2M1_EMAX, torch.full_like(e, -E8M0_BIAS)).clamp(-E8M0_BIAS, E8M0_BIAS)
    return torch.ldexp(torch.ones_like(amax), exp)


def gptq_mxfp4(w: Tensor, hessian: Tensor, block_size: int = MX_BLOCK, damp: float = 0.01) -> Tensor:
    """GPTQ onto the MXFP4 grid for a batch of problems: ``w (B, out, in)``, ``hessian (B, in, in)`` -> ``(B, out, in)``.

    Natural column order, ``damp`` x mean diagonal added to ``H``, dead inputs (zero diagonal) zeroed; the
    E8M0 scale of each 32-column block is fixed from the error-updated weights when the sweep reaches it.

    .. code-block:: python

        w_q = gptq_mxfp4(expert_weights, expert_hessians)       # per expert (E, out, in), (E, in, in)
    """
    if w.dim() != 3 or hessian.shape != (w.shape[0], w.shape[2], w.shape[2]):
        raise ValueError(f"`w` must be (B, out, in) and `hessian` (B, in, in); got {tuple(w.shape)} and "
                         f"{tuple(hessian.shape)}.")
    if w.shape[-1] % block_size:
        raise ValueError(f"`w` has {w.shape[-1]} input columns: expected a multiple of block_size={block_size}.")
    from lit_lowrank.ops.sphquant.feedback import inverse_hessian_factor

    u, dead = inverse_hessian_factor(hessian, damp)
    weight = w.detach().float().clone().masked_fill_(dead[:, None, :], 0.0)
    out = torch.empty_like(weight)
    for b0 in range(0, weight.shape[-1], block_size):
        b1 = b0 + block_size
        block = weight[..., b0:b1].clone()
        errors = torch.zeros_like(block)
        scale = _mx_scale(block)                                     # (B, out): from the updated weights
        for i in range(block_size):
            q = round_to_e2m1(block[..., i] / scale) * scale
            out[..., b0 + i] = q
            err = (block[..., i] - q) / u[:, b0 + i, b0 + i, None]
            block[..., i:] -= err[..., None] * u[:, None, b0 + i, b0 + i:b1]
            errors[..., i] = err
        weight[..., b1:] -= errors @ u[:, b0:b1, b1:]
    return out.to(w.dtype)
