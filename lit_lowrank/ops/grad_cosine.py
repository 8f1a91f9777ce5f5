"""Gradient cosine (METHODS.md, "Shared definitions"): per tensor, their unweighted mean, and the global cosine.

.. code-block:: python

    from lit_lowrank.ops.grad_cosine import gradient_cosine

    exact = {n: p.grad.clone() for n, p in model.named_parameters()}
    ...  # recompute the gradients with the approximate method
    approx = {n: p.grad.clone() for n, p in model.named_parameters()}
    result = gradient_cosine(approx, exact, names=compressed_weight_names)
    result.mean, result.global_cosine, result.per_tensor["layer.weight"]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GradientCosine", "gradient_cosine"]


@dataclass(frozen=True)
class GradientCosine:
    """``per_tensor``: cos(vec ĝ, vec g) per name; ``mean``: their unweighted mean;
    ``global_cosine``: the cosine of all selected gradients concatenated."""

    per_tensor: dict[str, float]
    mean: float
    global_cosine: float


def _cos(a: Tensor, b: Tensor, eps: float) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    denom = a.norm() * b.norm()
    if denom <= eps:  # both zero: identical; one zero: orthogonal by convention
        return 1.0 if a.norm() <= eps and b.norm() <= eps else 0.0
    return float(a @ b / denom)


def gradient_cosine(approx: Mapping[str, Tensor], exact: Mapping[str, Tensor], names: Iterable[str] | None = None,
                    eps: float = 1e-30) -> GradientCosine:
    """Cosines between approximate and exact gradients.

    Args:
        approx: name -> approximate gradient ĝ.
        exact: name -> exact gradient g (same shapes).
        names: the tensors to compare (the compressed/adapted ones); default: every name in ``exact``.
        eps: norms below this count as zero.

    Raises:
        ValueError: a name is missing from either mapping or shapes differ.
    """
    selected = list(exact) if names is None else list(names)
    if not selected:
        raise ValueError("gradient_cosine: `names` selects no tensor.")
    per: dict[str, float] = {}
    for name in selected:
        if name not in approx or name not in exact:
            raise ValueError(f"gradient_cosine: {name!r} missing from {'approx' if name not in approx else 'exact'}.")
        if approx[name].shape != exact[name].shape:
            raise ValueError(f"gradient_cosine: {name!r} has shapes {tuple(approx[name].shape)} (approx) and "
                             f"{tuple(exact[name].shape)} (exact).")
        per[name] = _cos(approx[name], exact[name], eps)
    flat_a = torch.cat([approx[n].double().flatten() for n in selected])
    flat_e = torch.cat([exact[n].double().flatten() for n in selected])
    return GradientCosine(per, sum(per.values()) / len(per), _cos(flat_a, flat_e, eps))
