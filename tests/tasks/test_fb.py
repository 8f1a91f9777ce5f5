"""FBModule: discrete and continuous training steps, target EMA, zero-shot z, exact evaluation, checkpoints."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lit_lowrank.datamodules.replay import ReplayDataModule
from lit_lowrank.datamodules.rl_envs import SlipGridWorld
from lit_lowrank.tasks import FBModule
from lit_lowrank.tasks.fb import _optimal_return, _policy_return, evaluate_gridworld, evaluate_rollouts


def _trainer(tmp_path, steps=3, **kwargs):
    return pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=tmp_path,
                      limit_val_batches=0, **kwargs)


def _grid_module(**kwargs):
    return FBModule(obs_dim=16, num_actions=4, z_dim=8, hidden_size=32, **kwargs)


def test_discrete_fit_moves_weights_and_targets(tmp_path):
    torch.manual_seed(0)
    data = ReplayDataModule("gridworld", {"size": 4}, k=2, num_transitions=2000, batch_size=64)
    model = _grid_module(discount=0.9)
    before_t = [p.clone() for p in model.target_backward_net.parameters()]
    before = [p.clone() for p in model.backward_net.parameters()]
    trainer = _trainer(tmp_path, steps=3)
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 3
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert "method/fb_temporal/ortho_loss" in trainer.callback_metrics
    assert trainer.callback_metrics["method/fb_temporal/macro_gamma"].item() == pytest.approx(0.81)
    moved = [not torch.equal(a, b) for a, b in zip(before, model.backward_net.parameters())]
    assert all(moved)
    # EMA: target moved, by less than the online net (tau = 0.01)
    for b0, t0, p, tp in zip(before, before_t, model.backward_net.parameters(),
                             model.target_backward_net.parameters()):
        assert 0 < (tp - t0).abs().max() < (p - b0).abs().max()
    assert not any(p.requires_grad for p in model.target_forward_heads.parameters())


def test_continuous_fit_with_actor(tmp_path):
    torch.manual_seed(0)
    data = ReplayDataModule("pointmass", k=2, num_transitions=2000, batch_size=64)
    model = FBModule(obs_dim=2, action_dim=2, z_dim=8, hidden_size=32)
    actor_before = [p.clone() for p in model.actor.parameters()]
    trainer = _trainer(tmp_path, steps=2)
    trainer.fit(model, datamodule=data)
    assert "method/fb_temporal/actor_loss" in trainer.callback_metrics
    assert any(not torch.equal(a, b) for a, b in zip(actor_before, model.actor.parameters()))
    action = model.act(torch.zeros(5, 2), torch.ones(8))
    assert action.shape == (5, 2) and action.abs().max() <= 1


def test_constructor_errors():
    with pytest.raises(ValueError, match="exactly one"):
        FBModule(obs_dim=4)
    with pytest.raises(ValueError, match="macro_discount"):
        FBModule(obs_dim=4, num_actions=2, macro_discount="nope")
    model = _grid_module()
    with pytest.raises(ValueError, match="obs_dim=16"):
        model.fb_losses({"obs": torch.zeros(4, 3), "action": torch.zeros(4).long(), "next_obs": torch.zeros(4, 3)})


def test_infer_z_and_q_values_shapes():
    model = _grid_module()
    z = model.infer_z(torch.eye(16), torch.arange(16.0))
    assert z.shape == (8,) and z.norm().item() == pytest.approx(8 ** 0.5, rel=1e-5)
    q = model(torch.eye(16), z.expand(16, -1))
    assert q.shape == (16, 4)
    assert model.act(torch.eye(16), z).shape == (16,)


def test_macro_discount_per_row():
    model = _grid_module(discount=0.9)
    batch = {"obs": torch.zeros(3, 16), "steps": torch.tensor([1.0, 2.0, 3.0]), "not_done": torch.tensor([1., 1., 0.])}
    torch.testing.assert_close(model._discounts(batch), torch.tensor([0.9, 0.81, 0.0]))
    per_decision = _grid_module(discount=0.9, macro_discount="per_decision")
    torch.testing.assert_close(per_decision._discounts(batch), torch.tensor([0.9, 0.9, 0.0]))


@pytest.mark.parametrize("abstraction", ["repeat", "options"])
def test_policy_return_matches_monte_carlo(abstraction):
    env = SlipGridWorld(size=4, slip=0.2)
    P = env.transition_tensor()
    actions = torch.tensor([3, 3, 3, 1] * 4)                         # right, and down on the last column
    goal, gamma, k, horizon = 15, 0.9, 2, 30
    exact = _policy_return(P, actions, k, goal, gamma, horizon, abstraction)
    rng = np.random.default_rng(0)
    n = 20000
    s = np.zeros(n, dtype=np.int64)                                  # start state 0
    alive, ret = np.ones(n, bool), np.zeros(n)
    for t in range(horizon):
        if t % k == 0:
            held = actions.numpy()[s]
        elif abstraction == "options":                               # after the first action: uniform ones
            held = rng.integers(0, 4, n)
        s = np.where(alive, env.step_batch(s, held, rng), s)
        hit = alive & (s == goal)
        ret[hit] += gamma ** t
        alive &= ~hit
    assert exact[0].item() == pytest.approx(ret.mean(), abs=0.01)
    assert (exact <= _optimal_return(P, goal, gamma, horizon) + 1e-12).all()


def test_evaluate_gridworld_and_rollouts(tmp_path):
    torch.manual_seed(0)
    data = ReplayDataModule("gridworld", {"size": 4}, k=2, num_transitions=2000, batch_size=64)
    model = _grid_module(discount=0.9)
    _trainer(tmp_path, steps=2).fit(model, datamodule=data)
    out = evaluate_gridworld(model, data.env, data.data, [3, 12], k=2, horizon=20)
    assert out["bound_holds"] and len(out["returns"]) == 2
    assert 0 <= out["normalized_return"] <= 1 + 1e-9 and out["sr_error"] > 0
    assert out["value_error"] <= out["value_bound"]
    pm = ReplayDataModule("pointmass", k=2, num_transitions=1000)
    pm.setup()
    cont = FBModule(obs_dim=2, action_dim=2, z_dim=8, hidden_size=32)
    res = evaluate_rollouts(cont, pm.env, pm.data, np.array([[0.5, 0.5]]), k=2, horizon=10, num_starts=4)
    assert len(res["ratios"]) == 1 and res["normalized_return"] >= 0


def test_checkpoint_round_trip(tmp_path):
    data = ReplayDataModule("gridworld", {"size": 4}, num_transitions=1000, batch_size=64)
    model = _grid_module()
    trainer = _trainer(tmp_path, steps=2)
    trainer.fit(model, datamodule=data)
    path = tmp_path / "fb.ckpt"
    trainer.save_checkpoint(path)
    reloaded = FBModule.load_from_checkpoint(path)
    z = torch.ones(8)
    torch.testing.assert_close(reloaded(torch.eye(16), z.expand(16, -1)), model(torch.eye(16), z.expand(16, -1)))


def test_policy_evaluation_mode_learns_the_uniform_repeat_sr(tmp_path):
    from lit_lowrank.tasks.fb import evaluate_policy_evaluation

    torch.manual_seed(0)
    data = ReplayDataModule("gridworld", {"size": 4, "slip": 0.2}, k=2, num_transitions=4000, batch_size=128,
                            val_fraction=0.0)
    model = _grid_module(discount=0.8, target_policy="uniform", tau=0.2,
                         optimizer=lambda p: torch.optim.Adam(p, lr=3e-3))
    data.setup("fit")
    before = evaluate_policy_evaluation(model, data.env, data.data, [3, 12], k=2)
    _trainer(tmp_path, steps=300).fit(model, datamodule=data)
    after = evaluate_policy_evaluation(model, data.env, data.data, [3, 12], k=2)
    assert after["sr_error"] < 0.6 * before["sr_error"]
    assert len(after["value_errors"]) == 2 and all(e < n for e, n in zip(after["value_errors"], after["value_norms"]))
    with pytest.raises(ValueError, match="target_policy"):
        _grid_module(target_policy="random")
    with pytest.raises(ValueError, match="discrete"):
        FBModule(obs_dim=2, action_dim=2, target_policy="uniform")
