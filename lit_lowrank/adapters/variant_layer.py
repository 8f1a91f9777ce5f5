"""The merge / unmerge / forward shared by our LoRA-variant layers that are not PEFT's own (SaMA, PoLAR).

PEFT's custom-module mechanism builds any ``nn.Module + LoraLayer`` class; what differs between variants is only
how an adapter maps its input (:meth:`VariantLinear.adapter_output`) and its explicit ``ΔW``
(:meth:`VariantLinear.get_delta_weight`). Everything else — adding/subtracting ``ΔW`` into the base weight,
``disable_adapters``, the refusal of mixed-adapter batches — lives here once. (SDS-LoRA subclasses PEFT's own
``lora.Linear`` instead: its forward and ``ΔW`` are LoRA's.)

.. code-block:: python

    class MyLinear(VariantLinear):
        adapter_layer_names = ("lora_M",)          # the first entry's keys are the adapters
        def adapter_output(self, h, adapter): return h @ self.lora_M[adapter].T
        def get_delta_weight(self, adapter): return self.lora_M[adapter]
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from peft.tuners.lora.layer import LoraLayer
from peft.tuners.tuners_utils import check_adapters_to_merge
from torch import Tensor, nn


class VariantLinear(nn.Module, LoraLayer):
    """Base of a LoRA-variant Linear layer: subclasses set ``adapter_layer_names`` and implement
    :meth:`adapter_output` and :meth:`get_delta_weight`."""

    #: the method's name in error messages
    variant_name: str = "this variant"

    def _check_linear_and_rank(self, r: int) -> None:
        """``r`` must be an integer in ``[1, min(in, out)]`` of a Linear-like base layer."""
        if self.in_features is None or self.out_features is None:
            raise ValueError(f"{type(self).__name__} needs a Linear-like base layer with in/out features, got "
                             f"{type(self.get_base_layer()).__name__}")
        limit = min(self.in_features, self.out_features)
        if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= limit:
            raise ValueError(f"`r`={r!r}: {self.variant_name} needs an integer rank in [1, min(in_features, "
                             f"out_features)={limit}] for a layer of shape ({self.out_features}, {self.in_features}).")

    def _record_lora_settings(self, adapter_name: str, r: int, lora_alpha: float, config: Any,
                              lora_dropout: float) -> None:
        """Validate the LoRA-level options (alpha, dropout; no ``lora_bias`` / DoRA) and record them as PEFT does.

        ``lora_dropout == 0`` with a ``config`` takes ``config.lora_dropout``.
        """
        if not lora_alpha > 0:
            raise ValueError(f"`lora_alpha`={lora_alpha!r}: expected a positive number (ΔW is scaled by alpha / r).")
        if config is not None and getattr(config, "lora_bias", False):
            raise ValueError(f"`lora_bias`=True is not supported by {self.variant_name} (its ΔW has no bias term).")
        if config is not None and getattr(config, "use_dora", False):
            raise ValueError(f"`use_dora`=True cannot be combined with {self.variant_name}; use method='dora' instead.")
        if lora_dropout == 0.0 and config is not None:
            lora_dropout = float(getattr(config, "lora_dropout", 0.0))
        if not 0.0 <= lora_dropout < 1.0:
            raise ValueError(f"`lora_dropout`={lora_dropout!r}: expected a probability in [0, 1).")
        self.r[adapter_name] = r
        self.lora_alpha[adapter_name] = lora_alpha
        self.scaling[adapter_name] = lora_alpha / r
        self.lora_bias[adapter_name] = False
        self.use_dora[adapter_name] = False
        self.lora_dropout.update(nn.ModuleDict({adapter_name: nn.Dropout(lora_dropout) if lora_dropout > 0
                                                else nn.Identity()}))

    @staticmethod
    def _merge_dtype(factor: Tensor) -> Optional[torch.dtype]:
        """float32 when ``factor`` is half precision on CPU (as PEFT's Linear: such matmuls are slow or
        unsupported there), else ``None`` (compute in the factor's dtype)."""
        half = factor.dtype in (torch.float16, torch.bfloat16)
        return torch.float32 if factor.device.type == "cpu" and half else None

    def _factors_of(self, adapter: str) -> Optional[Tensor]:
        """The adapter's first factor (its dtype is the adapter's), or ``None`` if this layer lacks ``adapter``."""
        factors = getattr(self, self.adapter_layer_names[0])
        return factors[adapter] if adapter in factors else None

    def adapter_output(self, h: Tensor, adapter: str) -> Tensor:
        """The adapter's contribution ``ΔW h`` (scaled), from the dropped-out input ``h``, without forming ΔW."""
        raise NotImplementedError

    def get_delta_weight(self, adapter: str) -> Tensor:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def merge(self, safe_merge: bool = False, adapter_names: Optional[list[str]] = None) -> None:
        """Add the active adapters' ΔW into the base weight (``safe_merge`` checks for non-finite values first)."""
        adapter_names = check_adapters_to_merge(self, adapter_names)
        for adapter in adapter_names:
            if self._factors_of(adapter) is None:
                continue
            weight = self.get_base_layer().weight
            delta = self.get_delta_weight(adapter).to(weight.dtype)
            if safe_merge:
                merged = weight.data + delta
                if not torch.isfinite(merged).all():
                    raise ValueError(f"NaNs detected in the merged weights. The adapter {adapter} seems to be broken")
                weight.data = merged
            else:
                weight.data += delta
            self.merged_adapters.append(adapter)

    def unmerge(self) -> None:
        """Subtract the merged adapters' ΔW from the base weight again."""
        if not self.merged:
            warnings.warn("Already unmerged. Nothing to do.")
            return
        while self.merged_adapters:
            adapter = self.merged_adapters.pop()
            if self._factors_of(adapter) is not None:
                weight = self.get_base_layer().weight
                weight.data -= self.get_delta_weight(adapter).to(weight.dtype)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """``W x + Σ_active adapter_output(dropout(x))``."""
        if kwargs.pop("adapter_names", None) is not None:
            raise ValueError(f"`adapter_names` (mixed-adapter batches) is not supported by {type(self).__name__}.")
        if self.disable_adapters:
            if self.merged:
                self.unmerge()
            return self.base_layer(x, *args, **kwargs)
        result = self.base_layer(x, *args, **kwargs)
        if self.merged:
            return result
        out_dtype = result.dtype
        for adapter in self.active_adapters:
            factor = self._factors_of(adapter)
            if factor is None:
                continue
            h = self.lora_dropout[adapter](self._cast_input_dtype(x, factor.dtype))
            result = result + self.adapter_output(h, adapter)
        return result.to(out_dtype)
