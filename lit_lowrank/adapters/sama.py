"""SaMA as a PEFT LoRA layer: ``y = W x + (α/r) · blockdiag(B_1..B_m1)(A ⊗ I_q) x``, never forming ΔW.

The math (shapes from a parameter budget, fast apply, explicit ΔW, rank report) is in :mod:`lit_lowrank.ops.sama`.
``r`` keeps LoRA's meaning for the *budget*: by default a SaMA layer gets at most the parameters of a rank-``r``
LoRA on the same layer, ``r·(in + out)``, and spends them on the shape of highest rank
(:func:`~lit_lowrank.ops.sama.sama_matched_to_lora`), so ``method="sama"`` and ``method="lora"`` with the same
``rank`` are a matched-parameter pair. ``budget=`` or an explicit ``num_blocks`` + ``block_cols`` override this.
The update is scaled by ``lora_alpha / r`` like LoRA (**decision**: the same α/r keeps one learning rate meaningful
for both; with ``B = 0`` at init the first step of ``B`` sees an input of LoRA's scale because ``A`` is
orthonormal).

:class:`~lit_lowrank.adapters.diagnostics.AdapterDiagnostics` logs ``method/sama/...`` (effective rank of ΔW and of
the adapter gradients, update–full-gradient cosine) plus this layer's :meth:`SaMALinear.adapter_diagnostics`.

What PEFT cannot express: mixed-adapter batches (``adapter_names=...``), ``lora_bias``, DoRA on top and PEFT's
LoRA-only helpers keyed on ``lora_A`` (``scale_layer``) are refused or do not apply.

.. code-block:: python

    from lit_lowrank.adapters import inject_adapters

    inject_adapters(model, method="sama", target_modules=["query", "value"], rank=8, alpha=16)  # LoRA-8 budget
    inject_adapters(model, method="sama", target_modules=["fc1"], rank=4, budget=20_000)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from peft.tuners.lora.layer import LoraLayer
from torch import Tensor, nn

from lit_lowrank.adapters.variant_layer import VariantLinear
from lit_lowrank.adapters.variants import register_variant
from lit_lowrank.ops.sama import SaMAShape, lora_budget, sama_apply, sama_delta_weight, sama_init, sama_shape


class SaMALinear(VariantLinear):
    """A Linear layer with a SaMA adapter ``ΔW = (α/r) blockdiag(B_i)(A ⊗ I_q)`` (PEFT custom LoRA module).

    Trainable per adapter: ``lora_sama_A[adapter]`` ``(m1, n1)`` (orthonormal rows or columns at init) and
    ``lora_sama_B[adapter]`` ``(m1, m2, q)`` (zero at init, so ``ΔW = 0`` and the output is unchanged). The forward
    costs one multiply–add per parameter and row, like LoRA. Built by PEFT through
    ``LoraConfig._register_custom_module({nn.Linear: SaMALinear})`` (the injector does this for ``method="sama"``);
    ``merge`` / ``unmerge`` / ``merge_and_unload`` / ``save_pretrained`` work like LoRA's.

    Args:
        base_layer: the ``nn.Linear`` to adapt.
        adapter_name: PEFT adapter name (``"default"``).
        config: the ``LoraConfig`` (dropout); ``None`` to use the arguments only.
        r: LoRA-equivalent rank: the default budget is ``r·(in + out)`` parameters and the scale ``lora_alpha / r``.
        lora_alpha: ΔW is scaled by ``lora_alpha / r``.
        lora_dropout: dropout on the adapter's input; when 0 and ``config`` is given, ``config.lora_dropout``.
        budget: parameter budget of the adapter (default ``r·(in + out)``, LoRA-matched).
        num_blocks: explicit ``m1`` (with ``block_cols``) instead of choosing the shape from the budget.
        block_cols: explicit ``q``.

    .. code-block:: python

        layer = SaMALinear(nn.Linear(64, 32), "default", r=4, lora_alpha=4)
        layer.sama_shape["default"].generic_rank     # >> 4 at the parameters of a rank-4 LoRA
    """

    variant_name = "SaMA"
    adapter_layer_names: tuple[str, ...] = ("lora_sama_A", "lora_sama_B")
    other_param_names: tuple[str, ...] = ("r", "lora_alpha", "scaling", "lora_dropout", "sama_shape")

    def __init__(
        self,
        base_layer: nn.Module,
        adapter_name: str,
        config: Any = None,
        r: int = 8,
        lora_alpha: float = 8,
        lora_dropout: float = 0.0,
        budget: int | None = None,
        num_blocks: int | None = None,
        block_cols: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        # PEFT passes bookkeeping kwargs (target_name, loaded_in_8bit, tied_adapter, ...): LoraLayer keeps them.
        LoraLayer.__init__(self, base_layer, **kwargs)
        self.lora_sama_A = nn.ParameterDict({})
        self.lora_sama_B = nn.ParameterDict({})
        self.sama_shape: dict[str, SaMAShape] = {}
        self._sama_kwargs = {"budget": budget, "num_blocks": num_blocks, "block_cols": block_cols}
        if getattr(config, "fan_in_fan_out", False):
            raise ValueError("`fan_in_fan_out`=True (GPT-2 Conv1D) is not supported by SaMALinear; it adapts nn.Linear.")
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config, lora_dropout=lora_dropout)

    def update_layer(  # type: ignore[override]
        self,
        adapter_name: str,
        r: int,
        lora_alpha: float,
        config: Any = None,
        lora_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        """Create adapter ``adapter_name`` with ``B = 0`` (PEFT calls this for added adapters too).

        Raises:
            ValueError: ``r`` not an integer in ``[1, min(in, out)]``, ``lora_alpha`` not positive, a budget too
                small for the layer, an explicit shape larger than the layer, or a config asking for
                ``lora_bias`` / DoRA.
        """
        self._check_linear_and_rank(r)
        self._record_lora_settings(adapter_name, r, lora_alpha, config, lora_dropout)
        budget = self._sama_kwargs["budget"]
        num_blocks, block_cols = self._sama_kwargs["num_blocks"], self._sama_kwargs["block_cols"]
        if budget is None and num_blocks is None:
            budget = lora_budget(self.in_features, self.out_features, r)
        shape = sama_shape(self.in_features, self.out_features, budget, num_blocks=num_blocks, block_cols=block_cols)

        self.sama_shape[adapter_name] = shape
        weight = self.get_base_layer().weight
        # factors start in float32 on the base weight's device; PEFT's helper below casts them like LoRA's
        a, b = sama_init(shape, dtype=torch.float32, device=weight.device)
        self.lora_sama_A[adapter_name] = nn.Parameter(a)
        self.lora_sama_B[adapter_name] = nn.Parameter(b)
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters)

    def sama_factors(self, adapter: str = "default") -> tuple[Tensor, Tensor, SaMAShape]:
        """``(A (m1, n1), B (m1, m2, q), shape)`` of ``adapter`` (the live parameters)."""
        if adapter not in self.lora_sama_A:
            raise KeyError(f"`adapter`={adapter!r} is not an adapter of this layer; it has {list(self.lora_sama_A)}.")
        return self.lora_sama_A[adapter], self.lora_sama_B[adapter], self.sama_shape[adapter]

    def get_delta_weight(self, adapter: str) -> Tensor:
        """The explicit ``ΔW = (α/r) blockdiag(B_i)(A ⊗ I_q)``, ``(out, in)`` (for merging and diagnostics)."""
        a, b, shape = self.sama_factors(adapter)
        dtype, work = a.dtype, self._merge_dtype(a)
        cast = work is not None
        if cast:
            a, b = a.to(work), b.to(work)
        delta = sama_delta_weight(a, b, shape, self.scaling[adapter])
        return delta.to(dtype) if cast else delta

    def adapter_output(self, h: Tensor, adapter: str) -> Tensor:
        """``(α/r) blockdiag(B_i)(A ⊗ I_q) h`` without forming ΔW."""
        a, b, shape = self.sama_factors(adapter)
        return sama_apply(h, a, b, shape, self.scaling[adapter])

    def adapter_diagnostics(self, adapter_name: str = "default") -> dict[str, float]:
        """SaMA's own diagnostics, logged by :class:`~lit_lowrank.adapters.diagnostics.AdapterDiagnostics`.

        ``generic_rank``: the rank the factor shapes allow; ``parameters``: the layer's adapter parameters;
        ``block_energy_cv``: coefficient of variation over blocks of ``‖B_i‖_F · ‖A_{i,:}‖`` (0 while ``B = 0``) —
        invariant under SaMA's only symmetry (``B_i → λ_i B_i``, ``A_{i,:} → A_{i,:}/λ_i``), it shows how unevenly
        the relaxed blocks carry the update (0: all blocks equally used, as in a plain Kronecker product).

        .. code-block:: python

            layer.adapter_diagnostics("default")   # {"generic_rank": 64.0, "parameters": 512.0, ...}
        """
        a, b, shape = self.sama_factors(adapter_name)
        with torch.no_grad():
            energy = b.detach().float().flatten(1).norm(dim=1) * a.detach().float().norm(dim=1)
            mean = float(energy.mean())
            cv = float(energy.std(unbiased=False)) / mean if mean > 0 else 0.0
        return {"generic_rank": float(shape.generic_rank), "parameters": float(shape.num_parameters),
                "block_energy_cv": cv}

    def __repr__(self) -> str:
        return "sama." + super().__repr__()


def sama_layers(model: nn.Module) -> Iterator[tuple[str, SaMALinear]]:
    """``(qualified name, layer)`` for every :class:`SaMALinear` in ``model``.

    .. code-block:: python

        for name, layer in sama_layers(model):
            print(name, layer.sama_shape["default"])
    """
    for name, module in model.named_modules():
        if isinstance(module, SaMALinear):
            yield name, module


register_variant("sama", SaMALinear)
