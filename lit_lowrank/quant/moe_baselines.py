"""Prior-method and equal-bits baselines of MoE quantization (no Lightning).

- **GPTQ-MXFP4** (:func:`expert_hessians`, :func:`apply_gptq_mxfp4`): every expert matrix quantized by
  GPTQ onto the MXFP4 grid with the Hessian of *its own* routed inputs (``gate_up_proj``: the hidden
  states of the tokens routed to the expert; ``down_proj``: their ``act(gate) * up`` intermediate),
  collected on full-precision calibration batches. Same storage as RTN-MXFP4 (4.25 bits/weight).
- **Mixed precision at equal bits** (:func:`allocate_fp8_experts`): the bits a compensator budget
  would spend instead keep the expert matrices with the largest load-weighted error reduction per bit
  in MXFP8 (8.25 bits/weight), greedily — the cheapest way to spend the same extra bits on precision.

.. code-block:: python

    hessians = expert_hessians(model, batches, forward=default_forward)
    apply_gptq_mxfp4(model, hessians, act_quant=True)          # MXFP4Experts serving GPTQ's codes
    fp8 = allocate_fp8_experts(model, loads, budget_bits=compensator_bits)
    apply_moe_quant(other_model, fp8_experts=fp8, act_quant=True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.ops.mx_extras import gptq_mxfp4, mxfp8_quantize
from lit_lowrank.ops.mxfp4 import MX_BLOCK, mxfp4_quantize
from lit_lowrank.quant.moe import PROJECTIONS, MXFP4Experts, apply_moe_quant, fp_reference, moe_experts
from lit_lowrank.quant.moe_routing import find_moe_blocks

__all__ = ["allocate_fp8_experts", "apply_gptq_mxfp4", "expert_hessians"]


def _base(experts: nn.Module) -> nn.Module:
    return experts.base if isinstance(experts, MXFP4Experts) else experts


@torch.no_grad()
def expert_hessians(model: nn.Module, batches: Iterable[Any], forward: Any) -> dict[str, list[Tensor]]:
    """Per MoE block, ``[H_gate_up (E, H, H), H_down (E, I, I)]``: ``X^T X`` of each expert's routed inputs
    (full-precision pass, the model's own routes).

    .. code-block:: python

        hessians = expert_hessians(model, calibration, forward=lambda m, b: m(b["input_ids"]))
    """
    blocks = find_moe_blocks(model)
    sums: dict[str, list[Tensor]] = {}

    def hook_for(name: str):
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            base = _base(module)
            hidden, index = (list(args) + [kwargs.get("hidden_states"), kwargs.get("top_k_index")])[:2] \
                if len(args) >= 2 else (kwargs["hidden_states"], kwargs["top_k_index"])
            gate_up, down = getattr(base, "gate_up_proj"), getattr(base, "down_proj")
            if name not in sums:
                sums[name] = [hidden.new_zeros(gate_up.shape[0], gate_up.shape[2], gate_up.shape[2]).float(),
                              hidden.new_zeros(down.shape[0], down.shape[2], down.shape[2]).float()]
            for e in torch.unique(index).tolist():
                token = torch.where(index == e)[0]
                x = hidden[token].float()
                gate, up = nn.functional.linear(x, gate_up[e].float()).chunk(2, dim=-1)
                mid = base.act_fn(gate) * up
                sums[name][0][e] += x.T @ x
                sums[name][1][e] += mid.T @ mid
        return hook

    handles = [block.experts.register_forward_pre_hook(hook_for(name), with_kwargs=True) for name, block in blocks]
    try:
        with fp_reference(model):
            for batch in batches:
                forward(model, batch)
    finally:
        for h in handles:
            h.remove()
    missing = [name for name, _ in blocks if name not in sums]
    if missing:
        raise RuntimeError(f"expert_hessians: MoE blocks {missing[:4]} saw no tokens; check the batches and `forward`.")
    return sums


@torch.no_grad()
def apply_gptq_mxfp4(model: nn.Module, hessians: dict[str, list[Tensor]], block_size: int = MX_BLOCK,
                     damp: float = 0.01, act_quant: bool = False) -> nn.Module:
    """RTN-MXFP4 surgery (:func:`~lit_lowrank.quant.moe.apply_moe_quant`, no compensators), then every expert
    matrix's ``Q(W)`` replaced by GPTQ-MXFP4 with its Hessian from :func:`expert_hessians`.

    .. code-block:: python

        apply_gptq_mxfp4(model, expert_hessians(model, batches, default_forward))
    """
    apply_moe_quant(model, block_size=block_size, act_quant=act_quant)
    for name, experts in moe_experts(model).items():
        if name not in hessians:
            raise ValueError(f"`hessians` has no entry for MoE block {name!r}; expected one per block.")
        for proj, h in zip(PROJECTIONS, hessians[name]):
            w = getattr(experts.base, proj).detach().float()
            experts.set_quantized(proj, gptq_mxfp4(w, h.to(w.device), block_size, damp))
    return model


@torch.no_grad()
def allocate_fp8_experts(model: nn.Module, loads: dict[str, Tensor], budget_bits: float,
                         block_size: int = MX_BLOCK) -> dict[str, list[list[int]]]:
    """Expert matrices kept in MXFP8 within ``budget_bits`` extra bits (4 per weight each), greedily by
    load-weighted error reduction per bit ``p_e (||W - Q4(W)||^2 - ||W - Q8(W)||^2) / (4 out in)``.

    Returns ``block -> [[gate_up experts], [down experts]]`` for ``apply_moe_quant(fp8_experts=...)``.
    """
    candidates = []
    for name, block in find_moe_blocks(model):
        base = _base(block.experts)
        for j, proj in enumerate(PROJECTIONS):
            w = getattr(base, proj).detach().float()
            gain = ((w - mxfp4_quantize(w, block_size)).pow(2).sum((1, 2))
                    - (w - mxfp8_quantize(w, block_size)).pow(2).sum((1, 2)))
            cost = 4 * w.shape[1] * w.shape[2]
            for e in range(w.shape[0]):
                candidates.append((float(loads[name][e]) * float(gain[e]) / cost, cost, name, j, e))
    out = {name: [[] for _ in PROJECTIONS] for name, _ in find_moe_blocks(model)}
    spent = 0.0
    for _, cost, name, j, e in sorted(candidates, key=lambda c: -c[0]):
        if spent + cost <= budget_bits:
            out[name][j].append(e)
            spent += cost
    return out
