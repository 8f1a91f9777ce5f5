"""SpecBlock's deployment-time adaptation: a drafter updated from verifier feedback, gated by a cost-aware bandit.

:class:`BanditAdaptiveDrafter` wraps a feature drafter (:class:`~lit_lowrank.decoding.SpecBlockDrafter`
or :class:`~lit_lowrank.decoding.EagleDrafter`; anything with a ``net``
:class:`~lit_lowrank.models.spec_drafter.BlockDrafterNet`). Every verified round is a free
label: the engine's :class:`~lit_lowrank.decoding.engine.RoundFeedback` carries the target's
hidden state and argmax at the root and every accepted node, which is exactly one more
position of the drafter's training data (``features``, ``target_ids``; the committed
tokens give the inputs). Every ``interval`` rounds an *epoch* ends: the bandit
(:class:`~lit_lowrank.ops.update_bandit.CostAwareUpdateBandit`) is told the Δτ the last
update brought (τ of this epoch − τ of the epoch before it) and picks the next arm —
no update, head only, last layer, or full — with reward
``horizon * E[Δτ] - update_seconds * tokens_per_second``; an update arm runs ``steps``
AdamW steps of :meth:`BlockDrafterNet.training_loss` on the last ``window`` positions of
the current sequence, on that arm's parameters only. The update time is real decode
time (it happens inside ``generate``), so the reported tokens/s pays for it. The output
stays lossless: only the drafter changes.

.. code-block:: python

    drafter = BanditAdaptiveDrafter(SpecBlockDrafter(net, blocks=2, expand=4), interval=8)
    engine = SpeculativeDecoder(target, drafter, budget=24)
    for prompt in stream:                         # a prompt stream that shifts
        out, stats = engine.generate(prompt, 64)
    print(drafter.arm_counts())                   # {"none": ..., "head": ..., ...}
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.decoding.engine import Drafter, DraftRequest, DraftTree, RoundFeedback
from lit_lowrank.models.spec_drafter import BlockDrafterNet
from lit_lowrank.ops.update_bandit import UPDATE_ARMS, CostAwareUpdateBandit


def update_scopes(net: BlockDrafterNet) -> dict[str, list[nn.Parameter]]:
    """Parameters each update arm trains: ``head`` (LM head, rank head, final norm), ``last_layer``
    (+ the last drafter layer), ``full`` (every parameter).

    .. code-block:: python

        scopes = update_scopes(net)      # {"head": [...], "last_layer": [...], "full": [...]}
    """
    head = list(net.head.parameters()) + list(net.norm.parameters())
    if net.rank_head is not None:
        head += list(net.rank_head.parameters())
    last = head + list(net.layers[-1].parameters())
    return {"head": head, "last_layer": last, "full": list(net.parameters())}


class BanditAdaptiveDrafter(Drafter):
    """A feature drafter updated online from verifier feedback when the bandit expects it to pay.

    Args:
        drafter: the wrapped drafter; must have a ``net`` attribute (a :class:`BlockDrafterNet`).
        bandit: the arm policy (default: :class:`CostAwareUpdateBandit` with ``horizon=4 * interval``).
        interval: rounds per epoch (one bandit decision per epoch).
        window: most recent positions of the current sequence an update trains on.
        steps: optimiser steps per update.
        lr: AdamW learning rate of the updates.

    .. code-block:: python

        drafter = BanditAdaptiveDrafter(SpecBlockDrafter(net), interval=8, steps=2)
    """

    def __init__(self, drafter: Drafter, bandit: CostAwareUpdateBandit | None = None, interval: int = 8,
                 window: int = 48, steps: int = 2, lr: float = 1e-3) -> None:
        net = getattr(drafter, "net", None)
        if not isinstance(net, BlockDrafterNet):
            raise TypeError(f"BanditAdaptiveDrafter: `drafter` must have a BlockDrafterNet `net`, got "
                            f"{type(drafter).__name__} with net={type(net).__name__}.")
        if interval < 1 or window < 3 or steps < 1 or lr <= 0:
            raise ValueError(f"BanditAdaptiveDrafter: expected interval >= 1, window >= 3, steps >= 1, lr > 0; got "
                             f"interval={interval}, window={window}, steps={steps}, lr={lr}.")
        self.drafter, self.net = drafter, net
        self.feature_layers = getattr(drafter, "feature_layers", None)  # what the verifier must return
        self.bandit = bandit or CostAwareUpdateBandit(UPDATE_ARMS, horizon=4.0 * interval, gain_cap=2.0)
        if len(self.bandit.arms) != len(UPDATE_ARMS):
            raise ValueError(f"BanditAdaptiveDrafter: the bandit must have the arms {UPDATE_ARMS}, "
                             f"got {self.bandit.arms}.")
        self.interval, self.window, self.steps, self.lr = interval, window, steps, lr
        self._initial = copy.deepcopy(net.state_dict())
        self.restart()

    # ------------------------------------------------------------------ stream state
    def restart(self) -> None:
        """Back to the deployed drafter: initial weights, a fresh bandit, no history (a new stream)."""
        self.net.load_state_dict(self._initial)
        self.net.eval().requires_grad_(False)
        self.bandit.reset()
        self.cost_seconds = [0.0] * len(UPDATE_ARMS)  # measured per arm (EMA); 0 until first pulled: optimistic
        self.pulls: list[str] = []
        self.update_seconds = 0.0  # wall time spent in updates since restart (part of the decode time)
        self._epoch_taus: list[float] = []
        self._prev_tau: float | None = None
        self._pending_arm: int | None = None
        self._round_seconds = 0.0
        self._last_time: float | None = None
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []  # committed tokens of the current sequence, aligned with the two below
        self.features: list[Tensor] = []  # target features (fused, as the drafter reads them) at each decoded position
        self.argmax: list[int] = []  # the target's argmax there (the drafter's label)
        self._target: Any = None
        self._last_time = None
        self.drafter.reset()

    def arm_counts(self) -> dict[str, int]:
        """How often each arm was chosen since :meth:`restart`."""
        return {name: self.pulls.count(name) for name in UPDATE_ARMS}

    # ------------------------------------------------------------------ drafter interface
    def draft(self, request: DraftRequest) -> DraftTree:
        self._target = request.target
        return self.drafter.draft(request)

    def observe(self, feedback: RoundFeedback) -> None:
        self.drafter.observe(feedback)
        now = time.perf_counter()
        if self._last_time is not None:  # EMA of seconds per round: converts update seconds into tokens
            dt = now - self._last_time
            self._round_seconds = dt if self._round_seconds == 0 else 0.8 * self._round_seconds + 0.2 * dt
        path = [0] + [a + 1 for a in feedback.accepted]  # root and accepted nodes (tree + root indexing)
        committed = feedback.request.tokens
        if not self.tokens:  # first round of a sequence: the committed prefix before the root
            self.tokens = committed[:-1].tolist()
        self.tokens += [int(committed[-1])] + [int(feedback.tree.tokens[a]) for a in feedback.accepted]
        self.features += list(feedback.target_features[path].float().cpu())
        self.argmax += feedback.target_tokens[path].tolist()
        self._epoch_taus.append(len(feedback.accepted) + 1.0)
        if len(self._epoch_taus) >= self.interval:
            self._end_epoch()
        self._last_time = time.perf_counter()

    # ------------------------------------------------------------------ bandit epoch
    def _end_epoch(self) -> None:
        tau = sum(self._epoch_taus) / len(self._epoch_taus)
        self._epoch_taus = []
        if self._pending_arm is not None and self._prev_tau is not None:
            self.bandit.update(self._pending_arm, tau - self._prev_tau)
        self._prev_tau = tau
        tokens_per_second = tau / self._round_seconds if self._round_seconds > 0 else 0.0
        arm = self.bandit.select([c * tokens_per_second for c in self.cost_seconds])
        self.pulls.append(UPDATE_ARMS[arm])
        self._pending_arm = arm
        if arm:
            start = time.perf_counter()
            self._update(UPDATE_ARMS[arm])
            took = time.perf_counter() - start
            self.update_seconds += took
            old = self.cost_seconds[arm]
            self.cost_seconds[arm] = took if old == 0 else 0.5 * old + 0.5 * took

    def _update(self, scope: str) -> None:
        """``steps`` AdamW steps on the last ``window`` decoded positions, training ``scope`` only."""
        n = len(self.features)
        decoded_start = len(self.tokens) - n  # features/argmax cover the last n committed positions
        take = min(self.window, n)
        if take < 3 or self._target is None:
            return
        net = self.net
        params = update_scopes(net)[scope]
        dtype = net.fc.weight.dtype
        ids = torch.tensor(self.tokens[decoded_start + n - take: decoded_start + n], dtype=torch.long)
        feats = torch.stack(self.features[n - take:]).to(dtype)[None]
        labels = torch.tensor(self.argmax[n - take:], dtype=torch.long)[None]
        with torch.no_grad():
            embeds = self._target.embed(ids.to(self._target.device)).to(dtype).cpu()[None]
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=0.0)
        net.train()
        with torch.enable_grad():
            for _ in range(self.steps):
                loss, _ = net.training_loss(embeds.to(feats.device), feats, labels.to(feats.device))
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
        net.eval().requires_grad_(False)
        self.drafter.reset()  # its KV cache over the context was computed with the old weights
