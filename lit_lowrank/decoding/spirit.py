"""SPIRIT: speed-driven online layer-skipping for self-speculative decoding, and its baselines.

The draft is the target itself with some attention / MLP sublayers of layers ``1..L-2``
left out (:func:`skip_sublayers`; no weight copy; the shared layer-skip machinery is in
:mod:`lit_lowrank.decoding.spirit_skip`, re-exported here). It drafts a chain on the *verifier's own*
KV cache (the committed prefix's keys/values are exact, no draft prefill) and crops the
cache back to the prefix afterwards, so the verifier of
:class:`~lit_lowrank.decoding.SpeculativeDecoder` sees its cache untouched: the output is
the target's own (greedy: identical to plain decoding; sampling: the target's distribution).

* :class:`LayerSkipDrafter` — a fixed pattern (the fixed-ratio baseline with a random pattern).
* :class:`AgreementSearchDrafter` — SWIFT-style: a fixed ratio, the pattern searched by
  matchness only (the agreement-only baseline).
* :class:`OfflineBayesDrafter` — Draft&Verify-style: the pattern at a fixed ratio searched
  *before* decoding by Bayesian optimisation (a GP surrogate) of matchness on calibration
  prompts, then fixed (the offline-search baseline).
* :class:`SpiritDrafter` — stage 1 picks the skip ratio by realised, length-normalised speed
  over decode windows (successive halving); stage 2 refines the pattern at that ratio by
  matchness; an EWMA of the normalised speed detects a task shift and re-enters stage 1,
  warm-started from the nearest stored profile. ``history`` logs every window (ratio,
  pattern, speed, acceptance, phase) and ``events`` the adaptation events.

.. code-block:: python

    from lit_lowrank.decoding import SpeculativeDecoder, SpiritDrafter, TargetLM, calibrate_length_profile

    target = TargetLM(model)
    drafter = SpiritDrafter(num_layers=model.config.num_hidden_layers, profile=calibrate_length_profile(target))
    engine = SpeculativeDecoder(target, drafter, budget=8)
    for prompt in stream:
        out, stats = engine.generate(prompt, max_new_tokens=64)
    print(drafter.events, drafter.history[-1])
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.decoding.engine import DraftRequest, DraftTree, RoundFeedback, TargetLM, plain_decode
from lit_lowrank.decoding.spirit_skip import (
    LayerSkipDrafter,
    calibrate_length_profile,
    pattern_matchness,
    sequence_matchness,
    skip_sublayers,
)
from lit_lowrank.ops.spirit import (
    BayesSearchResult,
    LengthProfile,
    ProfileStore,
    RatioSearch,
    ShiftDetector,
    SkipPattern,
    bayesian_pattern_search,
    mutate_pattern,
    random_pattern,
    skippable_sublayers,
    token_signature,
)

__all__ = ["AgreementSearchDrafter", "LayerSkipDrafter", "OfflineBayesDrafter", "SpiritDrafter",
           "calibrate_length_profile", "pattern_matchness", "sequence_matchness", "skip_sublayers"]


# ``search_stage`` metric: 0 = pattern fixed / monitoring, 1 = searching the ratio (stage 1) or the
# pattern (agreement-only search), 2 = an offline search before decoding
_STAGES = {"fixed": 0, "monitor": 0, "ratio": 1, "search": 1, "offline": 2}


class _WindowedSkipDrafter(LayerSkipDrafter):
    """Measures realised speed over windows of ``window_tokens`` emitted tokens (between draft calls)."""

    method = "spirit"  # the ``method/<name>/...`` prefix of the logged metrics

    def __init__(self, window_tokens: int = 32, profile: LengthProfile | None = None, match_window: int = 32,
                 seed: int = 0, clock: Callable[[], float] | None = None, logger: Any | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # any Lightning ``Logger`` (CSV, W&B, TensorBoard...): duck-typed, so decoding needs no trainer
        if logger is not None and not callable(getattr(logger, "log_metrics", None)):
            raise ValueError(f"`logger` must be a Lightning Logger (with `log_metrics`), got {type(logger).__name__}.")
        self.logger = logger
        self._logged_pattern: str | None = None
        self.clock = clock or time.perf_counter  # injectable: tests drive the windows with a fake clock
        if window_tokens < 1:
            raise ValueError(f"`window_tokens` must be >= 1, got {window_tokens}.")
        self.window_tokens, self.profile, self.match_window = window_tokens, profile, match_window
        self.generator = torch.Generator().manual_seed(seed)
        self.history: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.tokens_seen = 0
        self._t_last: float | None = None
        self._pending = 0
        self._window = {"tokens": 0, "seconds": 0.0, "context": 0.0, "rounds": 0, "accepted": 0, "drafted": 0}

    def reset(self) -> None:
        self._t_last, self._pending = None, 0  # the round before a new sequence includes its prefill

    def observe(self, feedback: RoundFeedback) -> None:
        self._pending = len(feedback.accepted) + 1
        self._window["accepted"] += len(feedback.accepted)
        self._window["drafted"] += feedback.tree.tokens.numel()
        self.tokens_seen += self._pending

    def draft(self, request: DraftRequest) -> DraftTree:
        now = self.clock()
        if self._t_last is not None and self._pending:
            w = self._window
            w["tokens"] += self._pending
            w["seconds"] += now - self._t_last
            w["context"] += request.tokens.numel() * self._pending
            w["rounds"] += 1
            if w["tokens"] >= self.window_tokens:
                self._close_window(request)
        self._pending = 0
        if self.profile is None:
            self.profile = calibrate_length_profile(request.target)
        # the round is timed from here: the search's own work above (matchness forwards,
        # calibration) is not charged to the configuration being measured
        self._t_last = self.clock()
        return super().draft(request)

    def _close_window(self, request: DraftRequest) -> None:
        w = self._window
        context = w["context"] / w["tokens"]
        speed = self.profile.normalise(w["tokens"], w["seconds"], context) if self.profile else w["tokens"] / w["seconds"]
        record = {"window": len(self.history), "tokens_seen": self.tokens_seen, "speed": speed,
                  "tokens_per_s": w["tokens"] / max(w["seconds"], 1e-12),
                  "acceptance": w["accepted"] / max(w["drafted"], 1), "tau": w["tokens"] / max(w["rounds"], 1),
                  "ratio": self.pattern.size / len(skippable_sublayers(self._num_layers(request))),
                  "pattern": self.pattern.describe()}
        self._window = {"tokens": 0, "seconds": 0.0, "context": 0.0, "rounds": 0, "accepted": 0, "drafted": 0}
        record.update(self.on_window(record, request))
        self.history.append(record)
        if self.logger is not None:
            self._log_window(record)

    def _log_window(self, record: dict[str, Any]) -> None:
        """Write one window's metrics under ``method/<method>/...`` at ``step=window``; the pattern as text."""
        key = f"method/{self.method}/"
        step = int(record["window"])
        self.logger.log_metrics({key + "ratio": float(record["ratio"]),
                                 key + "window_tokens_per_s": float(record["tokens_per_s"]),
                                 key + "normalised_speed": float(record["speed"]),
                                 key + "acceptance_length": float(record["tau"]),
                                 key + "acceptance_rate": float(record["acceptance"]),
                                 key + "search_stage": float(_STAGES.get(record.get("phase", "fixed"), 0)),
                                 key + "adaptation_event": float(len(self.events))}, step=step)
        # the pattern (text) only when it changed: W&B gets a table row, other loggers an hparam
        pattern = self.pattern.describe()  # the pattern the next window runs with
        if pattern != self._logged_pattern:
            self._logged_pattern = pattern
            if callable(getattr(self.logger, "log_text", None)):
                layers = getattr(self, "num_layers", None)  # subclasses know it; else the window's ratio
                ratio = self.pattern.size / len(skippable_sublayers(layers)) if layers else float(record["ratio"])
                self.logger.log_text(key=key + "pattern", columns=["window", "ratio", "pattern"],
                                     data=[[step, ratio, pattern]], step=step)
            else:
                self.logger.log_hyperparams({key + "pattern": pattern, key + "pattern_window": step})
        self.logger.save()

    @staticmethod
    def _num_layers(request: DraftRequest) -> int:
        return int(request.target.model.config.num_hidden_layers)

    def on_window(self, record: dict[str, Any], request: DraftRequest) -> dict[str, Any]:
        """A window closed: adapt (subclasses). Returns extra fields for the history record."""
        return {}

    def _best_by_matchness(self, request: DraftRequest, candidates: list[SkipPattern]) -> tuple[SkipPattern, float]:
        scored = [(pattern_matchness(request.target, request.tokens, p, self.match_window) or 0.0, i, p)
                  for i, p in enumerate(candidates)]
        best = max(scored, key=lambda s: (s[0], -s[1]))
        return best[2], best[0]

    def _proposals(self, best: SkipPattern, num_layers: int, ratio: float, n_random: int, n_mutate: int
                   ) -> list[SkipPattern]:
        return ([best] + [random_pattern(num_layers, ratio, self.generator) for _ in range(n_random)]
                + [mutate_pattern(best, num_layers, self.generator) for _ in range(n_mutate)])


class AgreementSearchDrafter(_WindowedSkipDrafter):
    """SWIFT-style agreement-only search: a fixed skip ratio, the pattern chosen by matchness alone.

    After each of the first ``search_windows`` windows it scores the incumbent, ``n_random``
    random patterns and ``n_mutate`` neighbours of the incumbent by matchness on the last
    ``match_window`` tokens and keeps the best. It never looks at speed.

    Args:
        num_layers: decoder layers of the target.
        ratio: the fixed skip ratio (fraction of the skippable sublayers; SWIFT uses ~0.45).
        search_windows: windows during which the pattern is searched.
        n_random / n_mutate: proposals per search step.
        **kwargs: :class:`LayerSkipDrafter` and window arguments.

    .. code-block:: python

        drafter = AgreementSearchDrafter(num_layers=12, ratio=0.45)
    """

    def __init__(self, num_layers: int, ratio: float = 0.45, search_windows: int = 8, n_random: int = 2,
                 n_mutate: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers, self.ratio = num_layers, ratio
        self.search_windows, self.n_random, self.n_mutate = search_windows, n_random, n_mutate
        self.pattern = random_pattern(num_layers, ratio, self.generator)

    def on_window(self, record: dict[str, Any], request: DraftRequest) -> dict[str, Any]:
        if len(self.history) >= self.search_windows:
            return {"phase": "fixed"}
        cands = self._proposals(self.pattern, self.num_layers, self.ratio, self.n_random, self.n_mutate)
        self.pattern, score = self._best_by_matchness(request, cands)
        return {"phase": "search", "matchness": score}


class SpiritDrafter(_WindowedSkipDrafter):
    """SPIRIT: skip ratio by realised speed, pattern by matchness, re-adaptation on a task shift.

    Phases (per window of ``window_tokens`` emitted tokens): ``ratio`` — successive halving
    over ``grid`` (:class:`~lit_lowrank.ops.spirit.RatioSearch`), each arm run with the best
    pattern known at that ratio (a random one at first), scored by the window's tokens/s
    divided by plain decoding's at the same context length (the ``profile``; calibrated on
    the first call when ``None``); ``refine`` — at the winning ratio, ``refine_steps`` rounds of
    matchness proposals (random + neighbours of the incumbent); ``monitor`` — the mean speed of
    ``reference_windows`` windows arms an EWMA :class:`~lit_lowrank.ops.spirit.ShiftDetector`;
    a drop beyond ``delta`` logs a ``shift`` event and re-enters ``ratio`` restricted to the
    grid neighbourhood of the nearest stored profile (token-histogram signature).

    Args:
        num_layers: decoder layers of the target.
        grid: candidate skip ratios (fractions of the skippable sublayers).
        refine_steps: matchness search steps in stage 2.
        n_random / n_mutate: proposals per refine step.
        alpha / delta / patience: the shift detector.
        reference_windows: windows averaged for the detector's reference speed.
        neighbourhood: grid steps around the stored ratio searched on re-adaptation.
        arm_candidates: random patterns scored by matchness when an arm is first run (best kept).
        arm_windows: windows per arm on the first successive-halving rung.
        **kwargs: ``window_tokens``, ``profile``, ``match_window``, ``seed``, ``clock``, ``logger`` (a
            Lightning ``Logger``: per-window ``method/spirit/{ratio, window_tokens_per_s,
            normalised_speed, acceptance_length, acceptance_rate, search_stage, adaptation_event}``
            at ``step=window``, the pattern as text when it changes) and
            :class:`LayerSkipDrafter` arguments.

    .. code-block:: python

        drafter = SpiritDrafter(num_layers=12, grid=[0.2, 0.3, 0.4, 0.5, 0.6], window_tokens=32)
        engine = SpeculativeDecoder(TargetLM(model), drafter, budget=8)
    """

    def __init__(self, num_layers: int, grid: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
                 refine_steps: int = 2, n_random: int = 2, n_mutate: int = 3, alpha: float = 0.5,
                 delta: float = 0.15, patience: int = 2, reference_windows: int = 2, neighbourhood: int = 1,
                 arm_candidates: int = 4, arm_windows: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        skippable_sublayers(num_layers)  # validates num_layers
        self.num_layers, self.grid = num_layers, tuple(grid)
        self.refine_steps, self.n_random, self.n_mutate = refine_steps, n_random, n_mutate
        self.reference_windows, self.neighbourhood = reference_windows, neighbourhood
        if arm_candidates < 1:
            raise ValueError(f"`arm_candidates` must be >= 1, got {arm_candidates}.")
        self.arm_candidates, self.arm_windows = arm_candidates, arm_windows
        self.detector = ShiftDetector(alpha, delta, patience)
        self.store = ProfileStore()
        self.best_patterns: dict[float, SkipPattern] = {}
        self._start_search(None)

    def _arm_pattern(self, ratio: float, request: DraftRequest | None) -> SkipPattern:
        """The best pattern known at ``ratio``; a new arm gets the best of ``arm_candidates`` random
        patterns by matchness (one cheap parallel forward each), so arms compare ratios rather
        than the luck of one random pattern."""
        if ratio not in self.best_patterns:
            cands = [random_pattern(self.num_layers, ratio, self.generator) for _ in range(self.arm_candidates)]
            enough = request is not None and request.target.length >= 2
            self.best_patterns[ratio] = self._best_by_matchness(request, cands)[0] if enough else cands[0]
        return self.best_patterns[ratio]

    def _start_search(self, incumbent: float | None, request: DraftRequest | None = None) -> None:
        self.phase = "ratio"
        self.search = RatioSearch(list(self.grid), windows_per_arm=self.arm_windows, incumbent=incumbent,
                                  neighbourhood=self.neighbourhood)
        self.pattern = self._arm_pattern(self.search.propose(), request)
        self._reference: list[float] = []

    def on_window(self, record: dict[str, Any], request: DraftRequest) -> dict[str, Any]:
        phase = self.phase
        extra: dict[str, Any] = {"phase": phase}
        if phase == "ratio":
            self.search.update(record["speed"])
            if not self.search.done:
                self.pattern = self._arm_pattern(self.search.propose(), request)
                return extra
            ratio = self.search.best
            best = self._arm_pattern(ratio, request)
            for _ in range(self.refine_steps):  # stage 2: refine the pattern at the chosen ratio
                cands = self._proposals(best, self.num_layers, ratio, self.n_random, self.n_mutate)
                best, score = self._best_by_matchness(request, cands)
                extra["matchness"] = score
            self.best_patterns[ratio] = self.pattern = best
            self.phase = "monitor"
            self.events.append({"event": "adapted", "window": record["window"], "tokens_seen": self.tokens_seen,
                                "ratio": ratio, "search_windows": self.search.windows})
        elif phase == "monitor":
            if not self.detector.armed:
                self._reference.append(record["speed"])
                if len(self._reference) >= self.reference_windows:
                    reference = sum(self._reference) / len(self._reference)
                    self.detector.arm(reference)
                    ratio = self.pattern.size / len(skippable_sublayers(self.num_layers))
                    self.store.add(self._signature(request), ratio, self.pattern, reference)
            elif self.detector.update(record["speed"]):
                nearest = self.store.nearest(self._signature(request))
                incumbent = None if nearest is None else nearest["ratio"]
                self.events.append({"event": "shift", "window": record["window"], "tokens_seen": self.tokens_seen,
                                    "warm_start_ratio": incumbent})
                self._start_search(incumbent, request)
        return extra

    def _signature(self, request: DraftRequest) -> Tensor:
        return token_signature(request.tokens[-4 * self.match_window:])


class OfflineBayesDrafter(_WindowedSkipDrafter):
    """Draft&Verify-style offline search: Bayesian optimisation of the pattern before decoding, then fixed.

    :meth:`calibrate` greedy-decodes each calibration prompt with the full target and runs
    :func:`~lit_lowrank.ops.spirit.bayesian_pattern_search` (GP surrogate, expected
    improvement) at the fixed ``ratio``, maximising :func:`sequence_matchness` on those
    continuations (the draft's agreement with the verifier); the winner is used for the whole
    stream, whatever the stream does afterwards. Windows are still measured (``history``,
    ``logger``) so it is comparable with the online drafters.

    Args:
        num_layers: decoder layers of the target.
        ratio: the fixed skip ratio (fraction of the skippable sublayers).
        budget / n_init: objective evaluations in all / random initial designs.
        **kwargs: window and :class:`LayerSkipDrafter` arguments (see :class:`SpiritDrafter`).

    .. code-block:: python

        drafter = OfflineBayesDrafter(num_layers=12, ratio=0.45, budget=24)
        drafter.calibrate(TargetLM(model), calibration_prompts, max_new_tokens=32)
        out, stats = SpeculativeDecoder(TargetLM(model), drafter, budget=8).generate(prompt, 64)
    """

    def __init__(self, num_layers: int, ratio: float = 0.45, budget: int = 24, n_init: int = 6,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        skippable_sublayers(num_layers)  # validates num_layers
        if not 1 <= n_init <= budget:
            raise ValueError(f"OfflineBayesDrafter: expected 1 <= n_init={n_init} <= budget={budget}.")
        self.num_layers, self.ratio, self.budget, self.n_init = num_layers, ratio, budget, n_init
        self.result: BayesSearchResult | None = None
        self.calibration_seconds = 0.0

    def calibrate(self, target: TargetLM | nn.Module, prompts: list[Tensor], max_new_tokens: int = 32
                  ) -> SkipPattern:
        """Search the pattern on ``prompts`` (their greedy continuations) and fix it; returns it."""
        if not prompts:
            raise ValueError("OfflineBayesDrafter.calibrate: `prompts` is empty.")
        target = target if isinstance(target, TargetLM) else TargetLM(target)
        t0 = time.perf_counter()
        seqs = [plain_decode(target, p, max_new_tokens)[0].cpu() for p in prompts]
        self.calibrate_on(target, seqs, [p.numel() for p in prompts])
        self.calibration_seconds = time.perf_counter() - t0
        return self.pattern

    def calibrate_on(self, target: TargetLM | nn.Module, sequences: list[Tensor], starts: list[int]) -> SkipPattern:
        """Search the pattern on known greedy ``sequences`` (continuations from ``starts[i]`` on) and fix it."""
        target = target if isinstance(target, TargetLM) else TargetLM(target)
        t0 = time.perf_counter()
        seqs, starts = [torch.as_tensor(q).cpu() for q in sequences], list(starts)
        self.result = bayesian_pattern_search(
            lambda pat: sequence_matchness(target.model, seqs, starts, pat), self.num_layers, self.ratio,
            budget=self.budget, n_init=self.n_init, generator=self.generator)
        self.pattern = self.result.best
        self.calibration_seconds = time.perf_counter() - t0
        return self.pattern

    def draft(self, request: DraftRequest) -> DraftTree:
        if self.result is None:
            raise RuntimeError("OfflineBayesDrafter: call `calibrate(target, prompts)` before decoding.")
        return super().draft(request)

    def on_window(self, record: dict[str, Any], request: DraftRequest) -> dict[str, Any]:
        return {"phase": "fixed"}
