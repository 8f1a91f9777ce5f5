"""SpecBlock's cost-aware update bandit: whether (and how much of) a deployed drafter to update (no Lightning).

Arms are update scopes, cheapest first: ``none`` (keep the drafter), ``head`` (output
head(s) only), ``last_layer`` (+ the last drafter layer), ``full`` (every drafter
weight). Pulling an update arm costs verifier time (the update runs between rounds);
it pays back as a higher acceptance length τ over the following rounds. In tokens::

    reward(arm) = horizon * E[Δτ | arm] - cost_seconds(arm) * tokens_per_second

The bandit estimates ``E[Δτ | arm]`` from the Δτ observed after each pull (UCB1 on the
gain, the optimism capped by ``gain_cap``, the largest Δτ a round can show); the cost is
measured, not learned. ``none`` has reward exactly 0, so an update happens only when
an update arm's optimistic reward is positive: with every arm's cost at or above its
largest possible gain the drafter is never touched.

.. code-block:: python

    from lit_lowrank.ops.update_bandit import CostAwareUpdateBandit

    bandit = CostAwareUpdateBandit(horizon=16, gain_cap=2.0)
    arm = bandit.select(costs=[0.0, 3.0, 8.0, 20.0])     # tokens each update would cost
    ...                                                    # update with `arm`, decode some rounds
    bandit.update(arm, gain=tau_after - tau_before)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The arms, cheapest first; index 0 never updates.
UPDATE_ARMS: tuple[str, ...] = ("none", "head", "last_layer", "full")


class CostAwareUpdateBandit:
    """UCB over the expected acceptance-length gain of each update scope, minus its measured cost.

    Args:
        arms: arm names; ``arms[0]`` is "no update" (reward 0, never estimated).
        horizon: rounds an update's gain is counted over (its gain persists that long).
        gain_cap: the largest Δτ an update can bring (bounds the optimism; e.g. the tree depth).
        exploration: UCB1 bonus scale ``c`` in ``c * sqrt(2 ln t / n)`` (in Δτ units: about the spread
            of one epoch's τ, which is a fraction of a token on a stable stream).

    .. code-block:: python

        bandit = CostAwareUpdateBandit(horizon=16, gain_cap=2.0)
        arm = bandit.select([0.0, 1.0, 4.0, 9.0])
        bandit.update(arm, gain=0.3)
        bandit.expected_rewards([0.0, 1.0, 4.0, 9.0])     # horizon * mean gain - cost
    """

    def __init__(self, arms: Sequence[str] = UPDATE_ARMS, horizon: float = 16.0, gain_cap: float = 2.0,
                 exploration: float = 0.25) -> None:
        if len(arms) < 2:
            raise ValueError(f"CostAwareUpdateBandit: need 'no update' plus >= 1 update arm, got arms={list(arms)}.")
        if horizon <= 0 or gain_cap <= 0 or exploration < 0:
            raise ValueError(f"CostAwareUpdateBandit: expected horizon > 0, gain_cap > 0, exploration >= 0; got "
                             f"horizon={horizon}, gain_cap={gain_cap}, exploration={exploration}.")
        self.arms = tuple(arms)
        self.horizon, self.gain_cap, self.exploration = float(horizon), float(gain_cap), float(exploration)
        self.counts = [0] * len(self.arms)
        self.gain_sums = [0.0] * len(self.arms)
        self.decisions = 0

    def _check_costs(self, costs: Sequence[float]) -> list[float]:
        costs = [float(c) for c in costs]
        if len(costs) != len(self.arms) or any(c < 0 or math.isnan(c) for c in costs):
            raise ValueError(f"`costs` must be {len(self.arms)} non-negative numbers (one per arm {self.arms}), "
                             f"got {costs}.")
        return costs

    def mean_gain(self, arm: int) -> float:
        """Observed mean Δτ of ``arm`` (0 for ``none`` and for an arm never pulled)."""
        return self.gain_sums[arm] / self.counts[arm] if arm and self.counts[arm] else 0.0

    def optimistic_gain(self, arm: int) -> float:
        """UCB1 upper bound on the arm's Δτ, capped at ``gain_cap`` (``gain_cap`` before its first pull)."""
        if arm == 0:
            return 0.0
        n = self.counts[arm]
        if n == 0:
            return self.gain_cap
        t = max(self.decisions, 1)
        return min(self.gain_cap, self.mean_gain(arm) + self.exploration * math.sqrt(2.0 * math.log(t + 1) / n))

    def expected_rewards(self, costs: Sequence[float]) -> list[float]:
        """Point estimates ``horizon * mean Δτ - cost`` per arm (``none``: 0)."""
        costs = self._check_costs(costs)
        return [0.0] + [self.horizon * self.mean_gain(a) - costs[a] for a in range(1, len(self.arms))]

    def select(self, costs: Sequence[float]) -> int:
        """The arm to pull now: the best optimistic reward, or 0 (no update) unless one is positive.

        Args:
            costs: each arm's update cost in tokens (seconds the update takes x current
                tokens/s); ``costs[0]`` is ignored (no update is free).
        """
        costs = self._check_costs(costs)
        self.decisions += 1
        best, best_reward = 0, 0.0
        for arm in range(1, len(self.arms)):
            reward = self.horizon * self.optimistic_gain(arm) - costs[arm]
            if reward > best_reward:
                best, best_reward = arm, reward
        return best

    def update(self, arm: int, gain: float) -> None:
        """Record the Δτ observed after pulling ``arm`` (``none`` pulls are only counted)."""
        if not 0 <= arm < len(self.arms):
            raise ValueError(f"`arm` must be in 0..{len(self.arms) - 1}, got {arm}.")
        self.counts[arm] += 1
        if arm:
            self.gain_sums[arm] += float(gain)

    def reset(self) -> None:
        """Forget every observation."""
        self.counts = [0] * len(self.arms)
        self.gain_sums = [0.0] * len(self.arms)
        self.decisions = 0
