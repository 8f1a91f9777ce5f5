"""STAC-R math: tracked-subspace activation codes, the factored Linear backward and the gradient bridge.

A saved activation ``X (N, d)`` is stored as coefficients ``C = X U`` (``coef_dtype``,
bf16 by default) in an orthonormal basis ``U (d, r)`` plus a sparse quantized residual
``Ê``: the top-``density`` fraction of the entries of ``E = X − C Uᵀ`` (by magnitude),
as int values of ``bits`` bits with one float scale and int32 flat indices. The
residual is taken against the *stored* coefficients, so it also corrects their
rounding. The basis ``U`` is persistent per layer and tracked across steps by one
subspace iteration ``U ← qr(Xᵀ(XU))`` (or an Oja step); it is model state, not a
saved activation, unless a per-step basis is stored (the iso-byte SVD control).

The Linear layer's weight gradient is contracted from the factors without
rebuilding ``X``: ``∂W ≈ Gᵀ C Uᵀ + Gᵀ Ê`` (a ``(d_out, r) @ (r, d)`` product and a
sparse–dense product); ``∂X = G W`` stays exact.

Gradient bridge: with ``X̂ = C Uᵀ + Ê`` and ``E = X − X̂``, the weight gradients are
``g = GᵀX`` and ``ĝ = GᵀX̂ = g − GᵀE``; with ``ε = ‖GᵀE‖_F / ‖GᵀX‖_F < 1`` the angle
between them has ``sin ≤ ε``, so ``cos(ĝ, g) ≥ √(1 − ε²)``. ``ε`` needs the exact ``X``
(a diagnostic step keeps it). The bound from the reconstruction error alone,
``ε ≤ ‖G‖₂ ‖E‖_F / ‖GᵀX‖_F``, is valid but vacuous on real activations (it gave cosine
bounds of 0.00–0.50 where the true cosine was ≈ 0.99: ``E`` is far from ``G``'s top
singular direction), so it is not computed.

.. code-block:: python

    from lit_lowrank.ops.stac_r.compress import compress_activation, decompress_activation, init_basis, stac_r_linear

    basis = init_basis(x2d, rank=16)
    code = compress_activation(x2d, basis, density=0.01, bits=8)
    x_hat = decompress_activation(code)
    y = stac_r_linear(x, linear.weight, linear.bias, basis, density=0.01)   # factored backward
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_lowrank.ops.lowrank import truncated_svd
from lit_lowrank.ops.stac_r.rank import select_rank
from lit_lowrank.ops.stac_r.saved_tensors import NO_CODEC_ATTR

__all__ = [
    "ActivationCode", "BridgeStats", "StacRLinearFunction", "compress_activation", "compressed_nbytes",
    "decompress_activation", "dequantize_residual", "factored_weight_grad", "gradient_bridge", "init_basis",
    "TrackedSavedTensorCodec", "iso_byte_rank", "oja_update", "quantize_residual", "random_projection",
    "random_projection_rank", "residual_count", "stac_r_linear", "subspace_iteration",
]

_DTYPE_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float64: 8}


def _check_2d(x: Tensor, name: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"`{name}` must be a matrix (N, d), got shape {tuple(x.shape)}.")


def _check_residual_args(density: float, bits: int) -> None:
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"`residual_density`={density!r}, expected a fraction in [0, 1].")
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"`residual_bits`={bits!r}, expected an integer in [2, 8] (stored as int8).")


# -- the tracked subspace -------------------------------------------------------------------------------------------
def init_basis(x: Tensor, rank: int, exact: bool = False) -> Tensor:
    """Orthonormal ``(d, rank)``: the top right singular vectors of ``x (N, d)`` (float32).

    A rank well below ``min(N, d)`` uses a seeded randomized range finder (``rank + 8``
    columns, two power iterations: ``O(N d r)`` instead of a full SVD's ``O(N d min(N, d))``,
    210 of which made the calibration step of a 135M model cost as much as four steps);
    it is exact on data of rank ``<= rank + 8`` and the tracked update refines it every step.
    ``exact=True`` (the per-step SVD control) always takes the full thin SVD.
    """
    _check_2d(x, "x")
    if not isinstance(rank, int) or not 1 <= rank <= x.shape[1]:
        raise ValueError(f"`rank`={rank!r}, expected an integer in [1, d={x.shape[1]}] for x of shape {tuple(x.shape)}.")
    k = min(rank, x.shape[0])
    if not exact and 4 * (k + 8) <= min(x.shape):
        xf = x.detach().float()
        gen = torch.Generator(device="cpu").manual_seed(0)
        q, _ = torch.linalg.qr(xf @ torch.randn(x.shape[1], k + 8, generator=gen).to(xf.device))
        for _ in range(2):
            q, _ = torch.linalg.qr(xf @ (xf.T @ q))
        _, _, vh = torch.linalg.svd(q.T @ xf, full_matrices=False)
        vh = vh[:k]
    else:
        _, _, vh = truncated_svd(x, k)
    basis = vh.transpose(-1, -2)
    if k < rank:  # fewer rows than the rank: complete the basis with fixed (seeded) directions
        gen = torch.Generator(device="cpu").manual_seed(0)
        extra = torch.randn(x.shape[1], rank - k, generator=gen).to(basis.device)
        basis, _ = torch.linalg.qr(torch.cat([basis, extra], 1))
    return basis.contiguous()


def subspace_iteration(basis: Tensor, x: Tensor) -> Tensor:
    """One block power step on ``XᵀX``: ``qr(Xᵀ(X U)).Q`` (float32 ``(d, r)``)."""
    _check_2d(x, "x")
    xf = x.float()
    q, _ = torch.linalg.qr(xf.T @ (xf @ basis.float()))
    return q.contiguous()


def oja_update(basis: Tensor, x: Tensor, lr: float) -> Tensor:
    """Oja's rule ``qr(U + η XᵀXU / s).Q`` with ``s = ‖X‖_F²`` so that ``η`` is scale-free."""
    _check_2d(x, "x")
    xf = x.float()
    scale = xf.pow(2).sum().clamp_min(1e-30)
    q, _ = torch.linalg.qr(basis.float() + lr * (xf.T @ (xf @ basis.float())) / scale)
    return q.contiguous()


# -- the sparse quantized residual ----------------------------------------------------------------------------------
def residual_count(numel: int, density: float) -> int:
    """Entries kept of ``numel``: ``⌈density · numel⌉`` (with a tolerance so 0.1 · 960 is 96, not 97)."""
    return min(numel, math.ceil(density * numel - 1e-9))


def quantize_residual(residual: Tensor, density: float, bits: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``density`` entries of ``residual`` by magnitude as ``(values int8, flat indices int32, scale ())``.

    ``values * scale`` approximates the kept entries (symmetric, ``2**(bits-1) − 1`` levels).
    """
    _check_residual_args(density, bits)
    flat = residual.detach().reshape(-1).float()
    k = residual_count(flat.numel(), density)
    index_dtype = torch.int32 if flat.numel() < 2**31 else torch.int64
    if k == 0:
        return (torch.zeros(0, dtype=torch.int8, device=flat.device), torch.zeros(0, dtype=index_dtype,
                device=flat.device), torch.ones((), device=flat.device))
    idx = flat.abs().topk(k, sorted=False).indices
    vals = flat[idx]
    qmax = 2 ** (bits - 1) - 1
    scale = (vals.abs().max() / qmax).clamp_min(1e-30)
    q = torch.round(vals / scale).clamp_(-qmax, qmax).to(torch.int8)
    return q, idx.to(index_dtype), scale


def dequantize_residual(values: Tensor, indices: Tensor, scale: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The dense float32 residual (zeros off the kept entries)."""
    out = torch.zeros(math.prod(shape), device=values.device)
    out[indices.long()] = values.float() * scale
    return out.view(shape)


# -- the activation code --------------------------------------------------------------------------------------------
@dataclass
class ActivationCode:
    """``X ≈ coef @ basisᵀ + residual`` for ``X (N, d)``.

    Attributes:
        coef: ``(N, r)`` in the storage dtype. basis: ``(d, r)``.
        values / indices / scale: the sparse quantized residual. shape: ``(N, d)``.
    """

    coef: Tensor
    basis: Tensor
    values: Tensor
    indices: Tensor
    scale: Tensor
    shape: tuple[int, int]

    def nbytes(self, include_basis: bool = False) -> int:
        """Bytes stored per step (the basis only when it is stored per step)."""
        parts = [self.coef, self.values, self.indices, self.scale] + ([self.basis] if include_basis else [])
        return int(sum(p.numel() * p.element_size() for p in parts))


def compress_activation(x: Tensor, basis: Tensor, density: float, bits: int = 8,
                        coef_dtype: torch.dtype = torch.bfloat16) -> ActivationCode:
    """Code ``x (N, d)`` in ``basis (d, r)`` plus the sparse quantized residual."""
    _check_2d(x, "x")
    if basis.dim() != 2 or basis.shape[0] != x.shape[1]:
        raise ValueError(f"`basis` must be (d={x.shape[1]}, r), got shape {tuple(basis.shape)}.")
    xf = x.detach().float()
    coef = (xf @ basis.float()).to(coef_dtype)
    if density == 0.0:  # no residual kept: skip the (N, d) reconstruction it would be taken from
        values, indices, scale = quantize_residual(xf[:0], density, bits)
    else:
        residual = xf - coef.float() @ basis.float().T
        values, indices, scale = quantize_residual(residual, density, bits)
    return ActivationCode(coef, basis, values, indices, scale, (x.shape[0], x.shape[1]))


def decompress_activation(code: ActivationCode) -> Tensor:
    """The float32 reconstruction ``X̂ = C Uᵀ + Ê`` ``(N, d)``."""
    low = code.coef.float() @ code.basis.float().T
    return low + dequantize_residual(code.values, code.indices, code.scale, code.shape)


def factored_weight_grad(grad_out: Tensor, code: ActivationCode) -> Tensor:
    """``Gᵀ X̂ = (Gᵀ C) Uᵀ + Gᵀ Ê`` ``(d_out, d)`` without rebuilding ``X̂`` (``grad_out``: ``(N, d_out)``)."""
    _check_2d(grad_out, "grad_out")
    g = grad_out.float()
    out = (g.T @ code.coef.float()) @ code.basis.float().T
    if code.values.numel():
        n, d = code.shape
        idx = code.indices.long()
        rows, cols = idx // d, idx % d
        # Êᵀ as a sparse (d, N) matrix times G (N, d_out): touches only the kept entries
        sparse_t = torch.sparse_coo_tensor(torch.stack([cols, rows]), code.values.float() * code.scale, (d, n),
                                           check_invariants=False)
        out = out + torch.sparse.mm(sparse_t, g).T
    return out


def compressed_nbytes(n: int, d: int, rank: int, density: float, coef_dtype: torch.dtype = torch.bfloat16,
                      basis_stored: bool = False) -> int:
    """Bytes :func:`compress_activation` stores for an ``(n, d)`` activation (int32 indices, int8 values)."""
    nnz = residual_count(n * d, density)
    elem = _DTYPE_BYTES[coef_dtype]
    index_bytes = 4 if n * d < 2**31 else 8
    return n * rank * elem + nnz * (1 + index_bytes) + 4 + (d * rank * elem if basis_stored else 0)


def iso_byte_rank(n: int, d: int, rank: int, coef_dtype: torch.dtype = torch.bfloat16) -> int:
    """Rank of a per-step SVD code that stores its ``(d, r')`` basis too, at the bytes of rank ``rank`` coefficients.

    ``r'(n + d) ≤ r n`` → ``r' = ⌊r n / (n + d)⌋`` (at least 1).
    """
    return max(1, (rank * n) // (n + d))


def random_projection(d: int, rank: int, seed: int, device: torch.device | str = "cpu") -> Tensor:
    """A Gaussian projection ``P (d, rank)`` with i.i.d. ``N(0, 1/rank)`` entries (CompAct-style control).

    ``E[P Pᵀ] = I``, so the weight gradient contracted from ``C = X P``, ``Gᵀ C Pᵀ``, is an
    unbiased estimate of ``Gᵀ X``. ``P`` is a function of ``seed`` only (drawn on the CPU with
    its own generator: the global RNG stream is untouched), so it costs no saved bytes: it
    can be regenerated in backward from the seed.

    .. code-block:: python

        proj = random_projection(256, 16, seed=step)
        code = compress_activation(x2d, proj, density=0.0)   # X ≈ (X P) Pᵀ in expectation
    """
    if not isinstance(rank, int) or not 1 <= rank <= d:
        raise ValueError(f"`rank`={rank!r}, expected an integer in [1, d={d}] for a random projection.")
    gen = torch.Generator(device="cpu").manual_seed(int(seed) % (2**63 - 1))
    return (torch.randn(d, rank, generator=gen) / math.sqrt(rank)).to(device)


def random_projection_rank(n: int, d: int, rank: int, density: float,
                           coef_dtype: torch.dtype = torch.bfloat16) -> int:
    """Width of a residual-free random-projection code at the bytes of a rank-``rank`` STAC-R code.

    STAC-R stores ``n·rank`` coefficients plus the residual; the projection spends all of
    those bytes on coefficients: ``r' = ⌊(bytes − 4) / (n · itemsize)⌋`` (at most ``d``, at least 1),
    so its code is never larger than STAC-R's (the 4 bytes are the residual scale).
    """
    budget = compressed_nbytes(n, d, rank, density, coef_dtype) - 4
    return max(1, min(d, budget // (n * _DTYPE_BYTES[coef_dtype])))


# -- the gradient bridge --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BridgeStats:
    """Per-layer gradient bridge (floats).

    ``eps = ‖GᵀE‖/‖GᵀX‖``; ``cos_lower = √(1−eps²)`` lower-bounds ``cosine`` = cos(GᵀX̂, GᵀX);
    ``rel_error = ‖E‖_F/‖X‖_F``.
    """

    eps: float
    cos_lower: float
    cosine: float
    rel_error: float


def gradient_bridge(grad_out: Tensor, x: Tensor, x_hat: Tensor) -> BridgeStats:
    """The bridge between reconstruction error and weight-gradient cosine for one Linear layer.

    Args:
        grad_out: ``G (N, d_out)``. x: exact input ``(N, d)``. x_hat: reconstruction ``(N, d)``.
    """
    for t, name in ((grad_out, "grad_out"), (x, "x"), (x_hat, "x_hat")):
        _check_2d(t, name)
    if x.shape != x_hat.shape or grad_out.shape[0] != x.shape[0]:
        raise ValueError(f"gradient_bridge: shapes G {tuple(grad_out.shape)}, X {tuple(x.shape)}, "
                         f"X̂ {tuple(x_hat.shape)} do not agree (N rows each, X and X̂ equal).")
    # float32: two (d_out, N) @ (N, d) products per layer; a diagnostic step on a 135M model runs hundreds
    g, xd, xh = grad_out.float(), x.float(), x_hat.float()
    err = xd - xh
    exact, approx = g.T @ xd, g.T @ xh
    norm_exact = float(exact.norm())
    if norm_exact == 0.0:
        return BridgeStats(0.0, 1.0, 1.0, 0.0)
    eps = float((exact - approx).norm()) / norm_exact  # GᵀE = GᵀX − GᵀX̂
    denom = float(approx.norm()) * norm_exact
    cosine = float((approx * exact).sum()) / denom if denom > 0 else 0.0
    x_norm = float(xd.norm())
    return BridgeStats(eps, math.sqrt(max(0.0, 1.0 - eps**2)) if eps < 1 else 0.0, cosine,
                       float(err.norm()) / x_norm if x_norm > 0 else 0.0)


# -- the factored Linear --------------------------------------------------------------------------------------------
def _no_codec(*tensors: Tensor) -> None:
    # a generic saved-tensor codec must store these as they are: they are the compressed form already
    for t in tensors:
        setattr(t, NO_CODEC_ATTR, True)


class StacRLinearFunction(torch.autograd.Function):
    """``y = x Wᵀ + b`` saving the activation code of ``x`` instead of ``x``.

    ``exact=True`` saves ``x`` itself (the calibration step). ``diagnostics`` (a dict or
    ``None``) receives the :class:`BridgeStats` of the step under ``"bridge"``, computed in
    backward; in compressed mode this keeps ``x`` on the context for that step (outside the
    saved-tensor hooks, so diagnostic steps must not be used for memory measurement), and
    ``diagnostics["capture"] = True`` also hands back the exact ``"x"`` and ``"g"``. In exact
    mode, ``diagnostics["select"] = {target, criterion, margin, ...}`` instead receives the
    :class:`~lit_lowrank.ops.stac_r_rank.RankChoice` of :func:`~lit_lowrank.ops.stac_r_rank.select_rank`
    under ``"choice"`` (the per-layer rank for a fidelity target).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, basis: Tensor, density: float,
                bits: int, coef_dtype: torch.dtype, store_basis: bool, exact: bool,
                diagnostics: dict[str, Any] | None) -> Tensor:
        y = F.linear(x, weight, bias)
        x2d = x.reshape(-1, x.shape[-1])
        ctx.meta = (x.shape, bias is not None, density, bits, coef_dtype, store_basis, exact, diagnostics)
        ctx.basis = basis  # persistent state: replaced (never modified in place) by the tracker
        if exact:
            ctx.save_for_backward(weight, x2d)
            return y
        if store_basis:  # code against the basis as it will be stored, so the residual corrects its rounding too
            basis = basis.to(coef_dtype).float()
        code = compress_activation(x2d, basis, density, bits, coef_dtype)
        stored_basis = basis.to(coef_dtype) if store_basis else None
        saved = [code.coef, code.values, code.indices, code.scale] + ([stored_basis] if store_basis else [])
        _no_codec(*saved)
        ctx.save_for_backward(weight, *saved)
        ctx.shape2d = code.shape
        ctx.x_exact = x2d.detach() if diagnostics is not None else None
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, ...]:
        x_shape, has_bias, density, bits, coef_dtype, store_basis, exact, diagnostics = ctx.meta
        weight, *saved = ctx.saved_tensors
        g2d = grad_y.reshape(-1, grad_y.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # under autocast (bf16/fp16-mixed) forward's F.linear ran in the low dtype, so grad_y arrives in it
            # while the saved weight is float32: contract in the weight's dtype (autograd casts grad_x to x's)
            grad_x = (grad_y.to(weight.dtype) @ weight).reshape(x_shape)
        if exact:
            (x2d,) = saved
            if ctx.needs_input_grad[1]:
                grad_w = (g2d.float().T @ x2d.float()).to(weight.dtype)
            if diagnostics is not None and "select" in diagnostics:  # the per-layer rank for a fidelity target
                diagnostics["choice"] = select_rank(x2d, g2d, **diagnostics["select"])
            elif diagnostics is not None:
                code = compress_activation(x2d, ctx.basis, density, bits, coef_dtype)
                diagnostics["bridge"] = gradient_bridge(g2d, x2d, decompress_activation(code))
        else:
            coef, values, indices, scale = saved[:4]
            basis = saved[4] if store_basis else ctx.basis
            code = ActivationCode(coef, basis, values, indices, scale, ctx.shape2d)
            if ctx.needs_input_grad[1]:
                grad_w = factored_weight_grad(g2d, code).to(weight.dtype)
            if diagnostics is not None and ctx.x_exact is not None:
                diagnostics["bridge"] = gradient_bridge(g2d, ctx.x_exact, decompress_activation(code))
                if diagnostics.get("capture"):  # the exact (X, G) of this step, for controls scored on the same step
                    diagnostics["x"], diagnostics["g"] = ctx.x_exact, g2d.detach().float()
                ctx.x_exact = None
        if has_bias and ctx.needs_input_grad[2]:
            grad_b = g2d.sum(0).to(weight.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None, None


def stac_r_linear(x: Tensor, weight: Tensor, bias: Tensor | None, basis: Tensor, density: float = 0.01,
                  bits: int = 8, coef_dtype: torch.dtype = torch.bfloat16, store_basis: bool = False,
                  exact: bool = False, diagnostics: dict[str, Any] | None = None) -> Tensor:
    """Functional STAC-R Linear: ``F.linear(x, weight, bias)`` whose backward uses the activation code.

    Args:
        x: ``(..., d)``. weight: ``(d_out, d)``. bias: ``(d_out,)`` or ``None``. basis: ``(d, r)`` orthonormal.
        density / bits: the residual's kept fraction and bit width.
        coef_dtype: storage dtype of the coefficients.
        store_basis: save the basis per step (a per-step SVD basis is an activation, not state).
        exact: save ``x`` (no compression); with ``diagnostics`` the bridge is still measured.
        diagnostics: a dict that receives ``"bridge"``: :class:`BridgeStats` after backward.
    """
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"stac_r_linear: x has {x.shape[-1]} features, weight expects {weight.shape[-1]}.")
    _check_residual_args(density, bits)
    return StacRLinearFunction.apply(x, weight, bias, basis, density, bits, coef_dtype, store_basis, exact,
                                     diagnostics)


# -- the generic saved-tensor path ----------------------------------------------------------------------------------
class _Ref:
    """Holds a basis inside a packed tuple without the counter counting it (it is persistent state)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor


class TrackedSavedTensorCodec:
    """STAC-R for any saved tensor: a :class:`~lit_lowrank.ops.saved_tensors.SavedTensorCounter` codec.

    Every saved floating tensor with at least ``min_numel`` elements and a last dimension
    wider than ``rank`` is coded over its last dimension (``(…, d)`` → ``(N, d)``) and
    decompressed on unpack, so the op's own backward runs on ``X̂`` (memory is saved,
    compute is not: only the Linear path contracts from the factors). Bases are tracked
    per *slot*: the k-th coded tensor of a step with the same width reuses the basis of
    the k-th one of the previous step; call :meth:`start_step` before each step.

    .. code-block:: python

        codec = TrackedSavedTensorCodec(rank=16, residual_density=0.01, min_numel=2**16)
        with SavedTensorCounter(codec=codec):
            codec.start_step()
            loss = model(x).mean(); loss.backward()
    """

    def __init__(self, rank: int = 16, residual_density: float = 0.01, residual_bits: int = 8,
                 coef_dtype: torch.dtype = torch.bfloat16, min_numel: int = 2**16) -> None:
        _check_residual_args(residual_density, residual_bits)
        if rank < 1:
            raise ValueError(f"`rank`={rank!r}, expected a positive integer.")
        self.rank, self.density, self.bits, self.coef_dtype, self.min_numel = (rank, residual_density, residual_bits,
                                                                               coef_dtype, min_numel)
        self.bases: dict[str, Tensor] = {}
        self._slot = 0

    def start_step(self) -> None:
        self._slot = 0

    def pack(self, tensor: Tensor) -> tuple[Any, ...] | None:
        if not tensor.is_floating_point() or tensor.numel() < self.min_numel or tensor.dim() < 2 \
                or tensor.shape[-1] <= self.rank:
            return None
        x2d = tensor.detach().reshape(-1, tensor.shape[-1])
        key = f"{self._slot}:{tensor.shape[-1]}"
        self._slot += 1
        basis = self.bases.get(key)
        basis = init_basis(x2d, self.rank) if basis is None else subspace_iteration(basis.to(x2d.device), x2d)
        self.bases[key] = basis
        code = compress_activation(x2d, basis, self.density, self.bits, self.coef_dtype)
        return (code.coef, code.values, code.indices, code.scale, _Ref(basis), tuple(tensor.shape), tensor.dtype)

    def unpack(self, packed: tuple[Any, ...]) -> Tensor:
        coef, values, indices, scale, basis, shape, dtype = packed
        code = ActivationCode(coef, basis.tensor, values, indices, scale, (coef.shape[0], basis.tensor.shape[0]))
        return decompress_activation(code).reshape(shape).to(dtype)
