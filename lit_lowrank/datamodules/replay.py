"""Offline replay data for the FB task: collected by random / exploratory policies, or ExORL-style from disk.

Batches are dicts of tensors: ``obs (n, obs_dim)``, ``action`` (``(n,)`` long for discrete
environments, ``(n, action_dim)`` in ``[-1, 1]`` otherwise), ``reward (n,)`` (the macro reward),
``next_obs``, ``not_done (n,)`` (0 after a termination) and ``steps (n,)`` (primitive steps of the
macro transition, for the ``γ^steps`` macro discount); the gridworld adds the integer
``state``/``next_state``.

Temporal abstraction is applied to collection: with ``k > 1`` every stored transition is one
macro step of :class:`~lit_lowrank.datamodules.rl_envs.ActionRepeat` (same semantics, vectorised
for the built-in environments): ``abstraction="repeat"`` holds the stored action ``k`` steps,
``"options"`` takes it once and then ``k − 1`` fresh uniform actions (a fixed-length option whose
averaged operator is ``P_πᵏ``). ExORL-style episodes (``.npz`` with ``observation``, ``action``,
``reward``, ``discount``) are turned into ``k``-step transitions ``(s_t, a_t, Σ r, s_{t+k})``:
offline data collected without repeats gives fixed-length options "first action, then the
behaviour policy" — the offline form of the abstraction.

.. code-block:: python

    data = ReplayDataModule(env="gridworld", k=4, num_transitions=100_000)
    data = ReplayDataModule(env="pointmass", k=2, policy="exploratory")
    data = ReplayDataModule(env="gym:Pendulum-v1", path="/data/exorl/pendulum/rnd/buffer", k=2)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_lowrank.datamodules.rl_envs import ActionRepeat, PointMass, SlipGridWorld, make_env
from lit_lowrank.ops.fb import ABSTRACTIONS, MACRO_REWARDS

__all__ = ["ReplayDataModule", "TransitionDataset", "collect_transitions", "load_exorl"]

POLICIES = ("random", "exploratory")


class TransitionDataset(Dataset):
    """A dict of equally long tensors indexed by transition."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        lengths = {k: len(v) for k, v in tensors.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"TransitionDataset: tensors of different lengths {lengths}.")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[index] for k, v in self.tensors.items()}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        # the DataLoader fetches whole batches through this: one gather per tensor, no per-item collate
        index = torch.as_tensor(indices, dtype=torch.long)
        return {k: v[index] for k, v in self.tensors.items()}


def _batch_as_is(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return batch


def _random_actions(env: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    if env.discrete:
        return rng.integers(0, env.num_actions, n)
    return rng.uniform(-1, 1, (n, env.action_dim)).astype(np.float32)


def collect_transitions(env: Any, num_transitions: int, k: int = 1, policy: str = "random",
                        macro_reward: str = "sum", gamma: float = 0.99, episode_length: int = 100,
                        num_envs: int = 64, persistence: float = 0.75, seed: int = 0,
                        abstraction: str = "repeat") -> dict[str, torch.Tensor]:
    """Collect ``num_transitions`` macro transitions of length ``k`` with a reward-free behaviour policy.

    ``"random"``: uniform actions, a fresh one every macro step; ``"exploratory"``: the previous
    macro action is kept with probability ``persistence`` (a temporally correlated random walk
    that covers the space further from its start). ``abstraction``: ``"repeat"`` holds the macro
    action ``k`` steps, ``"options"`` follows it with ``k − 1`` uniform actions. Episodes last ``episode_length`` macro steps
    and start uniformly. Built-in environments are stepped ``num_envs`` at a time.

    .. code-block:: python

        data = collect_transitions(SlipGridWorld(), 50_000, k=4)
    """
    if policy not in POLICIES:
        raise ValueError(f"`policy`={policy!r}, expected one of {POLICIES}.")
    if macro_reward not in MACRO_REWARDS:
        raise ValueError(f"`macro_reward`={macro_reward!r}, expected one of {MACRO_REWARDS}.")
    if abstraction not in ABSTRACTIONS:
        raise ValueError(f"`abstraction`={abstraction!r}, expected one of {ABSTRACTIONS}.")
    if num_transitions < 1 or k < 1:
        raise ValueError(f"`num_transitions`={num_transitions} and `k`={k} must be >= 1.")
    rng = np.random.default_rng(seed)
    if isinstance(env, (SlipGridWorld, PointMass)):
        return _collect_vectorised(env, num_transitions, k, policy, macro_reward, gamma, episode_length,
                                   num_envs, persistence, rng, abstraction)
    return _collect_sequential(env, num_transitions, k, policy, macro_reward, gamma, episode_length, persistence,
                               rng, seed, abstraction)


def _collect_vectorised(env: Any, n_total: int, k: int, policy: str, macro_reward: str, gamma: float,
                        episode_length: int, num_envs: int, persistence: float,
                        rng: np.random.Generator, abstraction: str = "repeat") -> dict[str, torch.Tensor]:
    grid = isinstance(env, SlipGridWorld)
    weights = np.ones(k) if macro_reward == "sum" else gamma ** np.arange(k)
    out: dict[str, list] = {key: [] for key in ("state", "action", "next_state", "reward")}
    collected, t = 0, 0
    states = actions = None
    while collected < n_total:
        if t % episode_length == 0:
            states = rng.integers(0, env.num_states, num_envs) if grid else rng.uniform(-1, 1, (num_envs, 2))
            actions = _random_actions(env, num_envs, rng)
        fresh = _random_actions(env, num_envs, rng)
        if policy == "random":
            actions = fresh
        else:
            keep = rng.random(num_envs) < persistence
            actions = np.where(keep if grid else keep[:, None], actions, fresh)
        s, reward = states, np.zeros(num_envs, dtype=np.float32)
        for i in range(k):
            held = actions if i == 0 or abstraction == "repeat" else _random_actions(env, num_envs, rng)
            s = env.step_batch(s, held, rng)
            reward += weights[i] * env.reward_of(s)
        out["state"].append(states), out["action"].append(actions)
        out["next_state"].append(s), out["reward"].append(reward)
        states, collected, t = s, collected + num_envs, t + 1
    cat = {key: np.concatenate(v)[:n_total] for key, v in out.items()}
    data = {
        "obs": torch.from_numpy(env.observe(cat["state"])),
        "action": torch.from_numpy(cat["action"]).long() if grid else torch.from_numpy(cat["action"]).float(),
        "reward": torch.from_numpy(cat["reward"]).float(),
        "next_obs": torch.from_numpy(env.observe(cat["next_state"])),
        "not_done": torch.ones(n_total),
        "steps": torch.full((n_total,), float(k)),
    }
    if grid:
        data["state"] = torch.from_numpy(cat["state"]).long()
        data["next_state"] = torch.from_numpy(cat["next_state"]).long()
    return data


def _collect_sequential(env: Any, n_total: int, k: int, policy: str, macro_reward: str, gamma: float,
                        episode_length: int, persistence: float, rng: np.random.Generator,
                        seed: int, abstraction: str = "repeat") -> dict[str, torch.Tensor]:
    options = None if abstraction == "repeat" else (
        lambda obs, option, i: option if i == 0 else _random_actions(env, 1, rng)[0])
    wrapped = ActionRepeat(env, k, gamma=gamma, reward=macro_reward, option_policy=options)
    rows: dict[str, list] = {key: [] for key in ("obs", "action", "reward", "next_obs", "not_done", "steps")}
    obs, _ = wrapped.reset(seed=seed)
    action, t = _random_actions(env, 1, rng)[0], 0
    for _ in range(n_total):
        fresh = _random_actions(env, 1, rng)[0]
        action = action if policy == "exploratory" and rng.random() < persistence else fresh
        next_obs, reward, terminated, truncated, info = wrapped.step(action)
        for key, value in (("obs", obs), ("action", action), ("reward", reward), ("next_obs", next_obs),
                           ("not_done", 0.0 if terminated else 1.0), ("steps", info["steps"])):
            rows[key].append(value)
        obs, t = next_obs, t + 1
        if terminated or truncated or t >= episode_length:
            obs, _ = wrapped.reset()
            t = 0
    data = {key: torch.as_tensor(np.asarray(v)) for key, v in rows.items()}
    data["action"] = data["action"].long() if env.discrete else data["action"].float()
    return {key: (v if key == "action" else v.float()) for key, v in data.items()}


def load_exorl(path: str | Path, k: int = 1, macro_reward: str = "sum", gamma: float = 0.99,
               max_transitions: int | None = None) -> dict[str, torch.Tensor]:
    """Load ExORL-style episodes (a ``.npz`` file or a folder of them) as ``k``-step transitions.

    Each episode holds ``observation (T+1, ...)``, ``action``, ``reward``, ``discount``. When
    ``action`` has ``T+1`` rows (ExORL's layout: row 0 is a placeholder and row ``t+1`` is the
    step out of ``observation[t]``) row 0 is dropped; with ``T`` rows they align with
    ``observation[:-1]``. ``discount`` is the continuation flag (0 at a termination).

    .. code-block:: python

        data = load_exorl("/data/exorl/point_mass_maze/proto/buffer", k=4)
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"ExORL data `path`={str(path)!r} does not exist; expected a .npz episode file or a "
                                "folder of them (keys observation/action/reward/discount), e.g. an ExORL "
                                "'<domain>/<algo>/buffer' folder.")
    files = [path] if path.is_file() else sorted(path.glob("*.npz"))
    if not files:
        raise FileNotFoundError(f"ExORL data `path`={str(path)!r} holds no .npz episodes.")
    weights = np.ones(k) if macro_reward == "sum" else gamma ** np.arange(k)
    parts: dict[str, list] = {key: [] for key in ("obs", "action", "reward", "next_obs", "not_done", "steps")}
    for file in files:
        with np.load(file) as ep:
            missing = [key for key in ("observation", "action", "reward", "discount") if key not in ep]
            if missing:
                raise KeyError(f"ExORL episode {str(file)!r} lacks keys {missing}; it has {sorted(ep.keys())}.")
            obs = ep["observation"].reshape(len(ep["observation"]), -1).astype(np.float32)
            T = len(obs) - 1
            offset = 1 if len(ep["action"]) == T + 1 else 0
            act = ep["action"][offset:offset + T]
            rew = ep["reward"].reshape(-1)[offset:offset + T].astype(np.float32)
            cont = ep["discount"].reshape(-1)[offset:offset + T].astype(np.float32)
        if T < k:
            continue
        starts = np.arange(T - k + 1)
        window = starts[:, None] + np.arange(k)[None]
        # a termination inside the window ends the macro transition: later rewards are not collected
        alive = np.cumprod(np.concatenate([np.ones((len(starts), 1)), cont[window][:, :-1]], 1), 1)
        parts["obs"].append(obs[starts]), parts["next_obs"].append(obs[starts + k])
        parts["action"].append(act[starts]), parts["reward"].append((rew[window] * alive * weights).sum(1))
        parts["not_done"].append(np.prod(cont[window], 1)), parts["steps"].append(np.full(len(starts), float(k)))
    if not parts["obs"]:
        raise ValueError(f"ExORL data {str(path)!r}: no episode is longer than k={k} steps.")
    data = {key: torch.as_tensor(np.concatenate(v)) for key, v in parts.items()}
    if max_transitions is not None:
        data = {key: v[:max_transitions] for key, v in data.items()}
    discrete = data["action"].dim() == 1 and not data["action"].is_floating_point()
    return {key: (v.long() if key == "action" and discrete else v.float()) for key, v in data.items()}


class ReplayDataModule(pl.LightningDataModule):
    """Offline transitions for :class:`~lit_lowrank.tasks.fb.FBModule`.

    Args:
        env: ``"gridworld"``, ``"pointmass"`` or ``"gym:<id>"`` (the environment of collection and
            of zero-shot evaluation); ``None`` with ``path``: data only (no environment needed).
        env_kwargs: constructor arguments of the environment.
        k: temporal-abstraction length applied to collection / loading.
        abstraction: ``"repeat"`` (the action held ``k`` steps) or ``"options"`` (the action, then
            ``k − 1`` uniform actions) for collected data; loaded data are always options of the
            behaviour policy.
        num_transitions: transitions to collect (ignored with ``path``).
        policy: ``"random"`` or ``"exploratory"`` behaviour policy.
        macro_reward: ``"sum"`` or ``"discounted"``.
        gamma: per-step discount for ``macro_reward="discounted"``.
        path: ExORL-style ``.npz`` file or folder; replaces collection.
        batch_size: transitions per batch.
        val_fraction: held-out share for ``val/loss``.
        episode_length: macro steps per collected episode.
        seed: collection and split seed.

    .. code-block:: python

        data = ReplayDataModule(env="gridworld", env_kwargs={"size": 10, "slip": 0.2}, k=4)
        data.setup("fit"); batch = next(iter(data.train_dataloader()))
    """

    def __init__(self, env: str | None = "gridworld", env_kwargs: dict[str, Any] | None = None, k: int = 1,
                 num_transitions: int = 50_000, policy: str = "random", macro_reward: str = "sum",
                 gamma: float = 0.99, path: str | None = None, batch_size: int = 256, val_fraction: float = 0.05,
                 episode_length: int = 100, seed: int = 0, num_workers: int = 0, abstraction: str = "repeat") -> None:
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"`policy`={policy!r}, expected one of {POLICIES}.")
        if abstraction not in ABSTRACTIONS:
            raise ValueError(f"`abstraction`={abstraction!r}, expected one of {ABSTRACTIONS}.")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"`val_fraction`={val_fraction}, expected in [0, 1).")
        if env is None and path is None:
            raise ValueError("ReplayDataModule: `env`=None needs `path` (an ExORL-style dataset); give an environment "
                             "to collect from ('gridworld', 'pointmass', 'gym:<id>') or a data path.")
        self.save_hyperparameters()
        self.env = None if env is None else make_env(env, **(env_kwargs or {}))
        self.data: dict[str, torch.Tensor] | None = None
        self.train_set = self.val_set = None

    @property
    def env_spec(self) -> dict[str, Any]:
        """``obs_dim`` and ``num_actions`` or ``action_dim`` (what FBModule needs)."""
        if self.env is None:
            if self.data is None:
                self.setup()
            action = self.data["action"]
            discrete = not action.is_floating_point()
            spec = {"obs_dim": self.data["obs"].shape[1], "discrete": discrete}
            spec.update({"num_actions": int(action.max()) + 1} if discrete else {"action_dim": action.shape[1]})
            return spec
        spec = {"obs_dim": self.env.obs_dim, "discrete": self.env.discrete}
        spec.update({"num_actions": self.env.num_actions} if self.env.discrete else {"action_dim": self.env.action_dim})
        return spec

    def setup(self, stage: str | None = None) -> None:
        if self.data is not None:
            return
        h = self.hparams
        if h.path is not None:
            self.data = load_exorl(h.path, k=h.k, macro_reward=h.macro_reward, gamma=h.gamma)
        else:
            self.data = collect_transitions(self.env, h.num_transitions, k=h.k, policy=h.policy,
                                            macro_reward=h.macro_reward, gamma=h.gamma,
                                            episode_length=h.episode_length, seed=h.seed,
                                            abstraction=h.abstraction)
        if self.env is not None and self.data["obs"].shape[1] != self.env.obs_dim:
            raise ValueError(f"ReplayDataModule: data observations have {self.data['obs'].shape[1]} dims, "
                             f"the environment {h.env!r} has obs_dim={self.env.obs_dim}.")
        n = len(self.data["obs"])
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(h.seed))
        n_val = int(n * h.val_fraction)
        self.train_set = TransitionDataset({key: v[perm[n_val:]] for key, v in self.data.items()})
        self.val_set = TransitionDataset({key: v[perm[:n_val]] for key, v in self.data.items()}) if n_val else None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True, drop_last=True,
                          num_workers=self.hparams.num_workers, collate_fn=_batch_as_is)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None:
            return []
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size, drop_last=True,
                          num_workers=self.hparams.num_workers, collate_fn=_batch_as_is)
