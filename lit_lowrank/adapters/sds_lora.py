"""SDS-LoRA as a PEFT LoRA layer: the same forward, merge and weights as LoRA, SDS-LoRA's backward.

The forward is PEFT LoRA's ``y = W x + (α/r)·B A x`` and the parameters are PEFT's ``lora_A`` / ``lora_B`` (so
``save_pretrained``, ``merge_and_unload``, ``get_delta_weight`` and PEFT's state-dict helpers are LoRA's own, and
an SDS-LoRA checkpoint even loads as plain LoRA for inference). Only the adapter branch's backward differs: the
factors receive the full fine-tuning gradient projected on the sign-canonical orthonormal bases of the factors
(:func:`lit_lowrank.ops.sds_lora.sds_lora_delta`; init and basis choices are documented there).

What PEFT cannot express: mixed-adapter batches (``adapter_names=`` in ``forward``) would route through PEFT's
LoRA path with LoRA gradients, so this layer refuses them rather than silently training with LoRA's backward;
``lora_bias`` and DoRA on top of SDS are refused for the same reason.

.. code-block:: python

    from lit_lowrank.adapters import inject_adapters

    inject_adapters(model, method="sds_lora", target_modules=["query", "value"], rank=8, alpha=16, basis="qr")
"""

from __future__ import annotations

from typing import Any

import torch
from peft import LoraConfig
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn

from lit_lowrank.adapters.variants import register_variant
from lit_lowrank.ops.sds_lora import BASES, sds_lora_delta


class SDSLoraLinear(LoraLinear):
    """A PEFT LoRA ``Linear`` (``nn.Module`` + ``LoraLayer``) whose adapter gradients are SDS-LoRA's.

    Args:
        base_layer: the ``nn.Linear`` to adapt.
        adapter_name: PEFT adapter name.
        config: the ``LoraConfig`` (PEFT passes it; built from ``r`` / ``lora_alpha`` / ``lora_dropout`` when
            ``None``).
        r, lora_alpha, lora_dropout: LoRA rank, alpha (scaling α/r) and input dropout.
        basis: ``"qr"`` (sign-canonical thin QR, the paper's) or ``"polar"``.
        rank_tol: relative threshold under which a factor direction is outside its column space (gated);
            ``None``: ``max(m, r)`` times the dtype's eps.
        **kwargs: PEFT's layer kwargs (``target_name``, ...).

    .. code-block:: python

        layer = SDSLoraLinear(nn.Linear(64, 32), "default", r=4, lora_alpha=8)
        y = layer(torch.randn(5, 64))
    """

    def __init__(
        self,
        base_layer: nn.Module,
        adapter_name: str,
        config: LoraConfig | None = None,
        r: int = 8,
        lora_alpha: float = 8,
        lora_dropout: float = 0.0,
        basis: str = "qr",
        rank_tol: float | None = None,
        **kwargs: Any,
    ) -> None:
        if basis not in BASES:
            raise ValueError(f"`basis`={basis!r}: expected one of {BASES}.")
        if rank_tol is not None and not 0.0 <= rank_tol < 1.0:
            raise ValueError(f"`rank_tol`={rank_tol!r}: expected a relative tolerance in [0, 1).")
        if config is None:
            config = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout)
        if config.use_dora or config.lora_bias:
            raise ValueError("SDS-LoRA defines the gradients of B A only: `use_dora` and `lora_bias` must be False.")
        base = base_layer.get_base_layer() if hasattr(base_layer, "get_base_layer") else base_layer
        if not isinstance(base, nn.Linear):
            raise TypeError(f"SDSLoraLinear adapts nn.Linear layers, got {type(base).__name__}.")
        rank_limit = min(base.in_features, base.out_features)
        if r > rank_limit:
            raise ValueError(f"`r`={r} exceeds min(in, out)={rank_limit} of {base}: SDS needs r orthonormal columns.")
        self.sds_basis, self.sds_rank_tol = basis, rank_tol
        super().__init__(base_layer, adapter_name, config=config, r=r, lora_alpha=lora_alpha, **kwargs)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("adapter_names") is not None:
            raise NotImplementedError("SDSLoraLinear does not support mixed-adapter batches (`adapter_names`).")
        kwargs.pop("adapter_names", None)
        if self.disable_adapters or self.merged:
            # PEFT's path: unmerges when adapters are disabled, or uses the merged weight
            return super().forward(x, *args, **kwargs)
        result = self.base_layer(x, *args, **kwargs)
        torch_result_dtype = result.dtype
        for active_adapter in self.active_adapters:
            if active_adapter not in self.lora_A:
                continue
            lora_a = self.lora_A[active_adapter].weight
            lora_b = self.lora_B[active_adapter].weight
            dropout = self.lora_dropout[active_adapter]
            h = self._cast_input_dtype(x, lora_a.dtype)
            result = result + sds_lora_delta(dropout(h), lora_a, lora_b, self.scaling[active_adapter],
                                             basis=self.sds_basis, rank_tol=self.sds_rank_tol).to(torch_result_dtype)
        return result

    def __repr__(self) -> str:
        return "sds_lora." + super().__repr__()


register_variant("sds_lora", SDSLoraLinear)
