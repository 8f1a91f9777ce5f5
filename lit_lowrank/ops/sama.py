"""SaMA math: the relaxed shared-block (generalised Kronecker) weight update, applied without forming ΔW.

SaMA (Scalable Morpho Adaptation, METHODS.md §10, derived from the abstract) generalises the
Kronecker product. A Kronecker update ``A ⊗ B`` has blocks ``a_ij B`` that all share one block
``B``. Relaxing that shared-block constraint to one block per block-row gives

.. math::

    ΔW = s · \\mathrm{blockdiag}(B_1, …, B_{m_1}) · (A ⊗ I_q),
    \\qquad (ΔW)_{ij\\text{-block}} = a_{ij} B_i

with ``A: (m1, n1)`` (the mixing factor) and ``B_i: (m2, q)`` (the relaxed blocks), for a layer with
``out_features ≤ m1·m2`` and ``in_features ≤ n1·q``. With the perfect shuffles ``P, P'``,
``A ⊗ I_q = Pᵀ (I_q ⊗ A) P'``: on an input reshaped to ``(n1, q)`` the shuffle is the reshape
itself, so ``(A ⊗ I_q) x`` is the small matmul ``A @ x.view(n1, q)``. The fast apply
(:func:`sama_apply`) therefore costs ``m1·n1·q + m1·m2·q`` multiply–adds per row — exactly the
number of parameters, like LoRA — and never forms the ``(out, in)`` matrix;
:func:`sama_delta_weight` builds it explicitly for tests and merging.

Properties (tested in ``tests/adapters/test_sama.py``):

- generic rank ``min(m1·min(m2, q), min(m1, n1)·q)`` (capped by the layer): with ``m1 = q = k`` the
  update has rank ``k²`` for about ``k·out + in`` parameters, where LoRA needs ``k²·(out + in)``;
  rank grows quadratically with the budget while LoRA's grows linearly, and the family spans rank 1
  (``m1 = q = 1`` is rank-1 LoRA) up to full rank;
- the only invariance of the factorisation is the diagonal group ``B_i → λ_i B_i``,
  ``A_{i,:} → A_{i,:}/λ_i`` (LoRA's is all of ``GL(r)``), which is why the factors are kept dense
  rather than themselves low-rank (**decision**: low-rank blocks would bring the ``GL(r)`` back);
- non-divisible layer shapes are handled by zero-padding the input to ``n1·q`` and cropping the
  output to ``out_features`` (**decision**; the padded parameters are counted in the budget).

Initialisation (**decision**): ``B_i = 0`` so ``ΔW = 0`` at init (LoRA's ``B = 0`` convention) and
``A`` with orthonormal rows (or columns), so ``A ⊗ I_q`` neither amplifies nor shrinks the input and
the gradient of every ``B_i`` is non-zero from the first step.

.. code-block:: python

    import torch
    from lit_lowrank.ops.sama import sama_shape, sama_init, sama_apply, sama_delta_weight, sama_rank_report

    shape = sama_shape(in_features=384, out_features=384, budget=8 * (384 + 384))  # LoRA r=8 budget
    a, b = sama_init(shape)                                     # b == 0: ΔW = 0
    b.normal_()
    x = torch.randn(5, 384)
    torch.testing.assert_close(sama_apply(x, a, b, shape), x @ sama_delta_weight(a, b, shape).T)
    sama_rank_report(384, 384, budget=8 * 768)["rank"]         # far above LoRA's 8
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_lowrank.ops.lowrank import effective_rank_of, singular_values, stable_rank_of

__all__ = [
    "SaMAShape",
    "lora_budget",
    "sama_apply",
    "sama_delta_weight",
    "sama_init",
    "sama_matched_to_lora",
    "sama_min_parameters",
    "sama_rank_report",
    "sama_shape",
]


@dataclass(frozen=True)
class SaMAShape:
    """Factor shapes of one SaMA update for a ``(out_features, in_features)`` layer.

    Attributes:
        in_features: ``n``, the layer's input width.
        out_features: ``m``, the layer's output width.
        num_blocks: ``m1``, rows of ``A`` = number of relaxed blocks ``B_i``.
        block_rows: ``m2``, rows of each ``B_i`` (``m1·m2 ≥ m``).
        in_blocks: ``n1``, columns of ``A`` (``n1·q ≥ n``).
        block_cols: ``q``, columns of each ``B_i`` (the identity size in ``A ⊗ I_q``).

    .. code-block:: python

        shape = SaMAShape(64, 64, num_blocks=8, block_rows=8, in_blocks=16, block_cols=4)
        shape.num_parameters, shape.generic_rank     # (8*16 + 8*8*4, 32)
    """

    in_features: int
    out_features: int
    num_blocks: int
    block_rows: int
    in_blocks: int
    block_cols: int

    def __post_init__(self) -> None:
        for name in ("in_features", "out_features", "num_blocks", "block_rows", "in_blocks", "block_cols"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SaMAShape.{name} must be a positive integer, got {value!r}")
        if self.num_blocks * self.block_rows < self.out_features:
            raise ValueError(f"SaMAShape: num_blocks*block_rows = {self.num_blocks}*{self.block_rows} must cover "
                             f"out_features={self.out_features}")
        if self.in_blocks * self.block_cols < self.in_features:
            raise ValueError(f"SaMAShape: in_blocks*block_cols = {self.in_blocks}*{self.block_cols} must cover "
                             f"in_features={self.in_features}")

    @property
    def a_shape(self) -> tuple[int, int]:
        """Shape of the mixing factor ``A``: ``(m1, n1)``."""
        return (self.num_blocks, self.in_blocks)

    @property
    def b_shape(self) -> tuple[int, int, int]:
        """Shape of the stacked relaxed blocks ``B``: ``(m1, m2, q)``."""
        return (self.num_blocks, self.block_rows, self.block_cols)

    @property
    def padded_out(self) -> int:
        return self.num_blocks * self.block_rows

    @property
    def padded_in(self) -> int:
        return self.in_blocks * self.block_cols

    @property
    def num_parameters(self) -> int:
        """Stored parameters ``m1·n1 + m1·m2·q`` (padding included)."""
        return self.num_blocks * self.in_blocks + self.num_blocks * self.block_rows * self.block_cols

    @property
    def generic_rank(self) -> int:
        """Rank of ΔW for generic (random) factors.

        Block-row ``i`` of ΔW is ``B_i (a_i ⊗ I_q)``: its row space is ``a_i ⊗ rowspace(B_i)``, so the blocks add
        their ranks while the rows ``a_i`` of ``A`` stay independent: uncropped, the rank is
        ``min(m1·min(m2, q), min(m1, n1)·q)``. Cropping to ``(m, n)`` shortens the last output block to
        ``m - (m1-1)·m2`` rows and removes the last column block of ``A`` from ``q - (n - (n1-1)·q)`` of the
        ``q`` interleaved copies of ``A``; the rank is the smaller of the two cropped factor ranks (checked
        numerically in the tests, for random shapes).
        """
        m1, m2, n1, q = self.num_blocks, self.block_rows, self.in_blocks, self.block_cols
        last_rows = self.out_features - (m1 - 1) * m2
        left = (m1 - 1) * min(m2, q) + min(last_rows, q)
        last_cols = self.in_features - (n1 - 1) * q
        right = last_cols * min(m1, n1) + (q - last_cols) * min(m1, n1 - 1)
        return min(left, right)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def lora_budget(in_features: int, out_features: int, rank: int) -> int:
    """Parameters of a rank-``rank`` LoRA on the layer: ``rank·(in + out)`` — the matched budget."""
    return rank * (in_features + out_features)


def _check_dims(in_features: int, out_features: int) -> None:
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _block_counts(size: int, limit: int) -> list[int]:
    """Block counts ``k ≤ limit`` that leave no empty block when ``size`` is cut into ``ceil(size/k)``-wide pieces."""
    counts = {math.ceil(size / math.ceil(size / k)) for k in range(1, min(size, limit) + 1)}
    return sorted(c for c in counts if c <= limit)


def sama_min_parameters(in_features: int, out_features: int) -> int:
    """The smallest SaMA adapter on the layer (``m1 = 1``): ``min_q ceil(n/q) + m·q`` — at most ``n + m``."""
    _check_dims(in_features, out_features)
    return min(math.ceil(in_features / q) + out_features * q for q in range(1, in_features + 1))


@lru_cache(maxsize=4096)
def _best_shape(in_features: int, out_features: int, budget: int) -> SaMAShape:
    n, m = in_features, out_features
    best: tuple[tuple[int, int, int], SaMAShape] | None = None
    # m1·m2·q ≥ m·q ≤ budget bounds q; m1·n1 ≤ budget bounds m1 — the search stays small for LoRA-like budgets
    for q in range(1, min(n, budget // m) + 1):
        n1 = math.ceil(n / q)
        for m1 in _block_counts(m, max(1, budget // n1)):
            shape = SaMAShape(n, m, m1, math.ceil(m / m1), n1, q)
            params = shape.num_parameters
            if params > budget:
                continue
            padding = shape.padded_out - m + shape.padded_in - n
            # the highest rank first, then the budget used as fully as possible (more free parameters at equal rank),
            # then the least zero padding
            key = (shape.generic_rank, params, -padding)
            if best is None or key > best[0]:
                best = (key, shape)
    assert best is not None  # the caller checked budget ≥ sama_min_parameters
    return best[1]


def sama_shape(
    in_features: int,
    out_features: int,
    budget: int | None = None,
    *,
    num_blocks: int | None = None,
    block_cols: int | None = None,
) -> SaMAShape:
    """Factor shapes for a layer: explicit (``num_blocks`` and ``block_cols``) or chosen from a parameter ``budget``.

    With a budget, every feasible ``(m1, q)`` (``m2 = ceil(m/m1)``, ``n1 = ceil(n/q)``) is scored and the shape with
    the highest generic rank is returned, ties broken by using more of the budget, then by less padding. The chosen
    shape never exceeds the budget.

    Args:
        in_features: layer input width ``n``.
        out_features: layer output width ``m``.
        budget: maximum number of adapter parameters (e.g. :func:`lora_budget` for a LoRA-matched adapter).
        num_blocks: explicit ``m1`` (needs ``block_cols``; ``budget`` is then only checked).
        block_cols: explicit ``q``.

    Raises:
        ValueError: naming the parameter, for a budget below :func:`sama_min_parameters`, an explicit shape larger
            than the layer or than the budget, or only one of ``num_blocks`` / ``block_cols``.

    .. code-block:: python

        sama_shape(768, 768, budget=lora_budget(768, 768, 8))   # m1=48, q=12: rank 576 with LoRA r=8's 12,288
        sama_shape(768, 768, num_blocks=48, block_cols=8)       # rank 384, 10,752 parameters
    """
    _check_dims(in_features, out_features)
    if (num_blocks is None) != (block_cols is None):
        raise ValueError(f"num_blocks and block_cols must be given together (got num_blocks={num_blocks!r}, "
                         f"block_cols={block_cols!r}); give neither to choose them from budget")
    if num_blocks is not None and block_cols is not None:
        if not isinstance(num_blocks, int) or not 1 <= num_blocks <= out_features:
            raise ValueError(f"num_blocks must be an integer in [1, out_features={out_features}], got {num_blocks!r}")
        if not isinstance(block_cols, int) or not 1 <= block_cols <= in_features:
            raise ValueError(f"block_cols must be an integer in [1, in_features={in_features}], got {block_cols!r}")
        block_rows = math.ceil(out_features / num_blocks)
        # e.g. 12 rows in 10 blocks of 2 leave 4 blocks empty: use the 6 blocks that hold rows
        shape = SaMAShape(in_features, out_features, math.ceil(out_features / block_rows), block_rows,
                          math.ceil(in_features / block_cols), block_cols)
        if budget is not None and shape.num_parameters > budget:
            raise ValueError(f"budget={budget} is below the {shape.num_parameters} parameters of the explicit shape "
                             f"num_blocks={num_blocks}, block_cols={block_cols}")
        return shape
    if budget is None:
        raise ValueError("sama_shape needs budget (a parameter count) or both num_blocks and block_cols")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise ValueError(f"budget must be an integer number of parameters, got {budget!r}")
    smallest = sama_min_parameters(in_features, out_features)
    if budget < smallest:
        raise ValueError(f"budget={budget} is below the smallest SaMA adapter for a ({out_features}, {in_features}) "
                         f"layer, which needs {smallest} parameters")
    return _best_shape(in_features, out_features, budget)


def sama_matched_to_lora(in_features: int, out_features: int, lora_rank: int) -> SaMAShape:
    """The SaMA shape with at most the parameters of a rank-``lora_rank`` LoRA on the same layer.

    .. code-block:: python

        shape = sama_matched_to_lora(384, 384, lora_rank=8)
        assert shape.num_parameters <= 8 * (384 + 384)
    """
    if not isinstance(lora_rank, int) or isinstance(lora_rank, bool) or lora_rank < 1:
        raise ValueError(f"lora_rank must be a positive integer, got {lora_rank!r}")
    return sama_shape(in_features, out_features, budget=lora_budget(in_features, out_features, lora_rank))


def sama_init(
    shape: SaMAShape,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Initial factors ``A: (m1, n1)`` with orthonormal rows (or columns) and ``B: (m1, m2, q)`` all zero (ΔW = 0).

    .. code-block:: python

        a, b = sama_init(sama_shape(64, 32, budget=300))
    """
    a = torch.empty(shape.a_shape, dtype=dtype, device=device)
    torch.nn.init.orthogonal_(a, generator=generator)
    b = torch.zeros(shape.b_shape, dtype=dtype, device=device)
    return a, b


def _check_factors(a: Tensor, b: Tensor, shape: SaMAShape) -> None:
    if tuple(a.shape) != shape.a_shape:
        raise ValueError(f"a must have shape (num_blocks, in_blocks)={shape.a_shape}, got {tuple(a.shape)}")
    if tuple(b.shape) != shape.b_shape:
        raise ValueError(f"b must have shape (num_blocks, block_rows, block_cols)={shape.b_shape}, "
                         f"got {tuple(b.shape)}")


def sama_apply(x: Tensor, a: Tensor, b: Tensor, shape: SaMAShape, scale: float = 1.0) -> Tensor:
    """``x @ ΔWᵀ`` without forming ΔW: ``(…, in_features) → (…, out_features)``.

    Args:
        x: ``(…, n)`` input.
        a: ``(m1, n1)`` mixing factor.
        b: ``(m1, m2, q)`` relaxed blocks.
        shape: the factor shapes.
        scale: ``s`` in ``ΔW = s · blockdiag(B_i)(A ⊗ I_q)``.

    .. code-block:: python

        y = sama_apply(torch.randn(4, 10, shape.in_features), a, b, shape)   # (4, 10, out_features)
    """
    _check_factors(a, b, shape)
    if x.shape[-1] != shape.in_features:
        raise ValueError(f"x must end in in_features={shape.in_features}, got shape {tuple(x.shape)}")
    lead = x.shape[:-1]
    if shape.padded_in != shape.in_features:
        x = F.pad(x, (0, shape.padded_in - shape.in_features))
    # the perfect shuffle: viewing x as (n1, q) makes (A ⊗ I_q) x a single (m1, n1) @ (n1, q) product
    blocks = x.reshape(-1, shape.in_blocks, shape.block_cols)
    mixed = torch.matmul(a, blocks)  # (rows, m1, q)
    # block i of the output is B_i @ mixed_i: one batched matmul over the m1 blocks
    out = torch.einsum("iaq,niq->nia", b, mixed).reshape(*lead, shape.padded_out)
    if shape.padded_out != shape.out_features:
        out = out[..., : shape.out_features]
    return out * scale if scale != 1.0 else out


def sama_delta_weight(a: Tensor, b: Tensor, shape: SaMAShape, scale: float = 1.0) -> Tensor:
    """The explicit ``ΔW: (out_features, in_features)``, block ``(i, j) = s · a_ij B_i`` (for tests and merging).

    .. code-block:: python

        delta = sama_delta_weight(a, b, shape)       # (shape.out_features, shape.in_features)
    """
    _check_factors(a, b, shape)
    full = torch.einsum("ij,iaq->iajq", a, b).reshape(shape.padded_out, shape.padded_in)
    delta = full[: shape.out_features, : shape.in_features]
    return delta * scale if scale != 1.0 else delta


def sama_rank_report(
    in_features: int,
    out_features: int,
    budget: int,
    *,
    seed: int = 0,
    shape: SaMAShape | None = None,
) -> dict[str, object]:
    """Rank of the SaMA update a budget buys, measured on random factors, beside LoRA's at the same budget.

    ``A`` and every ``B_i`` are drawn i.i.d. standard normal (a trained adapter, not the all-zero init), ΔW is
    formed explicitly and its spectrum measured with :mod:`lit_lowrank.ops.lowrank`.

    Returns:
        ``{"parameters", "rank" (numerical, σ > max(m, n)·eps·σ₁), "generic_rank", "effective_rank"
        (Roy & Vetterli), "stable_rank", "lora_rank" (``budget // (m + n)``), "lora_parameters", "shape"}``.

    .. code-block:: python

        report = sama_rank_report(384, 384, budget=lora_budget(384, 384, 4))
        report["rank"], report["effective_rank"], report["lora_rank"]
    """
    shape = shape if shape is not None else sama_shape(in_features, out_features, budget)
    if (shape.in_features, shape.out_features) != (in_features, out_features):
        raise ValueError(f"shape is for a ({shape.out_features}, {shape.in_features}) layer, not "
                         f"({out_features}, {in_features})")
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(shape.a_shape, generator=gen, dtype=torch.float64)
    b = torch.randn(shape.b_shape, generator=gen, dtype=torch.float64)
    delta = sama_delta_weight(a, b, shape)
    sv = singular_values(delta)
    tol = max(delta.shape) * torch.finfo(delta.dtype).eps * float(sv[0])
    lora_rank = min(budget // (in_features + out_features), in_features, out_features)
    return {
        "parameters": shape.num_parameters,
        "rank": int((sv > tol).sum()),
        "generic_rank": shape.generic_rank,
        "effective_rank": float(effective_rank_of(delta)),
        "stable_rank": float(stable_rank_of(delta)),
        "lora_rank": lora_rank,
        "lora_parameters": lora_rank * (in_features + out_features),
        "shape": shape.as_dict(),
    }
