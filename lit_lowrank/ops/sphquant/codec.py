"""SPHQuant math: rotation-free spherical quantization of 8-D weight vectors.

Each row of a weight ``W (out, in)`` is cut into ``in / 8`` vectors ``v`` of 8 consecutive
input weights, and each vector is stored as

- its 8 coordinate **signs** ``s`` (8 bits),
- the **index** ``k`` of a unit direction ``c_k`` of a positive-orthant codebook
  (``log2 K`` bits): ``k = argmax_j <u, c_j>`` for ``u = |v| / ||v||``,
- its **radius** ``rho = <|v|, c_k>`` (the least-squares length along ``c_k``), quantized to
  ``radius_bits`` bits with an fp16 minimum and step per group of ``group_size / 8`` radii.

``v_hat = s * rho_hat * c_k``. Outlier magnitude goes to the radius, which gets the extra
bits, while the directions stay bounded and regular, so no rotation is needed. The
codebook (shared by every layer of a model, fp16) is learned by spherical k-means on the
weights' directions (:func:`positive_orthant_kmeans`) and fine-tuned in angular
coordinates (:func:`finetune_codebook`), which keep every codeword unit-norm and
non-negative: ``c_1 = cos t_1, c_j = prod_{i<j} sin t_i cos t_j, c_8 = prod_i sin t_i`` with
``t in [0, pi/2]^7``.

Bits per weight: ``(8 + log2 K + radius_bits) / 8`` for the codes plus ``32 / group_size``
for the radius minimum and step (+ ``128 K`` codebook bits per model):
K=64, b_r=2, g=256 -> 2.125; K=256, b_r=4 -> 2.625; K=4096, b_r=4 -> 3.125.

The packed stream (one item of ``8 + log2 K + radius_bits`` bits per vector, row-major, see
:func:`~lit_lowrank.ops.quantization.pack_fields`) is what ``SPHLinear`` stores and decodes
tile by tile.

.. code-block:: python

    w = torch.randn(512, 2048)
    codebook = positive_orthant_kmeans(sph_directions([w]), codebook_size=256, seed=0)
    codes = sph_quantize(w, codebook, radius_bits=4, group_size=128)
    w_hat = sph_dequantize(codes, codebook)
    stream = sph_pack(codes)                         # uint8 bit stream, 20 bits per vector
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lit_lowrank.ops.quantization import (
    FP16_BITS,
    BitsBreakdown,
    grouped,
    num_groups,
    pack_fields,
    split_fields,
    unpack_items,
)

SPH_DIM = 8
SIGN_BITS = SPH_DIM
FinetuneLoss = Literal["reconstruction", "hessian"]


# ----------------------------------------------------------------------------- format


def check_sph_format(codebook_size: int, radius_bits: int, group_size: int, in_features: int | None = None) -> int:
    """Validate an SPH format; return ``log2(codebook_size)``."""
    if codebook_size < 2 or codebook_size & (codebook_size - 1):
        raise ValueError(f"`codebook_size`={codebook_size}: expected a power of two >= 2 (e.g. 64, 256, 4096).")
    if not 1 <= radius_bits <= 16:
        raise ValueError(f"`radius_bits`={radius_bits}: expected 1..16.")
    if group_size < SPH_DIM or group_size % SPH_DIM:
        raise ValueError(f"`group_size`={group_size}: expected a positive multiple of {SPH_DIM} (weights per group).")
    index_bits = codebook_size.bit_length() - 1
    if SIGN_BITS + index_bits + radius_bits > 56:
        raise ValueError(f"log2(codebook_size) + radius_bits = {index_bits + radius_bits} exceeds 48 bits per vector.")
    if in_features is not None and in_features % SPH_DIM:
        raise ValueError(f"in_features={in_features}: SPHQuant cuts rows into {SPH_DIM}-D vectors, so the input "
                         f"dimension must be a multiple of {SPH_DIM}.")
    return index_bits


def sph_field_widths(codebook_size: int, radius_bits: int) -> list[int]:
    """Bit widths of one packed vector: ``[signs, index, radius]``."""
    return [SIGN_BITS, codebook_size.bit_length() - 1, radius_bits]


def sph_bits(out_features: int, in_features: int, codebook_size: int, radius_bits: int,
             group_size: int) -> BitsBreakdown:
    """Exact storage of one SPH-quantized ``(out, in)`` weight (the codebook as shared bits).

    .. code-block:: python

        sph_bits(512, 2048, 64, 2, 256).bits_per_weight    # 2.125 = (8 + 6 + 2) / 8 + 32 / 256
    """
    index_bits = check_sph_format(codebook_size, radius_bits, group_size, in_features)
    vectors = out_features * in_features // SPH_DIM
    groups = out_features * num_groups(in_features // SPH_DIM, group_size // SPH_DIM)
    return BitsBreakdown(
        num_weights=out_features * in_features,
        payload_bits=vectors * (SIGN_BITS + index_bits + radius_bits),
        scale_bits=groups * 2 * FP16_BITS,
        shared_bits=codebook_size * SPH_DIM * FP16_BITS,
    )


# ----------------------------------------------------------------------------- angular parameterisation


def codebook_from_angles(theta: Tensor) -> Tensor:
    """Hyperspherical coordinates ``(K, 7) -> (K, 8)`` unit vectors.

    ``c_1 = cos t_1``, ``c_j = sin t_1 ... sin t_{j-1} cos t_j``, ``c_8 = sin t_1 ... sin t_7``.
    With every ``t`` in ``[0, pi/2]`` all coordinates are >= 0, and ``||c|| = 1`` for any ``t``.
    """
    if theta.dim() != 2 or theta.shape[1] != SPH_DIM - 1:
        raise ValueError(f"`theta` must be (K, {SPH_DIM - 1}), got shape {tuple(theta.shape)}.")
    sin_prefix = torch.cumprod(torch.sin(theta), dim=1)                        # (K, 7): prod_{i<=j} sin
    ones = torch.ones_like(theta[:, :1])
    lead = torch.cat([ones, sin_prefix[:, :-1]], dim=1)                        # prod_{i<j} sin
    return torch.cat([lead * torch.cos(theta), sin_prefix[:, -1:]], dim=1)


def angles_from_codebook(codebook: Tensor) -> Tensor:
    """Inverse of :func:`codebook_from_angles` for non-negative unit rows: ``(K, 8) -> (K, 7)``.

    ``t_j = atan2(||c_{j+1:}||, c_j)``, which lies in ``[0, pi/2]`` for non-negative ``c``.
    """
    if codebook.dim() != 2 or codebook.shape[1] != SPH_DIM:
        raise ValueError(f"`codebook` must be (K, {SPH_DIM}), got shape {tuple(codebook.shape)}.")
    c = codebook.clamp_min(0)
    tail = torch.flip(torch.cumsum(torch.flip(c.pow(2), [1]), dim=1), [1]).sqrt()   # ||c_{j:}||
    return torch.atan2(tail[:, 1:], c[:, :-1])


# ----------------------------------------------------------------------------- decomposition and codebook


def _vectors(w: Tensor) -> Tensor:
    if w.dim() != 2 or w.shape[1] % SPH_DIM:
        raise ValueError(f"`w` must be (out_features, in_features) with in_features a multiple of {SPH_DIM}, "
                         f"got shape {tuple(w.shape)}.")
    return w.detach().float().reshape(w.shape[0], -1, SPH_DIM)


def sph_directions(weights: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Positive-orthant unit directions ``|v| / ||v||`` ``(N, 8)`` and squared radii ``(N,)`` of
    every 8-D vector of ``weights`` (zero vectors dropped)."""
    mags = torch.cat([_vectors(w).abs().reshape(-1, SPH_DIM) for w in weights])
    norms = mags.norm(dim=1)
    keep = norms > 0
    return mags[keep] / norms[keep, None], norms[keep].pow(2)


def assign_codewords(directions: Tensor, codebook: Tensor, chunk: int | None = None) -> Tensor:
    """``argmax_k <u_n, c_k>`` for each row of ``directions (N, 8)``; int64 ``(N,)`` (first index on ties)."""
    codebook = codebook.float()
    k = codebook.shape[0]
    # ~8M cosines (32 MB) per chunk: measured fastest on 2 cores (K=4096: 1.50 s per 1M vectors at 2,048 rows,
    # 2.05 s at 256, 2.67 s at 8,192), and bounded instead of costing a GB for the whole (N, K) matrix
    chunk = chunk or max(256, (1 << 23) // k)
    # torch's argmax over a long row is scalar code (~10x the matmul at K=4096); a vectorised max over
    # blocks of 64 codewords, then argmax over the block maxima and within the winning block, gives the
    # same (first-index) answer from the same scores at about a third of the cost
    block = 64 if k >= 256 and k % 64 == 0 else k
    out = torch.empty(directions.shape[0], dtype=torch.long, device=directions.device)
    buffer = torch.empty(min(chunk, directions.shape[0]), k, device=directions.device)
    for start in range(0, directions.shape[0], chunk):
        x = directions[start : start + chunk].float()
        scores = torch.mm(x, codebook.T, out=buffer[: x.shape[0]])
        if block == k:
            out[start : start + x.shape[0]] = scores.argmax(1)
            continue
        blocks = scores.view(x.shape[0], k // block, block)
        best_block = blocks.amax(2).argmax(1)
        inner = blocks[torch.arange(x.shape[0], device=x.device), best_block].argmax(1)
        out[start : start + x.shape[0]] = best_block * block + inner
    return out


def positive_orthant_kmeans(
    data: tuple[Tensor, Tensor], codebook_size: int, iterations: int = 10, max_vectors: int = 1 << 16, seed: int = 0,
) -> Tensor:
    """Spherical k-means of positive-orthant directions: the initial SPH codebook ``(K, 8)``.

    Minimises ``sum_n r_n^2 (1 - <u_n, c_k(n)>^2)``, the squared error of the least-squares
    radius: assignment by the largest cosine, update ``c_k = normalize(sum r_n^2 u_n)`` over
    its vectors (a non-negative sum, so codewords stay in the orthant). Empty clusters are
    re-seeded with the worst-represented vectors.

    Args:
        data: ``(directions (N, 8), squared radii (N,))`` from :func:`sph_directions`.
        codebook_size: ``K``.
        iterations: Lloyd iterations.
        max_vectors: a random subset of this many vectors is clustered (seeded).
        seed: initialisation and subsampling seed.

    .. code-block:: python

        codebook = positive_orthant_kmeans(sph_directions([layer.weight for layer in linears]), 256)
    """
    directions, radii2 = data
    if directions.dim() != 2 or directions.shape[1] != SPH_DIM or radii2.shape != directions.shape[:1]:
        raise ValueError(f"`data` must be (directions (N, {SPH_DIM}), squared radii (N,)); got shapes "
                         f"{tuple(directions.shape)} and {tuple(radii2.shape)}.")
    gen = torch.Generator().manual_seed(int(seed))
    n = directions.shape[0]
    if n > max_vectors:
        pick = torch.randperm(n, generator=gen)[:max_vectors].to(directions.device)
        directions, radii2 = directions[pick], radii2[pick]
        n = max_vectors
    if n < codebook_size:
        raise ValueError(f"`codebook_size`={codebook_size} exceeds the {n} weight vectors available to cluster.")
    codebook = directions[torch.randperm(n, generator=gen)[:codebook_size].to(directions.device)].clone()
    for _ in range(iterations):
        index = assign_codewords(directions, codebook)
        sums = torch.zeros_like(codebook).index_add_(0, index, directions * radii2[:, None])
        counts = torch.bincount(index, minlength=codebook_size)
        empty = torch.nonzero(counts == 0).flatten()
        new = torch.nn.functional.normalize(sums, dim=1)
        if empty.numel():
            cos = (directions * codebook[index]).sum(1)
            worst = torch.argsort(radii2 * (1 - cos.pow(2)), descending=True)[: empty.numel()]
            new[empty] = directions[worst]
        codebook = new
    return codebook


# ----------------------------------------------------------------------------- quantize / dequantize


@dataclass
class SPHCodes:
    """One SPH-quantized weight ``(out, in)``, unpacked.

    Attributes:
        signs: ``(out, V)`` int64 bit masks (bit ``d`` set = coordinate ``d`` negative), ``V = in/8``.
        index: ``(out, V)`` codeword indices.
        radius_code: ``(out, V)`` radius codes in ``[0, 2**radius_bits)``.
        radius_min, radius_step: ``(out, G)`` float16, ``G = ceil(V / (group_size/8))``.
        codebook_size, radius_bits, group_size: the format.
    """

    signs: Tensor
    index: Tensor
    radius_code: Tensor
    radius_min: Tensor
    radius_step: Tensor
    codebook_size: int
    radius_bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.signs.shape[0], self.signs.shape[1] * SPH_DIM

    def storage(self) -> BitsBreakdown:
        """Exact storage (codebook as shared bits)."""
        return sph_bits(*self.shape, self.codebook_size, self.radius_bits, self.group_size)


def _radius_params(radius: Tensor, radius_bits: int, vectors_per_group: int) -> tuple[Tensor, Tensor]:
    groups = grouped(radius, vectors_per_group)
    lo, hi = groups.amin(-1), groups.amax(-1)
    lo16 = lo.half().float()
    step16 = ((hi - lo16) / ((1 << radius_bits) - 1)).half().float()
    tiny = torch.finfo(torch.float16).tiny
    return lo16, torch.where(step16 > 0, step16, torch.full_like(step16, tiny))


def _expand_groups(values: Tensor, vectors: int, vectors_per_group: int) -> Tensor:
    index = torch.arange(vectors, device=values.device) // vectors_per_group
    return values.float()[:, index]


def quantize_radius(radius: Tensor, radius_bits: int, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Min-max uniform codes of radii ``(out, V)`` per group of ``group_size / 8`` radii.

    Returns ``(codes (out, V), minimum (out, G) fp16, step (out, G) fp16)``;
    ``rho_hat = minimum + step * code``.
    """
    per_group = group_size // SPH_DIM
    lo, step = _radius_params(radius, radius_bits, per_group)
    lo_v = _expand_groups(lo, radius.shape[1], per_group)
    step_v = _expand_groups(step, radius.shape[1], per_group)
    codes = torch.clamp(torch.round((radius - lo_v) / step_v), 0, (1 << radius_bits) - 1).long()
    return codes, lo.half(), step.half()


def sph_quantize(w: Tensor, codebook: Tensor, radius_bits: int, group_size: int = 128) -> SPHCodes:
    """Quantize ``w (out, in)`` with ``codebook (K, 8)`` (non-negative unit rows).

    .. code-block:: python

        codes = sph_quantize(layer.weight, codebook, radius_bits=4, group_size=128)
    """
    check_sph_format(codebook.shape[0], radius_bits, group_size, w.shape[1] if w.dim() == 2 else None)
    v = _vectors(w)
    out_features, vectors, _ = v.shape
    mags = v.abs()
    norms = mags.norm(dim=2, keepdim=True)
    directions = (mags / norms.clamp_min(1e-30)).reshape(-1, SPH_DIM)
    codebook = codebook.to(v.device).float()
    index = assign_codewords(directions, codebook).reshape(out_features, vectors)
    radius = (mags * codebook[index]).sum(-1)                                   # least squares, >= 0
    radius_code, lo, step = quantize_radius(radius, radius_bits, group_size)
    bit = 1 << torch.arange(SPH_DIM, device=v.device)
    signs = ((v < 0).long() * bit).sum(-1)
    return SPHCodes(signs, index, radius_code, lo, step, codebook.shape[0], radius_bits, group_size)


def sph_decode(signs: Tensor, index: Tensor, radius_code: Tensor, radius_min: Tensor, radius_step: Tensor,
               codebook: Tensor, group_size: int) -> Tensor:
    """Rows ``(r, V)`` of fields -> weights ``(r, 8 V)`` float32 (the decode step of the GEMV)."""
    rows, vectors = index.shape
    per_group = group_size // SPH_DIM
    rho = _expand_groups(radius_min, vectors, per_group) + _expand_groups(radius_step, vectors, per_group) * radius_code
    bit = 1 << torch.arange(SPH_DIM, device=signs.device)
    sign = 1.0 - 2.0 * ((signs[..., None] & bit) != 0).float()               # (r, V, 8)
    return (sign * rho[..., None] * codebook.float()[index]).reshape(rows, vectors * SPH_DIM)


def sph_dequantize(codes: SPHCodes, codebook: Tensor) -> Tensor:
    """``W_hat (out, in)`` float32 from unpacked codes."""
    return sph_decode(codes.signs, codes.index, codes.radius_code, codes.radius_min, codes.radius_step,
                      codebook, codes.group_size)


def sph_pack(codes: SPHCodes) -> Tensor:
    """The packed uint8 stream of ``codes`` (row-major vectors, ``[signs, index, radius]`` each)."""
    return pack_fields([codes.signs, codes.index, codes.radius_code],
                       sph_field_widths(codes.codebook_size, codes.radius_bits))


def sph_unpack_rows(stream: Tensor, in_features: int, codebook_size: int, radius_bits: int, row_start: int,
                    row_stop: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(signs, index, radius_code)``, each ``(rows, in/8)``, of rows ``[row_start, row_stop)``."""
    vectors = in_features // SPH_DIM
    widths = sph_field_widths(codebook_size, radius_bits)
    words = unpack_items(stream, sum(widths), row_start * vectors, row_stop * vectors)
    return tuple(f.view(row_stop - row_start, vectors) for f in split_fields(words, widths))  # type: ignore[return-value]


# ----------------------------------------------------------------------------- angular fine-tuning


def hessian_error(w: Tensor, w_hat: Tensor, hessian: Tensor | None) -> Tensor:
    """``tr(E H E^T) / tr(W H W^T)`` (``E = W_hat - W``), or the plain relative MSE without ``H``."""
    e = w_hat - w
    if hessian is None:
        return e.pow(2).sum() / w.pow(2).sum().clamp_min(1e-30)
    h = hessian.float()
    return ((e @ h) * e).sum() / ((w @ h) * w).sum().clamp_min(1e-30)


def sph_objective(weights: list[Tensor], codebook: Tensor, radius_bits: int, group_size: int,
                  hessians: list[Tensor | None] | None = None) -> float:
    """Mean over layers of :func:`hessian_error` after quantizing with ``codebook``."""
    return _quantize_all(weights, codebook, radius_bits, group_size, hessians)[1]


def _quantize_all(weights: list[Tensor], codebook: Tensor, radius_bits: int, group_size: int,
                  hessians: list[Tensor | None] | None = None) -> tuple[list[SPHCodes], float]:
    hessians = hessians or [None] * len(weights)
    total, all_codes = 0.0, []
    for w, h in zip(weights, hessians):
        codes = sph_quantize(w, codebook, radius_bits, group_size)
        total += float(hessian_error(w.float(), sph_dequantize(codes, codebook), h))
        all_codes.append(codes)
    return all_codes, total / len(weights)


def finetune_codebook(
    codebook: Tensor,
    weights: list[Tensor],
    radius_bits: int,
    group_size: int,
    hessians: list[Tensor | None] | None = None,
    loss: FinetuneLoss = "reconstruction",
    rounds: int = 2,
    steps: int = 50,
    lr: float = 0.02,
    rows_per_layer: int = 128,
    seed: int = 0,
    return_codes: bool = False,
) -> tuple[Tensor, list[float]] | tuple[Tensor, list[float], list[SPHCodes]]:
    """Fine-tune the codebook in angular coordinates; codewords stay unit-norm and non-negative.

    Each round: quantize every layer (assignments, radius codes), then take ``steps`` Adam
    steps on the angles ``t (K, 7)`` with assignments, signs and quantized radii fixed,
    projecting ``t`` back to ``[0, pi/2]`` after each step. The round's codebook is kept only
    if the full objective (:func:`sph_objective`, after re-quantizing) improved, so
    fine-tuning never makes the quantization worse than k-means.

    Args:
        codebook: ``(K, 8)`` initial codebook (non-negative unit rows).
        weights: the layers' weights ``(out, in)`` sharing this codebook.
        radius_bits, group_size: the format.
        hessians: per layer ``X^T X`` of its calibration inputs (``loss="hessian"``).
        loss: ``"reconstruction"``: per-layer relative ``||W_hat - W||^2``, exact over all
            vectors through per-codeword sufficient statistics; ``"hessian"``: per-layer
            ``tr(E H E^T) / tr(W H W^T)`` on ``rows_per_layer`` random rows per layer, drawn
            anew each round.
        rounds, steps, lr: schedule (Adam on the angles).
        rows_per_layer: rows sampled per layer and round (``"hessian"``).
        seed: row sampling seed.
        return_codes: also return each layer's :class:`SPHCodes` under the returned codebook
            rounded to fp16 (the stored precision; every objective is evaluated that way), so a
            caller need not quantize again.

    Returns:
        ``(codebook, history[, codes])``: the best codebook (float32, unit rows) and the
        objective before and after each round.

    .. code-block:: python

        codebook, history = finetune_codebook(codebook, [w1, w2], radius_bits=2, group_size=256)
    """
    if loss not in ("reconstruction", "hessian"):
        raise ValueError(f"`loss`={loss!r}, expected 'reconstruction' or 'hessian'.")
    if loss == "hessian" and (hessians is None or any(h is None for h in hessians)):
        raise ValueError("`loss`='hessian' needs one `hessians` matrix (X^T X of the calibration inputs) per layer.")
    # callers may sit in Lightning's test loop (inference mode): the angles need autograd, and
    # inference tensors cannot be saved for backward, so work on normal copies
    with torch.inference_mode(False), torch.enable_grad():
        weights = [w.detach().clone() for w in weights]
        hessians = None if hessians is None else [h.detach().clone() for h in hessians]  # type: ignore[union-attr]
        best, history, codes = _finetune(codebook.detach().clone(), weights, radius_bits, group_size, hessians, loss,
                                         rounds, steps, lr, rows_per_layer, seed)
    return (best, history, codes) if return_codes else (best, history)


def _finetune(codebook: Tensor, weights: list[Tensor], radius_bits: int, group_size: int,
              hessians: list[Tensor] | None, loss: FinetuneLoss, rounds: int, steps: int, lr: float,
              rows_per_layer: int, seed: int) -> tuple[Tensor, list[float], list[SPHCodes]]:
    objective_h = hessians if loss == "hessian" else None
    gen = torch.Generator().manual_seed(int(seed))
    best = codebook.float().clone()
    best_codes, score = _quantize_all(weights, best.half().float(), radius_bits, group_size, objective_h)
    history = [score]
    for _ in range(rounds):
        theta = torch.nn.Parameter(angles_from_codebook(best))
        optimizer = torch.optim.Adam([theta], lr=lr)
        fixed = []
        for codes in best_codes:
            per_group = group_size // SPH_DIM
            vectors = codes.index.shape[1]
            rho = (_expand_groups(codes.radius_min, vectors, per_group)
                   + _expand_groups(codes.radius_step, vectors, per_group) * codes.radius_code)
            fixed.append((codes, rho))
        stats = _reconstruction_stats(weights, fixed, best.shape[0]) if loss == "reconstruction" else None
        rows = None if stats is not None else _hessian_rows(weights, hessians, fixed, rows_per_layer, gen)  # type: ignore[arg-type]
        with _SingleThread():
            for _ in range(steps):
                optimizer.zero_grad()
                c = codebook_from_angles(theta)
                if stats is not None:
                    weight_sq, moment, constant = stats
                    value = ((weight_sq * c.pow(2).sum(1)).sum() - 2 * (moment * c).sum() + constant) / len(weights)
                else:
                    value = _hessian_loss(rows, c)  # type: ignore[arg-type]
                value.backward()
                optimizer.step()
                with torch.no_grad():
                    theta.clamp_(0.0, math.pi / 2)
        candidate = codebook_from_angles(theta.detach())
        codes_now, score = _quantize_all(weights, candidate.half().float(), radius_bits, group_size, objective_h)
        history.append(score)
        if score < min(history[:-1]):
            best, best_codes = candidate, codes_now
    return best, history, best_codes


def _reconstruction_stats(weights: list[Tensor], fixed: list[tuple[SPHCodes, Tensor]],
                          codebook_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per codeword ``sum rho^2`` and ``sum rho |v|`` (layer-normalised): the squared error
    ``sum_n ||rho_n c_k - |v_n| ||^2`` is quadratic in ``c_k`` with these coefficients."""
    device = weights[0].device
    weight_sq = torch.zeros(codebook_size, device=device)
    moment = torch.zeros(codebook_size, SPH_DIM, device=device)
    constant = torch.zeros((), device=device)
    for w, (codes, rho) in zip(weights, fixed):
        mags = _vectors(w).abs()
        scale = 1.0 / w.float().pow(2).sum().clamp_min(1e-30)
        index = codes.index.flatten()
        weight_sq.index_add_(0, index, rho.flatten().pow(2) * scale)
        moment.index_add_(0, index, mags.reshape(-1, SPH_DIM) * rho.reshape(-1, 1) * scale)
        constant += 1.0
    return weight_sq, moment, constant


def _hessian_rows(weights: list[Tensor], hessians: list[Tensor], fixed: list[tuple[SPHCodes, Tensor]],
                  rows_per_layer: int, gen: torch.Generator) -> list[tuple[Tensor, Tensor, Tensor, Tensor, float]]:
    """Per layer, for ``rows_per_layer`` random rows: ``(sign * rho (r, V, 8), index (r, V), W rows, H, norm)``.

    Drawn once per round, so each Adam step is a handful of ops per layer.
    """
    out = []
    bit = 1 << torch.arange(SPH_DIM)
    for w, h, (codes, rho) in zip(weights, hessians, fixed):
        rows = torch.randperm(w.shape[0], generator=gen)[:rows_per_layer].to(w.device)
        sign = 1.0 - 2.0 * ((codes.signs[rows][..., None] & bit.to(w.device)) != 0).float()
        w_rows = w[rows].float()
        hf = h.float()
        # the whole layer's tr(W H W^T), scaled to the sampled rows: every layer weighs the same
        norm = float(((w.float() @ hf) * w.float()).sum().clamp_min(1e-30)) * len(rows) / w.shape[0]
        out.append((sign * rho[rows][..., None], codes.index[rows], w_rows, hf, norm))
    return out


def _hessian_loss(batches: list[tuple[Tensor, Tensor, Tensor, Tensor, float]], c: Tensor) -> Tensor:
    total = c.new_zeros(())
    for coef, index, w_rows, h, norm in batches:
        e = (coef * c.to(coef.device)[index]).reshape(w_rows.shape) - w_rows
        total = total + ((e @ h) * e).sum() / norm
    return total / len(batches)


class _SingleThread:
    """One intra-op CPU thread while the angle optimisation runs: its hundreds of tiny ops
    cost more in OpenMP wake-ups than they gain (20x slower with 2 threads on a busy 2-core box)."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.threads)
