"""SPIRIT's pure math: skip patterns, the speed-driven ratio search, length-aware normalisation,
EWMA shift detection and the profile store (no model, no Lightning).

SPIRIT drafts with the target itself, some attention / MLP *sublayers* of layers
``1..L-2`` left out (a :class:`SkipPattern`). Stage 1 picks the *skip ratio* (the fraction
of skippable sublayers left out) from a grid by realised speed over decode windows
(:class:`RatioSearch`, successive halving), each window's speed first divided by plain
decoding's speed at the same context length (:class:`LengthProfile`), because a window at
a longer context is slower for reasons that have nothing to do with the draft. Stage 2
refines the pattern at that ratio by matchness (:func:`matchness`, :func:`mutate_pattern`).
Afterwards an EWMA of the normalised speed watches for a task shift
(:class:`ShiftDetector`); a drop re-enters stage 1, warm-started from the nearest stored
profile (:class:`ProfileStore`, keyed by a token-histogram signature).

.. code-block:: python

    from lit_lowrank.ops.spirit import LengthProfile, RatioSearch, ShiftDetector

    profile = LengthProfile.fit(lengths=[32, 64, 128], seconds_per_token=[0.010, 0.011, 0.013])
    search = RatioSearch([0.2, 0.3, 0.4, 0.5, 0.6])
    while not search.done:
        rho = search.propose()
        speed = profile.normalise(tokens=40, seconds=0.25, context_length=90)   # measured at rho
        search.update(speed)
    detector = ShiftDetector(delta=0.15)
    detector.arm(reference=search.best_score)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

SUBLAYERS = ("attn", "mlp")


@dataclass(frozen=True)
class SkipPattern:
    """Which sublayers the draft leaves out.

    Attributes:
        attn: decoder-layer indices whose self-attention sublayer is skipped.
        mlp: decoder-layer indices whose MLP sublayer is skipped.
    """

    attn: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()

    @property
    def size(self) -> int:
        """Number of skipped sublayers."""
        return len(self.attn) + len(self.mlp)

    @property
    def whole_layers(self) -> frozenset[int]:
        """Layers with both sublayers skipped (dropped whole, norms included)."""
        return self.attn & self.mlp

    def sublayers(self) -> set[tuple[int, str]]:
        return {(i, "attn") for i in self.attn} | {(i, "mlp") for i in self.mlp}

    @staticmethod
    def from_sublayers(items: set[tuple[int, str]] | list[tuple[int, str]]) -> SkipPattern:
        bad = [s for s in items if s[1] not in SUBLAYERS]
        if bad:
            raise ValueError(f"SkipPattern: sublayer kinds {bad} not in {SUBLAYERS}.")
        return SkipPattern(frozenset(i for i, k in items if k == "attn"), frozenset(i for i, k in items if k == "mlp"))

    def describe(self) -> str:
        return f"attn{sorted(self.attn)} mlp{sorted(self.mlp)}"


def skippable_sublayers(num_layers: int) -> list[tuple[int, str]]:
    """The sublayers a draft may skip: attention and MLP of layers ``1..L-2`` (first and last stay)."""
    if num_layers < 3:
        raise ValueError(f"`num_layers`={num_layers}: SPIRIT needs >= 3 layers (first and last are never skipped).")
    return [(i, k) for i in range(1, num_layers - 1) for k in SUBLAYERS]


def pattern_size(num_layers: int, ratio: float) -> int:
    """Sublayers skipped at skip ratio ``ratio`` (rounded, at least 1 when ``ratio > 0``)."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"`ratio`={ratio}: expected a skip ratio in [0, 1].")
    n = len(skippable_sublayers(num_layers))
    return min(n, max(int(ratio > 0), round(ratio * n)))


def random_pattern(num_layers: int, ratio: float, generator: torch.Generator | None = None) -> SkipPattern:
    """A uniformly random pattern at skip ratio ``ratio``."""
    cands = skippable_sublayers(num_layers)
    k = pattern_size(num_layers, ratio)
    idx = torch.randperm(len(cands), generator=generator)[:k].tolist()
    return SkipPattern.from_sublayers([cands[i] for i in idx])


def mutate_pattern(pattern: SkipPattern, num_layers: int, generator: torch.Generator | None = None) -> SkipPattern:
    """A neighbour at the same ratio: one skipped sublayer swapped for one kept sublayer."""
    cands = skippable_sublayers(num_layers)
    skipped = sorted(pattern.sublayers())
    kept = [c for c in cands if c not in pattern.sublayers()]
    if not skipped or not kept:
        return pattern
    out = torch.randint(len(skipped), (1,), generator=generator).item()
    into = torch.randint(len(kept), (1,), generator=generator).item()
    return SkipPattern.from_sublayers((set(skipped) - {skipped[out]}) | {kept[into]})


def matchness(draft_argmax: Tensor, next_tokens: Tensor) -> float:
    """SWIFT's matchness: the fraction of greedy draft predictions equal to the actual next tokens.

    Args:
        draft_argmax: ``(N,)`` the draft's argmax after each of ``N`` context tokens.
        next_tokens: ``(N,)`` the tokens that actually followed.
    """
    if draft_argmax.shape != next_tokens.shape or draft_argmax.dim() != 1 or draft_argmax.numel() == 0:
        raise ValueError(f"matchness: expected two equal non-empty (N,) tensors, got {tuple(draft_argmax.shape)} "
                         f"and {tuple(next_tokens.shape)}.")
    return float((draft_argmax == next_tokens).float().mean())


def chain_speedup(acceptance: float, draft_length: int, draft_cost: float) -> float:
    """Expected speedup of chain drafting over plain decoding (the standard i.i.d. acceptance model).

    Each of ``draft_length`` draft tokens is accepted with probability ``acceptance`` given its
    predecessors were; a round emits ``(1 - a^(k+1)) / (1 - a)`` tokens and costs
    ``k * draft_cost + 1`` target forwards (``draft_cost`` = a draft forward's time relative
    to a target forward). Used as a synthetic cost model with a known optimum.
    """
    if not 0.0 <= acceptance <= 1.0 or draft_length < 0 or draft_cost < 0:
        raise ValueError(f"chain_speedup: acceptance={acceptance} in [0,1], draft_length={draft_length} >= 0 "
                         f"and draft_cost={draft_cost} >= 0 expected.")
    return _chain_tokens(acceptance, draft_length) / (draft_length * draft_cost + 1.0)


def _chain_tokens(acceptance: float, draft_length: int) -> float:
    """Expected tokens per round of a ``draft_length`` chain at i.i.d. per-token ``acceptance``."""
    k, a = draft_length, acceptance
    return k + 1.0 if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def break_even_acceptance(ceiling: float, draft_length: int) -> float | None:
    """The per-token acceptance a chain drafter needs to match plain decoding, given its measured ceiling.

    ``ceiling`` is the drafter's speed-up when every draft is accepted (``draft_length + 1``
    tokens per round at its real drafting and verification cost, e.g. an oracle priced as the
    drafter). Under the i.i.d. acceptance model of :func:`chain_speedup` a round at acceptance
    ``a`` costs the same and emits ``(1 - a^(k+1)) / (1 - a)`` tokens, so the speed-up is
    ``ceiling * tokens(a) / (k + 1)``; this returns the ``a`` where that is 1 (bisection),
    or ``None`` when even ``a = 1`` is not enough (``ceiling <= 1``).

    .. code-block:: python

        break_even_acceptance(1.4, 6)   # ~0.885: below that the drafter is slower than plain decoding
    """
    if not ceiling > 0 or draft_length < 1:
        raise ValueError(f"break_even_acceptance: ceiling={ceiling} > 0 and draft_length={draft_length} >= 1 "
                         "expected.")
    k = draft_length
    if ceiling <= 1.0:
        return None
    need = (k + 1) / ceiling  # tokens per round that make the round as fast as plain steps
    lo, hi = 0.0, 1.0
    for _ in range(60):  # tokens(a) is increasing in a; 60 halvings reach float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _chain_tokens(mid, k) < need else (lo, mid)
    return (lo + hi) / 2


@dataclass
class LengthProfile:
    """Plain autoregressive decoding speed vs context length: ``sec/token = intercept + slope * length``.

    Linear because per-token work is the weights (constant) plus attention over the context
    (linear in its length). :meth:`normalise` divides a window's tokens/s by plain decoding's
    tokens/s at the window's mean context length: a relative speed (a speedup estimate) that
    windows at different context lengths can be compared by.
    """

    intercept: float
    slope: float = 0.0

    def __post_init__(self) -> None:
        if not self.intercept > 0 or self.slope < 0:
            raise ValueError(f"LengthProfile: intercept={self.intercept} must be > 0 and slope={self.slope} >= 0.")

    @staticmethod
    def fit(lengths: list[float] | Tensor, seconds_per_token: list[float] | Tensor) -> LengthProfile:
        """Least squares over measured ``(context length, seconds per plain token)`` points."""
        x = torch.as_tensor(lengths, dtype=torch.float64).flatten()
        y = torch.as_tensor(seconds_per_token, dtype=torch.float64).flatten()
        if x.numel() != y.numel() or x.numel() == 0:
            raise ValueError(f"LengthProfile.fit: {x.numel()} lengths and {y.numel()} times; need equal, >= 1.")
        if x.numel() == 1 or float(x.var()) == 0.0:
            return LengthProfile(float(y.mean()))
        slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
        slope = max(slope, 0.0)  # timing noise must not make longer contexts faster
        intercept = float(y.mean()) - slope * float(x.mean())
        if intercept <= 0:
            intercept, slope = float(y.mean()), 0.0
        return LengthProfile(intercept, slope)

    def seconds_per_token(self, context_length: float) -> float:
        return self.intercept + self.slope * float(context_length)

    def plain_tokens_per_second(self, context_length: float) -> float:
        return 1.0 / self.seconds_per_token(context_length)

    def normalise(self, tokens: float, seconds: float, context_length: float) -> float:
        """``(tokens / seconds) / plain tokens/s at context_length``: 1.0 = as fast as plain decoding."""
        if seconds <= 0 or tokens < 0:
            raise ValueError(f"normalise: tokens={tokens} >= 0 and seconds={seconds} > 0 expected.")
        return tokens / seconds * self.seconds_per_token(context_length)


class RatioSearch:
    """Stage 1: successive halving over a grid of skip ratios, scored by normalised window speed.

    Every live arm is measured for ``windows_per_arm`` windows per rung (doubling each rung),
    the better half (by mean score) survives, until one arm is left. ``propose`` returns the
    ratio to run next, ``update`` takes its measured score. A warm start (``incumbent``)
    keeps only the grid points within ``neighbourhood`` steps of a stored ratio, so
    re-adaptation after a shift costs a few windows instead of a full search.

    Args:
        grid: candidate skip ratios (each in ``(0, 1]``).
        windows_per_arm: windows per arm on the first rung.
        incumbent: warm-start ratio (the nearest stored profile's), or ``None``.
        neighbourhood: grid steps kept around ``incumbent``.

    .. code-block:: python

        search = RatioSearch([0.2, 0.4, 0.6])
        while not search.done:
            search.update(measure(search.propose()))
        best = search.best
    """

    def __init__(self, grid: list[float], windows_per_arm: int = 1, incumbent: float | None = None,
                 neighbourhood: int = 1) -> None:
        grid = sorted(float(g) for g in grid)
        if not grid or any(not 0.0 < g <= 1.0 for g in grid):
            raise ValueError(f"`grid`={grid}: expected a non-empty list of skip ratios in (0, 1].")
        if windows_per_arm < 1 or neighbourhood < 0:
            raise ValueError(f"`windows_per_arm`={windows_per_arm} must be >= 1, `neighbourhood`={neighbourhood} >= 0.")
        if incumbent is not None:
            centre = min(range(len(grid)), key=lambda i: abs(grid[i] - incumbent))
            grid = grid[max(0, centre - neighbourhood): centre + neighbourhood + 1]
        self.arms = grid
        self.scores: dict[float, list[float]] = {g: [] for g in grid}
        self.alive = list(grid)
        self.per_arm = windows_per_arm
        self._queue = self._schedule()
        self.windows = 0

    def _schedule(self) -> list[float]:
        return [g for g in self.alive for _ in range(self.per_arm)]

    @property
    def done(self) -> bool:
        return len(self.alive) == 1 and not self._queue

    def propose(self) -> float:
        """The ratio to measure next (the winner once :attr:`done`)."""
        return self._queue[0] if self._queue else self.best

    def update(self, score: float) -> None:
        """The normalised speed measured over one window at :meth:`propose`'s ratio."""
        if not self._queue:
            return
        self.scores[self._queue.pop(0)].append(float(score))
        self.windows += 1
        if not self._queue and len(self.alive) > 1:
            ranked = sorted(self.alive, key=self.mean, reverse=True)
            self.alive = ranked[: max(1, len(ranked) // 2)]
            if len(self.alive) > 1:
                self.per_arm *= 2
                self._queue = self._schedule()

    def mean(self, ratio: float) -> float:
        s = self.scores[ratio]
        return sum(s) / len(s) if s else -math.inf

    @property
    def best(self) -> float:
        return max(self.alive, key=self.mean)

    @property
    def best_score(self) -> float:
        return self.mean(self.best)


class ShiftDetector:
    """EWMA of normalised speed; a drop below ``(1 - delta) * reference`` for ``patience`` windows is a shift.

    Args:
        alpha: EWMA weight of the newest window.
        delta: relative drop that counts as a shift (~0.15).
        patience: consecutive windows below the threshold before firing (noise guard).

    .. code-block:: python

        det = ShiftDetector(alpha=0.5, delta=0.15)
        det.arm(reference=1.4)
        for speed in trace:
            if det.update(speed):
                print("task shift: re-adapt")
    """

    def __init__(self, alpha: float = 0.5, delta: float = 0.15, patience: int = 2) -> None:
        if not 0 < alpha <= 1 or not 0 < delta < 1 or patience < 1:
            raise ValueError(f"ShiftDetector: alpha={alpha} in (0,1], delta={delta} in (0,1), patience={patience} >= 1.")
        self.alpha, self.delta, self.patience = alpha, delta, patience
        self.reference: float | None = None
        self.ewma: float | None = None
        self._below = 0

    def arm(self, reference: float) -> None:
        """Start watching, with the adapted configuration's speed as the reference."""
        self.reference, self.ewma, self._below = float(reference), float(reference), 0

    def disarm(self) -> None:
        self.reference, self.ewma, self._below = None, None, 0

    @property
    def armed(self) -> bool:
        return self.reference is not None

    def update(self, speed: float) -> bool:
        """Feed one window's normalised speed; True when a shift is detected (then disarmed)."""
        if self.reference is None:
            return False
        self.ewma = self.alpha * float(speed) + (1 - self.alpha) * self.ewma
        self._below = self._below + 1 if self.ewma < (1 - self.delta) * self.reference else 0
        if self._below >= self.patience:
            self.disarm()
            return True
        return False


def token_signature(tokens: Tensor, buckets: int = 64) -> Tensor:
    """A request-stream signature: the L2-normalised histogram of token ids hashed into ``buckets``."""
    if tokens.numel() == 0:
        raise ValueError("token_signature: `tokens` is empty.")
    hist = torch.bincount(tokens.flatten().long() % buckets, minlength=buckets).double()
    return hist / hist.norm()


@dataclass
class ProfileStore:
    """Adapted configurations keyed by stream signature; :meth:`nearest` warm-starts re-adaptation."""

    entries: list[dict[str, Any]] = field(default_factory=list)

    def add(self, signature: Tensor, ratio: float, pattern: SkipPattern, speed: float) -> None:
        self.entries.append({"signature": signature, "ratio": ratio, "pattern": pattern, "speed": speed})

    def nearest(self, signature: Tensor) -> dict[str, Any] | None:
        """The stored entry with the highest cosine similarity to ``signature`` (None when empty)."""
        if not self.entries:
            return None
        return max(self.entries, key=lambda e: float(e["signature"] @ signature))


def pattern_features(pattern: SkipPattern, num_layers: int) -> Tensor:
    """The pattern as a 0/1 vector over :func:`skippable_sublayers` (the surrogate's input space)."""
    skipped = pattern.sublayers()
    return torch.tensor([float(c in skipped) for c in skippable_sublayers(num_layers)], dtype=torch.float64)


@dataclass
class BayesSearchResult:
    """What :func:`bayesian_pattern_search` found: the best evaluated pattern and every evaluation in order."""

    best: SkipPattern
    best_score: float
    trace: list[tuple[SkipPattern, float]]


def bayesian_pattern_search(objective: Any, num_layers: int, ratio: float, budget: int = 24, n_init: int = 6,
                            pool: int = 128, xi: float = 0.01,
                            generator: torch.Generator | None = None) -> BayesSearchResult:
    """Draft&Verify-style offline Bayesian optimisation of a skip pattern at a fixed skip ratio.

    A Gaussian process (scikit-learn; Matern-5/2 + white noise on the 0/1 sublayer vector,
    normalised targets) is fitted to the patterns evaluated so far; the next pattern is the
    expected-improvement maximiser over a candidate pool (random patterns at ``ratio`` plus
    one-swap neighbours of the incumbent, unevaluated only). ``n_init`` random patterns start
    it; ``budget`` objective calls in all. Deterministic given ``generator``.

    Args:
        objective: ``SkipPattern -> float`` to maximise (e.g. matchness on calibration prompts).
        num_layers: decoder layers of the target.
        ratio: the skip ratio every proposal has.
        budget: objective evaluations in total (>= ``n_init`` >= 1).
        n_init: random patterns before the surrogate is used.
        pool: random candidates scored by the acquisition per step (plus all neighbours).
        xi: exploration margin of expected improvement (in objective units).
        generator: randomness for the initial and pool patterns.

    .. code-block:: python

        result = bayesian_pattern_search(lambda p: my_matchness(p), num_layers=12, ratio=0.45, budget=24)
        drafter_pattern = result.best
    """
    import numpy as np
    from scipy.stats import norm
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    if not 1 <= n_init <= budget:
        raise ValueError(f"bayesian_pattern_search: expected 1 <= n_init={n_init} <= budget={budget}.")
    if pool < 1:
        raise ValueError(f"bayesian_pattern_search: `pool` must be >= 1, got {pool}.")
    total = math.comb(len(skippable_sublayers(num_layers)), pattern_size(num_layers, ratio))
    seen: dict[str, float] = {}
    trace: list[tuple[SkipPattern, float]] = []

    def evaluate(p: SkipPattern) -> None:
        score = float(objective(p))
        seen[p.describe()] = score
        trace.append((p, score))

    tries = 0
    while len(trace) < min(n_init, total) and tries < 50 * n_init:  # distinct random starts
        tries += 1
        p = random_pattern(num_layers, ratio, generator)
        if p.describe() not in seen:
            evaluate(p)
    kernel = ConstantKernel(1.0) * Matern(length_scale=2.0, nu=2.5) + WhiteKernel(1e-3, (1e-6, 1e-1))
    while len(trace) < min(budget, total):
        x = torch.stack([pattern_features(p, num_layers) for p, _ in trace]).numpy()
        y = np.array([s for _, s in trace])
        with warnings.catch_warnings():  # hyperparameters at their bounds on a few points: expected, harmless
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=0).fit(x, y)
        incumbent = max(trace, key=lambda t: t[1])[0]
        cands: dict[str, SkipPattern] = {}
        skipped = sorted(incumbent.sublayers())
        kept = [c for c in skippable_sublayers(num_layers) if c not in incumbent.sublayers()]
        for out in skipped:  # every one-swap neighbour of the incumbent: local refinement
            for into in kept:
                q = SkipPattern.from_sublayers((set(skipped) - {out}) | {into})
                cands[q.describe()] = q
        for _ in range(pool):  # random patterns: global exploration
            q = random_pattern(num_layers, ratio, generator)
            cands[q.describe()] = q
        fresh = [q for key, q in cands.items() if key not in seen]
        if not fresh:
            break
        xc = torch.stack([pattern_features(q, num_layers) for q in fresh]).numpy()
        mu, sd = gp.predict(xc, return_std=True)
        best_y = y.max()
        sd = np.maximum(sd, 1e-12)
        z = (mu - best_y - xi) / sd
        ei = (mu - best_y - xi) * norm.cdf(z) + sd * norm.pdf(z)
        evaluate(fresh[int(np.argmax(ei))])
    best, score = max(trace, key=lambda t: t[1])
    return BayesSearchResult(best, score, trace)
