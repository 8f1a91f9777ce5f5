"""Riemannian-preconditioned LoRA (ScaledGD): LoRA's factor gradients scaled by the inverse factor Gram matrices.

Zhang & Pilanci, "Riemannian Preconditioned LoRA for Fine-Tuning Foundation Models" (ICML 2024), after ScaledGD
(Tong, Ma & Chi 2021): before the optimizer step, for every PEFT LoRA layer (``lora_A: r×n``, ``lora_B: m×r``)

    ∂A ← (BᵀB + δI)⁻¹ ∂A          ∂B ← ∂B (AAᵀ + δI)⁻¹

both from the factors *before* the step; then any optimizer (SGD, or AdamW as in the paper's "scaled AdamW") steps.
This is the known preconditioner that makes low-rank factorised gradient descent independent of the factors'
condition number — the baseline SDS-LoRA's convergence claim has to be separated from (the math, with the
``power = ½`` case that *is* polar-basis SDS, is :func:`lit_lowrank.ops.sds_lora.preconditioned_factor_grads`).

**Decision** ``δ = 1e-6``: at PEFT's init ``B = 0``, so ``BᵀB = 0`` and ``∂A = Bᵀ G = 0`` as well; the regulariser
only keeps the solve defined there and is negligible once ``B`` has moved.

.. code-block:: python

    from lit_lowrank.adapters import inject_adapters
    from lit_lowrank.adapters.scaled_gd import RiemannianPreconditioner, precondition_lora_grads_

    inject_adapters(model, method="lora", target_modules=["query", "value"], rank=8)
    loss.backward(); precondition_lora_grads_(model); optimizer.step()          # plain PyTorch
    trainer = L.Trainer(callbacks=[RiemannianPreconditioner(delta=1e-6)])       # Lightning
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from lit_lowrank.ops.sds_lora import _gram_power


def _lora_factor_pairs(model: nn.Module, adapter_name: str) -> list[tuple[nn.Parameter, nn.Parameter]]:
    from peft.tuners.lora.layer import LoraLayer

    pairs = []
    for module in model.modules():
        if isinstance(module, LoraLayer) and isinstance(getattr(module, "lora_A", None), nn.ModuleDict) \
                and adapter_name in module.lora_A and adapter_name in module.lora_B:
            a, b = module.lora_A[adapter_name].weight, module.lora_B[adapter_name].weight
            if a.ndim == 2 and b.ndim == 2:
                pairs.append((a, b))
    return pairs


@torch.no_grad()
def precondition_lora_grads_(model: nn.Module, delta: float = 1e-6, power: float = 1.0,
                             adapter_name: str = "default") -> int:
    """In place, for every PEFT LoRA layer of ``model``: ``∂A ← (BᵀB + δI)^{-p} ∂A``, ``∂B ← ∂B (AAᵀ + δI)^{-p}``.

    Call between ``loss.backward()`` and ``optimizer.step()``. Returns how many layers were preconditioned.

    Raises:
        ValueError: ``delta`` not positive, or no LoRA layer carries ``adapter_name``.
    """
    if not delta > 0:
        raise ValueError(f"`delta`={delta!r}: expected a positive regulariser (B = 0 at PEFT's init).")
    pairs = _lora_factor_pairs(model, adapter_name)
    if not pairs:
        raise ValueError(f"precondition_lora_grads_: no PEFT LoRA layer with adapter {adapter_name!r} in "
                         f"{type(model).__name__} (inject method='lora' first).")
    count = 0
    for a, b in pairs:
        if a.grad is None and b.grad is None:
            continue
        work = torch.promote_types(a.dtype, torch.float32)  # half-precision factors: solve in float32
        af, bf = a.detach().to(work), b.detach().to(work)
        left, right = _gram_power(bf.t() @ bf, power, delta), _gram_power(af @ af.t(), power, delta)
        if a.grad is not None:
            a.grad.copy_((left @ a.grad.to(work)).to(a.grad.dtype))
        if b.grad is not None:
            b.grad.copy_((b.grad.to(work) @ right).to(b.grad.dtype))
        count += 1
    return count


class RiemannianPreconditioner(pl.Callback):
    """Precondition LoRA factor gradients before every optimizer step (after accumulation and AMP unscaling).

    Args:
        delta: regulariser ``δ`` of the Gram matrices.
        power: ``1`` (ScaledGD / Riemannian preconditioning); ``0.5`` reproduces polar-basis SDS-LoRA.
        adapter_name: the PEFT adapter to precondition.

    .. code-block:: python

        trainer = L.Trainer(callbacks=[AdapterInjector(method="lora", target_modules=["q", "v"]),
                                       RiemannianPreconditioner()])
    """

    def __init__(self, delta: float = 1e-6, power: float = 1.0, adapter_name: str = "default") -> None:
        if not delta > 0 or power < 0:
            raise ValueError(f"`delta`={delta!r} must be positive and `power`={power!r} non-negative.")
        self.delta, self.power, self.adapter_name = delta, power, adapter_name

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        precondition_lora_grads_(pl_module, self.delta, self.power, self.adapter_name)
