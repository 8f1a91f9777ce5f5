"""The one SVD / low-rank helper every method uses (METHODS.md, "Shared definitions").

Effective rank (Roy & Vetterli) and stable rank are defined once here; rows that
report a rank say which one they use. Everything works on a matrix or a batch of
matrices (leading dimensions are batch) and computes in float32 or wider, because
half-precision SVDs are unreliable and often unsupported.

.. code-block:: python

    from lit_lowrank.ops.lowrank import low_rank_factors, stable_rank_of, effective_rank_of

    A, B = low_rank_factors(weight, rank=8)      # weight ≈ A @ B, A: (m, 8), B: (8, n)
    stable_rank_of(weight), effective_rank_of(weight)
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "effective_rank_of",
    "low_rank_approx",
    "low_rank_factors",
    "rank_for_energy",
    "singular_values",
    "stable_rank_of",
    "truncated_svd",
]


def _as_float(matrix: Tensor, name: str = "matrix") -> Tensor:
    if matrix.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (..., m, n), got shape {tuple(matrix.shape)}")
    return matrix.float() if matrix.dtype in (torch.float16, torch.bfloat16) or not matrix.is_floating_point() \
        else matrix


def _check_rank(rank: int, matrix: Tensor) -> int:
    limit = min(matrix.shape[-2], matrix.shape[-1])
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= limit:
        raise ValueError(f"rank must be an integer in [1, min(m, n)={limit}] for a matrix of shape "
                         f"{tuple(matrix.shape)}, got {rank!r}")
    return rank


def singular_values(matrix: Tensor) -> Tensor:
    """Singular values, descending, shape ``(..., min(m, n))`` (float32 or wider)."""
    return torch.linalg.svdvals(_as_float(matrix))


def truncated_svd(matrix: Tensor, rank: int) -> tuple[Tensor, Tensor, Tensor]:
    """The top-``rank`` SVD ``U (…, m, r), S (…, r), Vh (…, r, n)`` (exact, via a full thin SVD).

    Raises:
        ValueError: if ``rank`` is not in ``[1, min(m, n)]``.
    """
    m = _as_float(matrix)
    rank = _check_rank(rank, m)
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    return u[..., :rank], s[..., :rank], vh[..., :rank, :]


def low_rank_factors(matrix: Tensor, rank: int, balance: bool = True) -> tuple[Tensor, Tensor]:
    """Factors ``A (…, m, r)``, ``B (…, r, n)`` with ``A @ B`` the best rank-``r`` approximation (Eckart–Young).

    Args:
        matrix: ``(…, m, n)``.
        rank: target rank ``r``.
        balance: split √S into both factors (``A = U√S, B = √S Vh``), which keeps the two factors on the same
            scale — the usual initialisation for LoRA-style adapters; otherwise ``A = U S, B = Vh``.
    """
    u, s, vh = truncated_svd(matrix, rank)
    if balance:
        root = s.sqrt()
        return u * root.unsqueeze(-2), root.unsqueeze(-1) * vh
    return u * s.unsqueeze(-2), vh


def low_rank_approx(matrix: Tensor, rank: int) -> Tensor:
    """The best rank-``rank`` approximation of ``matrix`` in Frobenius and spectral norm, in its dtype."""
    a, b = low_rank_factors(matrix, rank, balance=False)
    return (a @ b).to(matrix.dtype if matrix.is_floating_point() else torch.float32)


def rank_for_energy(singular: Tensor, energy: float) -> Tensor:
    """Smallest rank whose leading singular values keep ``energy`` of ``Σ σ²`` (per matrix, ≥ 1).

    Args:
        singular: descending singular values ``(…, k)``.
        energy: fraction in ``(0, 1]``.
    """
    if not 0.0 < energy <= 1.0:
        raise ValueError(f"energy must be in (0, 1], got {energy!r}")
    power = singular.double().pow(2)
    cumulative = power.cumsum(-1) / power.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    # small tolerance so energy=1.0 is reached despite rounding in the cumulative sum
    return ((cumulative < energy - 1e-12).sum(-1) + 1).clamp(max=singular.shape[-1])


def stable_rank_of(matrix: Tensor, eps: float = 1e-12) -> Tensor:
    """Stable rank ``‖M‖_F² / ‖M‖₂²`` per matrix (shape ``(…)``); 0 for an all-zero matrix."""
    s = singular_values(matrix)
    top = s[..., 0].pow(2)
    return torch.where(top > eps, s.pow(2).sum(-1) / top.clamp_min(eps), torch.zeros_like(top))


def effective_rank_of(matrix: Tensor, eps: float = 1e-12) -> Tensor:
    """Effective rank ``exp(H(p))`` with ``p_i = σ_i / Σ σ_j`` (Roy & Vetterli), per matrix; 0 for a zero matrix."""
    s = singular_values(matrix)
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(eps)
    entropy = -(p * torch.log(p.clamp_min(eps))).sum(-1)
    return torch.where(total.squeeze(-1) > eps, entropy.exp(), torch.zeros_like(entropy))
