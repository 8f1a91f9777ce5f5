"""MoRA as a PEFT LoRA layer: ``y = W x + f_decomp(M f_comp(x))`` with one square ``M`` (a high-rank baseline).

The math (``r̂`` from a LoRA budget, the ``"rope"`` / ``"sharing"`` compression pairs) is in
:mod:`lit_lowrank.ops.mora`. ``r`` keeps LoRA's meaning for the *budget*, as for SaMA: a MoRA layer gets
``r̂ = ⌊√((in + out)·r)⌋``, at most the parameters of a rank-``r`` LoRA, so ``method="mora"`` with the same ``rank``
is the parameter-matched high-rank baseline of ``lora_variants``. ``M`` starts at 0 (``ΔW = 0``).

Scale (**decision**, the reference's): ``ΔW`` is *not* multiplied by ``α/r`` (MoRA's code uses scaling 1; a square
``M`` has no rank to normalise by); ``lora_alpha`` is recorded but unused.

.. code-block:: python

    from lit_lowrank.adapters import inject_adapters

    inject_adapters(model, method="mora", target_modules=["query", "value"], rank=8)            # LoRA-8 budget
    inject_adapters(model, method="mora", target_modules=["fc1"], rank=8, mora_type="sharing")
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora.layer import LoraLayer
from torch import Tensor, nn

from lit_lowrank.adapters.variant_layer import VariantLinear
from lit_lowrank.adapters.variants import register_variant
from lit_lowrank.ops.mora import MORA_KINDS, mora_apply, mora_delta_weight, mora_rank


class MoRALinear(VariantLinear):
    """A Linear layer with a MoRA adapter (PEFT custom LoRA module); trainable ``lora_mora_M[adapter]`` ``(r̂, r̂)``.

    Args:
        base_layer: the ``nn.Linear`` to adapt.
        adapter_name: PEFT adapter name.
        config: the ``LoraConfig`` (dropout); ``None`` to use the arguments only.
        r: LoRA-equivalent rank: ``r̂ = ⌊√((in + out)·r)⌋`` (even for ``"rope"``).
        lora_alpha: recorded, not used (scale 1, as MoRA's reference).
        lora_dropout: dropout on the adapter's input.
        mora_type: ``"rope"`` (the paper's Eq. 9, for small ranks; default) or ``"sharing"`` (Eq. 6).
        mora_rank: explicit ``r̂`` instead of the LoRA-matched one.

    .. code-block:: python

        layer = MoRALinear(nn.Linear(64, 64), "default", r=4)
        layer.lora_mora_M["default"].shape      # (22, 22)
    """

    variant_name = "MoRA"
    adapter_layer_names: tuple[str, ...] = ("lora_mora_M",)
    other_param_names: tuple[str, ...] = ("r", "lora_alpha", "scaling", "lora_dropout", "mora_kind")

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: Any = None, r: int = 8,
                 lora_alpha: float = 8, lora_dropout: float = 0.0, mora_type: str = "rope",
                 mora_rank: int | None = None, **kwargs: Any) -> None:
        if mora_type not in MORA_KINDS:
            raise ValueError(f"`mora_type`={mora_type!r}: expected one of {MORA_KINDS}.")
        if mora_rank is not None and (not isinstance(mora_rank, int) or mora_rank < 1
                                      or (mora_type == "rope" and mora_rank % 2)):
            raise ValueError(f"`mora_rank`={mora_rank!r}: expected a positive integer (even for mora_type='rope').")
        super().__init__()
        LoraLayer.__init__(self, base_layer, **kwargs)
        if getattr(config, "fan_in_fan_out", False):
            raise ValueError("`fan_in_fan_out`=True (GPT-2 Conv1D) is not supported by MoRALinear; it adapts nn.Linear.")
        self.lora_mora_M = nn.ParameterDict({})
        self.mora_kind: dict[str, str] = {}
        self._mora_kwargs = {"mora_type": mora_type, "mora_rank": mora_rank}
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config, lora_dropout=lora_dropout)

    def update_layer(self, adapter_name: str, r: int, lora_alpha: float, config: Any = None,  # type: ignore[override]
                     lora_dropout: float = 0.0, **kwargs: Any) -> None:
        """Create adapter ``adapter_name`` with ``M = 0``."""
        self._check_linear_and_rank(r)
        self._record_lora_settings(adapter_name, r, lora_alpha, config, lora_dropout)
        self.scaling[adapter_name] = 1.0
        kind = self._mora_kwargs["mora_type"]
        r_hat = self._mora_kwargs["mora_rank"] or mora_rank(self.in_features, self.out_features, r, kind)
        weight = self.get_base_layer().weight
        self.lora_mora_M[adapter_name] = nn.Parameter(torch.zeros(r_hat, r_hat, device=weight.device))
        self.mora_kind[adapter_name] = kind
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters)

    def get_delta_weight(self, adapter: str) -> Tensor:
        """The explicit ``ΔW: (out, in)`` (for merging and diagnostics)."""
        m = self.lora_mora_M[adapter]
        work = self._merge_dtype(m)
        delta = mora_delta_weight(m if work is None else m.to(work), self.in_features, self.out_features,
                                  self.mora_kind[adapter])
        return delta.to(m.dtype)

    def adapter_output(self, h: Tensor, adapter: str) -> Tensor:
        """``f_decomp(M f_comp(h))`` without forming ΔW."""
        return mora_apply(h, self.lora_mora_M[adapter], self.out_features, self.mora_kind[adapter])

    def __repr__(self) -> str:
        return "mora." + super().__repr__()


register_variant("mora", MoRALinear)
