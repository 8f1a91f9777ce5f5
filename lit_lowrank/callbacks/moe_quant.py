"""MoE quantization as two Lightning callbacks (METHODS.md §19): MXFP4 QAT of the experts with
load-aware low-rank compensators (:class:`MoEQuantQAT`) and limited routing replay
(:class:`RoutingReplay`). Use them together for the method; each alone gives a baseline.

- :class:`MoEQuantQAT` (``setup``, before the optimizers): measures each expert's load on a few
  full-precision calibration batches, allocates compensator ranks under the total budget
  ``avg_rank x (#expert matrices)`` (greedy by marginal load-weighted spectral gain, or uniform),
  swaps every MoE block's experts for :class:`~lit_lowrank.quant.moe.MXFP4Experts` and freezes
  everything except the compensators (the expert-side adapters).
- :class:`RoutingReplay` (every training step): runs the same module with quantization off
  (:func:`~lit_lowrank.quant.moe.fp_reference`, no model copy) under no-grad, records its top-k
  routes and logits, then lets the training step replay those routes in the quantized model
  with the routers frozen, and adds ``kl_weight * KL(p_FP || p_Q)`` on the logits.

**"Limited" replay (decided here).** At step ``t`` routes are replayed with probability
``π(t)`` annealed from ``replay_start`` to ``replay_end`` over ``anneal_steps`` (default: the whole
run, linear), and only in the MoE layers ``layers`` (default: all; a fraction picks the deepest
layers, where routing drift accumulates). Early on, replay gives the compensators clean
FP-aligned targets while their error is largest; later the student increasingly trains on its
own routes, the only ones it has at inference (no FP routes exist at deployment), so the
train/inference router mismatch is annealed away instead of switched off abruptly. The replay
decision is a deterministic function of ``(seed, global_step)``, so resuming reproduces it
without callback state.

Diagnostics (``method/moe_quant/...``): ``replay_prob``, ``replayed``, ``kl``,
``agreement/layer{i}`` (top-k overlap of the quantized model's own choice with the FP routes,
measured before replay overrides it), ``val_agreement/layer{i}`` (validation, no replay),
``load/layer{i}/expert{e}`` and ``rank/layer{i}/{proj}/expert{e}`` (models with ≤ 16 experts; per
layer ``load_max``, ``rank_mean`` otherwise), ``weighted_residual`` (load-weighted residual energy
left by the SVD-initialised compensators) and ``trainable_params``.

.. code-block:: python

    trainer = pl.Trainer(callbacks=[MoEQuantQAT(avg_rank=4, allocation="load"),
                                    RoutingReplay(replay_start=1.0, replay_end=0.0, kl_weight=1.0)])
    trainer.fit(CausalLMModule(model_config={"model_type": "qwen3_moe", ...}), datamodule=data)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from typing_extensions import override

from lit_lowrank.core.loss_hooks import MethodCallback, require_outputs
from lit_lowrank.quant.moe import (
    PROJECTIONS,
    allocate_expert_ranks,
    apply_moe_quant,
    expert_loads,
    expert_residual_spectra,
    fp_reference,
    load_weighted_residual,
    moe_experts,
)
from lit_lowrank.quant.moe_routing import RouteController, find_moe_blocks, replay_schedule, select_layers
from lit_lowrank.quant.ptq import _to_device, default_forward

#: Where replayed routes come from: the FP pass of the same tokens, or (control) those routes shuffled.
ROUTE_SOURCES = ("fp", "shuffled")
#: Above this many experts per layer, per-expert diagnostics are summarised per layer.
PER_EXPERT_LOG_LIMIT = 16


def _logits(output: Any) -> Tensor:
    if isinstance(output, dict) and output.get("logits") is not None:
        return output["logits"]
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, Tensor):
        return output
    raise ValueError(f"RoutingReplay: cannot find logits in the forward output of type {type(output).__name__}; "
                     "pass `forward=` returning a tensor, a dict with 'logits' or a transformers output.")


def _calibration_batches(trainer: pl.Trainer, n: int) -> list[Any]:
    datamodule = getattr(trainer, "datamodule", None)
    loader = None
    if datamodule is not None and hasattr(datamodule, "train_dataloader"):
        loader = datamodule.train_dataloader()
    else:  # fit(module, train_dataloaders=...): Lightning keeps the source on the fit loop
        source = getattr(trainer.fit_loop, "_data_source", None)
        if source is not None and source.is_defined():
            loader = source.dataloader()
    if loader is None:
        raise RuntimeError(f"MoEQuantQAT(calibration_batches={n}) measures expert loads on the training data; run "
                           "fit with a datamodule or train_dataloaders, or use allocation='uniform'.")
    batches = []
    for batch in loader:
        if len(batches) >= n:
            break
        batches.append(batch)
    return batches


class MoEQuantQAT(MethodCallback):
    """MXFP4 expert fake quantization + load-aware low-rank compensators, applied in ``setup``.

    Args:
        avg_rank: compensator rank budget per expert matrix (total = ``avg_rank x 2 x experts x layers``).
        allocation: ``"load"`` (greedy marginal load-weighted spectral gain; optimal for the
            load-weighted residual energy), ``"uniform"`` (``avg_rank`` each) or ``"none"`` (no
            compensator: RTN-MXFP4; then nothing is trainable unless ``train_experts``).
        max_rank: per-matrix cap for ``"load"`` (default ``4 * avg_rank``).
        calibration_batches: training batches whose full-precision routes give the loads.
        block_size: MX block size (32 in OCP MXFP4).
        init: compensator init, ``"svd"`` (of the quantization residual) or ``"zeros"``.
        train_experts: also train the expert weights through the straight-through estimator
            (default False: the spec's adapters-only QAT).
        act_quant: W4A8 as served: FP8 E4M3 per-token activations at the expert GEMMs (straight-through
            in training; the FP teacher pass of :class:`RoutingReplay` stays full precision).

    .. code-block:: python

        MoEQuantQAT(avg_rank=4, allocation="load", calibration_batches=4)
    """

    method_name = "moe_quant"

    def __init__(self, avg_rank: int = 4, allocation: str = "load", max_rank: int | None = None,
                 calibration_batches: int = 4, block_size: int = 32, init: str = "svd",
                 train_experts: bool = False, act_quant: bool = False) -> None:
        if allocation not in ("load", "uniform", "none"):
            raise ValueError(f"`allocation`={allocation!r}: expected 'load', 'uniform' or 'none'.")
        if avg_rank < 0 or (allocation != "none" and avg_rank == 0):
            raise ValueError(f"`avg_rank`={avg_rank}: expected a positive rank budget per matrix "
                             "(or allocation='none').")
        if allocation == "load" and calibration_batches < 1:
            raise ValueError(f"`calibration_batches`={calibration_batches}: allocation='load' needs >= 1.")
        self.avg_rank, self.allocation, self.max_rank = int(avg_rank), allocation, max_rank
        self.calibration_batches, self.block_size, self.init = int(calibration_batches), int(block_size), init
        self.train_experts = bool(train_experts)
        self.act_quant = bool(act_quant)
        self.report: dict[str, Any] = {}
        self._logged = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # on resume the checkpoint's compensator shapes win (MXFP4Experts adopts them when loading)
        if not moe_experts(pl_module):
            self.quantize(pl_module, lambda: _calibration_batches(trainer, self.calibration_batches))
        self._freeze(pl_module)

    def quantize(self, pl_module: torch.nn.Module, batches: Callable[[], list[Any]]) -> dict[str, Any]:
        """The functional form: loads -> ranks -> :func:`apply_moe_quant`; returns the report."""
        blocks = [name for name, _ in find_moe_blocks(pl_module)]
        spectra = expert_residual_spectra(pl_module, self.block_size)
        num_experts = {name: len(spec[0]) for name, spec in spectra.items()}
        if self.allocation == "load":
            device = next(pl_module.parameters()).device
            loads = expert_loads(pl_module, [_to_device(b, device) for b in batches()], default_forward)
        else:  # uniform allocation ignores loads; report against uniform loads
            loads = {name: torch.full((num_experts[name],), 1.0 / num_experts[name]) for name in blocks}
        ranks = None if self.allocation == "none" else allocate_expert_ranks(
            spectra, loads, self.avg_rank, allocation=self.allocation, max_rank=self.max_rank)
        apply_moe_quant(pl_module, ranks=ranks, block_size=self.block_size, init=self.init, act_quant=self.act_quant)
        self.report = {"loads": {k: v.tolist() for k, v in loads.items()}, "ranks": ranks,
                       "weighted_residual": load_weighted_residual(spectra, loads, ranks),
                       "trainable_params": sum(e.trainable_parameters() for e in moe_experts(pl_module).values())}
        return self.report

    def _freeze(self, pl_module: pl.LightningModule) -> None:
        trainable = set()
        for experts in moe_experts(pl_module).values():
            for proj in PROJECTIONS:
                trainable.add(id(getattr(experts, f"lora_A_{proj}")))
                trainable.add(id(getattr(experts, f"lora_B_{proj}")))
                if self.train_experts:
                    trainable.add(id(getattr(experts.base, proj)))
        from peft.tuners.tuners_utils import BaseTunerLayer  # only here: the CLI stays free of PEFT's import

        adapters = sorted(name for name, m in pl_module.named_modules() if isinstance(m, BaseTunerLayer)
                          and any(p.requires_grad and id(p) not in trainable for p in m.parameters()))
        if adapters:  # freezing them would train nothing the user asked for, silently
            raise RuntimeError(
                f"MoEQuantQAT trains only the experts' compensators and would freeze the trainable adapters on "
                f"{adapters[:4]}{' ...' if len(adapters) > 4 else ''}; inject the adapters after MoEQuantQAT's setup "
                "(list AdapterInjector after MoEQuantQAT in the callbacks) or leave them out.")
        for p in pl_module.parameters():
            p.requires_grad_(id(p) in trainable)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._logged or not self.report:
            return
        self._logged = True  # the allocation is fixed: log it once
        self.log_method(pl_module, "weighted_residual", float(self.report["weighted_residual"]))
        self.log_method(pl_module, "trainable_params", float(self.report["trainable_params"]))
        for i, (name, load) in enumerate(self.report["loads"].items()):
            ranks = (self.report["ranks"] or {}).get(name)
            if len(load) <= PER_EXPERT_LOG_LIMIT:
                for e, p in enumerate(load):
                    self.log_method(pl_module, f"load/layer{i}/expert{e}", float(p))
                    for j, proj in enumerate(PROJECTIONS):
                        self.log_method(pl_module, f"rank/layer{i}/{proj}/expert{e}", float(ranks[j][e] if ranks else 0))
            else:
                self.log_method(pl_module, f"load_max/layer{i}", float(max(load)))
                for j, proj in enumerate(PROJECTIONS):
                    mean = sum(ranks[j]) / len(ranks[j]) if ranks else 0.0
                    self.log_method(pl_module, f"rank_mean/layer{i}/{proj}", float(mean))


class RoutingReplay(MethodCallback):
    """Limited routing replay with the routers frozen, and KL distillation to the full-precision logits.

    Args:
        replay_start, replay_end: replay probability at the first step and after ``anneal_steps``.
        schedule: ``"linear"``, ``"cosine"`` or ``"constant"`` (``replay_start`` throughout).
        anneal_steps: steps of the annealing (default: ``trainer.max_steps``, else the estimated
            stepping batches).
        layers: MoE layers replayed: ``None`` (all), a list of indices, or a fraction (deepest layers).
        kl_weight: weight of ``T² KL(softmax(z_FP / T) || softmax(z_Q / T))`` (token mean).
        ce_weight: weight of the module's own loss (the task cross-entropy).
        temperature: ``T`` of the distillation.
        freeze_router: set the routers' ``requires_grad`` to False in ``setup`` (the spec's setting).
        val_agreement: on validation, also run the FP pass and log top-k agreement per layer.
        seed: seed of the per-step replay draws (and of ``route_source="shuffled"``).
        route_source: ``"fp"`` (the method: the FP routes of the same tokens) or ``"shuffled"`` (a control:
            each layer's FP routes permuted across the batch's tokens before they are replayed — the same
            per-layer expert loads, the wrong token-to-expert pairs).
        forward: ``forward(module, batch) -> output with logits`` for the FP pass (default: the
            module's ``step`` or ``module(batch["input_ids"])``).

    .. code-block:: python

        RoutingReplay(replay_start=1.0, replay_end=0.0, schedule="linear", layers=None, kl_weight=1.0)
    """

    method_name = "moe_quant"

    def __init__(self, replay_start: float = 1.0, replay_end: float = 0.0, schedule: str = "linear",
                 anneal_steps: int | None = None, layers: Sequence[int] | float | None = None,
                 kl_weight: float = 1.0, ce_weight: float = 1.0, temperature: float = 1.0,
                 freeze_router: bool = True, val_agreement: bool = True, seed: int = 0,
                 forward: Callable[[Any, Any], Any] | None = None, route_source: str = "fp") -> None:
        for name, value in (("replay_start", replay_start), ("replay_end", replay_end)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}`={value!r}: expected a probability in [0, 1].")
        replay_schedule(0, 1, replay_start, replay_end, schedule)  # validates `schedule`
        if route_source not in ROUTE_SOURCES:
            raise ValueError(f"`route_source`={route_source!r}: expected one of {ROUTE_SOURCES}.")
        if temperature <= 0 or kl_weight < 0 or ce_weight < 0:
            raise ValueError(f"temperature={temperature}, kl_weight={kl_weight}, ce_weight={ce_weight}: expected "
                             "temperature > 0 and non-negative weights.")
        self.replay_start, self.replay_end, self.schedule = float(replay_start), float(replay_end), schedule
        self.anneal_steps, self.layers = anneal_steps, layers
        self.kl_weight, self.ce_weight, self.temperature = float(kl_weight), float(ce_weight), float(temperature)
        self.freeze_router, self.val_agreement, self.seed = bool(freeze_router), bool(val_agreement), int(seed)
        self.forward = forward or default_forward
        self.route_source = route_source
        self.controller: RouteController | None = None
        self._teacher: Tensor | None = None
        self._replayed = False
        self._prob = 0.0
        self._val_agree: dict[int, list[float]] = {}

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.controller is None:
            self.controller = RouteController(pl_module)
            self.controller.replay_layers = select_layers(len(self.controller.routers), self.layers)
        if self.freeze_router:
            self.controller.freeze_routers()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.controller is not None:
            self.controller.remove()
            self.controller = None

    def replay_probability(self, step: int, trainer: pl.Trainer | None = None) -> float:
        """``π(step)`` of the schedule."""
        total = self.anneal_steps
        if total is None and trainer is not None:
            total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else \
                int(min(trainer.estimated_stepping_batches, 1e12))
        return replay_schedule(step, int(total or 0), self.replay_start, self.replay_end, self.schedule)

    def replay_decision(self, step: int, prob: float) -> bool:
        """Whether step ``step`` replays: a seeded draw, identical across runs, resumes and ranks."""
        if prob >= 1.0:
            return True
        if prob <= 0.0:
            return False
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(step))
        return bool(torch.rand((), generator=gen) < prob)

    def _fp_pass(self, pl_module: pl.LightningModule, batch: Any) -> Tensor:
        assert self.controller is not None
        with torch.no_grad(), fp_reference(pl_module), self.controller.mode("record"):
            logits = _logits(self.forward(pl_module, batch)).detach()
        return logits

    # ------------------------------------------------------------------ training
    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        assert self.controller is not None, "RoutingReplay.setup did not run"
        self._teacher = self._fp_pass(pl_module, batch)
        self._prob = self.replay_probability(trainer.global_step, trainer)
        self._replayed = self.replay_decision(trainer.global_step, self._prob)
        if self._replayed and self.route_source == "shuffled":
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(trainer.global_step) + 7)
            self.controller.routes = {i: [c[torch.randperm(c.shape[0], generator=gen).to(c.device)] for c in calls]
                                      for i, calls in self.controller.routes.items()}
        self.controller.set_mode("replay" if self._replayed else "observe")

    @override
    def on_loss(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, outputs: dict[str, Any],
                loss: Tensor) -> Tensor:
        require_outputs(outputs, ("logits",), "RoutingReplay")
        if self._teacher is None:
            return loss
        student = outputs["logits"].float()
        teacher = self._teacher.float()
        if student.shape != teacher.shape:
            raise ValueError(f"RoutingReplay: student logits {tuple(student.shape)} and FP logits "
                             f"{tuple(teacher.shape)} differ; the FP pass must run the same batch.")
        t = self.temperature
        kl = F.kl_div(F.log_softmax(student / t, -1).flatten(0, -2), F.log_softmax(teacher / t, -1).flatten(0, -2),
                      log_target=True, reduction="batchmean") * t * t
        self.log_method(pl_module, "kl", kl.detach())
        return self.ce_weight * loss + self.kl_weight * kl

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        assert self.controller is not None
        agreement = self.controller.agreement_per_layer()
        self.controller.set_mode("off")
        self._teacher = None
        self.log_method(pl_module, "replay_prob", self._prob)
        self.log_method(pl_module, "replayed", float(self._replayed))
        for i, value in agreement.items():
            self.log_method(pl_module, f"agreement/layer{i}", value)

    # ------------------------------------------------------------------ validation
    @override
    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self.val_agreement or self.controller is None or trainer.sanity_checking:
            return
        self._fp_pass(pl_module, batch)
        self.controller.set_mode("observe")

    @override
    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self.val_agreement or self.controller is None or trainer.sanity_checking:
            return
        for i, value in self.controller.agreement_per_layer().items():
            self._val_agree.setdefault(i, []).append(value)
        self.controller.set_mode("off")

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for i, values in sorted(self._val_agree.items()):
            self.log_method(pl_module, f"val_agreement/layer{i}", sum(values) / len(values), on_step=False,
                            on_epoch=True)
        self._val_agree = {}


__all__ = ["MoEQuantQAT", "RoutingReplay"]
