"""Route recording and replay for transformers' sparse-MoE routers (no Lightning).

Supported routers (transformers 5.x): ``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``,
``MixtralTopKRouter``, ``OlmoeTopKRouter`` — every one maps hidden states ``(T, H)`` to
``(router_logits (T, E), top_k_weights (T, k), top_k_index (T, k))``: softmax over the ``E`` logits
in float32, ``torch.topk`` of the probabilities, then (Mixtral always; the others when
``config.norm_topk_prob``) renormalised to sum to 1 over the ``k`` chosen experts. Their sparse-MoE
block (``.gate`` = router, ``.experts`` = the 3-D ``gate_up_proj``/``down_proj`` weights) passes
the weights and indices to the experts, so a forward hook on the router that returns new
``(weights, index)`` changes which experts run, for every family alike.

:class:`RouteController` attaches one hook per router and is switched between modes:

- ``"off"``: nothing happens (the hook returns ``None``).
- ``"record"``: each router call's top-k indices are appended to ``routes[layer]``.
- ``"replay"``: in the layers of ``replay_layers``, the ``i``-th call of a router uses the
  recorded indices of its ``i``-th recorded call; the weights are recomputed from the *current*
  logits over the replayed experts (softmax, gathered, renormalised as the router does), so the
  gate weights stay those of the frozen router on the current hidden states. Other layers route
  themselves. In every layer the router's own choice is compared with the recorded one
  (``agreement``) before it is overridden.
- ``"observe"``: route normally, but compare with the recorded routes (agreement only).

.. code-block:: python

    ctl = RouteController(model)
    with ctl.mode("record"):
        fp_logits = model(input_ids).logits          # full-precision pass
    with ctl.mode("replay"):
        q_logits = quantized_forward(input_ids)      # same routes as the FP pass
    ctl.agreement_per_layer()                        # top-k overlap of the model's own choice
    ctl.remove()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["RouteController", "find_moe_blocks", "is_moe_router", "topk_agreement"]

#: Router classes whose output contract the hooks rely on (checked by tests on tiny configs).
SUPPORTED_ROUTERS = ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "MixtralTopKRouter", "OlmoeTopKRouter")


def is_moe_router(module: nn.Module) -> bool:
    """A top-k router with the ``(logits, weights, index)`` output contract."""
    return type(module).__name__ in SUPPORTED_ROUTERS or (
        type(module).__name__.endswith("TopKRouter") and hasattr(module, "top_k") and hasattr(module, "weight"))


def find_moe_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Sparse-MoE blocks of ``model``: modules with a supported router ``.gate`` and 3-D expert weights.

    Raises:
        ValueError: when the model has none (naming the router classes supported).

    .. code-block:: python

        [name for name, _ in find_moe_blocks(model)]   # ['model.layers.0.mlp', 'model.layers.1.mlp']
    """
    found = []
    for name, module in model.named_modules():
        gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        if isinstance(gate, nn.Module) and is_moe_router(gate) and isinstance(experts, nn.Module):
            found.append((name, module))
    if not found:
        raise ValueError(f"{type(model).__name__} has no sparse-MoE block (a module with a `.gate` router among "
                         f"{SUPPORTED_ROUTERS} and `.experts`); expected a transformers MoE model such as "
                         "Qwen3-MoE, Mixtral or OLMoE.")
    return found


def topk_agreement(a: Tensor, b: Tensor) -> Tensor:
    """Per-token top-k agreement ``|S_a ∩ S_b| / k`` of two index tensors ``(T, k)`` (order ignored)."""
    if a.shape != b.shape:
        raise ValueError(f"topk_agreement: shapes {tuple(a.shape)} and {tuple(b.shape)} differ.")
    return (a[:, :, None] == b[:, None, :]).any(-1).float().mean(-1)


def _normalizes(router: nn.Module) -> bool:
    # Mixtral always renormalises the top-k weights and has no flag; the others read norm_topk_prob
    return bool(getattr(router, "norm_topk_prob", True))


class RouteController:
    """Record / replay / observe the routes of every MoE router of ``model`` (see the module docstring).

    Args:
        model: a transformers MoE model (or a module containing one).

    Attributes:
        routers: ``layer index -> router``, in model order.
        routes: ``layer -> list of recorded (T, k) index tensors`` (one per router call).
        replay_layers: layers replayed in ``"replay"`` mode (default: all).
    """

    def __init__(self, model: nn.Module) -> None:
        self.names = [name for name, _ in find_moe_blocks(model)]
        self.routers = {i: block.gate for i, (_, block) in enumerate(find_moe_blocks(model))}
        self.replay_layers: set[int] = set(self.routers)
        self.routes: dict[int, list[Tensor]] = {i: [] for i in self.routers}
        self._mode = "off"
        self._cursor: dict[int, int] = {}
        self._agree: dict[int, list[Tensor]] = {}
        self._handles = [r.register_forward_hook(self._hook_for(i)) for i, r in self.routers.items()]

    # ------------------------------------------------------------------ control
    @contextlib.contextmanager
    def mode(self, mode: str) -> Iterator[RouteController]:
        """Switch to ``mode`` (``off``/``record``/``replay``/``observe``) inside the block.

        ``record`` clears previous routes; ``replay``/``observe`` reset the call cursors and the
        agreement statistics.
        """
        self.set_mode(mode)
        try:
            yield self
        finally:
            self.set_mode("off")

    def set_mode(self, mode: str) -> None:
        if mode not in ("off", "record", "replay", "observe"):
            raise ValueError(f"`mode`={mode!r}: expected 'off', 'record', 'replay' or 'observe'.")
        if mode == "record":
            self.routes = {i: [] for i in self.routers}
        if mode in ("replay", "observe"):
            self._cursor = {i: 0 for i in self.routers}
            self._agree = {i: [] for i in self.routers}
        self._mode = mode

    def remove(self) -> None:
        """Detach the hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def freeze_routers(self) -> int:
        """``requires_grad_(False)`` on every router parameter; returns how many were frozen."""
        n = 0
        for router in self.routers.values():
            for p in router.parameters():
                p.requires_grad_(False)
                n += 1
        return n

    # ------------------------------------------------------------------ statistics
    def agreement_per_layer(self) -> dict[int, float]:
        """Mean top-k agreement of each layer's own choice with the recorded routes (last replay/observe)."""
        return {i: float(torch.cat(v).mean()) for i, v in self._agree.items() if v}

    def expert_load(self) -> dict[int, Tensor]:
        """Fraction of routed (token, slot) pairs per expert, from the recorded routes: ``layer -> (E,)``."""
        out = {}
        for i, calls in self.routes.items():
            if calls:
                idx = torch.cat([c.reshape(-1) for c in calls])
                counts = torch.bincount(idx.cpu(), minlength=self.routers[i].num_experts).double()
                out[i] = counts / counts.sum().clamp_min(1)
        return out

    # ------------------------------------------------------------------ the hook
    def _hook_for(self, layer: int):
        def hook(router: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if self._mode == "off":
                return None
            logits, weights, index = output
            if self._mode == "record":
                self.routes[layer].append(index.detach().clone())
                return None
            calls = self.routes[layer]
            i = self._cursor[layer]
            if i >= len(calls):
                raise RuntimeError(f"RouteController: layer {layer} ({self.names[layer]}) made router call {i + 1} but "
                                   f"only {len(calls)} were recorded; record on the same batch before replaying.")
            recorded = calls[i].to(index.device)
            if recorded.shape != index.shape:
                raise RuntimeError(f"RouteController: layer {layer} routes {tuple(index.shape)} tokens x top-k, the "
                                   f"recorded call has {tuple(recorded.shape)}; replay needs the recorded batch.")
            self._cursor[layer] = i + 1
            self._agree[layer].append(topk_agreement(index.detach(), recorded).cpu())
            if self._mode == "observe" or layer not in self.replay_layers:
                return None
            probs = torch.softmax(logits.float(), dim=-1)
            new_weights = probs.gather(-1, recorded)
            if _normalizes(router):
                new_weights = new_weights / new_weights.sum(-1, keepdim=True)
            return logits, new_weights.to(weights.dtype), recorded

        return hook


def replay_schedule(step: int, total: int, start: float, end: float, schedule: str) -> float:
    """Replay probability at ``step`` of ``total``: ``constant`` (= ``start``), ``linear`` or ``cosine``
    annealing from ``start`` to ``end`` (held at ``end`` after ``total``).

    .. code-block:: python

        replay_schedule(50, 100, 1.0, 0.0, "linear")   # 0.5
    """
    if schedule not in ("constant", "linear", "cosine"):
        raise ValueError(f"`schedule`={schedule!r}: expected 'constant', 'linear' or 'cosine'.")
    if schedule == "constant" or total <= 0:
        return float(start)
    t = min(max(step / total, 0.0), 1.0)
    if schedule == "linear":
        return float(start + (end - start) * t)
    import math

    return float(end + (start - end) * 0.5 * (1 + math.cos(math.pi * t)))


def select_layers(num_layers: int, layers: Sequence[int] | float | None) -> set[int]:
    """Replayed MoE layers: ``None`` = all, a list of indices, or a fraction ``f`` = the deepest
    ``ceil(f * L)`` layers (routing drift accumulates with depth, so the deepest layers flip most).

    .. code-block:: python

        select_layers(8, 0.25)   # {6, 7}
    """
    import math

    if layers is None:
        return set(range(num_layers))
    if isinstance(layers, (int, float)) and not isinstance(layers, bool):
        if not 0.0 <= float(layers) <= 1.0:
            raise ValueError(f"`layers`={layers!r}: a fraction must lie in [0, 1] (or pass a list of layer indices).")
        k = math.ceil(float(layers) * num_layers)
        return set(range(num_layers - k, num_layers))
    chosen = {int(i) for i in layers}
    bad = [i for i in chosen if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"`layers`={list(layers)!r}: indices {bad} outside [0, {num_layers}) MoE layers.")
    return chosen
