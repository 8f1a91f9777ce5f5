"""Group-wise uniform weight quantization — the baselines SPHQuant is compared with:
RTN, GPTQ and rotation-based variants (randomized block-Hadamard + RTN, and + GPTQ: QuaRot-style).

All store the same format (``bits``-bit codes packed into a bit stream, an fp16 minimum and
step per group of ``group_size`` input weights): ``bits + 32 / group_size`` bits/weight. The
Hadamard variants quantize ``W R^T`` (GPTQ with the rotated Hessian ``R H R^T``) and must
rotate every input at run time (``R x``), the overhead rotation-free methods avoid; their
int8 signs are counted as side data. ``clip_grid`` adds GPTQ's clipping search of each
group's range (its published grid: 100).

.. code-block:: python

    from lit_lowrank.quant import quantize_uniform

    report = quantize_uniform(model, method="rtn", bits=2, group_size=128)
    report = quantize_uniform(model, method="gptq", bits=2, group_size=128, hessians=hessians, clip_grid=100)
    report = quantize_uniform(model, method="hadamard_gptq", bits=2, group_size=128, hessians=hessians)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_lowrank.core.surgery import mark_replaced, record_surgery, replace_module
from lit_lowrank.ops.quantization import (
    BitsBreakdown,
    UniformCodes,
    gptq_quantize,
    gptq_sweep,
    hadamard_block_size,
    hadamard_rotate,
    num_groups,
    pack_fields,
    random_signs,
    rotate_hessian,
    rtn_quantize,
    split_fields,
    uniform_bits,
    uniform_dequantize,
    unpack_items,
)
from lit_lowrank.quant.linear import QuantizedLinear, model_bits
from lit_lowrank.quant.pretrained import record_in_config
from lit_lowrank.quant.ptq import ForwardFn, PostTrainingQuantizer, collect_hessians, default_forward, select_linears

UniformMethod = Literal["rtn", "gptq", "hadamard_rtn", "hadamard_gptq"]
METHODS: tuple[str, ...] = ("rtn", "gptq", "hadamard_rtn", "hadamard_gptq")
#: methods that need calibration Hessians / that rotate inputs at run time
HESSIAN_METHODS: tuple[str, ...] = ("gptq", "hadamard_gptq")
ROTATED_METHODS: tuple[str, ...] = ("hadamard_rtn", "hadamard_gptq")


class UniformQuantLinear(QuantizedLinear):
    """A Linear stored as packed group-wise uniform codes (RTN / GPTQ / Hadamard + RTN).

    Buffers: ``packed`` (uint8 bit stream, ``bits`` per weight, row-major), ``group_min`` and
    ``group_step`` (fp16 ``(out, G)``), ``hadamard_signs`` (±1 ``(in,)``, rotation only).

    .. code-block:: python

        layer = UniformQuantLinear.from_linear(linear, bits=3, group_size=128)
        y = layer(x)
    """

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int, bias: Tensor | None = None,
                 rotate: bool = False) -> None:
        super().__init__(in_features, out_features, bias)
        self.bits, self.group_size, self.rotate = int(bits), int(group_size), bool(rotate)
        groups = num_groups(in_features, group_size)
        n_bytes = (out_features * in_features * bits + 7) // 8 + 8
        self.register_buffer("packed", torch.zeros(n_bytes, dtype=torch.uint8))
        self.register_buffer("group_min", torch.zeros(out_features, groups, dtype=torch.float16))
        self.register_buffer("group_step", torch.zeros(out_features, groups, dtype=torch.float16))
        self.hadamard_block = hadamard_block_size(in_features) if rotate else 0
        # int8 ±1: the rotation's diagonal, stored with the layer (8 bits per input feature)
        self.register_buffer("hadamard_signs", torch.ones(in_features, dtype=torch.int8) if rotate else None)

    @classmethod
    def from_codes(cls, codes: UniformCodes, bias: Tensor | None = None,
                   hadamard_signs: Tensor | None = None) -> UniformQuantLinear:
        """Wrap codes from :func:`~lit_lowrank.ops.quantization.rtn_quantize` / ``gptq_quantize``."""
        out_features, in_features = codes.codes.shape
        layer = cls(in_features, out_features, codes.bits, codes.group_size, bias, rotate=hadamard_signs is not None)
        layer.packed.copy_(pack_fields([codes.codes], [codes.bits]))
        layer.group_min.copy_(codes.minimum)
        layer.group_step.copy_(codes.step)
        if hadamard_signs is not None:
            layer.hadamard_signs.copy_(hadamard_signs.to(torch.int8))
        return layer.to(codes.codes.device)

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int, group_size: int = 128, method: UniformMethod = "rtn",
                    hessian: Tensor | None = None, seed: int = 0, clip_grid: int = 0) -> UniformQuantLinear:
        """Quantize one ``nn.Linear`` with ``method`` (``"gptq"`` / ``"hadamard_gptq"`` need its input ``hessian``)."""
        codes, signs = quantize_weight(linear.weight, bits, group_size, method, hessian, seed, clip_grid)
        return cls.from_codes(codes, linear.bias, signs)

    def decode_rows(self, start: int, stop: int) -> Tensor:
        codes = split_fields(unpack_items(self.packed, self.bits, start * self.in_features,
                                          stop * self.in_features), [self.bits])[0]
        codes = codes.view(stop - start, self.in_features).float()
        index = torch.arange(self.in_features, device=codes.device) // self.group_size
        return self.group_min[start:stop].float()[:, index] + self.group_step[start:stop].float()[:, index] * codes

    def prepare_input(self, x: Tensor) -> Tensor:
        if not self.rotate:
            return x
        return hadamard_rotate(x, self.hadamard_signs.to(x.dtype), self.hadamard_block)

    def dequantize_unrotated(self) -> Tensor:
        """The effective weight in the original input basis (``W_hat R`` for a rotated layer)."""
        return _unrotate(self.dequantize(), self.hadamard_signs if self.rotate else None)

    def storage(self) -> BitsBreakdown:
        s = uniform_bits(self.out_features, self.in_features, self.bits, self.group_size)
        # the rotation's int8 signs are side data outside the per-weight rate (reported as shared_bits)
        return BitsBreakdown(s.num_weights, s.payload_bits, s.scale_bits, 8 * self.in_features if self.rotate else 0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}, group_size={self.group_size}, rotate={self.rotate}"


def _unrotate(w: Tensor, signs: Tensor | None) -> Tensor:
    """``W_hat`` in the original input basis: ``W_hat R`` for a rotated layer (``signs`` given), else ``W_hat``."""
    if signs is None:
        return w
    # R = H D / sqrt(b) with H symmetric, so each row's R^T w = D H w / sqrt(b)
    signs = signs.float()
    return hadamard_rotate(w, torch.ones_like(signs), hadamard_block_size(w.shape[1])) * signs


def quantize_weight(w: Tensor, bits: int, group_size: int, method: UniformMethod = "rtn",
                    hessian: Tensor | None = None, seed: int = 0, clip_grid: int = 0) -> tuple[UniformCodes, Tensor | None]:
    """Codes of a ``(out, in)`` weight (stacked rows of layers sharing an input are fine) and the
    Hadamard signs of a rotated method (``None`` otherwise)."""
    w, hessian, signs = _in_method_basis(w, hessian, method, seed)
    if method in HESSIAN_METHODS:
        return gptq_quantize(w, hessian, bits, group_size, clip_grid=clip_grid), signs  # type: ignore[arg-type]
    return rtn_quantize(w, bits, group_size, clip_grid), signs


def _in_method_basis(w: Tensor, hessian: Tensor | None, method: str,
                     seed: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The weight (and Hessian) a method quantizes: rotated by a seeded block-Hadamard for the rotated methods."""
    if method not in METHODS:
        raise ValueError(f"`method`={method!r}, expected one of {METHODS}.")
    if method in HESSIAN_METHODS and hessian is None:
        raise ValueError(f"method={method!r} needs the layer's calibration `hessian` (X^T X of its inputs).")
    w = w.detach().float()
    signs = None
    if method in ROTATED_METHODS:
        signs = random_signs(w.shape[1], seed, w.device)
        block = hadamard_block_size(w.shape[1])
        w = hadamard_rotate(w, signs, block)
        if hessian is not None:
            hessian = rotate_hessian(hessian.float(), signs, block)
    return w, hessian, signs


def _quantize_groups(stacked: list[tuple[Tensor, Tensor | None]], bits: int, group_size: int, method: str,
                     clip_grid: int) -> list[UniformCodes]:
    """Codes of each ``(weight, hessian)``; GPTQ problems of one shape share one batched column sweep."""
    if method not in HESSIAN_METHODS:
        return [rtn_quantize(w, bits, group_size, clip_grid) for w, _ in stacked]
    out: list[UniformCodes | None] = [None] * len(stacked)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, (w, _) in enumerate(stacked):
        by_shape.setdefault(tuple(w.shape), []).append(i)  # type: ignore[arg-type]
    for idx in by_shape.values():
        codes, lo, step = gptq_sweep(torch.stack([stacked[i][0] for i in idx]),
                                     torch.stack([stacked[i][1] for i in idx]),  # type: ignore[misc]
                                     bits, group_size, clip_grid=clip_grid)
        for j, i in enumerate(idx):
            out[i] = UniformCodes(codes[j], lo[j], step[j], bits, group_size)
    return out  # type: ignore[return-value]


def shared_input_groups(names: list[str], hessians: dict[str, Tensor] | None) -> list[list[str]]:
    """Layers whose calibration Hessians are equal read the same input (q/k/v, gate/up): one group each.

    GPTQ's rows are independent given ``H``, so a group is quantized in one column sweep on its
    stacked rows (and a rotated group shares one rotation). Without Hessians every layer is its own group.
    """
    if hessians is None:
        return [[n] for n in names]
    groups: list[list[str]] = []
    for name in names:
        h = hessians.get(name)
        home = next((g for g in groups if h is not None and hessians.get(g[0]) is not None
                     and hessians[g[0]].shape == h.shape and torch.equal(hessians[g[0]], h)), None)
        if home is None:
            groups.append([name])
        else:
            home.append(name)
    return groups


def quantize_uniform(
    model: nn.Module,
    method: UniformMethod = "rtn",
    bits: int = 4,
    group_size: int = 128,
    target: str | list[str] | None = None,
    exclude: tuple[str, ...] | list[str] = ("lm_head",),
    hessians: dict[str, Tensor] | None = None,
    calibration: Iterable[Any] | None = None,
    forward: ForwardFn = default_forward,
    seed: int = 0,
    clip_grid: int = 0,
) -> dict[str, Any]:
    """Replace the Linear layers of ``model`` by :class:`UniformQuantLinear` (in place).

    Idempotent: layers already quantized are skipped. The structure is recorded
    (``record_surgery``) so a checkpoint of a task module reloads it.

    Args:
        model: any ``nn.Module``.
        method: ``"rtn"``, ``"gptq"`` (needs ``hessians`` or ``calibration`` batches),
            ``"hadamard_rtn"`` or ``"hadamard_gptq"`` (QuaRot-style: rotate, then GPTQ).
        bits, group_size: the format.
        target: regex / names of the Linear layers (``None``: all), minus ``exclude``.
        hessians: per layer name ``X^T X`` (GPTQ).
        calibration: batches to compute ``hessians`` from (with ``forward``).
        seed: the Hadamard signs' seed (per group of layers sharing an input: ``seed + group index``).
        clip_grid: GPTQ's clipping search of each group's range (0: min-max; published: 100).

    Returns:
        ``{"quantized_layers", "bits_per_weight", "bits_per_weight_with_shared", "relative_error"}``.

    .. code-block:: python

        quantize_uniform(model, method="hadamard_rtn", bits=2, group_size=128)
    """
    if method not in METHODS:
        raise ValueError(f"`method`={method!r}, expected one of {METHODS}.")
    layers = select_linears(model, target, tuple(exclude))
    if not layers:
        return {"quantized_layers": 0}
    if method in HESSIAN_METHODS and hessians is None:
        if calibration is None:
            raise ValueError(f"method={method!r} needs `hessians` or `calibration` batches.")
        hessians = collect_hessians(model, layers, calibration, forward)
    err_num = err_den = 0.0
    use_h = hessians if method in HESSIAN_METHODS else None
    groups = shared_input_groups(list(layers), use_h)
    prepared = [_in_method_basis(torch.cat([layers[n].weight for n in group]), None if use_h is None
                                 else use_h[group[0]], method, seed + i) for i, group in enumerate(groups)]
    all_codes = _quantize_groups([(w, h) for w, h, _ in prepared], bits, group_size, method, clip_grid)
    for group, (_, _, signs), codes in zip(groups, prepared, all_codes):
        start = 0
        for name in group:
            w = layers[name].weight.detach().float()
            rows = slice(start, start + w.shape[0])
            start += w.shape[0]
            part = UniformCodes(codes.codes[rows], codes.minimum[rows], codes.step[rows], bits, group_size)
            layer = UniformQuantLinear.from_codes(part, layers[name].bias, signs)
            # from the codes, not the packed stream: decoding 100M packed weights again costs seconds
            err_num += float((_unrotate(uniform_dequantize(part), signs) - w).pow(2).sum())
            err_den += float(w.pow(2).sum())
            replace_module(model, name, mark_replaced(layer, "uniform_quant"))
    record_surgery(model, f"uniform_{method}", rebuild_uniform_layers,
                   {"layers": list(layers), "bits": bits, "group_size": group_size,
                    "rotate": method in ROTATED_METHODS})
    record_in_config(model)
    bits_total = model_bits(model)
    return {"quantized_layers": len(layers), "bits_per_weight": bits_total.bits_per_weight,
            "bits_per_weight_with_shared": bits_total.bits_per_weight_with_shared,
            "relative_error": err_num / max(err_den, 1e-30)}


def rebuild_uniform_layers(model: nn.Module, layers: list[str], bits: int, group_size: int, rotate: bool) -> None:
    """Re-create empty :class:`UniformQuantLinear` shells at ``layers`` (the checkpoint fills them)."""
    for name in layers:
        old = model.get_submodule(name)
        if isinstance(old, UniformQuantLinear):
            continue
        if not isinstance(old, nn.Linear):
            raise TypeError(f"rebuild_uniform_layers: {name!r} is a {type(old).__name__}, expected nn.Linear.")
        shell = UniformQuantLinear(old.in_features, old.out_features, bits, group_size,
                                   None if old.bias is None else old.bias, rotate)
        replace_module(model, name, mark_replaced(shell.to(old.weight.device), "uniform_quant"))


class UniformQuantizer(PostTrainingQuantizer):
    """Callback: RTN / GPTQ / Hadamard+RTN weight-only quantization before test / predict.

    Args:
        method: ``"rtn"``, ``"gptq"``, ``"hadamard_rtn"`` or ``"hadamard_gptq"``.
        bits, group_size: the format (``bits + 32 / group_size`` bits/weight).
        target, exclude: which Linear layers (see :func:`quantize_uniform`).
        calibration_batches: training batches for GPTQ's Hessians (0 = none; GPTQ needs > 0).
        after_fit: also quantize at the end of ``fit``.
        seed: Hadamard signs' seed.
        clip_grid: GPTQ's clipping search (0: min-max ranges; published: 100).

    .. code-block:: python

        trainer = L.Trainer(callbacks=[UniformQuantizer(method="rtn", bits=3)])
        trainer.test(model, datamodule=dm)
    """

    method_name = "uniform_quant"

    def __init__(self, method: UniformMethod = "rtn", bits: int = 4, group_size: int = 128,
                 target: str | list[str] | None = None, exclude: list[str] | None = None,
                 calibration_batches: int = 0, after_fit: bool = False, seed: int = 0, clip_grid: int = 0) -> None:
        if method not in METHODS:
            raise ValueError(f"`method`={method!r}, expected one of {METHODS}.")
        if method in HESSIAN_METHODS and calibration_batches == 0:
            raise ValueError(f"UniformQuantizer(method={method!r}) needs calibration_batches > 0 for its Hessians.")
        if clip_grid < 0:
            raise ValueError(f"`clip_grid`={clip_grid}: expected >= 0.")
        super().__init__(after_fit=after_fit, calibration_batches=calibration_batches)
        self.method, self.bits, self.group_size, self.seed, self.clip_grid = method, bits, group_size, seed, clip_grid
        self.target, self.exclude = target, tuple(exclude if exclude is not None else ("lm_head",))

    def quantize(self, module: nn.Module, batches: Iterable[Any] | None) -> dict[str, Any]:
        return quantize_uniform(module, self.method, self.bits, self.group_size, self.target, self.exclude,
                                calibration=batches, seed=self.seed, clip_grid=self.clip_grid)
