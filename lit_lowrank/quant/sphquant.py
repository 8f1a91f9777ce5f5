"""SPHQuant: rotation-free spherical weight-only quantization of a model's Linear layers.

:func:`quantize_sph` (the functional form, any ``nn.Module``) and :class:`SPHQuantizer` (a
callback acting before test / predict, or after fit) replace Linear layers by
:class:`SPHLinear`, which stores per 8-D weight vector its sign bits, a codeword index into
a positive-orthant unit-direction codebook shared by the model, and a radius code with an
fp16 minimum and step per group (math in :mod:`lit_lowrank.ops.sphquant.codec`). Its product
decodes the packed stream tile by tile (CPU reference) or in a Triton kernel with the
codebook in shared memory (GPU), never materialising the dense weight.

.. code-block:: python

    from lit_lowrank.quant import SPHQuantizer, quantize_sph

    report = quantize_sph(model, codebook_size=256, radius_bits=3, group_size=256)
    print(report["bits_per_weight"])                       # 2.5 (codebook excluded; see report)

    trainer = L.Trainer(callbacks=[SPHQuantizer(codebook_size=64, radius_bits=2, group_size=256)])
    trainer.test(model, datamodule=dm)                     # quantized at on_test_start
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.core.surgery import mark_replaced, record_surgery, replace_module
from lit_lowrank.ops.quantization import PACK_PADDING_BYTES, BitsBreakdown, num_groups
from lit_lowrank.ops.sphquant.codec import (
    SPH_DIM,
    FinetuneLoss,
    SPHCodes,
    check_sph_format,
    finetune_codebook,
    positive_orthant_kmeans,
    sph_bits,
    sph_decode,
    sph_directions,
    sph_field_widths,
    sph_pack,
    sph_quantize,
    sph_unpack_rows,
)
from lit_lowrank.ops.sphquant.feedback import sph_feedback_sweep
from lit_lowrank.quant.linear import QuantizedLinear, model_bits
from lit_lowrank.quant.pretrained import record_in_config
from lit_lowrank.quant.ptq import ForwardFn, PostTrainingQuantizer, collect_hessians, default_forward, select_linears

METHOD = "sphquant"


class SPHLinear(QuantizedLinear):
    """A Linear stored in the packed SPH format.

    Buffers: ``packed`` (uint8 stream, ``8 + log2 K + radius_bits`` bits per 8-D vector,
    row-major), ``codebook`` (fp16 ``(K, 8)``, usually the same tensor in every layer of a
    model), ``radius_min`` / ``radius_step`` (fp16 ``(out, G)``, ``G = ceil(in / group_size)``).

    The product runs the Triton GEMV (:mod:`lit_lowrank.ops.sphquant.triton_gemv`) for CUDA
    inputs of at most ``MAX_ROWS`` (8) rows when Triton is installed (``use_kernel=True``),
    else the torch reference that decodes ``tile_rows`` output rows at a time.

    The model-wide codebook is one tensor shared by every layer; ``save_pretrained`` stores it once
    (``_tied_weights_keys``), and :func:`~lit_lowrank.quant.pretrained.load_quantized` rebuilds the
    sharing before loading.

    .. code-block:: python

        layer = SPHLinear.from_codes(sph_quantize(linear.weight, codebook, 4, 128), codebook, linear.bias)
        torch.testing.assert_close(layer(x), x @ layer.dequantize().T + linear.bias)
    """

    # transformers' save_pretrained keeps one copy of buffers shared under these names
    _tied_weights_keys = {"codebook": "codebook"}

    def __init__(self, in_features: int, out_features: int, codebook_size: int, radius_bits: int, group_size: int,
                 bias: Tensor | None = None, codebook: Tensor | None = None, use_kernel: bool = True) -> None:
        check_sph_format(codebook_size, radius_bits, group_size, in_features)
        super().__init__(in_features, out_features, bias)
        self.codebook_size, self.radius_bits, self.group_size = int(codebook_size), int(radius_bits), int(group_size)
        self.use_kernel = use_kernel
        total_bits = sum(sph_field_widths(codebook_size, radius_bits))
        n_bytes = (out_features * in_features // SPH_DIM * total_bits + 7) // 8 + PACK_PADDING_BYTES
        groups = num_groups(in_features // SPH_DIM, group_size // SPH_DIM)
        self.register_buffer("packed", torch.zeros(n_bytes, dtype=torch.uint8))
        if codebook is None:
            codebook = torch.zeros(codebook_size, SPH_DIM, dtype=torch.float16)
        if codebook.shape != (codebook_size, SPH_DIM) or codebook.dtype != torch.float16:
            raise ValueError(f"`codebook` must be float16 ({codebook_size}, {SPH_DIM}), "
                             f"got {codebook.dtype} {tuple(codebook.shape)}.")
        self.register_buffer("codebook", codebook)
        self.register_buffer("radius_min", torch.zeros(out_features, groups, dtype=torch.float16))
        self.register_buffer("radius_step", torch.zeros(out_features, groups, dtype=torch.float16))

    @classmethod
    def from_codes(cls, codes: SPHCodes, codebook: Tensor, bias: Tensor | None = None) -> SPHLinear:
        """Pack ``codes``; ``codebook`` (fp16 ``(K, 8)``) is stored by reference (share it across layers)."""
        out_features, in_features = codes.shape
        layer = cls(in_features, out_features, codes.codebook_size, codes.radius_bits, codes.group_size, bias,
                    codebook.half())
        layer.packed.copy_(sph_pack(codes))
        layer.radius_min.copy_(codes.radius_min)
        layer.radius_step.copy_(codes.radius_step)
        return layer

    def fields(self, start: int = 0, stop: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(signs, index, radius_code)`` of output rows ``[start, stop)``, each ``(rows, in/8)``."""
        stop = self.out_features if stop is None else stop
        return sph_unpack_rows(self.packed, self.in_features, self.codebook_size, self.radius_bits, start, stop)

    def decode_rows(self, start: int, stop: int) -> Tensor:
        signs, index, radius_code = self.fields(start, stop)
        return sph_decode(signs, index, radius_code, self.radius_min[start:stop], self.radius_step[start:stop],
                          self.codebook, self.group_size)

    def matmul(self, x: Tensor) -> Tensor:
        if self.use_kernel and x.is_cuda:
            from lit_lowrank.ops.sphquant.triton_gemv import MAX_ROWS, sph_matmul_triton, triton_available

            if triton_available() and x.shape[0] <= MAX_ROWS:
                return sph_matmul_triton(x, self.packed, self.codebook, self.radius_min, self.radius_step,
                                         self.out_features, self.codebook_size, self.radius_bits, self.group_size)
        return self.matmul_reference(x)

    def storage(self) -> BitsBreakdown:
        return sph_bits(self.out_features, self.in_features, self.codebook_size, self.radius_bits, self.group_size)

    def shared_tensors(self) -> list[Tensor]:
        return [self.codebook]

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, codebook_size={self.codebook_size}, radius_bits={self.radius_bits}, "
                f"group_size={self.group_size}")


def learn_codebook(
    weights: list[Tensor],
    codebook_size: int,
    radius_bits: int,
    group_size: int,
    hessians: list[Tensor | None] | None = None,
    loss: FinetuneLoss = "reconstruction",
    kmeans_iterations: int = 10,
    kmeans_vectors: int = 1 << 16,
    finetune_rounds: int = 2,
    finetune_steps: int = 50,
    finetune_lr: float = 0.02,
    rows_per_layer: int = 128,
    seed: int = 0,
) -> tuple[Tensor, list[float], list[SPHCodes] | None]:
    """Spherical k-means on the weights' directions, then angular fine-tuning.

    Returns ``(codebook, history, codes)``: ``history`` is the objective (mean per-layer
    relative error; Hessian-weighted for ``loss="hessian"``) after k-means and after each
    fine-tuning round; ``codes`` the layers' codes under the fp16-rounded codebook (``None``
    without fine-tuning).

    .. code-block:: python

        codebook, history, codes = learn_codebook([w1, w2], codebook_size=256, radius_bits=3, group_size=256)
    """
    codebook = positive_orthant_kmeans(sph_directions(weights), codebook_size, kmeans_iterations, kmeans_vectors,
                                       seed)
    if finetune_rounds == 0 or finetune_steps == 0:
        return codebook, [], None
    return finetune_codebook(codebook, weights, radius_bits, group_size, hessians, loss, finetune_rounds,  # type: ignore[return-value]
                             finetune_steps, finetune_lr, rows_per_layer, seed, return_codes=True)


def quantize_sph(
    model: nn.Module,
    codebook_size: int = 256,
    radius_bits: int = 4,
    group_size: int = 128,
    target: str | list[str] | None = None,
    exclude: tuple[str, ...] | list[str] = ("lm_head",),
    loss: FinetuneLoss = "reconstruction",
    hessians: dict[str, Tensor] | None = None,
    calibration: Iterable[Any] | None = None,
    forward: ForwardFn = default_forward,
    kmeans_iterations: int = 10,
    kmeans_vectors: int = 1 << 16,
    finetune_rounds: int = 2,
    finetune_steps: int = 50,
    finetune_lr: float = 0.02,
    rows_per_layer: int = 128,
    codebook: Tensor | None = None,
    seed: int = 0,
    feedback: bool | None = None,
    damp: float = 0.01,
) -> dict[str, Any]:
    """Quantize the Linear layers of ``model`` with SPHQuant, in place (the functional form).

    One codebook is learned for all selected layers (spherical k-means on their 8-D
    directions, then angular fine-tuning) and shared by their :class:`SPHLinear`. Idempotent:
    layers already quantized are skipped; the structure is recorded so a task module's
    checkpoint rebuilds it.

    Args:
        model: any ``nn.Module``; selected layers need ``in_features % 8 == 0``.
        codebook_size: ``K`` (power of two); ``log2 K`` index bits per 8 weights.
        radius_bits: bits of each vector's radius code.
        group_size: weights per radius group along a row (multiple of 8).
        target: regex / names of Linear layers (``None``: all), minus ``exclude``.
        loss: fine-tuning loss, ``"reconstruction"`` (data-free) or ``"hessian"`` (needs
            ``hessians`` or ``calibration`` batches).
        hessians: per layer name ``X^T X / n`` of its calibration inputs.
        calibration: batches to compute ``hessians`` from (with ``forward``).
        kmeans_iterations, kmeans_vectors: codebook initialisation.
        finetune_rounds, finetune_steps, finetune_lr, rows_per_layer: angular fine-tuning
            (``finetune_rounds=0`` keeps the k-means codebook).
        codebook: use this fp16/float ``(K, 8)`` codebook instead of learning one.
        seed: k-means and row-sampling seed.
        feedback: GPTQ/LDLQ-style block error feedback with each layer's calibration Hessian
            (:func:`~lit_lowrank.ops.sphquant_feedback.sph_quantize_feedback`): ``None`` (default)
            turns it on exactly when ``hessians`` or ``calibration`` are given; ``True`` without
            them raises. Layers reading one input (q/k/v, gate/up) share one sweep.
        damp: the feedback's Hessian damping (fraction of the mean diagonal).

    Returns:
        ``{"quantized_layers", "bits_per_weight", "bits_per_weight_with_shared",
        "relative_error", "objective_history"}``.

    .. code-block:: python

        report = quantize_sph(model, codebook_size=64, radius_bits=2, group_size=256, loss="hessian",
                              calibration=[batch for _, batch in zip(range(4), loader)])
    """
    check_sph_format(codebook_size, radius_bits, group_size)
    layers = select_linears(model, target, tuple(exclude))
    if not layers:
        return {"quantized_layers": 0}
    bad = [f"{n} (in_features={m.in_features})" for n, m in layers.items() if m.in_features % SPH_DIM]
    if bad:
        raise ValueError(f"SPHQuant needs in_features divisible by {SPH_DIM}; exclude or re-target: {bad[:4]}.")
    if feedback is None:
        feedback = hessians is not None or calibration is not None
    if (loss == "hessian" or feedback) and hessians is None:
        if calibration is None:
            raise ValueError(f"loss={loss!r}, feedback={feedback}: Hessian-weighted fine-tuning and error feedback "
                             "need `hessians` or `calibration` batches (or feedback=False, loss='reconstruction').")
        hessians = collect_hessians(model, layers, calibration, forward)
    missing = [n for n in layers if hessians is not None and n not in hessians]
    if (loss == "hessian" or feedback) and missing:
        raise ValueError(f"`hessians` has no entry for layers {missing[:4]}; expected one (in, in) matrix per layer.")
    weights = [m.weight.detach().float() for m in layers.values()]
    history: list[float] = []
    all_codes: list[SPHCodes] | None = None
    if codebook is None:
        layer_h = [hessians[n] for n in layers] if (hessians is not None and loss == "hessian") else None
        codebook, history, all_codes = learn_codebook(weights, codebook_size, radius_bits, group_size, layer_h, loss,
                                                      kmeans_iterations, kmeans_vectors, finetune_rounds,
                                                      finetune_steps, finetune_lr, rows_per_layer, seed)
    if codebook.shape != (codebook_size, SPH_DIM):
        raise ValueError(f"`codebook` must be ({codebook_size}, {SPH_DIM}), got {tuple(codebook.shape)}.")
    shared = codebook.detach().half().to(weights[0].device)
    if feedback:  # the fine-tuning's codes were rounded without feedback: quantize again, with it
        all_codes = feedback_codes(layers, hessians, shared.float(), radius_bits, group_size, damp)  # type: ignore[arg-type]
    err_num = err_den = 0.0
    for i, ((name, linear), w) in enumerate(zip(layers.items(), weights)):
        # codes always come from the fp16 codebook the layer stores, so the decode matches exactly
        codes = all_codes[i] if all_codes is not None else sph_quantize(w, shared.float(), radius_bits, group_size)
        layer = SPHLinear.from_codes(codes, shared, linear.bias)
        err_num += float((layer.dequantize() - w).pow(2).sum())
        err_den += float(w.pow(2).sum())
        replace_module(model, name, mark_replaced(layer, METHOD))
    record_surgery(model, METHOD, rebuild_sph_layers, {"layers": list(layers), "codebook_size": codebook_size,
                                                         "radius_bits": radius_bits, "group_size": group_size})
    record_in_config(model)
    bits = model_bits(model)
    return {"quantized_layers": len(layers), "bits_per_weight": bits.bits_per_weight,
            "bits_per_weight_with_shared": bits.bits_per_weight_with_shared,
            "relative_error": err_num / max(err_den, 1e-30), "objective_history": history,
            "feedback": bool(feedback)}


def feedback_codes(layers: dict[str, nn.Linear], hessians: dict[str, Tensor], codebook: Tensor, radius_bits: int,
                   group_size: int, damp: float = 0.01) -> list[SPHCodes]:
    """Codes of every layer with block error feedback, in ``layers``' order.

    Layers reading one input (equal Hessians: q/k/v, gate/up) are stacked into one problem, and
    problems of one shape share one batched sweep
    (:func:`~lit_lowrank.ops.sphquant_feedback.sph_feedback_sweep`).
    """
    from lit_lowrank.quant.uniform import shared_input_groups

    names = list(layers)
    groups = shared_input_groups(names, {n: hessians[n] for n in names})
    stacked = [torch.cat([layers[n].weight.detach().float() for n in group]) for group in groups]
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, w in enumerate(stacked):
        by_shape.setdefault(tuple(w.shape), []).append(i)
    codes: dict[str, SPHCodes] = {}
    for idx in by_shape.values():
        results = sph_feedback_sweep(torch.stack([stacked[i] for i in idx]),
                                     torch.stack([hessians[groups[i][0]].float() for i in idx]),
                                     codebook, radius_bits, group_size, damp)
        for i, result in zip(idx, results):
            start = 0
            for n in groups[i]:
                rows = slice(start, start + layers[n].out_features)
                start = rows.stop
                codes[n] = SPHCodes(result.signs[rows], result.index[rows], result.radius_code[rows],
                                    result.radius_min[rows], result.radius_step[rows], result.codebook_size,
                                    result.radius_bits, result.group_size)
    return [codes[n] for n in names]


def rebuild_sph_layers(model: nn.Module, layers: list[str], codebook_size: int, radius_bits: int,
                       group_size: int) -> None:
    """Re-create empty :class:`SPHLinear` shells (one shared codebook) at ``layers``; a checkpoint's
    state dict then fills them (``load_from_checkpoint`` calls this through ``rebuild_surgery``)."""
    shared: Tensor | None = None
    for name in layers:
        old = model.get_submodule(name)
        if isinstance(old, SPHLinear):
            shared = old.codebook if shared is None else shared
            continue
        if not isinstance(old, nn.Linear):
            raise TypeError(f"rebuild_sph_layers: {name!r} is a {type(old).__name__}, expected nn.Linear.")
        if shared is None:
            shared = torch.zeros(codebook_size, SPH_DIM, dtype=torch.float16, device=old.weight.device)
        shell = SPHLinear(old.in_features, old.out_features, codebook_size, radius_bits, group_size, old.bias, shared)
        replace_module(model, name, mark_replaced(shell.to(old.weight.device), METHOD))


class SPHQuantizer(PostTrainingQuantizer):
    """Callback: SPHQuant post-training weight-only quantization before test / predict.

    Acts at ``on_test_start`` / ``on_predict_start`` (and ``trainer.validate``), or at the
    end of ``fit`` with ``after_fit=True``; see :class:`~lit_lowrank.quant.ptq.PostTrainingQuantizer`.
    Logs ``method/sphquant/bits_per_weight`` (codes + radius scales),
    ``method/sphquant/bits_per_weight_with_shared`` (+ the codebook) and
    ``method/sphquant/quantized_layers``.

    Args:
        codebook_size, radius_bits, group_size: the format (see :func:`quantize_sph`);
            ``(8 + log2 K + radius_bits) / 8 + 32 / group_size`` bits/weight.
        target, exclude: which Linear layers (default: all but ``lm_head``). For a
            vision-language model target the language backbone, e.g. ``r"language_model\\."``.
        loss: ``"reconstruction"`` (data-free) or ``"hessian"`` (needs ``calibration_batches``).
        calibration_batches: training batches for the calibration Hessians (``loss="hessian"`` and
            the error feedback).
        feedback: block error feedback (see :func:`quantize_sph`); ``None``: on exactly when
            ``calibration_batches > 0``.
        finetune_rounds, finetune_steps: angular fine-tuning schedule.
        after_fit: also quantize at the end of ``fit``.
        seed: k-means / sampling seed.

    .. code-block:: python

        trainer = L.Trainer(callbacks=[SPHQuantizer(codebook_size=256, radius_bits=3, group_size=256)])
        trainer.test(CausalLMModule(pretrained_path="smollm2"), datamodule=PackedTextDataModule(tokenizer="smollm2"))
    """

    method_name = METHOD

    def __init__(self, codebook_size: int = 256, radius_bits: int = 4, group_size: int = 128,
                 target: str | list[str] | None = None, exclude: list[str] | None = None,
                 loss: FinetuneLoss = "reconstruction", calibration_batches: int = 0, finetune_rounds: int = 2,
                 finetune_steps: int = 50, after_fit: bool = False, seed: int = 0,
                 feedback: bool | None = None) -> None:
        check_sph_format(codebook_size, radius_bits, group_size)
        if loss not in ("reconstruction", "hessian"):
            raise ValueError(f"`loss`={loss!r}, expected 'reconstruction' or 'hessian'.")
        if (loss == "hessian" or feedback) and calibration_batches == 0:
            raise ValueError(f"SPHQuantizer(loss={loss!r}, feedback={feedback}) needs calibration_batches > 0 for the "
                             "calibration Hessians.")
        super().__init__(after_fit=after_fit, calibration_batches=calibration_batches)
        self.codebook_size, self.radius_bits, self.group_size = codebook_size, radius_bits, group_size
        self.target, self.exclude = target, tuple(exclude if exclude is not None else ("lm_head",))
        self.loss, self.finetune_rounds, self.finetune_steps, self.seed = loss, finetune_rounds, finetune_steps, seed
        self.feedback = feedback

    def quantize(self, module: nn.Module, batches: Iterable[Any] | None) -> dict[str, Any]:
        return quantize_sph(module, self.codebook_size, self.radius_bits, self.group_size, self.target, self.exclude,
                            loss=self.loss, calibration=batches, finetune_rounds=self.finetune_rounds,
                            finetune_steps=self.finetune_steps, seed=self.seed, feedback=self.feedback)
