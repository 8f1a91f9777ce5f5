"""What a verification costs on this machine: ``v(n) = base + slope * n`` target steps for ``n >= 1`` draft nodes.

A round verifies the root and ``n`` draft nodes in one target forward. With no draft node
it is a plain decoding step (cost 1 by definition). From one draft node on, the matrix
products switch from matrix-vector to matrix-matrix kernels (MKL's GEMV -> GEMM): on a
CPU the first drafted token costs about half a step, every further node only a few
percent (SmolLM2-135M, 2 threads: 2 / 5 / 9 tokens ≈ 1.50 / 1.57 / 1.69 steps). So the
model is affine in ``n`` with a jump at ``n = 1``, not ``1 + 0.15 n``. :func:`fit_verify_cost`
measures it on the machine (interleaved repeats, medians) and :meth:`VerifyCost.best_size`
sizes a tree from its nodes' acceptance estimates.

.. code-block:: python

    cost = fit_verify_cost(TargetLM(model), prompt_ids)      # ~2 s on a CPU
    cost.steps(8)                                            # e.g. 1.62
    n = cost.best_size(values, draft_steps=0.07)             # how many of the best nodes to verify
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lit_lowrank.decoding.engine import TargetLM


@dataclass
class VerifyCost:
    """Verification cost in target steps: ``1`` with no draft node, ``base + slope * n`` with ``n >= 1``.

    Attributes:
        base: intercept of the affine part (steps), so one draft node costs ``base + slope``.
        slope: steps per further draft node.
        step_seconds: one plain step's seconds where measured (``0.0``: not measured).
        measured: ``{n: steps}`` the fit came from.

    .. code-block:: python

        cost = VerifyCost(base=1.45, slope=0.03)
        cost.steps(0), cost.steps(4)                        # 1.0, 1.57
    """

    base: float = 1.45
    slope: float = 0.03
    step_seconds: float = 0.0
    measured: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.base <= 0 or self.slope < 0:
            raise ValueError(f"VerifyCost: expected base > 0 and slope >= 0, got base={self.base}, slope={self.slope}.")

    def steps(self, nodes: int) -> float:
        """Cost of verifying ``nodes`` draft nodes (plus the root), in plain target steps."""
        if nodes < 0:
            raise ValueError(f"VerifyCost.steps: `nodes` must be >= 0, got {nodes}.")
        return 1.0 if nodes == 0 else self.base + self.slope * nodes

    def best_size(self, values: list[float], draft_steps: float = 0.0) -> int:
        """How many of ``values`` (acceptance probabilities of nodes in best-first order) to verify.

        Maximises expected tokens per unit of time, ``(1 + sum(values[:n])) / (draft_steps + steps(n))``:
        the expected tokens of a round are the bonus token plus, for every node, the probability
        that its whole path is accepted. ``0`` means a plain step beats any draft.
        """
        best_n, best_rate, total = 0, 1.0 / (draft_steps + 1.0), 1.0
        for n, v in enumerate(values, start=1):
            total += v
            rate = total / (draft_steps + self.steps(n))
            if rate > best_rate:
                best_n, best_rate = n, rate
        return best_n


@torch.no_grad()
def fit_verify_cost(target: TargetLM, prompt: Tensor, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
                    repeats: int = 5) -> VerifyCost:
    """Measure ``v(n)`` on this machine: chains of ``n`` draft nodes verified after ``prompt`` vs plain steps.

    Every repeat runs one plain step and one verification of each size (interleaved, the
    cache cut back after each), so a loaded machine slows all of them alike; the cost of
    each size is the median of its per-repeat ratio to the step, and ``base`` / ``slope``
    their least-squares line over ``sizes``.

    Args:
        target: the verifier.
        prompt: ``(T,)`` a prompt to prefill once.
        sizes: draft-node counts to measure (``>= 1``; at least two distinct).
        repeats: interleaved repeats (medians over them).
    """
    if len(set(sizes)) < 2 or min(sizes) < 1:
        raise ValueError(f"fit_verify_cost: `sizes` needs >= 2 distinct counts >= 1, got {sizes}.")
    if repeats < 1:
        raise ValueError(f"fit_verify_cost: `repeats` must be >= 1, got {repeats}.")
    prompt = prompt.flatten()
    target.start(prompt)
    device = target.device
    gen = torch.Generator().manual_seed(0)
    vocab = int(target.model.config.vocab_size)
    ratios: dict[int, list[float]] = {n: [] for n in sizes}
    steps: list[float] = []
    for _ in range(repeats + 1):  # the first repeat warms every shape up and is dropped
        t0 = time.perf_counter()
        target.extend(prompt[-1:].to(device), torch.full((1,), -1, device=device))  # a plain step, undone below
        step = time.perf_counter() - t0
        target.keep([])
        times = {}
        for n in sizes:
            tokens = torch.randint(vocab, (n + 1,), generator=gen).to(device)
            parents = torch.arange(-1, n, device=device)
            t0 = time.perf_counter()
            target.extend(tokens, parents)
            times[n] = time.perf_counter() - t0
            target.keep([])
        if _ == 0:
            continue
        steps.append(step)
        for n in sizes:
            ratios[n].append(times[n] / step)
    measured = {n: statistics.median(r) for n, r in ratios.items()}
    xs, ys = list(measured), list(measured.values())
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs))
    base = max(my - slope * mx, 1e-3)
    return VerifyCost(base=base, slope=slope, step_seconds=statistics.median(steps),
                      measured={n: round(v, 4) for n, v in measured.items()})
