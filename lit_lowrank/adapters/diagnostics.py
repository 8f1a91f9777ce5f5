"""Adapter diagnostics for every LoRA variant, logged under ``method/<variant>/...``.

Every ``every_n_steps`` optimizer steps, for each adapted ``nn.Linear`` (any PEFT tuner layer with
``get_delta_weight``: LoRA, DoRA, LoKr, SDS-LoRA, SaMA, PoLAR, ...):

- ``delta_erank``: effective rank (Roy & Vetterli) of ``ΔW``, mean over layers; ``delta_stable_rank`` likewise.
- ``grad_erank``: effective rank of each adapter-factor gradient, mean over tensors (2-D as matrices; SaMA's
  3-D stacked blocks as the block-diagonal matrix they form).
- ``induced_cosine``: cosine between the first-order change of ``ΔW`` along the factor gradients (``J·g``, the
  direction plain SGD would move ΔW; :func:`induced_updates`) and the full fine-tuning gradient ``G`` — the
  alignment the SDS-LoRA abstract measures, before any optimizer transform; mean over layers.
- ``update_cosine``: cosine between the update the step actually made to ``ΔW`` (after − before the optimizer
  step, so the optimizer's own transform is included) and ``−G``, the full fine-tuning gradient ``∂L/∂W`` of the
  frozen base weight (``G = Σ gᵀx`` from hooks on the base layer: never a second backward). ``update_cosine`` is
  the unweighted mean over layers, ``update_cosine_global`` the cosine over all layers concatenated
  (METHODS.md "Gradient cosine").
- whatever a layer reports through an optional ``adapter_diagnostics(adapter_name) -> dict[str, float]`` method
  (e.g. PoLAR's orthogonality error), averaged over layers under the same prefix.

The method name is the one :func:`~lit_lowrank.adapters.inject_adapters` recorded, unless given.

.. code-block:: python

    trainer = pl.Trainer(callbacks=[AdapterInjector(method="sds_lora", target_modules=["query", "value"]),
                                    AdapterDiagnostics(every_n_steps=20)])
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lit_lowrank.adapters.injector import adapter_method, named_adapter_layers
from lit_lowrank.core.logging import log_method
from lit_lowrank.ops.grad_cosine import gradient_cosine
from lit_lowrank.ops.lowrank import effective_rank_of, stable_rank_of


def adapted_linears(model: nn.Module, adapter_name: str = "default") -> list[tuple[str, nn.Module]]:
    """``(name, layer)`` for every adapted ``nn.Linear`` whose layer can report ``ΔW`` (``get_delta_weight``)."""
    return [(n, m) for n, m in named_adapter_layers(model, adapter_name)
            if isinstance(m.get_base_layer(), nn.Linear) and hasattr(m, "get_delta_weight")]


def delta_weights(model: nn.Module, adapter_name: str = "default") -> dict[str, Tensor]:
    """``ΔW`` (float32, detached) of every adapted Linear, by layer name.

    .. code-block:: python

        before = delta_weights(model); optimizer.step(); after = delta_weights(model)
    """
    with torch.no_grad():
        return {n: m.get_delta_weight(adapter_name).detach().float().clone()
                for n, m in adapted_linears(model, adapter_name)}


def _gradient_erank(grad: Tensor) -> float:
    """Effective rank of one factor gradient: a matrix as is; a stack ``(k, a, b)`` (SaMA's ``B``) as the block
    diagonal ``blockdiag(G_1..G_k)`` it contributes — the singular values of all blocks pooled."""
    g = grad.detach().float()
    if g.ndim == 2:
        return float(effective_rank_of(g))
    s = torch.linalg.svdvals(g).flatten()
    total = s.sum()
    if total <= 1e-12:
        return 0.0
    p = s / total
    return float(torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum()))


def _adapter_params(layer: nn.Module, adapter_name: str) -> list[tuple[str, nn.Parameter]]:
    """``(name relative to the layer, parameter)`` of ``adapter_name``'s trainable factors."""
    out = []
    for attr in layer.adapter_layer_names:
        container = getattr(layer, attr, None)
        if not isinstance(container, (nn.ModuleDict, nn.ParameterDict)) or adapter_name not in container:
            continue
        item = container[adapter_name]
        if isinstance(item, nn.Module):
            out += [(f"{attr}.{adapter_name}.{n}", p) for n, p in item.named_parameters() if p.requires_grad]
        elif item.requires_grad:
            out.append((f"{attr}.{adapter_name}", item))
    return out


def adapter_gradient_eranks(model: nn.Module, adapter_name: str = "default") -> list[float]:
    """Effective rank of every adapter-factor gradient of ``model`` with at least two non-trivial axes.

    2-D gradients (LoRA's ``A``, ``B``, PoLAR's ``X``, ``Θ``, ``Y``, MoRA's ``M``, SaMA's ``A``) as matrices; 3-D ones
    (SaMA's stacked blocks ``B: (m1, m2, q)``) as the block-diagonal matrix they form in ``ΔW``."""
    ranks = []
    for _, layer in adapted_linears(model, adapter_name):
        for _, p in _adapter_params(layer, adapter_name):
            g = p.grad
            if g is not None and g.ndim in (2, 3) and min(g.shape[-2:]) > 1:
                ranks.append(_gradient_erank(g))
    return ranks


class _DeltaOf(nn.Module):
    """``forward() = layer.get_delta_weight(adapter)``, so ``torch.func`` can differentiate ΔW in the factors."""

    def __init__(self, layer: nn.Module, adapter: str) -> None:
        super().__init__()
        self.layer, self.adapter = layer, adapter

    def forward(self) -> Tensor:
        return self.layer.get_delta_weight(self.adapter)


def induced_updates(model: nn.Module, adapter_name: str = "default") -> dict[str, Tensor]:
    """The first-order change of every adapted layer's ΔW along its factors' current gradients, ``J·g``.

    ``J`` is the Jacobian of ``get_delta_weight`` in the adapter factors (forward-mode AD, any variant) and ``g``
    the gradients in ``.grad`` — for SDS-LoRA its own (SDS) gradients. A plain-SGD step moves ΔW by ``−lr·J·g``:
    the "low-rank approximation of the full fine-tuning gradient" of the SDS-LoRA abstract, free of any
    optimizer's per-coordinate scaling. Layers without gradients are skipped.

    .. code-block:: python

        loss.backward(); moves = induced_updates(model)      # {layer: (out, in)}
    """
    from torch.func import functional_call, jvp

    out: dict[str, Tensor] = {}
    for name, layer in adapted_linears(model, adapter_name):
        params = [(n, p) for n, p in _adapter_params(layer, adapter_name) if p.grad is not None]
        if not params:
            continue
        wrapper = _DeltaOf(layer, adapter_name)
        names = [f"layer.{n}" for n, _ in params]

        def delta(*values: Tensor, _names=names, _wrapper=wrapper) -> Tensor:
            return functional_call(_wrapper, dict(zip(_names, values)), ())

        primals = tuple(p.detach() for _, p in params)
        tangents = tuple(p.grad.detach().to(p.dtype) for _, p in params)
        out[name] = jvp(delta, primals, tangents)[1].detach().float()
    return out


def induced_cosine(model: nn.Module, full_grads: dict[str, Tensor], adapter_name: str = "default") -> Any:
    """Cosine between ``J·g`` (:func:`induced_updates`) and the full fine-tuning gradient ``G`` per layer
    (``GradientCosine``: per tensor, mean, global) — the SDS-LoRA abstract's gradient alignment."""
    moves = induced_updates(model, adapter_name)
    names = [n for n in moves if n in full_grads]
    if not names:
        raise ValueError("induced_cosine: no adapted layer has both a factor gradient and a captured full gradient.")
    return gradient_cosine({n: moves[n] for n in names}, {n: full_grads[n] for n in names}, names)


class FullGradientCapture:
    """Context manager: the full fine-tuning gradient ``G = ∂L/∂W`` of each adapted Linear's frozen base weight.

    Hooks sit on the adapted layer (its output carries ``∂L/∂(W x)`` even when the frozen base's own output has no
    grad); ``G = Σ gᵀ x`` over the backward passes run inside the context (micro-batches add up).

    .. code-block:: python

        with FullGradientCapture(model) as cap:
            loss.backward()
        cap.grads["encoder.layer.0.attention.self.query"]   # (out, in)
    """

    def __init__(self, model: nn.Module, adapter_name: str = "default") -> None:
        self.model, self.adapter_name = model, adapter_name
        self.grads: dict[str, Tensor] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> FullGradientCapture:
        for name, layer in adapted_linears(self.model, self.adapter_name):
            self._handles.append(layer.register_forward_hook(self._hook(name)))
        return self

    def _hook(self, name: str):
        def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
            if not torch.is_grad_enabled() or not output.requires_grad:
                return
            x = args[0].detach()

            def grad_hook(g: Tensor) -> None:
                full = g.detach().reshape(-1, g.shape[-1]).float().t() @ x.reshape(-1, x.shape[-1]).float()
                self.grads[name] = self.grads[name] + full if name in self.grads else full

            output.register_hook(grad_hook)
        return hook

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __exit__(self, *exc: Any) -> None:
        self.close()


def update_cosine(before: dict[str, Tensor], after: dict[str, Tensor], full_grads: dict[str, Tensor]) -> Any:
    """Cosine between the step's change of ``ΔW`` and ``−G`` per layer (``GradientCosine``: per tensor, mean,
    global), over the layers present in all three mappings."""
    names = [n for n in after if n in before and n in full_grads]
    if not names:
        raise ValueError("update_cosine: no layer has ΔW before/after and a captured full gradient.")
    return gradient_cosine({n: after[n] - before[n] for n in names}, {n: -full_grads[n] for n in names}, names)


class AdapterDiagnostics(pl.Callback):
    """Effective ranks of ``ΔW`` and of the adapter gradients, and the update–full-gradient cosine.

    Args:
        every_n_steps: measure on every ``every_n_steps``-th optimizer step (steps n, 2n, ...; each measurement
            costs one SVD per adapted layer and tensor).
        method: logging prefix (default: the injected method's name).
        adapter_name: the PEFT adapter to inspect.
        full_gradient: also capture ``∂L/∂W`` of the frozen base weights for ``update_cosine`` (stores each
            adapted layer's input on the measured steps).

    .. code-block:: python

        diag = AdapterDiagnostics(every_n_steps=10)
        pl.Trainer(callbacks=[injector, diag]).fit(module, datamodule=data)
        diag.last        # {"delta_erank": ..., "grad_erank": ..., "update_cosine": ...}
    """

    def __init__(self, every_n_steps: int = 25, method: str | None = None, adapter_name: str = "default",
                 full_gradient: bool = True) -> None:
        if every_n_steps < 1:
            raise ValueError(f"`every_n_steps`={every_n_steps!r}: expected a positive integer.")
        self.every_n_steps, self.method, self.adapter_name = every_n_steps, method, adapter_name
        self.full_gradient = full_gradient
        self.last: dict[str, float] = {}
        self._active = False
        self._capture: FullGradientCapture | None = None
        self._before: dict[str, Tensor] = {}
        self._pending: dict[str, float] = {}

    def _prefix(self, pl_module: nn.Module) -> str:
        return self.method or adapter_method(pl_module, self.adapter_name) or "adapter"

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        # measured after every n-th step (not at step 0: ΔW = 0 there, and a one-step smoke run stays cheap)
        if (trainer.global_step + 1) % self.every_n_steps != 0 or self._active:
            return
        self._active = True
        self._pending, self._before = {}, {}
        if self.full_gradient:
            self._capture = FullGradientCapture(pl_module, self.adapter_name).__enter__()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if not self._active:
            return
        if self._capture is not None:
            self._capture.close()
        granks = adapter_gradient_eranks(pl_module, self.adapter_name)
        if granks:
            self._pending["grad_erank"] = sum(granks) / len(granks)
        if self._capture is not None and self._capture.grads:
            cos = induced_cosine(pl_module, self._capture.grads, self.adapter_name)
            self._pending["induced_cosine"] = cos.mean
        self._before = delta_weights(pl_module, self.adapter_name)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._active or not self._before:
            return  # gradient accumulation: wait for the optimizer step
        self._active = False
        after = delta_weights(pl_module, self.adapter_name)
        values = dict(self._pending)
        eranks = [float(effective_rank_of(d)) for d in after.values()]
        sranks = [float(stable_rank_of(d)) for d in after.values()]
        if eranks:
            values["delta_erank"] = sum(eranks) / len(eranks)
            values["delta_stable_rank"] = sum(sranks) / len(sranks)
        grads = self._capture.grads if self._capture is not None else {}
        if any(n in grads for n in after):
            cos = update_cosine(self._before, after, grads)
            values["update_cosine"], values["update_cosine_global"] = cos.mean, cos.global_cosine
        extras: dict[str, list[float]] = {}
        for _, layer in adapted_linears(pl_module, self.adapter_name):
            report = getattr(layer, "adapter_diagnostics", None)
            if callable(report):
                for key, value in report(self.adapter_name).items():
                    extras.setdefault(key, []).append(float(value))
        values.update({k: sum(v) / len(v) for k, v in extras.items()})
        self._before, self._pending, self._capture = {}, {}, None
        self.last = values
        prefix = self._prefix(pl_module)
        for key, value in values.items():
            log_method(pl_module, prefix, key, float(value))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._capture is not None:
            self._capture.close()
        self._active, self._capture = False, None
