"""PoLAR-VBLL: PoLAR adapters + a variational Bayesian last layer, trained by alternating optimisation.

Three pieces, usable together (:class:`PoLARVBLL`) or alone:

- :func:`apply_polar_vbll` (surgery, idempotent, rebuilt by ``load_from_checkpoint``): injects
  adapters (``adapter="polar"`` by default, ``"lora"`` or ``None``) into the module and swaps its
  linear head for a :class:`~lit_lowrank.ops.vbll.VBLLHead` whose posterior mean starts at the
  trained head. The head returns log predictive probabilities, so the task module's ``softmax`` /
  ECE / cross-entropy read the Bayesian predictive with one backbone forward.
- :class:`AlternatingSchedule`: a callback that switches which parameter groups train, phase by
  phase (phase A: adapters with the posterior fixed; phase B: the posterior with the features fixed).
- :class:`PoLARVBLL`: the method callback: surgery in ``setup``, the ELBO through the loss-hook
  protocol (it replaces the task's cross-entropy), the alternating schedule, PoLAR's landing step
  before each optimizer step, and ``method/polar_vbll/...`` diagnostics.

.. code-block:: python

    model = ClassificationModule("mlp", num_classes=10, in_chans=1,
                                 backbone_kwargs={"in_features": 64, "hidden_sizes": [64, 64]})
    trainer = L.Trainer(callbacks=[PoLARVBLL(target_modules=r"backbone\\.layers\\.\\d+$", rank=4)])
    trainer.fit(model, datamodule=DigitsDataModule())
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from lit_lowrank.core.loss_hooks import MethodCallback, require_outputs
from lit_lowrank.core.surgery import is_replaced, mark_replaced, record_surgery, replace_module
from lit_lowrank.ops.vbll import VBLLHead

METHOD = "polar_vbll"
ADAPTERS: tuple[str, ...] = ("polar", "lora")
#: where q(W)'s covariance starts when the ELBO takes over (PoLARVBLL's ``covariance_init``)
COVARIANCE_INITS: tuple[str, ...] = ("vbll", "elbo")

#: Default parameter groups (regexes on parameter names, ``re.search``): PEFT adapter factors
#: (LoRA's ``lora_A/B``, PoLAR's ``lora_X/theta/Y``) and the VBLL posterior.
DEFAULT_GROUPS: dict[str, list[str]] = {"adapter": [r"\.lora_"], "head": [r"(^|\.)head\.layer\."]}
#: Decided steps per phase (METHODS.md §8 leaves it open): short equal phases, so that on a few-label
#: set (tens of steps per epoch) both blocks are revisited many times; phase A first because the
#: posterior mean starts at the trained head.
DEFAULT_PHASES: list[dict[str, Any]] = [{"train": ["adapter"], "steps": 10}, {"train": ["head"], "steps": 10}]


# ----------------------------------------------------------------------------- surgery
def inject_lowrank_adapters(model: nn.Module, adapter: str, target_modules: str | list[str], rank: int,
                            alpha: float) -> nn.Module:
    """Inject ``adapter`` (``"polar"`` / ``"lora"``) into ``target_modules`` (idempotent; the project's injector).

    Only adapter parameters stay trainable in ``model`` afterwards; the new head is created after this.
    """
    if adapter not in ADAPTERS:
        raise ValueError(f"`adapter`={adapter!r}, expected one of {ADAPTERS} or None.")
    from lit_lowrank.adapters.injector import inject_adapters

    return inject_adapters(model, method=adapter, target_modules=target_modules, rank=rank, alpha=alpha)


def apply_polar_vbll(
    model: nn.Module,
    num_train: int,
    head: str = "head",
    adapter: str | None = "polar",
    target_modules: str | list[str] | None = None,
    rank: int = 8,
    alpha: float = 8.0,
    head_kwargs: dict[str, Any] | None = None,
) -> nn.Module:
    """Inject adapters and swap the linear head ``model.<head>`` for a :class:`VBLLHead` (in place, idempotent).

    Args:
        model: a module with a linear head at attribute path ``head``.
        num_train: training-set size ``N`` (the KL is scaled by ``1/N``).
        head: dotted attribute path of the ``nn.Linear`` head.
        adapter: ``"polar"``, ``"lora"`` or ``None`` (head only: VBLL on frozen/fully trained features).
        target_modules: the modules to adapt (regex or list of names, PEFT semantics).
        rank / alpha: adapter rank and scale.
        head_kwargs: keyword arguments of :class:`VBLLHead` (``kl_scale``, ``prior_scale``,
            ``parameterization``, ``predictive``, ``num_samples``...).

    .. code-block:: python

        apply_polar_vbll(model, num_train=500, target_modules=["q_proj", "v_proj"], rank=8)
    """
    head_kwargs = dict(head_kwargs or {})
    if adapter is not None:
        if target_modules is None:
            raise ValueError(f"`target_modules`=None with `adapter`={adapter!r}: name the modules to adapt.")
        inject_lowrank_adapters(model, adapter, target_modules, rank, alpha)
    try:
        old = model.get_submodule(head)
    except AttributeError as err:
        raise ValueError(f"`head`={head!r} is not a submodule of {type(model).__name__}.") from err
    if not is_replaced(old, METHOD):
        if not isinstance(old, nn.Linear):
            raise ValueError(f"`head`={head!r} is a {type(old).__name__}, expected an nn.Linear to replace.")
        new = VBLLHead(old.in_features, old.out_features, num_train=num_train, **head_kwargs).to(old.weight.device)
        new.init_from_linear(old)
        replace_module(model, head, mark_replaced(new, METHOD))
    record_surgery(model, METHOD, apply_polar_vbll, {
        "num_train": num_train, "head": head, "adapter": adapter, "target_modules": target_modules, "rank": rank,
        "alpha": alpha, "head_kwargs": head_kwargs,
    })
    return model


def find_vbll_head(model: nn.Module) -> VBLLHead:
    """The (single) :class:`VBLLHead` inside ``model``."""
    heads = [m for m in model.modules() if isinstance(m, VBLLHead)]
    if len(heads) != 1:
        raise ValueError(f"expected exactly one VBLLHead in {type(model).__name__}, found {len(heads)}.")
    return heads[0]


# ----------------------------------------------------------------------------- alternating schedule
class AlternatingSchedule(pl.Callback):
    """Switch which parameter groups train, phase by phase, cycling through ``phases``.

    A group is a list of regexes on parameter names (``re.search``). The schedule manages the
    parameters that are trainable when training starts and belong to some group: in each phase
    exactly the parameters of that phase's groups keep ``requires_grad=True``; every other managed
    parameter is frozen (its gradient stays ``None``, so the optimizer skips it and its weight
    decay). Parameters outside every group are frozen for the whole fit. The phase is a function of
    ``global_step`` only, so resuming from a checkpoint resumes the right phase (no state).

    Args:
        phases: ``[{"train": [group, ...], "steps": int}, ...]``, cycled.
        groups: group name -> regexes (default: ``adapter`` = PEFT adapter factors, ``head`` = the
            VBLL posterior).
        method_name: the ``method/<name>/phase`` diagnostic prefix.

    .. code-block:: python

        schedule = AlternatingSchedule([{"train": ["adapter"], "steps": 20}, {"train": ["head"], "steps": 20}])
        trainer = L.Trainer(callbacks=[schedule])
    """

    def __init__(self, phases: Sequence[dict[str, Any]] | None = None, groups: dict[str, list[str]] | None = None,
                 method_name: str = METHOD) -> None:
        super().__init__()
        self.groups = {k: list(v) for k, v in (groups or DEFAULT_GROUPS).items()}
        self.phases = [dict(p) for p in (phases if phases is not None else DEFAULT_PHASES)]
        self.method_name = method_name
        if not self.phases:
            raise ValueError("`phases`=[]: expected at least one phase {'train': [...], 'steps': int}.")
        for i, phase in enumerate(self.phases):
            steps, train = phase.get("steps"), phase.get("train")
            if not isinstance(steps, int) or steps < 1:
                raise ValueError(f"`phases[{i}]['steps']`={steps!r}, expected a positive integer.")
            if not isinstance(train, (list, tuple)) or not train or any(g not in self.groups for g in train):
                raise ValueError(f"`phases[{i}]['train']`={train!r}, expected a non-empty list of groups among "
                                 f"{sorted(self.groups)}.")
        self._managed: dict[str, tuple[nn.Parameter, set[str]]] = {}
        self.current_phase = -1
        self.offset = 0  # steps before the first phase (PoLARVBLL's MLE warm start): every managed group trains

    def phase_at(self, step: int) -> int:
        """Index of the phase that optimizer step ``step`` belongs to."""
        cycle = sum(p["steps"] for p in self.phases)
        pos = step % cycle
        for i, phase in enumerate(self.phases):
            if pos < phase["steps"]:
                return i
            pos -= phase["steps"]
        raise AssertionError("unreachable")

    def resolve(self, module: nn.Module) -> dict[str, list[str]]:
        """Collect the managed parameters of ``module``; returns group -> parameter names."""
        patterns = {g: [re.compile(p) for p in pats] for g, pats in self.groups.items()}
        self._managed = {}
        for name, param in module.named_parameters():
            member = {g for g, pats in patterns.items() if any(p.search(name) for p in pats)}
            if param.requires_grad:
                self._managed[name] = (param, member)
        empty = [g for g in self.groups if not any(g in m for _, m in self._managed.values())]
        used = {g for phase in self.phases for g in phase["train"]}
        if empty and set(empty) & used:
            raise ValueError(f"AlternatingSchedule: groups {sorted(set(empty) & used)} match no trainable parameter "
                             f"of {type(module).__name__} (groups={self.groups}).")
        return {g: [n for n, (_, m) in self._managed.items() if g in m] for g in self.groups}

    def apply_phase(self, index: int) -> None:
        """Set ``requires_grad`` of every managed parameter for phase ``index``."""
        active = set(self.phases[index]["train"])
        for param, member in self._managed.values():
            param.requires_grad_(bool(member & active))
        self.current_phase = index

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after configure_optimizers: the optimizer already holds every trainable parameter
        self.resolve(pl_module)

    def train_all(self) -> None:
        """Every managed parameter trains (outside the phases: the warm start)."""
        for param, _ in self._managed.values():
            param.requires_grad_(True)
        self.current_phase = -1

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step < self.offset:
            self.train_all()
            return
        index = self.phase_at(trainer.global_step - self.offset)
        if index != self.current_phase:
            self.apply_phase(index)
        from lit_lowrank.core.logging import log_method

        log_method(pl_module, self.method_name, "phase", float(index))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for param, _ in self._managed.values():  # leave the module as it was handed over
            param.requires_grad_(True)
        self.current_phase = -1


# ----------------------------------------------------------------------------- the method callback
class PoLARVBLL(MethodCallback):
    """PoLAR adapters + VBLL head, ELBO loss, alternating optimisation and PoLAR landing.

    In ``setup`` it applies :func:`apply_polar_vbll` to the LightningModule (``num_train`` defaults to
    the length of the datamodule's training set). ``on_loss`` replaces the task's cross-entropy
    (``outputs["loss"]`` when the module reports it, else the whole incoming loss) by the VBLL negative
    ELBO on ``outputs["features"]`` and ``batch["y"]``; terms other callbacks added are kept.

    Args:
        target_modules / rank / alpha / adapter: adapters (see :func:`apply_polar_vbll`).
        head: attribute path of the module's linear head.
        num_train: training-set size; ``None`` = ``len(datamodule.train_dataloader().dataset)``.
        head_kwargs: :class:`VBLLHead` options.
        phases / groups: the :class:`AlternatingSchedule`; ``phases=[]`` trains everything jointly (the
            benchmark picks joint / per-step / full-budget alternation on validation NLL).
        warmup_steps: MLE warm start: the first steps train adapters and the head's posterior *mean* with
            cross-entropy on its mean logits (the head starts at the task's fresh head, usually random), then
            the negative ELBO and the phases take over (``0``: ELBO from the first step).
        covariance_init: where ``q(W)``'s covariance and the logit noise start when the ELBO takes over:
            ``"vbll"`` (the package's init: weight std ``1/d`` whatever the feature scale) or ``"elbo"`` (their
            closed-form ELBO optimum at the current mean on the first ELBO batch's features,
            :meth:`~lit_lowrank.ops.vbll.VBLLHead.fit_covariance_`; a diagonal ``q(W)`` only).
        landing: apply PoLAR's landing step to the X/Y gradients before each optimizer step
            (``lam`` = ``landing_lambda``); ignored for ``adapter != "polar"``.

    .. code-block:: python

        cb = PoLARVBLL(target_modules=["q_proj", "v_proj"], rank=8,
                       phases=[{"train": ["adapter"], "steps": 20}, {"train": ["head"], "steps": 20}])
    """

    method_name = METHOD

    def __init__(
        self,
        target_modules: str | list[str] | None = None,
        rank: int = 8,
        alpha: float = 8.0,
        adapter: str | None = "polar",
        head: str = "head",
        num_train: int | None = None,
        head_kwargs: dict[str, Any] | None = None,
        phases: Sequence[dict[str, Any]] | None = None,
        groups: dict[str, list[str]] | None = None,
        landing: bool = True,
        landing_lambda: float = 5e-3,
        warmup_steps: int = 0,
        covariance_init: str = "vbll",
    ) -> None:
        super().__init__()
        if adapter is not None and adapter not in ADAPTERS:
            raise ValueError(f"`adapter`={adapter!r}, expected one of {ADAPTERS} or None.")
        if adapter is not None and target_modules is None:
            raise ValueError(f"`target_modules`=None with `adapter`={adapter!r}: name the modules to adapt.")
        self.target_modules, self.rank, self.alpha, self.adapter = target_modules, rank, alpha, adapter
        self.head, self.num_train, self.head_kwargs = head, num_train, dict(head_kwargs or {})
        if groups is None:  # the default head group follows the `head` attribute path
            groups = {"adapter": list(DEFAULT_GROUPS["adapter"]), "head": [rf"(^|\.){re.escape(head)}\.layer\."]}
        groups = dict(groups)
        if adapter is None:  # nothing to alternate with: the head alone trains
            groups.pop("adapter", None)
            phases = [{"train": ["head"], "steps": 1}] if phases is None else phases
        self.schedule = (AlternatingSchedule(phases, groups, METHOD) if phases is None or len(phases) > 0 else None)
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"`warmup_steps`={warmup_steps!r}, expected an integer >= 0 (MLE warm-start steps).")
        self.warmup_steps = warmup_steps
        if covariance_init not in COVARIANCE_INITS:
            raise ValueError(f"`covariance_init`={covariance_init!r}, expected one of {COVARIANCE_INITS}.")
        if covariance_init == "elbo" and self.head_kwargs.get("parameterization", "diagonal") != "diagonal":
            raise ValueError("`covariance_init`='elbo' needs head_kwargs['parameterization']='diagonal', got "
                             f"{self.head_kwargs['parameterization']!r}.")
        self.covariance_init = covariance_init
        self._covariance_ready = covariance_init == "vbll"
        if self.schedule is not None:
            self.schedule.offset = warmup_steps
        self.landing = landing and adapter == "polar"
        self.landing_lambda = landing_lambda
        self._head: VBLLHead | None = None

    def _num_train(self, trainer: pl.Trainer, required: bool = True) -> int:
        """``num_train`` or the datamodule's training-set size; when not ``required`` (evaluating: the size only
        scales the training KL) and there is none to read, 1."""
        if self.num_train is not None:
            return self.num_train
        dm = getattr(trainer, "datamodule", None)
        try:
            return len(dm.train_dataloader().dataset)  # type: ignore[union-attr]
        except Exception as err:  # noqa: BLE001 - any failure means: the user must say it
            if not required:
                return 1
            raise ValueError("PoLARVBLL: `num_train`=None and the training-set size could not be read from the "
                             f"datamodule ({err}); pass num_train=<N>.") from err

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" and any(isinstance(m, VBLLHead) for m in pl_module.modules()):
            self._head = find_vbll_head(pl_module)
            return
        # validate/test/predict on a fresh module (e.g. `trainer.predict(model, dataloaders=..., ckpt_path=...)`, no
        # datamodule): the head only needs its shape, the checkpoint fills it, and N does not enter the predictive
        num_train = self._num_train(trainer, required=stage == "fit")
        apply_polar_vbll(pl_module, num_train=num_train, head=self.head, adapter=self.adapter,
                         target_modules=self.target_modules, rank=self.rank, alpha=self.alpha,
                         head_kwargs=self.head_kwargs)
        self._head = find_vbll_head(pl_module)
        if stage == "fit" and self._head.num_train != num_train:  # a head built earlier for another N (or none)
            self._head.num_train = num_train
            self._head.layer.regularization_weight = self._head.kl_scale / num_train

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._covariance_ready = self.covariance_init == "vbll"
        if self.schedule is not None:
            self.schedule.on_train_start(trainer, pl_module)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.schedule is not None:
            self.schedule.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.schedule is not None:
            self.schedule.on_train_end(trainer, pl_module)

    def on_loss(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, outputs: dict[str, Any],
                loss: Tensor) -> Tensor:
        require_outputs(outputs, ("features",), METHOD)
        if not isinstance(batch, dict) or "y" not in batch:
            raise ValueError("PoLARVBLL needs labelled dict batches with key 'y' (the ELBO's targets).")
        assert self._head is not None, "PoLARVBLL.setup did not run"
        task_loss = outputs.get("loss")
        rest = loss - task_loss if isinstance(task_loss, Tensor) else torch.zeros_like(loss)
        if trainer.global_step < self.warmup_steps:  # MLE warm start of the posterior mean (and the adapters)
            mean, _ = self._head.logit_moments(outputs["features"])
            mle = torch.nn.functional.cross_entropy(mean, batch["y"])
            self.log_method(pl_module, "warmup_ce", mle.detach())
            return mle + rest
        if not self._covariance_ready:
            # the first ELBO step starts q(W) at the ELBO's optimum for this mean; a fit resumed past it keeps its own
            if trainer.global_step == self.warmup_steps:
                self._head.fit_covariance_(outputs["features"])
            self._covariance_ready = True
        elbo = self._head.elbo_loss(outputs["features"], batch["y"])
        self.log_method(pl_module, "neg_elbo", elbo.detach())
        with torch.no_grad():
            self.log_method(pl_module, "weight_var", self._head.weight_variance(outputs["features"]).mean())
        return elbo + rest

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if not self.landing:
            return
        from lit_lowrank.adapters.polar_landing import apply_landing_

        # factors frozen in this phase have no gradient and are skipped (no landing while frozen)
        apply_landing_(pl_module, self.landing_lambda)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.adapter != "polar" or trainer.global_step % max(trainer.log_every_n_steps, 1):
            return
        from lit_lowrank.adapters.polar_landing import polar_diagnostics

        for name, value in polar_diagnostics(pl_module).items():
            if name != "layers":
                self.log_method(pl_module, name, value)
