"""SARAController: the functional form of SARA — SVD surgery, per-step rank policy, calibration, MACs.

Pure PyTorch (no Lightning): it works on any denoiser ``nn.Module`` — our
``DiffusionModule.model``, a diffusers ``UNet2DModel`` / ``UNet2DConditionModel`` /
``DiTTransformer2DModel`` / ``SD3Transformer2DModel`` inside a pipeline — because it only
needs the denoiser's forward calls: a forward pre-hook reads the timestep argument
(``args[1]`` or ``timestep``/``timesteps``/``t``) to know the step (a new sampling run
starts when the timestep goes up; a repeated timestep — classifier-free guidance — is
the same step), and a forward hook sees the output (SARA-Online's signal, SARA-DP's
calibration). ``step_source`` overrides the timestep rule with an exact step index
(``DiffusionModule.current_step_index``). Nothing patches ``forward``.

Policies (``set_*``): ``full`` (original layers, bit-exact), ``uniform`` (one rank
fraction everywhere), ``static`` (per-layer rank keeping an energy fraction, the
classic static SVD compression), ``dp`` (a per-step × per-block level schedule from
:meth:`calibrate`), ``online`` (per-step rank fraction from the spectrum of the previous
denoiser output) and ``fractions`` (a fixed per-step rank fraction schedule, e.g. an online
run's fractions replayed or shuffled).

.. code-block:: python

    from lit_lowrank.callbacks.sara_controller import apply_sara

    with apply_sara(pipe.unet) as sara:                     # diffusers pipeline, or module.model
        sara.calibrate(lambda: pipe(prompts[:2], num_inference_steps=25,          # deterministic: seeded
                                    generator=torch.Generator().manual_seed(0)), budget=0.6)
        images = pipe(prompts, num_inference_steps=25).images
        print(sara.macs_ratio())
    # leaving the block restores the original Linear layers
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lit_lowrank.core.surgery import find_modules, mark_replaced, replace_module
from lit_lowrank.ops.lowrank import rank_for_energy
from lit_lowrank.ops.sara.rank import (
    factored_macs,
    fraction_rank,
    online_rank_fraction,
    rank_levels,
    solve_rank_dp,
)
from lit_lowrank.ops.sara.signal import (
    TIMESTEP_KEYS,
    clean_sample_signal,
    denoiser_output,
    read_timestep,
    returned_samples,
)
from lit_lowrank.ops.sara.svd_linear import SVDLinear, is_factorable_conv, is_pointwise_conv

__all__ = ["CONDITIONING_LAYERS", "DEFAULT_LEVELS", "SARAController", "apply_sara", "auto_block_name",
           "clean_sample_signal"]

#: rank fractions of ``min(m, n)`` that SARA-DP chooses among (1.0 = the original layer).
DEFAULT_LEVELS: tuple[float, ...] = (0.125, 0.25, 0.375, 0.5, 1.0)
#: names of per-sample conditioning layers in diffusers denoisers (timestep / class embedders, adaLN
#: modulation, DiT's conditioned output projection): a small share of the MACs that reaches every
#: token, so ``exclude=CONDITIONING_LAYERS`` keeps them dense for every policy.
CONDITIONING_LAYERS = (r"(time_embedding|time_emb_proj|timestep_embedder|class_embedding|add_embedding|"
                       r"norm1\.linear|norm1_context\.linear|norm_out\.linear|adaLN|proj_out_1$)")


def auto_block_name(name: str) -> str:
    """Block of a layer: its qualified name up to the first numeric index (``down_blocks.1``,
    ``transformer_blocks.3``), else its first component (``time_embedding``, ``proj_out_1``)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]


class SARAController:
    """Factor a denoiser's Linear layers by SVD and choose their rank per denoising step.

    Args:
        denoiser: the network called once (or once per guidance branch) per solver step.
        target: regex / names of the layers to factor (default: every ``nn.Linear``).
        include_conv1x1: also factor pointwise ``nn.Conv2d`` layers.
        include_conv: also factor every ungrouped zero-padded ``nn.Conv2d`` (``k×k`` kernels as the
            matrix ``C_out × C_in·k·k``: a ``k×k`` conv to ``r`` channels, then a pointwise map); implies
            ``include_conv1x1``. UNets hold most of their MACs in ``3×3`` convs.
        blocks: ``"auto"`` (:func:`auto_block_name`) or a list of regexes; a layer belongs to
            the first block regex it matches (unmatched layers form the block ``"other"``).
        levels: rank fractions of ``min(m, n)`` for the DP and uniform grids.
        step_source: returns the current step index (``None`` = use the timestep rule).
        exclude: regex of layer names never factored (e.g. :data:`CONDITIONING_LAYERS`).
        signal: SARA-Online's signal from a denoiser call, ``signal(output, args, kwargs) -> Tensor``
            (default: the output itself, as the abstract has it); e.g. a function returning the
            predicted clean sample x̂₀ for a given parameterisation.
    """

    def __init__(self, denoiser: nn.Module, target: str | Sequence[str] | None = None,
                 include_conv1x1: bool = False, blocks: str | Sequence[str] = "auto",
                 levels: Sequence[float] = DEFAULT_LEVELS,
                 step_source: Callable[[], int | None] | None = None, include_conv: bool = False,
                 exclude: str | None = None,
                 signal: Callable[[Tensor, tuple[Any, ...], dict[str, Any]], Tensor] | None = None) -> None:
        if not isinstance(denoiser, nn.Module):
            raise TypeError(f"`denoiser` must be an nn.Module, got {type(denoiser).__name__}.")
        self.denoiser = denoiser
        self.target, self.include_conv1x1, self.include_conv = target, include_conv1x1, include_conv
        self.block_spec = blocks
        self.levels = tuple(sorted(levels))
        rank_levels(8, self.levels)  # validates the fractions
        self.step_source = step_source
        self.exclude = re.compile(exclude) if exclude else None
        self.signal = signal
        self.layers: dict[str, SVDLinear] = {}
        self.block_of: dict[str, str] = {}
        self.blocks: list[str] = []
        self._originals: dict[str, nn.Module] = {}
        self._handles: list[Any] = []
        self.policy = "full"
        self.schedule: np.ndarray | None = None  # (T, B) level index per step and block
        self.threshold = 0.0
        self.first_fraction = 1.0
        self._static: dict[str, int | None] = {}
        self.step = -1
        self._last_t: float | None = None
        self._outputs: dict[int, Tensor] = {}
        self._fractions: list[float] = []
        #: SARA-Online: the rank fraction each step of the last run used (1.0 = dense)
        self.step_fractions: list[float] = []
        self._inside = False
        self._calibration: list[tuple[np.ndarray, np.ndarray]] | None = None
        #: (step, ranks) of a propagation probe run: that step truncated, every other dense
        self._probe: tuple[int, dict[str, int | None]] | None = None
        self._probe_error: float | None = None
        #: SARA-DP: per-step gain from a step's output error to the final sample's error (1 = unweighted)
        self.step_gains: np.ndarray | None = None
        #: SARA-DP: the unweighted teacher-forced output errors ``(T, B, L)`` of the last calibration
        self.output_errors: np.ndarray | None = None
        self._timestep: float | None = None
        self._calibration_t: dict[int, float] = {}
        #: timestep of each step of the calibrated DP schedule (maps calls outside a sampling loop)
        self.schedule_timesteps: list[float] = []
        self.step_ranks: list[dict[str, int | None]] = []

    # -- surgery -----------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return bool(self._originals)

    def attach(self) -> SARAController:
        """Replace the target layers with :class:`SVDLinear` (once) and hook the denoiser."""
        if self.attached:
            return self
        types = (nn.Linear, nn.Conv2d) if self.include_conv1x1 or self.include_conv else nn.Linear
        conv_ok = is_factorable_conv if self.include_conv else is_pointwise_conv
        found = [(n, m) for n, m in find_modules(self.denoiser, self.target, types=types)
                 if (isinstance(m, nn.Linear) or conv_ok(m)) and not (self.exclude and self.exclude.search(n))]
        if not found:
            kinds = " / conv" if self.include_conv else " / 1x1 conv" if self.include_conv1x1 else ""
            raise ValueError(f"`target`={self.target!r} matches no Linear{kinds} layer of "
                             f"{type(self.denoiser).__name__}.")
        for name, module in found:
            layer = mark_replaced(SVDLinear(module), "sara")
            self._originals[name] = replace_module(self.denoiser, name, layer)
            self.layers[name] = layer
            self.block_of[name] = self._block_name(name)
        self.blocks = list(dict.fromkeys(self.block_of.values()))
        self._handles = [
            self.denoiser.register_forward_pre_hook(self._pre_hook, with_kwargs=True),
            self.denoiser.register_forward_hook(self._post_hook, with_kwargs=True),
        ]
        return self

    def detach(self) -> None:
        """Put the original layers back and remove the hooks (the denoiser is as before)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for name, original in self._originals.items():
            replace_module(self.denoiser, name, original)
        self._originals.clear()
        self.layers.clear()

    def __enter__(self) -> SARAController:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def _block_name(self, name: str) -> str:
        if self.block_spec == "auto":
            return auto_block_name(name)
        for pattern in self.block_spec:
            if re.search(pattern, name):
                return pattern
        return "other"

    def _require_attached(self) -> None:
        if not self.attached:
            raise RuntimeError("SARAController is not attached: call attach() or use it as a context manager.")

    # -- policies ----------------------------------------------------------------------
    def level_ranks(self, name: str) -> list[int | None]:
        """The layer's rank at each level (``None`` where the level runs the dense layer)."""
        layer = self.layers[name]
        ranks = [max(1, min(layer.full_rank, round(f * layer.full_rank))) for f in self.levels]
        return [None if layer.runs_dense(r) else r for r in ranks]

    def set_full(self) -> None:
        self.policy = "full"

    def set_uniform(self, fraction: float) -> None:
        """Every layer at ``round(fraction · min(m, n))`` at every step."""
        self._require_attached()
        if not 0 < fraction <= 1:
            raise ValueError(f"`fraction` must be in (0, 1], got {fraction!r}.")
        self._static = {n: max(1, round(fraction * m.full_rank)) for n, m in self.layers.items()}
        self.policy = "static"

    def set_static_energy(self, energy: float) -> None:
        """Static SVD compression: each layer keeps the smallest rank holding ``energy`` of ``Σ σ²``."""
        self._require_attached()
        self._static = {n: int(rank_for_energy(m.singular, energy)) for n, m in self.layers.items()}
        self.policy = "static"

    def set_schedule(self, schedule: np.ndarray | Sequence[Sequence[int]]) -> None:
        """SARA-DP: ``schedule[t, b]`` = level index of block ``b`` at step ``t``."""
        self._require_attached()
        schedule = np.asarray(schedule, dtype=np.int64)
        if schedule.ndim != 2 or schedule.shape[1] != len(self.blocks):
            raise ValueError(f"`schedule` must be (steps, {len(self.blocks)} blocks), got shape {schedule.shape}.")
        if schedule.min() < 0 or schedule.max() >= len(self.levels):
            raise ValueError(f"`schedule` entries must be level indices in [0, {len(self.levels) - 1}].")
        self.schedule, self.policy = schedule, "dp"

    def set_online(self, threshold: float, first_fraction: float = 1.0) -> None:
        """SARA-Online with output tolerance ``threshold`` (see :func:`~lit_lowrank.ops.sara.online_rank_fraction`).

        ``first_fraction``: the rank fraction of the first step, which has no previous output to read
        (1.0 = dense, the default; with T steps a dense first step is ``1/T`` of the dense MACs).
        """
        self._require_attached()
        if threshold < 0:
            raise ValueError(f"`threshold` must be >= 0, got {threshold!r}.")
        if not 0.0 <= first_fraction <= 1.0:
            raise ValueError(f"`first_fraction` must be in [0, 1], got {first_fraction!r}.")
        self.threshold, self.policy = float(threshold), "online"
        self.first_fraction = float(first_fraction)

    def set_fractions(self, fractions: Sequence[float]) -> None:
        """A fixed rank fraction per step (every layer at ``⌈f_t · min(m, n)⌉``; 1.0 = dense)."""
        self._require_attached()
        if not len(fractions) or any(not 0.0 <= f <= 1.0 for f in fractions):
            raise ValueError(f"`fractions` must be a non-empty list of values in [0, 1], got {list(fractions)!r}.")
        self._fractions, self.policy = [float(f) for f in fractions], "fractions"

    def _fraction_ranks(self, fraction: float) -> dict[str, int | None]:
        if fraction >= 1.0:
            return dict.fromkeys(self.layers)
        return {n: fraction_rank(fraction, m.full_rank) for n, m in self.layers.items()}

    def ranks_for_step(self, step: int) -> dict[str, int | None]:
        """The rank of every layer at ``step`` under the current policy."""
        if self.policy == "full":
            return dict.fromkeys(self.layers)
        if self.policy == "static":
            return dict(self._static)
        if self.policy == "dp":
            assert self.schedule is not None
            if step >= len(self.schedule):
                raise ValueError(f"SARA-DP schedule covers {len(self.schedule)} steps but step {step} ran: sample "
                                 f"with num_inference_steps={len(self.schedule)} or calibrate again.")
            index = {b: i for i, b in enumerate(self.blocks)}
            return {n: self.level_ranks(n)[int(self.schedule[step, index[self.block_of[n]]])] for n in self.layers}
        if self.policy == "fractions":
            if step >= len(self._fractions):
                raise ValueError(f"the fraction schedule covers {len(self._fractions)} steps but step {step} ran.")
            return self._fraction_ranks(self._fractions[step])
        # online: the previous step's output decides (none yet: the first step runs at `first_fraction`)
        previous = self._outputs.get(step - 1)
        fraction = self.first_fraction if previous is None else online_rank_fraction(previous, self.threshold)
        while len(self.step_fractions) <= step:
            self.step_fractions.append(1.0)
        self.step_fractions[step] = fraction
        return self._fraction_ranks(fraction)

    # -- hooks -------------------------------------------------------------------------
    def _current_step(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        t = read_timestep(args, kwargs)
        self._timestep = t
        if self.step_source is not None:
            index = self.step_source()
            if index is not None:
                if index == 0 and self.step != 0:
                    self._new_run()
                return int(index)
            # a call outside the sampling loop (e.g. a test-loss forward at random timesteps): no history;
            # a DP schedule is read at the calibrated step whose timestep is nearest
            self._new_run()
            if self.policy == "dp" and self.schedule_timesteps and t is not None:
                return int(np.argmin(np.abs(np.asarray(self.schedule_timesteps) - t)))
            return 0
        if t is None:
            raise ValueError("SARA could not read the timestep of the denoiser call (positional argument 1 or "
                             f"one of {TIMESTEP_KEYS}); pass `step_source`.")
        if self._last_t is None or t > self._last_t:  # timesteps decrease within a run: a rise starts a new one
            self._new_run()
            step = 0
        else:
            step = self.step + (t < self._last_t)
        self._last_t = t
        return step

    def _new_run(self) -> None:
        self._outputs.clear()
        self.step_fractions = []

    def _pre_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._inside:
            return
        self.step = self._current_step(args, kwargs)
        if self._probe is not None:
            ranks = self._probe[1] if self.step == self._probe[0] else dict.fromkeys(self.layers)
        elif self._calibration is not None:
            ranks = dict.fromkeys(self.layers)
        else:
            ranks = self.ranks_for_step(self.step)
        for name, layer in self.layers.items():
            layer.rank = ranks[name]
        while len(self.step_ranks) <= self.step:
            self.step_ranks.append({})
        self.step_ranks[self.step] = ranks

    def _post_hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if self._inside:
            return
        out = denoiser_output(output).detach()
        if self.policy == "online":
            self._outputs[self.step] = out if self.signal is None else self.signal(out, args, kwargs).detach()
            self._outputs.pop(self.step - 2, None)
        if self._calibration is not None:
            self._measure(args, kwargs, out)
        if self._probe is not None and self.step == self._probe[0]:
            self._probe_error = self._dense_error(args, kwargs, out)

    @torch.no_grad()
    def _dense_error(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Tensor) -> float:
        """‖out − dense output on the same input‖ / ‖dense output‖ (one extra dense forward)."""
        ranks = {n: m.rank for n, m in self.layers.items()}
        self._inside = True
        try:
            for m in self.layers.values():
                m.rank = None
            dense = denoiser_output(self.denoiser(*args, **kwargs)).double()
        finally:
            for n, m in self.layers.items():
                m.rank = ranks[n]
            self._inside = False
        return float((out.double() - dense).norm() / dense.norm().clamp_min(1e-12))

    # -- SARA-DP calibration ------------------------------------------------------------
    @torch.no_grad()
    def _measure(self, args: tuple[Any, ...], kwargs: dict[str, Any], reference: Tensor) -> None:
        """Teacher-forced LRAE of every (block, level) at this step: the full-rank trajectory runs on,
        and each block alone is truncated to each level in an extra forward on the same input."""
        errors = np.zeros((len(self.blocks), len(self.levels)))
        costs = np.zeros((len(self.blocks), len(self.levels)))
        norm = reference.double().norm().clamp_min(1e-12)
        self._inside = True
        try:
            for b, block in enumerate(self.blocks):
                names = [n for n in self.layers if self.block_of[n] == block]
                for j in range(len(self.levels)):
                    ranks = {n: self.level_ranks(n)[j] for n in names}
                    costs[b, j] = sum(factored_macs(self.layers[n].rows_seen, self.layers[n].out_features,
                                                    self.layers[n].in_features, ranks[n]) for n in names)
                    if all(r is None for r in ranks.values()):
                        continue  # the dense level: no error
                    for n in names:
                        self.layers[n].rank = ranks[n]
                    out = denoiser_output(self.denoiser(*args, **kwargs))
                    errors[b, j] = float((out.double() - reference.double()).norm() / norm)
                    for n in names:
                        self.layers[n].rank = None
        finally:
            self._inside = False
        assert self._calibration is not None
        while len(self._calibration) <= self.step:
            self._calibration.append((errors, costs))
        self._calibration[self.step] = (errors, costs)
        if self._timestep is not None:
            self._calibration_t[self.step] = self._timestep

    def calibrate(self, run: Callable[[], Any], budget: float, propagate: bool = True, probe: float = 0.25,
                  **dp_kwargs: Any) -> np.ndarray:
        """SARA-DP: measure per-(step, block, level) LRAE while ``run()`` samples at full rank, then
        solve the schedule that minimises the summed error with factored-layer MACs ``≤ budget ×`` full.

        The LRAE of (step t, block b, level l) is the relative error of the denoiser *output* at step t
        when only block b runs at level l (teacher-forced: the full-rank trajectory continues). With
        ``propagate=True`` (decided, the default) it is weighted by the step's **propagation gain**
        ``g_t`` = (relative error of the final sample) / (relative output error at step t), measured
        with one more warm-up run per step in which every factored layer runs at rank fraction
        ``probe`` at step t only. Output errors of different steps reach the sample very differently
        (an ε error at a noisy step moves the whole sample; at the last step it barely moves it), so
        the unweighted sum misallocates rank across steps; ``propagate=False`` is the unweighted,
        output-level model (cheaper: no extra runs).

        Every measurement compares separate ``run()`` calls, so ``run`` must be **deterministic**: a
        second full-rank call checks it reproduces the first and raises otherwise (pass a seeded
        ``generator=`` to a diffusers pipeline, ``noise=`` to ``DiffusionModule.sample``).

        Args:
            run: a zero-argument, deterministic call that samples with the denoiser (warm-up prompts /
                labels, fixed noise), with the same number of steps as the sampling the schedule is for,
                returning the samples (a tensor, numpy array, PIL images, or a pipeline output with
                ``.images``).
            budget: MACs of the factored layers as a fraction of their full-rank MACs, in ``(0, 1]``.
            propagate: weight each step's errors by its measured propagation gain.
            probe: rank fraction of the propagation probe, in ``(0, 1)``.
            dp_kwargs: ``unit`` / ``resolution`` of :func:`~lit_lowrank.ops.sara.solve_rank_dp`.

        Returns:
            the ``(T, B)`` schedule, also installed (``policy = "dp"``).
        """
        self._require_attached()
        if not 0 < budget <= 1:
            raise ValueError(f"`budget` must be a MACs fraction in (0, 1], got {budget!r}.")
        if not 0 < probe < 1:
            raise ValueError(f"`probe` must be a rank fraction in (0, 1), got {probe!r}.")
        self._calibration, self._calibration_t = [], {}
        try:
            reference = run()
            measured = self._calibration
        finally:
            self._calibration = None
        if not measured:
            raise RuntimeError("SARA calibration: `run` never called the denoiser.")
        self._check_deterministic(run, reference)
        errors = np.stack([e for e, _ in measured])  # (T, B, L)
        costs = np.stack([c for _, c in measured])
        steps, blocks, levels = errors.shape
        self.step_gains = self._propagation_gains(run, reference, steps, probe) if propagate else np.ones(steps)
        self.output_errors = errors
        errors = errors * self.step_gains[:, None, None]
        total = costs[..., -1].sum()
        choice = solve_rank_dp(errors.reshape(-1, levels), costs.reshape(-1, levels), budget * total, **dp_kwargs)
        self.calibration_errors, self.calibration_costs = errors, costs
        self.set_schedule(choice.reshape(steps, blocks))
        self.schedule_timesteps = [self._calibration_t[i] for i in range(steps)] if len(self._calibration_t) == steps \
            else []
        self.reset_macs()
        assert self.schedule is not None
        return self.schedule

    @torch.no_grad()
    def _check_deterministic(self, run: Callable[[], Any], reference: Any) -> None:
        """Run ``run()`` a second time at full rank and raise unless it reproduces ``reference``.

        Every gain and error of the calibration compares separate ``run()`` calls; an unseeded sampler
        draws new noise each call, and the DP then allocates rank to noise differences (measured: two
        unseeded full-rank runs differ by 0.27 in relative error, more than any truncation).
        """
        policy, self.policy = self.policy, "full"
        try:
            again = run()
        finally:
            self.policy = policy
        first, second = returned_samples(reference, "calibrate"), returned_samples(again, "calibrate")
        if first.shape != second.shape or not torch.allclose(first, second, rtol=1e-4, atol=1e-5):
            diff = float((first - second).norm() / first.norm().clamp_min(1e-12)) if first.shape == second.shape \
                else math.inf
            raise ValueError("SARA calibrate: two full-rank calls of `run()` returned different samples (relative "
                             f"difference {diff:.3g}): the calibration compares separate runs, so `run` must be "
                             "deterministic — fix its noise, e.g. `generator=torch.Generator().manual_seed(0)` for a "
                             "diffusers pipeline or `noise=` / `generator=` for DiffusionModule.sample.")

    @torch.no_grad()
    def _propagation_gains(self, run: Callable[[], Any], reference: Any, steps: int, probe: float) -> np.ndarray:
        """``g_t`` = final-sample relative error / step-t output relative error, one probe run per step."""
        ref = returned_samples(reference, "calibrate")
        ranks = {n: fraction_rank(probe, m.full_rank) for n, m in self.layers.items()}
        gains = np.ones(steps)
        policy = self.policy
        try:
            for t in range(steps):
                self._probe, self._probe_error = (t, ranks), None
                sample = returned_samples(run(), "calibrate")
                final = float((sample - ref).norm() / ref.norm().clamp_min(1e-12))
                if self._probe_error:
                    gains[t] = final / self._probe_error
        finally:
            self._probe, self.policy = None, policy
        return gains

    # -- accounting ----------------------------------------------------------------------
    def reset_macs(self) -> None:
        for layer in self.layers.values():
            layer.reset_macs()
        self.step_ranks = []

    def macs(self) -> tuple[int, int]:
        """``(used, dense)`` MACs of the factored layers since :meth:`reset_macs`."""
        return (sum(m.macs_used for m in self.layers.values()), sum(m.macs_dense for m in self.layers.values()))

    def macs_ratio(self) -> float:
        used, dense = self.macs()
        return used / dense if dense else math.nan


def apply_sara(denoiser: nn.Module, mode: str = "full", budget: float | None = None,
               threshold: float | None = None, **kwargs: Any) -> SARAController:
    """Attach a :class:`SARAController` to ``denoiser`` with a data-free policy.

    Args:
        mode: ``"full"``, ``"uniform"`` (``budget`` = rank fraction), ``"static"`` (``budget`` = energy
            kept) or ``"online"`` (``threshold``). SARA-DP needs :meth:`SARAController.calibrate`.
        kwargs: :class:`SARAController` arguments.

    .. code-block:: python

        with apply_sara(model.model, mode="online", threshold=0.5) as sara:
            images = model.sample(16, class_labels=labels)
    """
    if mode not in ("full", "uniform", "static", "online"):
        raise ValueError(f"`mode`={mode!r}, expected 'full', 'uniform', 'static' or 'online' "
                         "(SARA-DP: attach, then calibrate()).")
    controller = SARAController(denoiser, **kwargs).attach()
    if mode == "uniform":
        controller.set_uniform(_required(budget, "budget", mode))
    elif mode == "static":
        controller.set_static_energy(_required(budget, "budget", mode))
    elif mode == "online":
        controller.set_online(_required(threshold, "threshold", mode))
    return controller


def _required(value: float | None, name: str, mode: str) -> float:
    if value is None:
        raise ValueError(f"mode={mode!r} needs `{name}`.")
    return float(value)
