"""MXFP4 experts with load-aware low-rank compensators for transformers MoE models (no Lightning).

:class:`MXFP4Experts` replaces a sparse-MoE block's ``experts`` module (the 3-D
``gate_up_proj (E, 2I, H)`` / ``down_proj (E, H, I)`` weights of Qwen3-MoE, Qwen2-MoE, Mixtral and
OLMoE). Per expert ``e`` and projection, the effective weight is

    W_eff = Q(W_e) + B_e A_e,    Q = MXFP4 fake quantization (blocks of 32 along the input dim),

with ``B_e A_e`` a rank-``r_e`` compensator initialised from the truncated SVD of the quantization
residual ``W_e - Q(W_e)`` (:func:`~lit_lowrank.ops.lowrank.low_rank_factors`, balanced), so at
initialisation it is the best rank-``r_e`` correction of the residual. The original weights stay
frozen (``.base``); only the compensators (the *expert-side adapters*) are trainable. Ranks differ
per expert: the factors are stored padded to the largest rank with a 0/1 ``rank_mask``, and the
trainable-parameter count counts only the active ranks. The forward computes the effective
weights once and calls the original experts forward on them (``torch.func.functional_call``),
so every family's own expert loop / kernels run unchanged.

:func:`apply_moe_quant` is the idempotent functional surgery (recorded for checkpoint rebuild);
:func:`expert_residual_spectra` / :func:`allocate_expert_ranks` give the load-aware ranks;
:func:`fp_reference` switches quantization and compensators off (the full-precision teacher pass
of routing replay runs on the same module, no copy).

.. code-block:: python

    loads = expert_loads(model, batches)                            # {block: (E,)} from FP routes
    ranks = allocate_expert_ranks(model, loads, avg_rank=4)         # {block: [[r gate_up], [r down]]}
    apply_moe_quant(model, ranks=ranks)                             # MXFP4 experts + compensators
    with fp_reference(model):
        fp_logits = model(input_ids).logits
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.core.surgery import is_replaced, mark_replaced, record_surgery
from lit_lowrank.core.temporary import temporarily_set
from lit_lowrank.ops.lowrank import low_rank_factors, singular_values
from lit_lowrank.ops.mx_extras import fp8_act_fake_quant, mxfp8_quantize
from lit_lowrank.ops.mxfp4 import MX_BLOCK, mxfp4_bits, mxfp4_fake_quant, mxfp4_quantize
from lit_lowrank.ops.quantization import BitsBreakdown
from lit_lowrank.ops.rank_allocation import allocate_ranks, uniform_ranks, weighted_residual_energy
from lit_lowrank.quant.moe_routing import RouteController, find_moe_blocks

__all__ = [
    "COMPENSATOR_BITS", "INITS", "MXFP4Experts", "PROJECTIONS", "allocate_expert_ranks", "apply_moe_quant",
    "expert_loads", "expert_residual_spectra", "fp_reference", "load_weighted_error", "load_weighted_residual",
    "moe_experts",
]

METHOD = "moe_quant"
#: The expert weight tensors quantized and compensated, in this order in every rank table.
PROJECTIONS = ("gate_up_proj", "down_proj")
#: Compensator initialisations (``"random"`` is the control: same ranks, random subspace).
INITS = ("svd", "zeros", "random")
#: Storage of one compensator factor entry (BF16, as the adapters are served).
COMPENSATOR_BITS = 16


class MXFP4Experts(nn.Module):
    """MXFP4 fake-quantized experts with per-expert low-rank compensators (see module docstring).

    Args:
        base: the transformers experts module (its ``gate_up_proj`` / ``down_proj`` are frozen).
        ranks: ``[[r_e for gate_up_proj], [r_e for down_proj]]`` (``None`` = no compensator).
        block_size: MX block size along the input dimension.
        init: ``"svd"`` (truncated SVD of the residual), ``"zeros"`` (``B = 0``, LoRA-style) or
            ``"random"`` (the residual projected on a random rank-``r_e`` subspace of the input space,
            ``B A = R V Vᵀ`` with ``V`` random orthonormal: a control with the same ranks and storage, no
            spectral selection).
        seed: random source of ``init="random"``.
        act_quant: W4A8 serving: FP8 E4M3 per-token fake quantization of both expert GEMMs' inputs (the
            routed hidden states and the ``act(gate) * up`` intermediate; straight-through gradient).
            Needs the Qwen3-MoE / Mixtral / OLMoE expert layout (``gate_up_proj``, ``down_proj``, ``act_fn``).
        fp8_experts: ``[[experts of gate_up_proj], [experts of down_proj]]`` kept in MXFP8 (8.25
            bits/weight) instead of MXFP4: the mixed-precision baseline at equal bits.

    .. code-block:: python

        block.experts = MXFP4Experts(block.experts, ranks=[[4] * 8, [2] * 8], act_quant=True)
    """

    def __init__(self, base: nn.Module, ranks: list[list[int]] | None = None, block_size: int = MX_BLOCK,
                 init: str = "svd", seed: int = 0, act_quant: bool = False,
                 fp8_experts: list[list[int]] | None = None) -> None:
        super().__init__()
        if init not in INITS:
            raise ValueError(f"`init`={init!r}: expected one of {INITS}.")
        gen = torch.Generator().manual_seed(int(seed))
        self.base = base
        self.block_size = int(block_size)
        self.num_experts = int(getattr(base, PROJECTIONS[0]).shape[0])
        ranks = ranks or [[0] * self.num_experts for _ in PROJECTIONS]
        if len(ranks) != len(PROJECTIONS) or any(len(r) != self.num_experts for r in ranks):
            raise ValueError(f"`ranks` must be {len(PROJECTIONS)} lists of {self.num_experts} ranks "
                             f"({PROJECTIONS}), got {ranks!r}.")
        self.ranks = [[int(r) for r in rs] for rs in ranks]
        self._q_cache: dict[str, tuple[Any, Tensor]] = {}
        self.enabled = True  # False: full-precision weights, no compensator (the replay teacher pass)
        self.act_quant = bool(act_quant)
        if self.act_quant and not all(hasattr(base, a) for a in ("act_fn", *PROJECTIONS)):
            raise ValueError(f"act_quant=True runs the experts' loop itself and needs `act_fn`, {PROJECTIONS} on "
                             f"{type(base).__name__} (the Qwen3-MoE / Mixtral / OLMoE layout).")
        self.fp8_experts = [sorted({int(e) for e in es}) for es in (fp8_experts or [[] for _ in PROJECTIONS])]
        if len(self.fp8_experts) != len(PROJECTIONS) or any(
                not 0 <= e < self.num_experts for es in self.fp8_experts for e in es):
            raise ValueError(f"`fp8_experts` must be {len(PROJECTIONS)} lists of expert indices in "
                             f"[0, {self.num_experts}), got {fp8_experts!r}.")
        for p in base.parameters():
            p.requires_grad_(False)
        for proj, rs in zip(PROJECTIONS, self.ranks):
            w = getattr(base, proj)
            if w.dim() != 3 or w.shape[-1] % self.block_size:
                raise ValueError(f"{type(base).__name__}.{proj} has shape {tuple(w.shape)}; expected 3-D "
                                 f"(experts, out, in) with `in` a multiple of block_size={self.block_size}.")
            e, out_f, in_f = w.shape
            r_max = max(rs)
            if r_max > min(out_f, in_f):
                raise ValueError(f"`ranks` for {proj} reach {r_max} > min(out, in) = {min(out_f, in_f)}.")
            mask = torch.zeros(e, r_max)
            for i, r in enumerate(rs):
                mask[i, :r] = 1.0
            a = torch.zeros(e, r_max, in_f)
            b = torch.zeros(e, out_f, r_max)
            if init != "zeros":
                residual = (w.detach().float() - self._rtn(proj, w.detach().float()))
                for i, r in enumerate(rs):
                    if r > 0 and init == "svd":
                        bi, ai = low_rank_factors(residual[i], r)  # residual ≈ bi (out, r) @ ai (r, in)
                        b[i, :, :r], a[i, :r] = bi, ai
                    elif r > 0:  # random subspace: the best correction within span(V), V random orthonormal
                        v, _ = torch.linalg.qr(torch.randn(in_f, r, generator=gen))
                        b[i, :, :r], a[i, :r] = residual[i].cpu() @ v, v.T
            self.register_parameter(f"lora_A_{proj}", nn.Parameter(a.to(w.dtype)))
            self.register_parameter(f"lora_B_{proj}", nn.Parameter(b.to(w.dtype)))
            self.register_buffer(f"rank_mask_{proj}", mask.to(w.dtype))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # A checkpoint may carry other ranks than this module was built with (resuming a run whose
        # calibration is redone in setup): adopt the checkpoint's ranks, read from its rank masks.
        for j, proj in enumerate(PROJECTIONS):
            mask = state_dict.get(f"{prefix}rank_mask_{proj}")
            current = getattr(self, f"rank_mask_{proj}")
            if mask is None or mask.shape == current.shape:
                continue
            e, r_max = mask.shape
            a, b = getattr(self, f"lora_A_{proj}"), getattr(self, f"lora_B_{proj}")
            self.register_parameter(f"lora_A_{proj}", nn.Parameter(a.new_zeros(e, r_max, a.shape[-1])))
            self.register_parameter(f"lora_B_{proj}", nn.Parameter(b.new_zeros(e, b.shape[1], r_max)))
            self.register_buffer(f"rank_mask_{proj}", current.new_zeros(e, r_max))
            self.ranks[j] = [int(r) for r in mask.sum(-1).round().long()]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _rtn(self, proj: str, w: Tensor) -> Tensor:
        """Round-to-nearest of ``w (E, out, in)``: MXFP4, MXFP8 for the experts in ``fp8_experts``."""
        q = mxfp4_quantize(w, self.block_size)
        high = self.fp8_experts[PROJECTIONS.index(proj)]
        if high:
            q = q.clone()
            q[high] = mxfp8_quantize(w[high], self.block_size)
        return q

    def set_quantized(self, proj: str, values: Tensor) -> None:
        """Serve ``values`` (already on the MXFP4 grid, e.g. :func:`~lit_lowrank.ops.mx_extras.gptq_mxfp4`'s
        output) as ``Q(W)`` of ``proj`` instead of round-to-nearest (a persistent buffer ``quantized_<proj>``)."""
        w = getattr(self.base, proj)
        if values.shape != w.shape:
            raise ValueError(f"set_quantized({proj!r}): values have shape {tuple(values.shape)}, expected "
                             f"{tuple(w.shape)}.")
        if not torch.equal(mxfp4_quantize(values.float(), self.block_size), values.float()):
            raise ValueError(f"set_quantized({proj!r}): values are not on the MXFP4 grid (RTN-MXFP4 changes them).")
        self.register_buffer(f"quantized_{proj}", values.detach().to(w.dtype).clone())

    def quantized_weight(self, proj: str) -> Tensor:
        """``Q(W)`` of one projection (straight-through gradient if the base weight is unfrozen).

        A frozen weight's ``Q(W)`` is cached and recomputed only when the weight changes (its
        storage or in-place version, e.g. after ``load_state_dict``): encoding every forward would
        cost more than the tiny models' expert products.
        """
        fixed = getattr(self, f"quantized_{proj}", None)
        if fixed is not None:
            return fixed
        w = getattr(self.base, proj)
        if w.requires_grad:
            if any(self.fp8_experts):
                raise ValueError("train_experts with fp8_experts is not supported (the STE covers MXFP4 only).")
            return mxfp4_fake_quant(w, self.block_size)
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        cached = self._q_cache.get(proj)
        if cached is None or cached[0] != key:
            cached = (key, self._rtn(proj, w.detach()))
            self._q_cache[proj] = cached
        return cached[1]

    def correction(self, proj: str) -> Tensor:
        """``B_e diag(mask_e) A_e`` for every expert: ``(E, out, in)``."""
        a, b = getattr(self, f"lora_A_{proj}"), getattr(self, f"lora_B_{proj}")
        mask = getattr(self, f"rank_mask_{proj}")
        return torch.bmm(b * mask[:, None, :], a)

    def effective_weight(self, proj: str) -> Tensor:
        if not self.enabled:
            return getattr(self.base, proj)
        return self.quantized_weight(proj) + self.correction(proj)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        weights = {proj: self.effective_weight(proj) for proj in PROJECTIONS}
        if self.act_quant and self.enabled:
            return a8_experts(self.base, weights, *args, **kwargs)
        return torch.func.functional_call(self.base, weights, args, kwargs)

    def trainable_parameters(self) -> int:
        """Active compensator parameters: ``Σ_e r_e (out + in)`` over both projections."""
        total = 0
        for proj, rs in zip(PROJECTIONS, self.ranks):
            _, out_f, in_f = getattr(self.base, proj).shape
            total += sum(rs) * (out_f + in_f)
        return total

    def storage(self, compensator_bits: int | None = COMPENSATOR_BITS) -> BitsBreakdown:
        """Storage of every stored parameter of the experts: MXFP4 codes and E8M0 scales (4.25 bits/weight)
        plus the active compensator factors at ``compensator_bits`` each (BF16 by default; counted in
        ``payload_bits``). ``compensator_bits=None`` gives the MXFP4 part alone.

        .. code-block:: python

            experts.storage().bits_per_weight        # 4.25 + 16 * Σ r_e (out + in) / #weights
        """
        total = BitsBreakdown(0, 0, 0)
        for proj, high in zip(PROJECTIONS, self.fp8_experts):
            e, out_f, in_f = getattr(self.base, proj).shape
            total = total + mxfp4_bits(e * out_f, in_f, self.block_size)
            # an MXFP8 expert stores 8-bit instead of 4-bit elements (same E8M0 scales)
            total = total + BitsBreakdown(0, len(high) * out_f * in_f * (8 - 4), 0)
        if compensator_bits is None:
            return total
        return total + BitsBreakdown(0, self.trainable_parameters() * int(compensator_bits), 0)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, block_size={self.block_size}, ranks={self.ranks}, "
                f"act_quant={self.act_quant}, fp8_experts={self.fp8_experts}")


def a8_experts(base: nn.Module, weights: dict[str, Tensor], hidden_states: Tensor, top_k_index: Tensor,
               top_k_weights: Tensor) -> Tensor:
    """The sparse experts' loop (transformers' Qwen3-MoE / Mixtral / OLMoE layout) with ``weights`` and FP8
    per-token activations at both GEMM inputs: ``sum_k w_k down_e(A8(act(gate) * up)), [gate, up] = gate_up_e(A8(x))``."""
    out = torch.zeros_like(hidden_states)
    x8 = fp8_act_fake_quant(hidden_states)
    gate_up, down = weights["gate_up_proj"], weights["down_proj"]
    for e in torch.unique(top_k_index).tolist():
        token, slot = torch.where(top_k_index == e)
        gate, up = nn.functional.linear(x8[token], gate_up[e]).chunk(2, dim=-1)
        y = nn.functional.linear(fp8_act_fake_quant(base.act_fn(gate) * up), down[e])
        out.index_add_(0, token, (y * top_k_weights[token, slot, None]).to(out.dtype))
    return out


def moe_experts(model: nn.Module) -> dict[str, MXFP4Experts]:
    """The :class:`MXFP4Experts` of ``model`` by block name."""
    return {name: block.experts for name, block in find_moe_blocks(model) if isinstance(block.experts, MXFP4Experts)}


def apply_moe_quant(model: nn.Module, ranks: dict[str, list[list[int]]] | None = None,
                    block_size: int = MX_BLOCK, init: str = "svd", seed: int = 0, act_quant: bool = False,
                    fp8_experts: dict[str, list[list[int]]] | None = None) -> nn.Module:
    """Replace every MoE block's experts with :class:`MXFP4Experts` (idempotent; recorded for reload).

    Args:
        model: a transformers MoE model or a module containing one.
        ranks: ``block name -> [[gate_up ranks], [down ranks]]``; missing blocks / ``None`` get no
            compensator (plain RTN-MXFP4 fake quantization).
        block_size: MX block size.
        init: compensator initialisation (``"svd"``, ``"zeros"`` or ``"random"``, see :class:`MXFP4Experts`).
        seed: random source of ``init="random"``.
        act_quant: W4A8: FP8 per-token activations at the expert GEMMs (see :class:`MXFP4Experts`).
        fp8_experts: ``block name -> [[gate_up experts], [down experts]]`` kept in MXFP8.

    .. code-block:: python

        apply_moe_quant(model, ranks={"model.layers.0.mlp": [[4] * 8, [4] * 8]}, act_quant=True)
    """
    ranks = ranks or {}
    blocks = find_moe_blocks(model)
    unknown = sorted(set(ranks) - {name for name, _ in blocks})
    if unknown:
        raise ValueError(f"`ranks` names blocks {unknown} that are not MoE blocks of the model; expected among "
                         f"{[n for n, _ in blocks]}.")
    for name, block in blocks:
        if isinstance(block.experts, MXFP4Experts) or is_replaced(block.experts):
            continue
        block.experts = mark_replaced(MXFP4Experts(block.experts, ranks.get(name), block_size, init, seed, act_quant,
                                                   (fp8_experts or {}).get(name)), METHOD)
    record_surgery(model, METHOD, apply_moe_quant, {"ranks": {k: [list(r) for r in v] for k, v in ranks.items()},
                                                    "block_size": block_size, "init": init, "seed": seed,
                                                    "act_quant": act_quant,
                                                    "fp8_experts": {k: [list(e) for e in v]
                                                                    for k, v in (fp8_experts or {}).items()}})
    return model


@contextlib.contextmanager
def fp_reference(model: nn.Module) -> Iterator[None]:
    """Inside the block, every :class:`MXFP4Experts` uses its full-precision weights (no Q, no B A)."""
    with temporarily_set(moe_experts(model).values(), "enabled", False):
        yield


@torch.no_grad()
def expert_loads(model: nn.Module, batches: Iterable[Any], forward: Any) -> dict[str, Tensor]:
    """Fraction of routed (token, slot) pairs per expert of each MoE block, from full-precision routes.

    Args:
        model: the MoE model (quantized experts are switched to FP for the pass).
        batches: calibration batches.
        forward: ``forward(model, batch)`` running one batch.

    .. code-block:: python

        loads = expert_loads(model, batches, forward=lambda m, b: m(b["input_ids"]))
    """
    ctl = RouteController(model)
    try:
        with fp_reference(model), ctl.mode("record"):
            for batch in batches:
                forward(model, batch)
            loads = ctl.expert_load()
    finally:
        ctl.remove()
    if not loads:
        raise RuntimeError("expert_loads: no router was called; check the calibration batches and `forward`.")
    return {ctl.names[i]: v.float() for i, v in loads.items()}


@torch.no_grad()
def expert_residual_spectra(model: nn.Module, block_size: int = MX_BLOCK) -> dict[str, list[list[Tensor]]]:
    """Singular values of ``W_e - Q(W_e)`` per block, projection and expert (``[proj][expert] -> (k,)``)."""
    out = {}
    for name, block in find_moe_blocks(model):
        experts = block.experts.base if isinstance(block.experts, MXFP4Experts) else block.experts
        per_proj = []
        for proj in PROJECTIONS:
            w = getattr(experts, proj).detach().float()
            per_proj.append(list(singular_values(w - mxfp4_quantize(w, block_size))))
        out[name] = per_proj
    return out


def _flatten(spectra: dict[str, list[list[Tensor]]], loads: dict[str, Tensor]) -> tuple[list, list, list]:
    keys, specs, weights = [], [], []
    for name, per_proj in spectra.items():
        if name not in loads:
            raise ValueError(f"`loads` has no entry for MoE block {name!r}; expected one per block {list(spectra)}.")
        for j, proj_specs in enumerate(per_proj):
            for e, s in enumerate(proj_specs):
                keys.append((name, j, e))
                specs.append(s)
                weights.append(float(loads[name][e]))
    return keys, specs, weights


def allocate_expert_ranks(spectra: dict[str, list[list[Tensor]]], loads: dict[str, Tensor], avg_rank: int,
                          allocation: str = "load", max_rank: int | None = None) -> dict[str, list[list[int]]]:
    """Ranks of every expert compensator under the total budget ``avg_rank x (number of matrices)``.

    Args:
        spectra: from :func:`expert_residual_spectra`.
        loads: from :func:`expert_loads` (block -> per-expert load; both projections of an expert share it).
        avg_rank: the budget per matrix (uniform allocation gives exactly this to each).
        allocation: ``"load"`` (greedy marginal load-weighted spectral gain, optimal) or ``"uniform"``.
        max_rank: cap per matrix (default: ``4 * avg_rank``, so one hot expert cannot take everything).

    .. code-block:: python

        ranks = allocate_expert_ranks(expert_residual_spectra(model), loads, avg_rank=4)
    """
    if allocation not in ("load", "uniform"):
        raise ValueError(f"`allocation`={allocation!r}: expected 'load' or 'uniform'.")
    if avg_rank < 0:
        raise ValueError(f"`avg_rank`={avg_rank}: expected >= 0.")
    keys, specs, weights = _flatten(spectra, loads)
    budget = avg_rank * len(keys)
    if allocation == "uniform":
        flat = uniform_ranks(len(keys), budget)
    else:
        flat = allocate_ranks(specs, weights, budget, max_rank=max_rank if max_rank is not None else 4 * avg_rank)
    out: dict[str, list[list[int]]] = {name: [[0] * len(per_proj[0]) for _ in per_proj]
                                       for name, per_proj in spectra.items()}
    for (name, j, e), r, s in zip(keys, flat, specs):
        out[name][j][e] = min(int(r), s.numel())
    return out


def load_weighted_residual(spectra: dict[str, list[list[Tensor]]], loads: dict[str, Tensor],
                           ranks: dict[str, list[list[int]]] | None) -> float:
    """Load-weighted residual energy of an SVD-initialised allocation (1 = no compensation)."""
    keys, specs, weights = _flatten(spectra, loads)
    flat = [ranks[name][j][e] if ranks and name in ranks else 0 for name, j, e in keys]
    return weighted_residual_energy(specs, weights, flat)


@torch.no_grad()
def load_weighted_error(model: nn.Module, loads: dict[str, Tensor]) -> float:
    """``Σ p_e ‖W_e - Q(W_e) - B_e A_e‖² / Σ p_e ‖W_e - Q(W_e)‖²`` of the current (possibly trained) compensators."""
    num = den = 0.0
    for name, experts in moe_experts(model).items():
        p = loads[name].double()
        for proj in PROJECTIONS:
            w = getattr(experts.base, proj).detach().double()
            residual = w - experts.quantized_weight(proj).detach().double()
            left = residual - experts.correction(proj).detach().double()
            num += float((p * left.pow(2).sum((1, 2))).sum())
            den += float((p * residual.pow(2).sum((1, 2))).sum())
    return num / den if den > 0 else 0.0
