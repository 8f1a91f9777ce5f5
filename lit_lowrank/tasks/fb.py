"""FBModule: offline forward–backward representation learning with temporal abstraction (arXiv 2603.20103).

``F(s, a, z)`` (an ensemble of ``num_heads`` forward nets) and ``B(s')`` (output rescaled to norm
``√d``) are trained on offline (macro) transitions with the FB loss and the orthonormality
regulariser of :mod:`lit_lowrank.ops.fb`; target networks are EMA copies (``tau``); the target
``M̄ = mean_h F̄_h(s', π_z(s'), z)ᵀ B̄(s')`` uses the greedy policy ``argmax_a F(s', a, z)ᵀz``
(discrete actions, selected with the online heads) or the actor ``π(s', z)`` with clipped noise
(continuous actions; the actor maximises ``min_h F_h(s, π(s, z), z)ᵀ z``). Each macro transition
is discounted by :func:`~lit_lowrank.ops.fb.macro_discount` of its ``steps``.

Zero-shot: :meth:`FBModule.infer_z` turns reward samples into ``z_r``; :meth:`FBModule.act` is the
policy. :func:`evaluate_gridworld` scores it exactly on a :class:`SlipGridWorld` (normalised
return against the optimal finite-horizon return, relative SR error against the exact successor
measure of ``π_z``, and the value-error bound); :func:`evaluate_rollouts` scores continuous
environments by rollouts against a goal-directed oracle.

Logged: ``train/loss``, ``val/loss`` and ``method/fb_temporal/{fb_loss, fb_diag, fb_offdiag,
ortho_loss, actor_loss, q_mean, target_m_mean, b_erank, macro_gamma}``; with ``eval_goals > 0``
and a gridworld / point-mass datamodule, ``val/zero_shot_return`` (and ``val/sr_error``).

.. code-block:: python

    data = ReplayDataModule(env="gridworld", k=4)
    model = FBModule(obs_dim=100, num_actions=4, z_dim=32, discount=0.99, eval_goals=10)
    L.Trainer(max_steps=2000).fit(model, datamodule=data)
    z = model.infer_z(next_obs, reward)          # reward samples -> task latent
    action = model.act(obs, z)
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.ops.fb import (
    MACRO_DISCOUNTS,
    fb_loss,
    macro_action_operators,
    macro_discount,
    macro_transition,
    normalize_sphere,
    orthonormality_loss,
    relative_sr_error,
    sample_z,
    successor_measure,
    value_error_bound,
    zero_shot_z,
)
from lit_lowrank.ops.lowrank import effective_rank_of
from lit_lowrank.tasks.base import TaskModule

METHOD = "fb_temporal"
TARGET_POLICIES = ("greedy", "uniform")
__all__ = ["FBModule", "evaluate_gridworld", "evaluate_policy_evaluation", "evaluate_rollouts", "goal_states"]


def _mlp(in_dim: int, hidden: int, layers: int, out_dim: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    dim = in_dim
    for i in range(layers):
        mods += [nn.Linear(dim, hidden), nn.LayerNorm(hidden) if i == 0 else nn.Identity(), nn.ReLU()]
        dim = hidden
    mods.append(nn.Linear(dim, out_dim))
    return nn.Sequential(*mods)


class FBModule(TaskModule):
    """Forward–backward representations trained offline, with a zero-shot policy.

    Args:
        obs_dim: observation size.
        num_actions: number of discrete actions (set this *or* ``action_dim``).
        action_dim: continuous action size (actions in ``[-1, 1]``; adds the actor).
        z_dim: representation dimension ``d``.
        hidden_size, num_layers: the F, B and actor MLPs.
        num_heads: forward heads (the target averages them, the actor uses their minimum).
        discount: per-step ``γ``.
        macro_discount: ``"power"`` (``γ^steps`` per macro step, same horizon for every ``k``) or
            ``"per_decision"`` (``γ`` per macro step).
        tau: EMA rate of the target networks.
        ortho_coef: weight of the orthonormality loss.
        mix_ratio: share of ``z`` drawn from ``B(s')`` instead of the sphere.
        norm_b: rescale ``B`` to norm ``√d``.
        target_noise, target_noise_clip: smoothing noise on the target action (continuous).
        target_policy: ``"greedy"`` (FB: the target follows ``π_z = argmax_a F(s', a, z)ᵀz``) or
            ``"uniform"`` (discrete actions: the target averages ``F(s', ·, z)`` over actions — FB as
            policy *evaluation* of the uniform macro policy, whose exact SR and spectrum the
            value-error bound is computed for).
        eval_goals: goals for the zero-shot evaluation at each validation epoch (0: off).
        eval_horizon: primitive steps of the zero-shot evaluation.
        optimizer: callable ``params -> Optimizer`` (one optimizer, param groups F+B and actor).

    .. code-block:: python

        model = FBModule(obs_dim=2, action_dim=2, z_dim=32, discount=0.99)
        L.Trainer(max_steps=2000).fit(model, datamodule=ReplayDataModule("pointmass", k=2))
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int | None = None,
        action_dim: int | None = None,
        z_dim: int = 50,
        hidden_size: int = 256,
        num_layers: int = 2,
        num_heads: int = 2,
        discount: float = 0.99,
        macro_discount: str = "power",
        tau: float = 0.01,
        ortho_coef: float = 1.0,
        mix_ratio: float = 0.5,
        norm_b: bool = True,
        target_noise: float = 0.2,
        target_noise_clip: float = 0.3,
        target_policy: str = "greedy",
        eval_goals: int = 0,
        eval_horizon: int = 100,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "step",
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        if (num_actions is None) == (action_dim is None):
            raise ValueError(f"FBModule: set exactly one of `num_actions` (discrete) and `action_dim` (continuous), "
                             f"got num_actions={num_actions}, action_dim={action_dim}.")
        if macro_discount not in MACRO_DISCOUNTS:
            raise ValueError(f"`macro_discount`={macro_discount!r}, expected one of {MACRO_DISCOUNTS}.")
        if not 0.0 <= discount < 1.0:
            raise ValueError(f"`discount`={discount}, expected in [0, 1).")
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"`tau`={tau}, expected in (0, 1].")
        if target_policy not in TARGET_POLICIES:
            raise ValueError(f"`target_policy`={target_policy!r}, expected one of {TARGET_POLICIES}.")
        if target_policy == "uniform" and num_actions is None:
            raise ValueError("`target_policy`='uniform' needs discrete actions (`num_actions`).")
        if num_heads < 1 or z_dim < 1:
            raise ValueError(f"`num_heads`={num_heads} and `z_dim`={z_dim} must be >= 1.")
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.automatic_optimization = False
        self.discrete = num_actions is not None
        d = z_dim
        f_in = obs_dim + d + (0 if self.discrete else action_dim)
        f_out = d * num_actions if self.discrete else d
        self.forward_heads = nn.ModuleList([_mlp(f_in, hidden_size, num_layers, f_out) for _ in range(num_heads)])
        self.backward_net = _mlp(obs_dim, hidden_size, num_layers, d)
        self.actor = None if self.discrete else _mlp(obs_dim + d, hidden_size, num_layers, action_dim)
        self.target_forward_heads = copy.deepcopy(self.forward_heads).requires_grad_(False)
        self.target_backward_net = copy.deepcopy(self.backward_net).requires_grad_(False)

    # ------------------------------------------------------------------ networks
    def backward_rep(self, obs: Tensor, target: bool = False) -> Tensor:
        """``B(s)`` ``(n, d)`` (norm ``√d`` with ``norm_b``)."""
        out = (self.target_backward_net if target else self.backward_net)(obs)
        return normalize_sphere(out) if self.hparams.norm_b else out

    def forward_rep(self, obs: Tensor, z: Tensor, action: Tensor | None = None, target: bool = False) -> Tensor:
        """``F(s, a, z)``: ``(H, n, A, d)`` for every discrete action, ``(H, n, d)`` for given continuous actions."""
        heads = self.target_forward_heads if target else self.forward_heads
        if self.discrete:
            x = torch.cat([obs, z], -1)
            return torch.stack([h(x).view(len(obs), self.hparams.num_actions, -1) for h in heads])
        x = torch.cat([obs, action, z], -1)
        return torch.stack([h(x) for h in heads])

    def forward(self, obs: Tensor, z: Tensor, action: Tensor | None = None) -> Tensor:
        """Q-values ``F(s, a, z)ᵀ z`` averaged over heads: ``(n, A)`` discrete, ``(n,)`` continuous."""
        F = self.forward_rep(obs, z, action)
        return torch.einsum("hnad,nd->na" if self.discrete else "hnd,nd->n", F, z) / F.shape[0]

    def policy(self, obs: Tensor, z: Tensor, noise: float = 0.0) -> Tensor:
        """Greedy discrete actions ``(n,)`` (online heads) or actor actions ``(n, action_dim)`` in ``[-1, 1]``."""
        if self.discrete:
            return self(obs, z).argmax(-1)
        action = torch.tanh(self.actor(torch.cat([obs, z], -1)))
        if noise > 0:
            eps = (torch.randn_like(action) * noise).clamp(-self.hparams.target_noise_clip,
                                                           self.hparams.target_noise_clip)
            action = (action + eps).clamp(-1.0, 1.0)
        return action

    @torch.no_grad()
    def act(self, obs: Tensor, z: Tensor) -> Tensor:
        """The zero-shot policy ``π_z`` (``z`` ``(d,)`` or ``(n, d)``)."""
        z = z.expand(len(obs), -1) if z.dim() == 1 else z
        return self.policy(obs, z)

    @torch.no_grad()
    def infer_z(self, next_obs: Tensor, reward: Tensor, method: str = "mean", normalize: bool = True) -> Tensor:
        """``z_r = √d·normalize(E[r(s') B(s')])`` from reward samples (:func:`~lit_lowrank.ops.fb.zero_shot_z`)."""
        return zero_shot_z(self.backward_rep(next_obs), reward, method=method, normalize=normalize)

    # ------------------------------------------------------------------ training
    def configure_optimizers(self) -> Any:
        # one optimizer (F+B group, actor group): one optimizer step per training step, so
        # ``max_steps`` / ``global_step`` count training steps as in the other task modules
        groups = [{"params": [*self.forward_heads.parameters(), *self.backward_net.parameters()]}]
        if self.actor is not None:
            groups.append({"params": list(self.actor.parameters())})
        optimizer = self.optimizer_factory(groups)
        if self.lr_scheduler_factory is None:
            return optimizer
        return [optimizer], [self.lr_scheduler_factory(optimizer)]

    def _check_batch(self, batch: dict[str, Tensor]) -> None:
        missing = [k for k in ("obs", "action", "next_obs") if k not in batch]
        if missing:
            raise KeyError(f"FBModule batch lacks {missing}; expected ReplayDataModule batches "
                           "(obs, action, reward, next_obs, not_done, steps).")
        if batch["obs"].shape[-1] != self.hparams.obs_dim:
            raise ValueError(f"FBModule(obs_dim={self.hparams.obs_dim}) got observations of size "
                             f"{batch['obs'].shape[-1]}.")

    def _discounts(self, batch: dict[str, Tensor]) -> Tensor:
        n = len(batch["obs"])
        steps = batch.get("steps", torch.ones(n, device=self.device))
        not_done = batch.get("not_done", torch.ones(n, device=self.device))
        gamma = macro_discount(self.hparams.discount, steps.float().cpu(), self.hparams.macro_discount)
        return gamma.to(self.device) * not_done.float()

    def fb_losses(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The FB + orthonormality loss of one batch and its parts (no optimiser step)."""
        self._check_batch(batch)
        obs, action, next_obs = batch["obs"].float(), batch["action"], batch["next_obs"].float()
        n, d = len(obs), self.hparams.z_dim
        discount = self._discounts(batch)
        with torch.no_grad():
            z = sample_z(n, d, B_next=self.backward_rep(next_obs), mix_ratio=self.hparams.mix_ratio)
            if self.hparams.target_policy == "uniform":
                target_F = self.forward_rep(next_obs, z, target=True).mean(2)
            else:
                next_action = self.policy(next_obs, z, noise=0.0 if self.discrete else self.hparams.target_noise)
                target_F = self.forward_rep(next_obs, z, None if self.discrete else next_action, target=True)
                if self.discrete:
                    target_F = target_F[:, torch.arange(n, device=obs.device), next_action]
            target_B = self.backward_rep(next_obs, target=True)
            target_M = torch.einsum("hnd,md->hnm", target_F, target_B).mean(0)
        F = self.forward_rep(obs, z, None if self.discrete else action.float())
        if self.discrete:
            F = F[:, torch.arange(n, device=obs.device), action.long()]
        B = self.backward_rep(next_obs)
        fb, diag, offdiag = 0.0, 0.0, 0.0
        for h in range(F.shape[0]):
            loss_h, parts = fb_loss(F[h], B, target_M, discount)
            fb, diag, offdiag = fb + loss_h, diag + parts["diag"], offdiag + parts["offdiag"]
        ortho = orthonormality_loss(B)
        return {"loss": fb + self.hparams.ortho_coef * ortho, "fb_loss": fb, "fb_diag": diag, "fb_offdiag": offdiag,
                "ortho_loss": ortho, "target_m_mean": target_M.mean(), "B": B.detach(), "z": z,
                "macro_gamma": discount.mean()}

    def actor_loss(self, obs: Tensor, z: Tensor) -> Tensor:
        """``−mean min_h F_h(s, π(s, z), z)ᵀ z`` (continuous actions only)."""
        action = self.policy(obs, z)
        F = self.forward_rep(obs, z, action)
        return -torch.einsum("hnd,nd->hn", F, z).min(0).values.mean()

    @torch.no_grad()
    def update_targets(self) -> None:
        """EMA ``θ̄ ← (1 − τ) θ̄ + τ θ``."""
        tau = self.hparams.tau
        for online, target in ((self.forward_heads, self.target_forward_heads),
                               (self.backward_net, self.target_backward_net)):
            for p, tp in zip(online.parameters(), target.parameters()):
                tp.lerp_(p, tau)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        optimizer = self.optimizers()
        out = self.fb_losses(batch)
        loss = apply_loss_hooks(self, batch, out, out["loss"])
        optimizer.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if self.actor is not None:
            # the actor's gradient must not reach F: freeze the heads while it flows back
            self.forward_heads.requires_grad_(False)
            actor_loss = self.actor_loss(batch["obs"].float(), out["z"])
            self.manual_backward(actor_loss)
            self.forward_heads.requires_grad_(True)
            log_method(self, METHOD, "actor_loss", actor_loss.detach())
        optimizer.step()
        self.update_targets()
        schedulers = self.lr_schedulers()
        if schedulers is not None and self.lr_scheduler_interval == "step":
            for sched in schedulers if isinstance(schedulers, list) else [schedulers]:
                sched.step()
        n = len(batch["obs"])
        self.log_split("train", {"loss": loss.detach()}, batch_size=n)
        for name in ("fb_loss", "fb_diag", "fb_offdiag", "ortho_loss", "target_m_mean", "macro_gamma"):
            log_method(self, METHOD, name, out[name].detach())
        if batch_idx % 50 == 0:
            # effective rank of the batch's B covariance: how many directions the representation uses
            log_method(self, METHOD, "b_erank", effective_rank_of(out["B"].T @ out["B"] / n))
        return loss.detach()

    def on_train_epoch_end(self) -> None:
        schedulers = self.lr_schedulers()
        if schedulers is not None and self.lr_scheduler_interval == "epoch":
            for sched in schedulers if isinstance(schedulers, list) else [schedulers]:
                sched.step()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        out = self.fb_losses(batch)
        self.log_split("val", {"loss": out["loss"]}, batch_size=len(batch["obs"]))

    def on_validation_epoch_end(self) -> None:
        if not self.hparams.eval_goals or self.trainer is None or self.trainer.sanity_checking:
            return
        data = getattr(self.trainer, "datamodule", None)
        env, replay = getattr(data, "env", None), getattr(data, "data", None)
        if env is None or replay is None:
            return
        from lit_lowrank.datamodules.rl_envs import PointMass, SlipGridWorld

        k = int(data.hparams.k)
        if isinstance(env, SlipGridWorld):
            result = evaluate_gridworld(self, env, replay, goal_states(env, self.hparams.eval_goals), k,
                                        horizon=self.hparams.eval_horizon,
                                        abstraction=getattr(data.hparams, "abstraction", "repeat"))
            self.log_split("val", {"zero_shot_return": result["normalized_return"], "sr_error": result["sr_error"]})
            self._log_returns_figure(result["returns"], [f"goal {g}" for g in goal_states(env, self.hparams.eval_goals)])
        elif isinstance(env, PointMass):
            goals = np.random.default_rng(0).uniform(-0.8, 0.8, (self.hparams.eval_goals, 2))
            result = evaluate_rollouts(self, env, replay, goals, k, horizon=self.hparams.eval_horizon)
            self.log_split("val", {"zero_shot_return": result["normalized_return"]})
            self._log_returns_figure(result["ratios"], [f"goal {i}" for i in range(len(goals))])

    def _log_returns_figure(self, returns: Any, labels: list[str]) -> None:
        """Dashboard: the zero-shot return of every evaluation goal."""
        if not self.figures_due():
            return
        from lit_lowrank.core.figures import log_figure, new_figure

        values = [float(v) for v in returns]
        fig, ax = new_figure(max(4.0, 0.5 * len(values) + 1.5), 3.2)
        bars = ax.bar(labels[:len(values)], values, color="tab:blue")
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7)
        ax.set(ylabel="normalized zero-shot return", title=f"FB (k={int(self.trainer.datamodule.hparams.k)}) "
               f"zero-shot return per goal, epoch {self.current_epoch}")
        ax.tick_params(axis="x", rotation=60, labelsize=7)
        log_figure(self.trainer, "method/fb_temporal/zero_shot_returns", fig)


# ---------------------------------------------------------------------------- zero-shot evaluation
def goal_states(env: Any, n: int, seed: int = 0) -> list[int]:
    """``n`` distinct goal states of a gridworld, drawn with ``seed``."""
    n = min(n, env.num_states)
    return sorted(np.random.default_rng(seed).choice(env.num_states, n, replace=False).tolist())


@torch.no_grad()
def evaluate_gridworld(module: FBModule, env: Any, replay: dict[str, Tensor], goals: list[int], k: int,
                       horizon: int = 100, reward_goals: list[int] | None = None,
                       abstraction: str = "repeat") -> dict[str, Any]:
    """Exact zero-shot scores of an FB model on a :class:`SlipGridWorld` (one-goal rewards ``r = 1[s' = g]``).

    For each goal: ``z_r`` from the replay's next states and their rewards; the greedy macro
    policy ``π_z`` (its action held ``k`` steps, or with ``abstraction="options"`` taken once and
    followed by ``k − 1`` uniform actions); its goal-reaching return (entering the goal pays 1 and ends
    the episode, also inside a repeat; per-step discount ``γ``; ``horizon`` primitive steps) from
    a uniform start, divided by the optimal primitive policy's return; the relative error of
    ``F(s, a, z)ᵀB(s')ρ(s')`` against the exact macro successor measure of ``π_z``; and the
    value-error bound :func:`~lit_lowrank.ops.fb.value_error_bound` for ``r``.

    ``reward_goals`` (default ``goals``) are the goals whose rewards ``z_r`` is inferred from: a
    permutation of ``goals`` scores policies aimed at the wrong goal (a control).

    Returns:
        ``normalized_return`` (mean over goals), ``sr_error`` (mean), ``bound_holds`` (every goal),
        ``value_error``/``value_bound`` (max over goals, sup norm) and the per-goal lists.
    """
    module.eval()
    device = module.device
    P = env.transition_tensor()                                        # (A, S, S) float64
    A, S = P.shape[0], P.shape[1]
    Pk = macro_action_operators(P, k, abstraction)                     # (A, S, S)
    gamma = float(macro_discount(module.hparams.discount, k, module.hparams.macro_discount))
    gamma_eval = float(module.hparams.discount)
    next_states = replay["next_state"].long()
    rho = torch.bincount(next_states, minlength=S).double() / len(next_states)
    all_obs = torch.from_numpy(env.observe(np.arange(S))).to(device)
    B_all = module.backward_rep(all_obs).double().cpu()                # (S, d)
    sample = next_states[:20000]
    obs_next = torch.from_numpy(env.observe(sample.numpy())).to(device)
    returns, errors, bounds, value_errors, holds = [], [], [], [], []
    reward_goals = goals if reward_goals is None else reward_goals
    if len(reward_goals) != len(goals):
        raise ValueError(f"`reward_goals` has {len(reward_goals)} goals, expected {len(goals)} (one per goal).")
    for g, g_reward in zip(goals, reward_goals):
        r_states = torch.zeros(S, dtype=torch.float64)
        r_states[g] = 1.0
        r_infer = torch.zeros(S, dtype=torch.float64)
        r_infer[g_reward] = 1.0
        z = module.infer_z(obs_next, r_infer[sample].float().to(device))
        actions = module.act(all_obs, z).cpu()                         # (S,)
        P_pi = Pk[actions, torch.arange(S)]                            # (S, S) macro policy operator
        M_true = successor_measure(P_pi, gamma, P_first=Pk).permute(1, 0, 2).reshape(S * A, S)
        F = module.forward_rep(all_obs, z.expand(S, -1)).mean(0).double().cpu()   # (S, A, d)
        M_hat = (F.reshape(S * A, -1) @ B_all.T) * rho[None]
        errors.append(float(relative_sr_error(M_hat, M_true)))
        check = value_error_bound(M_hat, M_true, r_states)
        holds.append(bool(check["holds"]))
        value_errors.append(float(check["error_inf"][0])), bounds.append(float(check["bound_inf"][0]))
        starts = torch.arange(S) != g
        ret = _policy_return(P, actions, k, g, gamma_eval, horizon, abstraction)[starts].mean()
        returns.append(float(ret / _optimal_return(P, g, gamma_eval, horizon)[starts].mean().clamp_min(1e-12)))
    module.train()
    return {"normalized_return": float(np.mean(returns)), "sr_error": float(np.mean(errors)),
            "bound_holds": all(holds), "value_error": max(value_errors), "value_bound": max(bounds),
            "returns": returns, "sr_errors": errors}


@torch.no_grad()
def evaluate_policy_evaluation(module: FBModule, env: Any, replay: dict[str, Tensor], goals: list[int], k: int,
                               abstraction: str = "repeat") -> dict[str, Any]:
    """Exact scores of an FB model trained with ``target_policy="uniform"`` on a :class:`SlipGridWorld`.

    The target is the SR of the uniform macro policy, ``M(s, a, ·) = P_a^(k) (I − γ_k P̃)⁻¹`` with
    ``P_a^(k)`` and ``P̃ = ¼Σ_a P_a^(k)`` from :func:`~lit_lowrank.ops.fb.macro_action_operators` for
    ``abstraction`` (``"repeat"``: ``P_aᵏ``; ``"options"``: ``P_a P_πᵏ⁻¹``, so ``P̃ = P_πᵏ``): a fixed, well-conditioned matrix (the SR of a greedy ``π_z`` changes by
    tens of percent when one action flips). Returns the relative SR error
    ``‖F(s, a, z)ᵀB(s')ρ(s') − M‖_F/‖M‖_F`` (mean over the goal latents) and, per one-goal reward
    ``r = 1[s' = g]``, the value error ``‖V̂ − V‖₂`` of ``V̂(s) = mean_a M̂(s, a, ·) r`` against
    ``V = P̃(I − γ_k P̃)⁻¹ r`` and ``‖V‖₂`` — what :func:`~lit_lowrank.ops.fb.repeat_value_bound` bounds.
    """
    module.eval()
    device = module.device
    P = env.transition_tensor()
    A, S = P.shape[0], P.shape[1]
    Pk = macro_action_operators(P, k, abstraction)
    P_macro = macro_transition(P, k, abstraction=abstraction)
    gamma = float(macro_discount(module.hparams.discount, k, module.hparams.macro_discount))
    M_true = successor_measure(P_macro, gamma, P_first=Pk).permute(1, 0, 2).reshape(S * A, S)
    M_state = successor_measure(P_macro, gamma)
    next_states = replay["next_state"].long()
    rho = torch.bincount(next_states, minlength=S).double() / len(next_states)
    all_obs = torch.from_numpy(env.observe(np.arange(S))).to(device)
    B_all = module.backward_rep(all_obs).double().cpu()
    sample = next_states[:20000]
    obs_next = torch.from_numpy(env.observe(sample.numpy())).to(device)
    errors, value_errors, value_norms = [], [], []
    for g in goals:
        r = torch.zeros(S, dtype=torch.float64)
        r[g] = 1.0
        z = module.infer_z(obs_next, r[sample].float().to(device))
        F = module.forward_rep(all_obs, z.expand(S, -1)).mean(0).double().cpu()   # (S, A, d)
        M_hat = (F.reshape(S * A, -1) @ B_all.T) * rho[None]
        errors.append(float(relative_sr_error(M_hat, M_true)))
        v_hat = M_hat.reshape(S, A, S).mean(1) @ r
        v = M_state @ r
        value_errors.append(float((v_hat - v).norm()))
        value_norms.append(float(v.norm()))
    module.train()
    return {"sr_error": float(np.mean(errors)), "value_errors": value_errors, "value_norms": value_norms,
            "sr_errors": errors}


def _policy_return(P: Tensor, actions: Tensor, k: int, goal: int, gamma: float, horizon: int,
                   abstraction: str = "repeat") -> Tensor:
    """Expected discounted goal-reaching return ``E[γ^(T_hit − 1)]`` per start of the macro policy.

    The action ``actions[b]`` of the macro boundary state ``b`` is held ``k`` primitive steps
    (``"options"``: taken once, then ``k − 1`` uniform actions);
    entering ``goal`` pays 1 and terminates (also inside a repeat); ``horizon`` primitive steps.
    """
    S = P.shape[1]
    held = P[actions]                                  # (b, S, S): the operator of b's held action
    uniform = P.mean(0)
    # one repeat from every boundary state b, computed once: the mass entering the goal at each of
    # its steps, and where the surviving mass is at its end (the goal's column zeroed = terminated)
    cur = torch.eye(S, dtype=torch.float64)
    hits, ends = [], []
    for i in range(min(k, horizon)):
        if i == 0 or abstraction == "repeat":
            cur = torch.bmm(cur.unsqueeze(1), held).squeeze(1)
        else:
            cur = cur @ uniform
        hits.append(cur[:, goal].clone())
        cur[:, goal] = 0.0
        ends.append(cur)
    hit = torch.stack(hits, dim=1)                     # (b, steps)
    dist = torch.eye(S, dtype=torch.float64)           # (start, boundary state) mass still running
    total = torch.zeros(S, dtype=torch.float64)
    t = 0
    while t < horizon:
        steps = min(k, horizon - t)
        discounts = gamma ** torch.arange(t, t + steps, dtype=torch.float64)
        total = total + dist @ (hit[:, :steps] @ discounts)
        dist = dist @ ends[steps - 1]
        t += steps
    return total


def _optimal_return(P: Tensor, goal: int, gamma: float, horizon: int) -> Tensor:
    """Optimal primitive finite-horizon value of the same goal-reaching task per start state."""
    S = P.shape[1]
    hit = torch.zeros(S, dtype=torch.float64)
    hit[goal] = 1.0
    V = torch.zeros(S, dtype=torch.float64)
    for _ in range(horizon):
        V = (P @ (hit + gamma * V * (1.0 - hit))).amax(0)
    return V


@torch.no_grad()
def evaluate_rollouts(module: FBModule, env: Any, replay: dict[str, Tensor], goals: np.ndarray, k: int,
                      horizon: int = 100, num_starts: int = 16, seed: int = 0) -> dict[str, Any]:
    """Zero-shot return on a :class:`PointMass` against a goal-directed oracle (same starts and noise).

    Rewards are ``1[‖s − g‖ < goal_radius]`` per primitive step; ``z_r`` comes from the replay's
    next observations; the policy's action is held ``k`` steps; the oracle steps straight to the
    goal every primitive step. Returns the mean ratio over goals (``normalized_return``) and the
    per-goal returns.
    """
    module.eval()
    device = module.device
    next_obs = replay["next_obs"][:20000]
    ratios, raw = [], []
    for gi, goal in enumerate(np.asarray(goals, dtype=np.float32)):
        reward = torch.from_numpy(env.reward_of(next_obs.numpy(), goal))
        z = module.infer_z(next_obs.to(device), reward.to(device))
        results = []
        for oracle in (False, True):
            rng = np.random.default_rng(seed + gi)
            states = rng.uniform(-1, 1, (num_starts, 2)).astype(np.float32)
            total = np.zeros(num_starts)
            action = None
            for t in range(horizon):
                if oracle:
                    action = np.clip((goal - states) / env.step_size, -1, 1)
                elif t % k == 0:
                    action = module.act(torch.from_numpy(states).to(device), z).cpu().numpy()
                states = env.step_batch(states, action, rng)
                total += env.reward_of(states, goal)
            results.append(total.mean())
        raw.append(results[0])
        ratios.append(results[0] / max(results[1], 1e-12))
    module.train()
    return {"normalized_return": float(np.mean(ratios)), "returns": raw, "ratios": ratios}

