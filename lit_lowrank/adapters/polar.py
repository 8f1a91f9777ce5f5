"""PoLAR as a PEFT LoRA layer: ``y = W x + (α/r) · X Θ Yᵀ x`` with X, Y near-orthonormal and Θ free.

The math (landing field, init, stable rank) is in :mod:`lit_lowrank.ops.polar`; the landing step that keeps X and Y
near the Stiefel manifold is :class:`lit_lowrank.adapters.polar_landing.PoLARLanding` (a callback) or
:func:`lit_lowrank.adapters.polar_landing.apply_landing_` (the functional form). Without either, X and Y are
trained with their plain Euclidean gradients and drift off the manifold (the "PoLAR without landing" ablation).

.. code-block:: python

    from lit_lowrank.adapters import inject_adapters, PoLARLanding

    inject_adapters(model, method="polar", target_modules=["query", "value"], rank=8, alpha=8)
    trainer = L.Trainer(callbacks=[PoLARLanding(lam=5e-3)])
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import torch
from peft.tuners.lora.layer import LoraLayer
from peft.utils.other import transpose
from torch import Tensor, nn

from lit_lowrank.adapters.variant_layer import VariantLinear
from lit_lowrank.adapters.variants import register_variant
from lit_lowrank.ops.polar import polar_delta_weight, polar_init_, polar_stable_rank


class PoLARLandingWarning(UserWarning):
    """PoLAR factors were stepped by an optimizer without the landing step (they drift off the manifold)."""


_NO_LANDING = (
    "PoLAR adapters were updated by the optimizer without their landing step: X and Y leave the Stiefel manifold "
    "(‖XᵀX − I‖_F grows without bound; 20.8 after 300 AdamW steps in issue #29) and the update is not PoLAR's. "
    "Add `lit_lowrank.adapters.PoLARLanding(lam=...)` to the Trainer's callbacks, or call "
    "`lit_lowrank.adapters.apply_landing_(model, lam)` between `loss.backward()` and `optimizer.step()`. "
    "(For the no-landing ablation, filter lit_lowrank.adapters.polar.PoLARLandingWarning.)"
)


class PoLARLinear(VariantLinear):
    """A Linear layer with a PoLAR adapter ``ΔW = (α/r) X Θ Yᵀ`` (PEFT custom LoRA module).

    Trainable per adapter: ``lora_X[adapter]`` ``(out, r)`` and ``lora_Y[adapter]`` ``(in, r)`` with orthonormal
    columns at init, and ``lora_theta[adapter]`` ``(r, r)``, zero at init so ``ΔW = 0`` and the output is unchanged.
    The forward never forms ΔW: ``x → (x Y) (X Θ)ᵀ`` with ``X Θ`` formed once per call, two thin matmuls per
    token like LoRA.
    X and Y are stored "tall" (columns on the manifold), unlike LoRA's ``lora_A (r, in)``, so that the landing field
    applies to them directly.

    Built by PEFT through ``LoraConfig._register_custom_module({nn.Linear: PoLARLinear})`` (the injector does this
    for ``method="polar"``); ``merge`` / ``unmerge`` / ``merge_and_unload`` / ``save_pretrained`` work like LoRA's.
    What PEFT cannot express: mixed-adapter batches (``adapter_names=...``) and ``lora_bias`` are refused with an
    error, and PEFT's LoRA-only conversions (``scale_layer``, which keys on ``lora_A``) do not apply.

    Args:
        base_layer: the ``nn.Linear`` (or GPT-2 ``Conv1D`` with ``fan_in_fan_out``) to adapt.
        adapter_name: PEFT adapter name (``"default"``).
        config: the ``LoraConfig`` (dropout, ``fan_in_fan_out``); ``None`` to use the arguments only.
        r: rank, ``1 <= r <= min(in, out)`` (orthonormal columns need ``r`` at most the dimension).
        lora_alpha: ``ΔW`` is scaled by ``lora_alpha / r``.
        lora_dropout: dropout on the adapter's input; when 0 and ``config`` is given, ``config.lora_dropout``.

    .. code-block:: python

        layer = PoLARLinear(nn.Linear(64, 32), "default", r=4, lora_alpha=4)
        x, theta, y = layer.polar_factors("default")
    """

    adapter_layer_names: tuple[str, ...] = ("lora_X", "lora_theta", "lora_Y")
    variant_name = "PoLAR"
    other_param_names: tuple[str, ...] = ("r", "lora_alpha", "scaling", "lora_dropout")

    def __init__(
        self,
        base_layer: nn.Module,
        adapter_name: str,
        config: Any = None,
        r: int = 8,
        lora_alpha: float = 8,
        lora_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        # PEFT passes bookkeeping kwargs (target_name, loaded_in_8bit, tied_adapter, ...): LoraLayer keeps them.
        LoraLayer.__init__(self, base_layer, **kwargs)
        self.lora_X = nn.ParameterDict({})
        self.lora_theta = nn.ParameterDict({})
        self.lora_Y = nn.ParameterDict({})
        self.fan_in_fan_out = bool(getattr(config, "fan_in_fan_out", False))
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
        """Create adapter ``adapter_name``: orthonormal X, Y and ``Θ = 0`` (PEFT calls this for added adapters).

        Raises:
            ValueError: ``r`` not an integer in ``[1, min(in, out)]``, ``lora_alpha`` not positive, a
                ``config`` asking for ``lora_bias`` / DoRA, or a base layer without in/out features.
        """
        self._check_linear_and_rank(r)
        self._record_lora_settings(adapter_name, r, lora_alpha, config, lora_dropout)
        weight = self.get_base_layer().weight
        # the factors start in float32 on the base weight's device; PEFT's helper below casts them like LoRA's
        factory = {"device": weight.device, "dtype": torch.float32}
        x = torch.empty(self.out_features, r, **factory)
        theta = torch.empty(r, r, **factory)
        y = torch.empty(self.in_features, r, **factory)
        polar_init_(x, theta, y)
        self.lora_X[adapter_name] = nn.Parameter(x)
        self.lora_theta[adapter_name] = nn.Parameter(theta)
        self.lora_Y[adapter_name] = nn.Parameter(y)
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters)

    def polar_factors(self, adapter: str = "default") -> tuple[Tensor, Tensor, Tensor]:
        """``(X (out, r), Θ (r, r), Y (in, r))`` of ``adapter`` (the live parameters)."""
        if adapter not in self.lora_X:
            raise KeyError(f"`adapter`={adapter!r} is not an adapter of this layer; it has {list(self.lora_X)}.")
        return self.lora_X[adapter], self.lora_theta[adapter], self.lora_Y[adapter]

    def get_delta_weight(self, adapter: str) -> Tensor:
        """``ΔW = (α/r) X Θ Yᵀ`` in the base weight's layout (transposed for ``fan_in_fan_out``)."""
        x, theta, y = self.polar_factors(adapter)
        work = self._merge_dtype(x)
        if work is not None:
            x, theta, y = x.to(work), theta.to(work), y.to(work)
        delta = transpose(polar_delta_weight(x, theta, y, self.scaling[adapter]), self.fan_in_fan_out)
        return delta.to(self.lora_X[adapter].dtype)

    #: landing steps applied to this layer (counted by :func:`~lit_lowrank.adapters.polar_landing.apply_landing_`)
    landing_steps: int = 0

    def _check_landing(self, factor: Tensor) -> None:
        """Warn once when X changed since the last training forward (an optimizer step) with no landing step
        in between, twice in a row (one change without landing is a ``load_state_dict``)."""
        if not (self.training and torch.is_grad_enabled() and factor.requires_grad):
            return
        seen = self.__dict__.get("_landing_seen")
        now = (factor._version, self.landing_steps)
        self.__dict__["_landing_seen"] = now
        if seen is None or seen[0] == now[0]:
            return  # first forward, or no step since (gradient accumulation, several forwards per step)
        strikes = 0 if now[1] != seen[1] else self.__dict__.get("_landing_strikes", 0) + 1
        self.__dict__["_landing_strikes"] = strikes
        if strikes >= 2 and not self.__dict__.get("_landing_warned"):
            self.__dict__["_landing_warned"] = True
            warnings.warn(_NO_LANDING, PoLARLandingWarning, stacklevel=3)

    def adapter_output(self, h: Tensor, adapter: str) -> Tensor:
        """``(α/r) X Θ Yᵀ h`` without forming ΔW."""
        fx, theta, fy = self.polar_factors(adapter)
        self._check_landing(fx)
        # fold Θ into X once per call (out·r² flops) so each token pays two thin matmuls, like LoRA
        return ((h @ fy) @ (fx @ theta).T) * self.scaling[adapter]

    def __repr__(self) -> str:
        return "polar." + super().__repr__()


def polar_layers(model: nn.Module) -> Iterator[tuple[str, PoLARLinear]]:
    """``(qualified name, layer)`` for every :class:`PoLARLinear` in ``model``.

    .. code-block:: python

        for name, layer in polar_layers(model):
            print(name, layer.r)
    """
    for name, module in model.named_modules():
        if isinstance(module, PoLARLinear):
            yield name, module


def polar_delta_stable_rank(layer: PoLARLinear, adapter: str = "default") -> float:
    """Stable rank ``‖ΔW‖²_F / ‖ΔW‖²₂`` of the layer's ``ΔW`` (0 while ``ΔW = 0``), exact from an r×r core.

    .. code-block:: python

        polar_delta_stable_rank(model.encoder.layer[0].attention.self.query)
    """
    if not isinstance(layer, PoLARLinear):
        raise TypeError(f"`layer` must be a PoLARLinear, got {type(layer).__name__}")
    return float(polar_stable_rank(*layer.polar_factors(adapter)))


register_variant("polar", PoLARLinear)
