"""Environments for the FB task: two built-in ones, a gymnasium adapter and the temporal-abstraction wrapper.

Every environment follows the gymnasium API (``reset(seed) -> (obs, info)``,
``step(action) -> (obs, reward, terminated, truncated, info)``) and describes itself with
``obs_dim`` and either ``num_actions`` (discrete) or ``action_dim`` (continuous, actions in
``[-1, 1]``), so the built-in ones need no gymnasium install:

- :class:`SlipGridWorld`: a ``size × size`` grid, 4 moves, with probability ``slip`` the move is
  replaced by a uniformly random one, with probability ``stay`` the agent does not move (a lazy,
  non-bipartite walk); walls keep the agent in place. Its exact transition
  tensor :meth:`~SlipGridWorld.transition_tensor` gives the true successor representation.
- :class:`PointMass`: 2-D navigation in ``[-1, 1]²``, ``s' = clip(s + step_size·a + noise)``.
- :class:`GymnasiumAdapter`: any gymnasium environment (continuous control; MuJoCo /
  dm_control tasks when those are installed); ``Box`` actions are rescaled from ``[-1, 1]``.
- :class:`ActionRepeat`: temporal abstraction of length ``k`` (action repeat, or fixed-length
  options through ``option_policy``): one macro step runs up to ``k`` primitive steps, returns the
  macro reward (:func:`~lit_lowrank.ops.fb.macro_reward`) and stops early at a termination or
  truncation inside the repeat (``info["steps"]`` says how many steps ran).

The built-ins also step batches of states (``step_batch``) so collecting 10⁵ transitions is
vectorised.

.. code-block:: python

    from lit_lowrank.datamodules.rl_envs import ActionRepeat, make_env

    env = ActionRepeat(make_env("gridworld", size=10, slip=0.2), k=4)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(3)   # info["steps"] <= 4
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from lit_lowrank.ops.fb import MACRO_REWARDS

__all__ = ["SlipGridWorld", "PointMass", "GymnasiumAdapter", "ActionRepeat", "make_env", "BUILTIN_ENVS"]

# up, down, left, right (row, column offsets)
_MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)])


class SlipGridWorld:
    """A slippery ``size × size`` gridworld with exact dynamics.

    Args:
        size: grid side (``size²`` states, state id ``row·size + col``).
        slip: probability that the chosen move is replaced by a uniformly random one.
        stay: probability that the agent stays where it is (after the slip). ``0`` gives the
            classic grid, whose uniform walk is nearly bipartite (an eigenvalue near ``−1``, so
            ``P²`` is not low-pass); ``stay ≥ 0.5`` makes every eigenvalue of the uniform walk
            ``≥ 0`` (``P = stay·I + (1 − stay)·P₀``), so ``Pᵏ`` is a low-pass filter.
        obs: ``"onehot"`` (``size²`` dims) or ``"xy"`` (coordinates scaled to ``[-1, 1]``).
        reward_states: states whose entry gives reward 1 (empty: reward-free, as for FB data).
        terminal_states: entering one ends the episode (``terminated=True``).
        max_episode_steps: truncation horizon of :meth:`step`.
        start_state: fixed start; ``None`` draws a uniform state at reset.

    .. code-block:: python

        env = SlipGridWorld(size=10, slip=0.2, stay=0.5)
        P = env.transition_tensor()           # (4, 100, 100) float64
    """

    discrete = True

    def __init__(self, size: int = 10, slip: float = 0.2, obs: str = "onehot", reward_states: Sequence[int] = (),
                 terminal_states: Sequence[int] = (), max_episode_steps: int = 100, start_state: int | None = None,
                 stay: float = 0.0) -> None:
        if size < 2:
            raise ValueError(f"`size`={size}, expected >= 2.")
        if not 0.0 <= slip <= 1.0:
            raise ValueError(f"`slip`={slip}, expected in [0, 1].")
        if not 0.0 <= stay < 1.0:
            raise ValueError(f"`stay`={stay}, expected in [0, 1).")
        if obs not in ("onehot", "xy"):
            raise ValueError(f"`obs`={obs!r}, expected 'onehot' or 'xy'.")
        self.size, self.slip, self.stay, self.obs_mode = size, slip, stay, obs
        self.num_states, self.num_actions = size * size, 4
        self.obs_dim = self.num_states if obs == "onehot" else 2
        self.reward_states = set(int(s) for s in reward_states)
        self.terminal_states = set(int(s) for s in terminal_states)
        self.max_episode_steps, self.start_state = max_episode_steps, start_state
        self._rng = np.random.default_rng()
        self.state, self._t = 0, 0
        # next state of each (state, move): walls keep the agent in place
        rows, cols = np.divmod(np.arange(self.num_states), size)
        nr = np.clip(rows[:, None] + _MOVES[None, :, 0], 0, size - 1)
        nc = np.clip(cols[:, None] + _MOVES[None, :, 1], 0, size - 1)
        self._next = nr * size + nc                                     # (S, 4)

    def transition_tensor(self) -> torch.Tensor:
        """Exact ``P[a, s, s']`` as float64 ``(4, S, S)``."""
        S, A = self.num_states, self.num_actions
        P = np.zeros((A, S, S))
        for a in range(A):
            for b in range(A):
                prob = (1 - self.slip) * (a == b) + self.slip / A
                np.add.at(P[a], (np.arange(S), self._next[:, b]), prob)
        P = (1.0 - self.stay) * P + self.stay * np.eye(S)[None]
        return torch.from_numpy(P)

    def observe(self, states: np.ndarray) -> np.ndarray:
        """Observations ``(n, obs_dim)`` float32 of integer states ``(n,)``."""
        states = np.asarray(states, dtype=np.int64)
        if self.obs_mode == "onehot":
            return np.eye(self.num_states, dtype=np.float32)[states]
        rows, cols = np.divmod(states, self.size)
        return (np.stack([rows, cols], -1) / (self.size - 1) * 2 - 1).astype(np.float32)

    def step_batch(self, states: np.ndarray, actions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Next states of a batch (vectorised sampling of the slip)."""
        slipped = rng.random(states.shape) < self.slip
        moves = np.where(slipped, rng.integers(0, self.num_actions, states.shape), actions)
        moved = self._next[states, moves]
        if self.stay > 0.0:
            moved = np.where(rng.random(states.shape) < self.stay, states, moved)
        return moved

    def reward_of(self, states: np.ndarray) -> np.ndarray:
        return np.isin(states, list(self.reward_states)).astype(np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.state = self.start_state if self.start_state is not None else int(self._rng.integers(self.num_states))
        self._t = 0
        return self.observe([self.state])[0], {"state": self.state}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not 0 <= int(action) < self.num_actions:
            raise ValueError(f"SlipGridWorld.step: `action`={action}, expected an integer in [0, {self.num_actions}).")
        self.state = int(self.step_batch(np.array([self.state]), np.array([int(action)]), self._rng)[0])
        self._t += 1
        reward = float(self.state in self.reward_states)
        terminated = self.state in self.terminal_states
        truncated = self._t >= self.max_episode_steps and not terminated
        return self.observe([self.state])[0], reward, terminated, truncated, {"state": self.state}


class PointMass:
    """2-D point-mass navigation in ``[-1, 1]²`` with velocity actions.

    Args:
        step_size: displacement per unit action.
        noise: std of the Gaussian displacement noise.
        goal: optional goal; reward 1 while within ``goal_radius`` of it.
        goal_radius: radius of the goal region.
        max_episode_steps: truncation horizon.

    .. code-block:: python

        env = PointMass(goal=(0.5, 0.5))
        obs, _ = env.reset(seed=0)
        obs, r, terminated, truncated, _ = env.step(np.array([1.0, 1.0]))
    """

    discrete = False
    obs_dim = 2
    action_dim = 2

    def __init__(self, step_size: float = 0.1, noise: float = 0.02, goal: Sequence[float] | None = None,
                 goal_radius: float = 0.15, max_episode_steps: int = 100) -> None:
        if step_size <= 0 or noise < 0:
            raise ValueError(f"`step_size`={step_size} must be > 0 and `noise`={noise} >= 0.")
        self.step_size, self.noise, self.goal_radius = step_size, noise, goal_radius
        self.goal = None if goal is None else np.asarray(goal, dtype=np.float32)
        self.max_episode_steps = max_episode_steps
        self._rng = np.random.default_rng()
        self.state, self._t = np.zeros(2, dtype=np.float32), 0

    def step_batch(self, states: np.ndarray, actions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        actions = np.clip(actions, -1.0, 1.0)
        nxt = states + self.step_size * actions + self.noise * rng.standard_normal(states.shape)
        return np.clip(nxt, -1.0, 1.0).astype(np.float32)

    def observe(self, states: np.ndarray) -> np.ndarray:
        return np.asarray(states, dtype=np.float32)

    def reward_of(self, states: np.ndarray, goal: np.ndarray | None = None) -> np.ndarray:
        goal = self.goal if goal is None else goal
        if goal is None:
            return np.zeros(states.shape[:-1], dtype=np.float32)
        return (np.linalg.norm(states - goal, axis=-1) < self.goal_radius).astype(np.float32)

    def cells(self, states: np.ndarray, bins: int = 10) -> np.ndarray:
        """Cell ids of a ``bins × bins`` discretisation (for the transition-operator tools)."""
        idx = np.clip(((np.asarray(states) + 1) / 2 * bins).astype(np.int64), 0, bins - 1)
        return idx[..., 0] * bins + idx[..., 1]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.state = self._rng.uniform(-1, 1, 2).astype(np.float32)
        self._t = 0
        return self.state.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action, dtype=np.float32).reshape(2)
        self.state = self.step_batch(self.state[None], action[None], self._rng)[0]
        self._t += 1
        reward = float(self.reward_of(self.state[None])[0])
        return self.state.copy(), reward, False, self._t >= self.max_episode_steps, {}


class GymnasiumAdapter:
    """A gymnasium environment behind the built-ins' interface (needs the ``gym`` extra).

    Observations are flattened to float32; ``Discrete`` actions give ``num_actions``, ``Box``
    actions ``action_dim`` with actions taken in ``[-1, 1]`` and rescaled to the box.

    Args:
        env: a gymnasium id (``"Pendulum-v1"``, ``"HalfCheetah-v5"`` with MuJoCo) or an env.
        **make_kwargs: passed to ``gymnasium.make``.

    .. code-block:: python

        env = GymnasiumAdapter("Pendulum-v1")
        obs, _ = env.reset(seed=0)
        obs, r, terminated, truncated, _ = env.step(np.zeros(env.action_dim))
    """

    def __init__(self, env: Any, **make_kwargs: Any) -> None:
        try:
            import gymnasium as gym
        except ImportError as error:  # pragma: no cover - depends on the install
            raise ImportError("GymnasiumAdapter needs gymnasium: pip install -e '.[gym]' (or use the built-in "
                              "'gridworld' / 'pointmass' environments).") from error
        self.env = gym.make(env, **make_kwargs) if isinstance(env, str) else env
        self.obs_dim = int(np.prod(self.env.observation_space.shape))
        space = self.env.action_space
        if isinstance(space, gym.spaces.Discrete):
            self.discrete, self.num_actions = True, int(space.n)
        elif isinstance(space, gym.spaces.Box):
            self.discrete, self.action_dim = False, int(np.prod(space.shape))
            self._low, self._high = space.low.astype(np.float32), space.high.astype(np.float32)
        else:
            raise ValueError(f"GymnasiumAdapter: action space {space} is not Discrete or Box.")

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        return np.asarray(obs, dtype=np.float32).reshape(-1), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.discrete:
            unit = np.clip(np.asarray(action, dtype=np.float32).reshape(self._low.shape), -1.0, 1.0)
            action = self._low + (unit + 1.0) * 0.5 * (self._high - self._low)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return np.asarray(obs, dtype=np.float32).reshape(-1), float(reward), bool(terminated), bool(truncated), info


class ActionRepeat:
    """Temporal abstraction of length ``k``: action repeat or fixed-length options.

    One :meth:`step` runs up to ``k`` primitive steps with ``option_policy(obs, option, i)``
    (default: the option *is* the action, repeated), sums the rewards into the macro reward
    (``"sum"`` or ``"discounted"`` ``Σ γ^i r_i``) and stops at the first termination or
    truncation inside the repeat. ``info`` holds ``steps`` (primitive steps run), ``rewards``
    (the primitive rewards) and the last primitive step's info.

    Args:
        env: an environment with the gymnasium ``reset``/``step`` API.
        k: repeat length (1: the environment itself).
        gamma: per-step discount for ``reward="discounted"``.
        reward: ``"sum"`` or ``"discounted"``.
        option_policy: optional ``(obs, option, i) -> primitive action`` for fixed-length options.

    .. code-block:: python

        env = ActionRepeat(PointMass(), k=4)
        obs, _ = env.reset(seed=0)
        obs, macro_r, terminated, truncated, info = env.step(np.array([1.0, 0.0]))
    """

    def __init__(self, env: Any, k: int, gamma: float = 0.99, reward: str = "sum",
                 option_policy: Callable[[np.ndarray, Any, int], Any] | None = None) -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"`k`={k}, expected an integer >= 1.")
        if reward not in MACRO_REWARDS:
            raise ValueError(f"`reward`={reward!r}, expected one of {MACRO_REWARDS}.")
        self.env, self.k, self.gamma, self.reward_mode = env, int(k), gamma, reward
        self.option_policy = option_policy
        self._obs: np.ndarray | None = None

    def __getattr__(self, name: str) -> Any:
        # obs_dim, num_actions, transition_tensor... come from the wrapped env
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self._obs, info = self.env.reset(seed=seed, options=options)
        return self._obs, info

    def step(self, option: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._obs is None:
            raise RuntimeError("ActionRepeat.step called before reset().")
        rewards: list[float] = []
        terminated = truncated = False
        info: dict = {}
        for i in range(self.k):
            action = option if self.option_policy is None else self.option_policy(self._obs, option, i)
            self._obs, reward, terminated, truncated, info = self.env.step(action)
            rewards.append(float(reward))
            if terminated or truncated:
                break
        weights = [1.0] * len(rewards) if self.reward_mode == "sum" else [self.gamma ** i for i in range(len(rewards))]
        macro = float(sum(w * r for w, r in zip(weights, rewards)))
        return self._obs, macro, terminated, truncated, {**info, "steps": len(rewards), "rewards": rewards}


BUILTIN_ENVS = {"gridworld": SlipGridWorld, "pointmass": PointMass}


def make_env(name: str, **kwargs: Any) -> Any:
    """``"gridworld"``, ``"pointmass"`` or ``"gym:<gymnasium id>"`` (e.g. ``"gym:Pendulum-v1"``).

    .. code-block:: python

        env = make_env("gym:Pendulum-v1")
    """
    if name in BUILTIN_ENVS:
        return BUILTIN_ENVS[name](**kwargs)
    if name.startswith("gym:"):
        return GymnasiumAdapter(name[4:], **kwargs)
    raise ValueError(f"`env`={name!r}, expected one of {sorted(BUILTIN_ENVS)} or 'gym:<gymnasium id>'.")
