"""FB environments, the action-repeat wrapper, replay collection and the ExORL-style loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_lowrank.datamodules.replay import ReplayDataModule, collect_transitions, load_exorl
from lit_lowrank.datamodules.rl_envs import ActionRepeat, PointMass, SlipGridWorld, make_env


class _ScriptedEnv:
    """Rewards 1, 2, 3, ... per step; terminates (or truncates) at a chosen step."""

    discrete, num_actions, obs_dim = True, 2, 1

    def __init__(self, terminate_at: int | None = None, truncate_at: int | None = None) -> None:
        self.terminate_at, self.truncate_at = terminate_at, truncate_at
        self.t, self.actions = 0, []

    def reset(self, seed=None, options=None):
        self.t, self.actions = 0, []
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        self.actions.append(action)
        return (np.full(1, self.t, np.float32), float(self.t), self.t == self.terminate_at,
                self.t == self.truncate_at, {"t": self.t})


def test_action_repeat_sums_rewards_and_repeats_the_action():
    env = ActionRepeat(_ScriptedEnv(), k=3)
    env.reset()
    obs, reward, terminated, truncated, info = env.step(1)
    assert reward == 1 + 2 + 3 and info["steps"] == 3 and info["rewards"] == [1.0, 2.0, 3.0]
    assert env.env.actions == [1, 1, 1] and obs[0] == 3 and not terminated and not truncated
    obs, reward, *_ = env.step(0)
    assert reward == 4 + 5 + 6 and env.env.actions[3:] == [0, 0, 0]


def test_action_repeat_discounted_macro_reward():
    env = ActionRepeat(_ScriptedEnv(), k=3, gamma=0.5, reward="discounted")
    env.reset()
    _, reward, *_ = env.step(1)
    assert reward == pytest.approx(1 + 0.5 * 2 + 0.25 * 3)


def test_termination_inside_a_repeat_stops_it():
    env = ActionRepeat(_ScriptedEnv(terminate_at=2), k=4)
    env.reset()
    obs, reward, terminated, truncated, info = env.step(1)
    assert terminated and not truncated
    assert info["steps"] == 2 and reward == 1 + 2 and obs[0] == 2
    assert len(env.env.actions) == 2                      # no primitive step after the termination


def test_truncation_inside_a_repeat_stops_it():
    env = ActionRepeat(_ScriptedEnv(truncate_at=5), k=4)
    env.reset()
    env.step(0)
    obs, reward, terminated, truncated, info = env.step(0)
    assert truncated and not terminated and info["steps"] == 1 and reward == 5


def test_fixed_length_option_policy():
    env = ActionRepeat(_ScriptedEnv(), k=3, option_policy=lambda obs, option, i: (option + i) % 2)
    env.reset()
    env.step(0)
    assert env.env.actions == [0, 1, 0]


def test_action_repeat_on_the_gridworld_terminal_state():
    # a 2x2 grid without slip: from state 0 moving right reaches terminal state 1 after one step
    env = ActionRepeat(SlipGridWorld(size=2, slip=0.0, reward_states=[1], terminal_states=[1], start_state=0), k=4)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(3)
    assert terminated and info["steps"] == 1 and reward == 1.0 and info["state"] == 1
    with pytest.raises(ValueError, match="k"):
        ActionRepeat(env, k=0)


def test_gridworld_step_batch_follows_the_transition_tensor():
    env = SlipGridWorld(size=4, slip=0.3)
    P = env.transition_tensor()
    rng = np.random.default_rng(0)
    states = np.full(20000, 5)
    nxt = env.step_batch(states, np.full(20000, 3), rng)
    freq = np.bincount(nxt, minlength=16) / len(nxt)
    np.testing.assert_allclose(freq, P[3, 5].numpy(), atol=0.015)


def test_collection_shapes_and_macro_steps():
    data = collect_transitions(SlipGridWorld(size=5), 1000, k=4, seed=0)
    assert data["obs"].shape == (1000, 25) and data["action"].dtype == torch.long
    assert (data["steps"] == 4).all() and (data["not_done"] == 1).all()
    pm = collect_transitions(PointMass(), 500, k=2, policy="exploratory", seed=0)
    assert pm["action"].shape == (500, 2) and pm["action"].abs().max() <= 1
    # a repeat of 2 moves at most 2·step_size + noise per axis
    assert ((pm["next_obs"] - pm["obs"]).abs().max() < 2 * 0.1 + 0.15)


def test_sequential_collection_records_terminations():
    env = SlipGridWorld(size=3, slip=0.0, terminal_states=[8], max_episode_steps=50)
    data = collect_transitions(_Undetected(env), 400, k=3, seed=0)
    assert set(data["steps"].unique().tolist()) <= {1.0, 2.0, 3.0}
    done = data["not_done"] == 0
    assert done.any()
    assert (data["next_obs"][done].argmax(1) == 8).all()


class _Undetected:
    """Hides the built-in type so the generic (gymnasium-style) collection path runs."""

    def __init__(self, env):
        self.env = env
        self.discrete, self.num_actions, self.obs_dim = True, env.num_actions, env.obs_dim

    def reset(self, seed=None, options=None):
        return self.env.reset(seed=seed)

    def step(self, action):
        return self.env.step(action)


def test_datamodule_batches():
    data = ReplayDataModule(env="gridworld", env_kwargs={"size": 5}, k=2, num_transitions=2000, batch_size=64)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch["obs"].shape == (64, 25) and batch["steps"].eq(2).all()
    assert data.env_spec == {"obs_dim": 25, "discrete": True, "num_actions": 4}


def _write_episode(path, T=10, discrete=False, terminal_at=None):
    obs = np.arange(T + 1, dtype=np.float32)[:, None].repeat(3, 1)
    action = np.zeros((T + 1, 2), np.float32) if not discrete else np.zeros(T + 1, np.int64)
    if not discrete:
        action[1:, 0] = np.arange(T)
    reward = np.arange(T + 1, dtype=np.float32)
    discount = np.ones(T + 1, np.float32)
    if terminal_at is not None:
        discount[terminal_at] = 0.0
    np.savez(path, observation=obs, action=action, reward=reward, discount=discount)


def test_exorl_loader_macro_transitions(tmp_path):
    _write_episode(tmp_path / "ep0.npz", T=10)
    data = load_exorl(tmp_path, k=3)
    # ExORL layout: the transition out of observation[t] has action/reward/discount row t+1
    assert len(data["obs"]) == 10 - 3 + 1
    torch.testing.assert_close(data["next_obs"][:, 0] - data["obs"][:, 0], torch.full((8,), 3.0))
    assert data["reward"][0].item() == 1 + 2 + 3 and data["action"][0, 0].item() == 0.0
    assert data["action"][2, 0].item() == 2.0


def test_exorl_loader_termination_inside_a_window(tmp_path):
    _write_episode(tmp_path / "ep0.npz", T=6, terminal_at=2)
    data = load_exorl(tmp_path, k=3)
    # window starting at t=0 covers rows 1..3; row 2 terminates: reward 1 + 2, not_done 0
    assert data["reward"][0].item() == 3.0 and data["not_done"][0].item() == 0.0
    assert data["not_done"][2].item() == 1.0


def test_exorl_loader_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_exorl(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no .npz"):
        load_exorl(tmp_path)
    np.savez(tmp_path / "bad.npz", observation=np.zeros((3, 2)))
    with pytest.raises(KeyError, match="action"):
        load_exorl(tmp_path)


def test_make_env_names():
    assert isinstance(make_env("pointmass"), PointMass)
    with pytest.raises(ValueError, match="gridworld"):
        make_env("nope")


def test_gymnasium_adapter_with_action_repeat():
    pytest.importorskip("gymnasium")
    env = ActionRepeat(make_env("gym:Pendulum-v1"), k=4)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (env.obs_dim,) and env.action_dim == 1 and not env.discrete
    _, reward, _, _, info = env.step(np.array([1.0]))
    assert info["steps"] == 4 and reward == pytest.approx(sum(info["rewards"]))
    data = collect_transitions(make_env("gym:Pendulum-v1"), 50, k=2, seed=0)
    assert data["obs"].shape == (50, 3) and data["action"].shape == (50, 1)


@pytest.mark.parametrize("abstraction", ["options", "repeat"])
def test_collected_macro_transitions_follow_their_abstraction(abstraction):
    """The empirical k-step transitions of the collected data match the exact operator of the abstraction."""
    from lit_lowrank.ops.fb import macro_action_operators

    env = SlipGridWorld(size=4, slip=0.1, stay=0.3)
    data = collect_transitions(env, 60_000, k=3, seed=0, abstraction=abstraction)
    exact = macro_action_operators(env.transition_tensor(), 3, abstraction)
    s, a, s2 = data["state"], data["action"], data["next_state"]
    errors = []
    for state, action in ((5, 3), (10, 0)):
        sel = (s == state) & (a == action)
        empirical = torch.bincount(s2[sel], minlength=16).double() / sel.sum()
        errors.append(float((empirical - exact[action, state]).abs().sum() / 2))
    assert max(errors) < 0.06
    other = macro_action_operators(env.transition_tensor(), 3, "repeat" if abstraction == "options" else "options")
    sel = (s == 5) & (a == 3)
    empirical = torch.bincount(s2[sel], minlength=16).double() / sel.sum()
    assert float((empirical - other[3, 5]).abs().sum() / 2) > 0.1


def test_abstraction_errors_name_it():
    with pytest.raises(ValueError, match="abstraction"):
        ReplayDataModule("gridworld", abstraction="hold")
    with pytest.raises(ValueError, match="abstraction"):
        collect_transitions(SlipGridWorld(size=3), 10, k=2, abstraction="hold")
