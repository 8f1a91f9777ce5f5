"""PoLAR: polar-decomposed low-rank adaptation kept near the Stiefel manifold by the landing field.

The adapter's update is ``ΔW = s · X Θ Yᵀ`` with ``X (out, r)`` and ``Y (in, r)`` kept *near* orthonormal
columns (the Stiefel manifold St(n, r)) and ``Θ (r, r)`` free, ``s = α / r``. X and Y are not retracted onto the
manifold after each step (no QR / polar retraction): the landing field of Ablin & Peyré replaces their gradient,
a tangent (Riemannian) part that decreases the loss plus a normal part that pulls the iterate back to the manifold:

    Λ(X) = (G Xᵀ − X Gᵀ) X + λ X (XᵀX − I),

where ``G = ∂L/∂X``. The second term is ``λ ∇N(X)`` with ``N(X) = ‖XᵀX − I‖²_F / 4``. The first uses the
PoLAR / METHODS.md convention ``ψ = G Xᵀ − X Gᵀ`` (twice Ablin & Peyré's ``skew(G Xᵀ)``; the factor 2 only rescales
the learning rate). It is computed as ``G (XᵀX) − X (GᵀX)``: O(n r²), never the ``n × n`` matrix ``ψ``.

Init (documented choice, the PoLAR reference's default): X and Y with orthonormal columns (``nn.init.orthogonal_``
on a Gaussian draw), ``Θ = 0``, so ``ΔW = 0`` at init and the layer's output is unchanged; Θ then receives the
gradient ``s Xᵀ (∂L/∂ΔW) Y`` from the first step, while X and Y only move once Θ ≠ 0.

Because X and Y have (near-)orthonormal columns, the spectrum of ΔW is (nearly) that of Θ: the
stable rank of ΔW is computed exactly and cheaply from the ``r × r`` core ``R_X Θ R_Yᵀ`` (QR of X and Y), never from
the ``out × in`` matrix.

.. code-block:: python

    from lit_lowrank.ops.polar import landing_direction, orthogonality_error, polar_stable_rank

    x.grad = landing_direction(x.detach(), x.grad, lam=5e-3)   # before optimizer.step()
    orthogonality_error(x), polar_stable_rank(x, theta, y)
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_lowrank.ops.lowrank import stable_rank_of

__all__ = [
    "landing_direction",
    "orthogonality_error",
    "polar_delta_weight",
    "polar_init_",
    "polar_stable_rank",
    "shorten_to_safe_region",
]


def _check_tall(x: Tensor, name: str = "x") -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} must be a matrix (n, r) with orthonormal-ish columns, got shape {tuple(x.shape)}")
    if x.shape[1] > x.shape[0]:
        raise ValueError(f"{name} must have at most as many columns as rows (r <= n) to have orthonormal columns, "
                         f"got shape {tuple(x.shape)}")


def orthogonality_error(x: Tensor) -> Tensor:
    """Distance to the Stiefel manifold ``‖XᵀX − I_r‖_F`` (0 iff the columns are orthonormal), a float32 scalar.

    Args:
        x: ``(n, r)`` with ``r <= n``.

    .. code-block:: python

        orthogonality_error(torch.linalg.qr(torch.randn(64, 8)).Q)   # ≈ 1e-6
    """
    _check_tall(x)
    xf = x.detach().float()
    gram = xf.T @ xf
    return torch.linalg.matrix_norm(gram - torch.eye(gram.shape[0], device=gram.device, dtype=gram.dtype))


def landing_direction(x: Tensor, grad: Tensor, lam: float) -> Tensor:
    """The landing field ``Λ = (G Xᵀ − X Gᵀ) X + λ X (XᵀX − I)`` that replaces ``G`` before the optimizer step.

    The first term is tangent to the manifold's orbit (``ψ = G Xᵀ − X Gᵀ`` is skew, so it leaves ``XᵀX`` unchanged
    to first order); the second is ``λ ∇ ‖XᵀX − I‖²_F / 4`` and points away from the manifold, so a descent step
    along ``−Λ`` lands back on it. Computed in float32 (or wider) and returned in ``grad``'s dtype.

    Args:
        x: ``(n, r)`` current factor, ``r <= n``.
        grad: ``(n, r)`` Euclidean gradient of the loss with respect to ``x``.
        lam: ``λ >= 0``, the weight of the attraction to the manifold.

    Raises:
        ValueError: on mismatched shapes or a negative / non-finite ``lam``.

    .. code-block:: python

        with torch.no_grad():
            x.grad.copy_(landing_direction(x, x.grad, lam=5e-3))
    """
    _check_tall(x)
    if grad.shape != x.shape:
        raise ValueError(f"grad must have the shape of x {tuple(x.shape)}, got {tuple(grad.shape)}")
    lam = float(lam)
    if not (lam >= 0.0 and lam < float("inf")):
        raise ValueError(f"lam must be a finite number >= 0 (the landing attraction weight), got {lam!r}")
    work = torch.promote_types(x.dtype, torch.float32)
    xf, gf = x.detach().to(work), grad.detach().to(work)
    gram = xf.T @ xf  # (r, r)
    # (G Xᵀ − X Gᵀ) X = G (XᵀX) − X (GᵀX): the n×n skew matrix is never formed.
    field = gf @ gram - xf @ (gf.T @ xf)
    if lam:
        field = field + lam * (xf @ gram - xf)
    return field.to(grad.dtype)


def shorten_to_safe_region(x_old: Tensor, x_new: Tensor, eps: float, max_halvings: int = 30) -> tuple[Tensor, float]:
    """Shorten the step ``x_new − x_old`` until ``‖XᵀX − I‖_F <= eps`` (Ablin & Peyré's safe region).

    Ablin & Peyré bound the *SGD* step so the iterate never leaves ``{‖XᵀX − I‖ <= ε}``. Under an adaptive
    optimizer (Adam) the realised step is not ``−η Λ``, so the same invariant is enforced on the step that was
    actually taken: ``X = x_old + t (x_new − x_old)`` with the largest ``t ∈ {1, 1/2, 1/4, …}`` that stays inside
    (``t = 0`` — no move — if ``x_old`` itself is outside or no halving suffices). Still no retraction: X only moves
    along the optimizer's own step.

    Args:
        x_old: ``(n, r)`` the factor before the step.
        x_new: ``(n, r)`` the factor after the step.
        eps: radius ``ε > 0`` of the safe region.
        max_halvings: how many halvings to try before giving up the step.

    Returns:
        ``(x, t)``: the kept factor and the fraction of the step kept.

    .. code-block:: python

        x_safe, t = shorten_to_safe_region(x_before, x.detach(), eps=0.5)
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0 (radius of the safe region), got {eps!r}")
    if x_old.shape != x_new.shape:
        raise ValueError(f"x_old and x_new must have the same shape, got {tuple(x_old.shape)} and "
                         f"{tuple(x_new.shape)}")
    if float(orthogonality_error(x_new)) <= eps:
        return x_new, 1.0
    step = x_new - x_old
    t = 1.0
    for _ in range(max_halvings):
        t *= 0.5
        candidate = x_old + t * step
        if float(orthogonality_error(candidate)) <= eps:
            return candidate, t
    return x_old.clone(), 0.0


def polar_delta_weight(x: Tensor, theta: Tensor, y: Tensor, scaling: float = 1.0) -> Tensor:
    """``ΔW = scaling · X Θ Yᵀ``, shape ``(out, in)``.

    Args:
        x: ``(out, r)``; theta: ``(r, r)``; y: ``(in, r)``.

    .. code-block:: python

        delta = polar_delta_weight(x, theta, y, scaling=alpha / r)
    """
    r = theta.shape[-1]
    if theta.shape != (r, r) or x.shape[-1] != r or y.shape[-1] != r:
        raise ValueError(f"expected x (out, r), theta (r, r), y (in, r) with one r, got x {tuple(x.shape)}, "
                         f"theta {tuple(theta.shape)}, y {tuple(y.shape)}")
    return (x @ theta @ y.T) * scaling


@torch.no_grad()
def polar_init_(x: Tensor, theta: Tensor, y: Tensor, generator: torch.Generator | None = None) -> None:
    """In place: orthonormal columns for ``x`` and ``y`` (QR of a Gaussian draw), ``theta = 0`` (so ``ΔW = 0``).

    .. code-block:: python

        polar_init_(x, theta, y)
        assert orthogonality_error(x) < 1e-5 and theta.abs().max() == 0
    """
    for name, factor in (("x", x), ("y", y)):
        _check_tall(factor, name)
        torch.nn.init.orthogonal_(factor, generator=generator)
    theta.zero_()


def polar_stable_rank(x: Tensor, theta: Tensor, y: Tensor) -> Tensor:
    """Stable rank ``‖ΔW‖²_F / ‖ΔW‖²₂`` of ``ΔW = X Θ Yᵀ`` (0 for ``ΔW = 0``), exact, from an ``r × r`` core.

    With ``X = Q_X R_X`` and ``Y = Q_Y R_Y`` (thin QR), ``ΔW = Q_X (R_X Θ R_Yᵀ) Q_Yᵀ`` has the singular values of
    the core, whether or not X and Y are exactly orthonormal. Scale-free, so ``α / r`` does not matter.

    .. code-block:: python

        polar_stable_rank(layer.lora_X["default"], layer.lora_theta["default"], layer.lora_Y["default"])
    """
    _check_tall(x, "x")
    _check_tall(y, "y")
    work = torch.promote_types(x.dtype, torch.float32)
    rx = torch.linalg.qr(x.detach().to(work), mode="r").R
    ry = torch.linalg.qr(y.detach().to(work), mode="r").R
    return stable_rank_of(rx @ theta.detach().to(work) @ ry.T)
