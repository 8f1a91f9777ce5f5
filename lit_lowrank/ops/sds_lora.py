"""SDS-LoRA math (METHODS.md §15, arXiv 2606.16454): LoRA's forward, a backward through orthonormal bases only.

LoRA's update is ``ΔW = s·B A`` (``s = α/r``, ``A: r×n``, ``B: m×r``). With ``G = ∂L/∂W`` the full fine-tuning
gradient (``m×n``), LoRA's factor gradients are ``∂B = s·G Aᵀ`` and ``∂A = s·Bᵀ G``: writing the thin QR
factorisations ``Aᵀ = Q_A R_A`` and ``B = Q_B R_B`` shows ``∂B = s·G Q_A R_A`` and ``∂A = s·R_Bᵀ Q_Bᵀ G``, so the
gradient is scaled anisotropically by the factors' singular values (through ``R``). SDS-LoRA keeps the same
forward and uses

    ∂B := s·G Q_A        ∂A := s·Q_Bᵀ G

i.e. the full gradient back-propagated through the sign-canonical orthonormal bases only (``Q ← Q·sign(diag R)``
makes the basis a continuous, unique function of the factor: Householder QR's column signs are otherwise
arbitrary). For a layer ``h = s·B(A x)`` this is the custom autograd Function :class:`SDSLoRAFunction`:
``grad_x`` is exact, ``grad_B = s·gᵀ(x Q_A)`` and ``grad_A = s·(g Q_B)ᵀ x`` (batched rows), one thin QR of each
factor per backward: ``O((m + n) r²)`` on top of LoRA's cost.

Init (the **decide** of §15): PEFT's LoRA init (``A`` Kaiming-uniform, ``B = 0``) so the output is unchanged at
injection. ``B = 0`` has no column space, so ``Q_B`` would be an arbitrary basis (whatever LAPACK returns for a
zero matrix) and ``∂A = s·Q_Bᵀ G`` would push ``A`` along arbitrary output directions. We *gate* instead: a basis
column whose ``|R_jj|`` is below ``rank_tol·max|R_ii|`` (default ``rank_tol = max(m, k)·eps`` of the dtype, the
usual numerical-rank threshold, so any condition number the dtype resolves is kept) is zeroed — the basis spans the factor's
numerical column space only. At ``B = 0`` this gives ``∂A = 0``, exactly LoRA's first step; from the second step
on ``B`` has a column space and SDS's backward takes over. The alternative (a non-zero ``B`` with a frozen
``W₀ − s·B₀A₀`` offset) changes the base weights, so merging and PEFT loading would need the offset too.

Basis (the other **decide**): ``"qr"`` (the paper's sign-canonical QR, default) or ``"polar"`` (``U Vᵀ`` of the
factor's SVD: the orthonormal matrix closest to the factor, rotation-equivariant, costlier).

.. code-block:: python

    from lit_lowrank.ops.sds_lora import sds_lora_delta

    h = sds_lora_delta(x, A, B, scaling=alpha / r)      # = scaling * x @ A.T @ B.T, SDS backward
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "SDSLoRAFunction",
    "lora_factor_grads",
    "orthonormal_basis",
    "preconditioned_factor_grads",
    "sds_factor_grads",
    "sds_lora_delta",
    "sign_canonical_qr",
]

BASES: tuple[str, ...] = ("qr", "polar")


def _check_basis(basis: str) -> None:
    if basis not in BASES:
        raise ValueError(f"`basis`={basis!r}: expected one of {BASES}.")


def sign_canonical_qr(matrix: Tensor, rank_tol: float | None = None) -> Tensor:
    """Orthonormal basis ``Q`` (m×k) of ``matrix`` (m×k, m ≥ k) from a thin QR with ``Q ← Q·sign(diag R)``.

    Columns whose ``|R_jj| <= rank_tol·max|R_ii|`` (numerically outside the column space; ``None``: ``max(m, k)``
    times the dtype's eps) are zeroed: see the module docstring (gating at ``B = 0``).

    .. code-block:: python

        q = sign_canonical_qr(B)          # B = q @ r with diag(r) >= 0
    """
    work = matrix.float() if matrix.dtype in (torch.float16, torch.bfloat16) else matrix
    q, r = torch.linalg.qr(work, mode="reduced")
    diag = torch.diagonal(r, dim1=-2, dim2=-1)
    scale = diag.abs().amax(-1, keepdim=True)
    keep = diag.abs() > _tol(work, rank_tol) * scale
    # sign(0) = 0 would also drop the column; the explicit mask covers the tiny-but-nonzero case too
    sign = torch.where(keep, torch.where(diag < 0, -1.0, 1.0).to(q.dtype), torch.zeros_like(diag))
    return (q * sign.unsqueeze(-2)).to(matrix.dtype)


def _tol(matrix: Tensor, rank_tol: float | None) -> float:
    if rank_tol is None:
        return max(matrix.shape[-2:]) * torch.finfo(matrix.dtype).eps
    return rank_tol


def _polar_basis(matrix: Tensor, rank_tol: float | None) -> Tensor:
    work = matrix.float() if matrix.dtype in (torch.float16, torch.bfloat16) else matrix
    u, s, vh = torch.linalg.svd(work, full_matrices=False)
    keep = (s > _tol(work, rank_tol) * s.amax(-1, keepdim=True)).to(u.dtype)
    return ((u * keep.unsqueeze(-2)) @ vh).to(matrix.dtype)


def orthonormal_basis(matrix: Tensor, basis: str = "qr", rank_tol: float | None = None) -> Tensor:
    """Orthonormal basis of the column space of ``matrix`` (m×k), same shape: ``"qr"`` or ``"polar"``.

    .. code-block:: python

        q_a = orthonormal_basis(A.T)      # n×r
    """
    _check_basis(basis)
    if matrix.shape[-2] < matrix.shape[-1]:
        raise ValueError(f"`matrix` must be tall (m >= k) to have k orthonormal columns, got shape "
                         f"{tuple(matrix.shape)}.")
    return sign_canonical_qr(matrix, rank_tol) if basis == "qr" else _polar_basis(matrix, rank_tol)


class SDSLoRAFunction(torch.autograd.Function):
    """``h = scaling · (x Aᵀ) Bᵀ`` with SDS-LoRA's backward (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float, basis: str,
                rank_tol: float) -> Tensor:
        ctx.save_for_backward(x, lora_a, lora_b)
        ctx.scaling, ctx.basis, ctx.rank_tol = scaling, basis, rank_tol
        return scaling * ((x @ lora_a.t()) @ lora_b.t())

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, lora_a, lora_b = ctx.saved_tensors
        # under autocast (bf16/fp16-mixed) grad_out and x may be half precision while the factors are float32:
        # compute in the factors' (saved) dtype; autograd casts each returned gradient to its input's dtype
        grad_out, x = grad_out.to(lora_a.dtype), x.to(lora_a.dtype)
        s = ctx.scaling
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = s * ((grad_out @ lora_b) @ lora_a)  # exact: the forward is linear in x
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            g2 = grad_out.reshape(-1, grad_out.shape[-1])
            x2 = x.reshape(-1, x.shape[-1])
            if ctx.needs_input_grad[2]:
                q_a = orthonormal_basis(lora_a.t(), ctx.basis, ctx.rank_tol)  # n×r
                grad_b = s * (g2.t() @ (x2 @ q_a))                            # = s·G Q_A, never forming G
            if ctx.needs_input_grad[1]:
                q_b = orthonormal_basis(lora_b, ctx.basis, ctx.rank_tol)      # m×r
                grad_a = s * ((g2 @ q_b).t() @ x2)                            # = s·Q_Bᵀ G
        return grad_x, grad_a, grad_b, None, None, None


def sds_lora_delta(x: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float = 1.0, basis: str = "qr",
                   rank_tol: float | None = None) -> Tensor:
    """The adapter branch ``scaling · x Aᵀ Bᵀ`` (``x: (…, n)``, ``A: (r, n)``, ``B: (m, r)``) with SDS backward.

    .. code-block:: python

        y = base(x) + sds_lora_delta(dropout(x), lora_A.weight, lora_B.weight, scaling=alpha / r)
    """
    _check_basis(basis)
    if lora_a.ndim != 2 or lora_b.ndim != 2 or lora_a.shape[0] != lora_b.shape[1] or x.shape[-1] != lora_a.shape[1]:
        raise ValueError(f"Shapes do not chain: x {tuple(x.shape)}, A {tuple(lora_a.shape)} (expected (r, n)), "
                         f"B {tuple(lora_b.shape)} (expected (m, r)).")
    if lora_a.shape[0] > min(lora_a.shape[1], lora_b.shape[0]):
        raise ValueError(f"rank r={lora_a.shape[0]} exceeds min(in, out)={min(lora_a.shape[1], lora_b.shape[0])}: "
                         "the factors cannot have r orthonormal columns.")
    return SDSLoRAFunction.apply(x, lora_a, lora_b, float(scaling), basis, rank_tol)


def sds_factor_grads(full_grad: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float = 1.0, basis: str = "qr",
                     rank_tol: float | None = None) -> tuple[Tensor, Tensor]:
    """Closed form ``(∂A, ∂B) = (s·Q_Bᵀ G, s·G Q_A)`` for a full fine-tuning gradient ``G`` (m×n).

    .. code-block:: python

        grad_a, grad_b = sds_factor_grads(G, A, B, scaling=2.0)
    """
    q_a = orthonormal_basis(lora_a.t(), basis, rank_tol)
    q_b = orthonormal_basis(lora_b, basis, rank_tol)
    return scaling * q_b.t() @ full_grad, scaling * full_grad @ q_a


def lora_factor_grads(full_grad: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float = 1.0) -> tuple[Tensor, Tensor]:
    """LoRA's ``(∂A, ∂B) = (s·Bᵀ G, s·G Aᵀ)`` for a full fine-tuning gradient ``G`` (the baseline of the above).

    .. code-block:: python

        grad_a, grad_b = lora_factor_grads(G, A, B)
    """
    return scaling * lora_b.t() @ full_grad, scaling * full_grad @ lora_a.t()


def _gram_power(gram: Tensor, power: float, delta: float) -> Tensor:
    """``(gram + δI)^{-power}`` of a symmetric PSD ``r×r`` matrix (eigendecomposition; ``power = 1`` by a solve)."""
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    if power == 1.0:
        return torch.linalg.inv(gram + delta * eye)
    evals, evecs = torch.linalg.eigh(gram + delta * eye)
    return (evecs * evals.clamp_min(torch.finfo(gram.dtype).tiny).pow(-power)) @ evecs.transpose(-1, -2)


def preconditioned_factor_grads(full_grad: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float = 1.0,
                                power: float = 1.0, delta: float = 0.0) -> tuple[Tensor, Tensor]:
    """LoRA's factor gradients preconditioned by the factors' Gram matrices: ``(∂A, ∂B)`` =
    ``((BᵀB + δI)^{-p} s·Bᵀ G,  s·G Aᵀ (AAᵀ + δI)^{-p})``.

    ``power = 1`` is ScaledGD / Riemannian-preconditioned LoRA (Tong, Ma & Chi 2021; Zhang & Pilanci 2024), the
    known κ-independent preconditioner. ``power = ½`` **is** SDS-LoRA with the polar basis: for ``Aᵀ = U S Vᵀ`` the
    polar factor is ``U Vᵀ = Aᵀ(AAᵀ)^{-1/2}``, so ``G·Q_A = G Aᵀ (AAᵀ)^{-1/2}`` (and likewise for ``B``; tested in
    ``tests/adapters/test_sds_lora.py``). SDS with the QR basis is ``G Aᵀ R_A^{-1}``, ScaledGD ``G Aᵀ R_A^{-1}R_A^{-T}``.

    .. code-block:: python

        grad_a, grad_b = preconditioned_factor_grads(G, A, B, power=1.0, delta=1e-6)    # ScaledGD
    """
    if power < 0 or delta < 0:
        raise ValueError(f"`power`={power!r} and `delta`={delta!r}: expected non-negative numbers.")
    grad_a, grad_b = lora_factor_grads(full_grad, lora_a, lora_b, scaling)
    return (_gram_power(lora_b.t() @ lora_b, power, delta) @ grad_a,
            grad_b @ _gram_power(lora_a @ lora_a.t(), power, delta))
