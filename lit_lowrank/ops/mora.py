"""MoRA math (Jiang et al. 2024, arXiv 2405.12130): a square ``r̂×r̂`` matrix between a compression and a decompression.

MoRA replaces LoRA's ``B A`` by one square matrix ``M`` (``r̂×r̂``, zero at init) applied between a
parameter-free compression ``f_comp: ℝⁿ → ℝ^r̂`` and decompression ``f_decomp: ℝ^r̂ → ℝᵐ``:

    ΔW x = f_decomp(M f_comp(x))

With the budget of a rank-``r`` LoRA, ``r̂ = ⌊√((m + n)·r)⌋``, so ``M`` can reach rank ``r̂ ≫ r``. Two of the
paper's operator pairs are implemented (its reference code's ``mora_type`` 1 and 6):

- ``"sharing"`` (type 1, Eq. 6; the paper's choice for large ranks): the input, cyclically padded to a multiple of
  ``r̂``, is cut into ``k = ⌈n/r̂⌉`` chunks that are *summed*; the output is ``M``'s result repeated and cropped to
  ``m``. ``ΔW`` has rank ``≤ r̂``.
- ``"rope"`` (type 6, Eq. 9; the paper's choice for small ranks, default): the chunks are *kept*, chunk ``j`` is
  rotated by the RoPE rotation of position ``j`` (so ``M`` sees the chunks as distinguishable), ``M`` is applied to
  every chunk, and the ``k·r̂`` outputs are cropped (or repeated) to ``m``. ``ΔW`` is block-structured
  ``[M R_j]`` and reaches rank far above ``r̂``.

**Decisions**: ``r̂`` is rounded *down* (the reference rounds to nearest), so MoRA never has more parameters than the
LoRA it is matched to; ``"rope"`` needs an even ``r̂`` (rounded down again). Cyclic padding repeats the first
entries of ``x`` (as the reference does); ``ΔW`` is formed by applying the operator to the identity.

.. code-block:: python

    from lit_lowrank.ops.mora import mora_apply, mora_delta_weight, mora_rank

    r_hat = mora_rank(384, 384, lora_rank=8, kind="rope")     # 78: 6,084 parameters vs LoRA's 6,144
    m = torch.zeros(r_hat, r_hat)
    y = mora_apply(x, m, out_features=384, kind="rope")       # x: (..., 384)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["MORA_KINDS", "mora_apply", "mora_delta_weight", "mora_rank"]

MORA_KINDS: tuple[str, ...] = ("rope", "sharing")


def _check_kind(kind: str) -> None:
    if kind not in MORA_KINDS:
        raise ValueError(f"`kind`={kind!r}: expected one of {MORA_KINDS}.")


def mora_rank(in_features: int, out_features: int, lora_rank: int, kind: str = "rope") -> int:
    """``r̂ = ⌊√((in + out)·lora_rank)⌋`` (even for ``"rope"``): the square size at a rank-``lora_rank`` LoRA budget.

    .. code-block:: python

        mora_rank(64, 64, lora_rank=4)    # 22: 484 parameters <= LoRA's 512
    """
    _check_kind(kind)
    for name, value in (("in_features", in_features), ("out_features", out_features), ("lora_rank", lora_rank)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{name}`={value!r}: expected a positive integer.")
    r_hat = math.isqrt((in_features + out_features) * lora_rank)
    if kind == "rope":
        r_hat -= r_hat % 2
    if r_hat < (2 if kind == "rope" else 1):
        raise ValueError(f"a rank-{lora_rank} budget on a ({out_features}, {in_features}) layer gives r̂={r_hat}: too "
                         f"small for MoRA kind {kind!r}.")
    return r_hat


def _rope_tables(chunks: int, r_hat: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, r_hat, 2, device=device, dtype=torch.float64) / r_hat))
    freqs = torch.outer(torch.arange(chunks, device=device, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # (chunks, r̂)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def mora_apply(x: Tensor, m: Tensor, out_features: int, kind: str = "rope") -> Tensor:
    """``ΔW x`` for ``x: (…, n)`` and the square ``m: (r̂, r̂)``, never forming ``ΔW``: ``(…, n) → (…, out)``.

    .. code-block:: python

        y = mora_apply(torch.randn(4, 10, 64), torch.randn(22, 22), out_features=64, kind="sharing")
    """
    _check_kind(kind)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"`m` must be a square (r̂, r̂) matrix, got shape {tuple(m.shape)}.")
    r_hat, n = m.shape[0], x.shape[-1]
    chunks = math.ceil(n / r_hat)
    # cyclic padding to chunks·r̂ (the reference repeats the first entries of x)
    idx = torch.arange(chunks * r_hat, device=x.device) % n
    pieces = x[..., idx].reshape(*x.shape[:-1], chunks, r_hat)
    if kind == "sharing":
        out = pieces.sum(-2) @ m.t()                                  # (…, r̂)
        width = r_hat
    else:
        cos, sin = _rope_tables(chunks, r_hat, x.device, x.dtype)
        half = r_hat // 2
        rotated = torch.cat([-pieces[..., half:], pieces[..., :half]], dim=-1)
        out = ((pieces * cos + rotated * sin) @ m.t()).reshape(*x.shape[:-1], chunks * r_hat)
        width = chunks * r_hat
    # decompression: repeat and crop to out_features
    return out[..., torch.arange(out_features, device=x.device) % width]


def mora_delta_weight(m: Tensor, in_features: int, out_features: int, kind: str = "rope") -> Tensor:
    """The explicit ``ΔW: (out, in)`` of the operator (applied to the identity; for tests, merging, diagnostics).

    .. code-block:: python

        delta = mora_delta_weight(m, 64, 64)
        torch.testing.assert_close(mora_apply(x, m, 64), x @ delta.T)
    """
    eye = torch.eye(in_features, device=m.device, dtype=m.dtype)
    return mora_apply(eye, m, out_features, kind).t()
