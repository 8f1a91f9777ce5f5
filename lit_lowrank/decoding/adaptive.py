"""SpecBlock's deployment-time adaptation: a drafter updated from verifier feedback, gated by a cost-aware bandit.

:class:`BanditAdaptiveDrafter` wraps a feature drafter (:class:`~lit_lowrank.decoding.SpecBlockDrafter`
or :class:`~lit_lowrank.decoding.EagleDrafter`; anything with a ``net``
:class:`~lit_lowrank.models.spec_drafter.BlockDrafterNet`). Every verified round is a free
label: the engine's :class:`~lit_lowrank.decoding.engine.RoundFeedback` carries the target's
hidden state and argmax at the root and every accepted node, which is exactly one more
position of the drafter's training data (``features``, ``target_ids``; the committed
tokens give the inputs). Every ``interval`` rounds an *epoch* ends: the bandit
(:class:`~lit_lowrank.ops.update_bandit.CostAwareUpdateBandit`) is told the Δτ the last
update brought and picks the next arm — no update, head only, last layer, or full — with
reward ``horizon * E[Δτ] - update_seconds * tokens_per_second``; an update arm runs
``steps`` AdamW steps of :meth:`BlockDrafterNet.training_loss` on the last ``window``
positions of the current sequence, on that arm's parameters only. The update time is real
decode time (it happens inside ``generate``), so the reported tokens/s pays for it. The
output stays lossless: only the drafter changes.

The Δτ of an update is *paired*: on the positions the epoch after it decoded (labels the
update never saw), the drafter's teacher-forced chain acceptance (block size x the
valid-prefix fraction of :meth:`BlockDrafterNet.training_loss`) with the updated weights
minus that with the weights before it. The unpaired alternative — τ of this epoch minus τ of
the last — mixes the update's effect with how easy each epoch's text is (its spread is
~0.5 token on a stable stream), so a bandit fed with it cannot tell a useless update from a
useful one within a stream and keeps updating.

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
        lr: AdamW learning rate of the updates. A fresh AdamW's first step moves every weight by
            about ``lr``; at 1e-3 that perturbs a trained drafter (measured on SmolLM2: τ 1.55 → 1.36
            over a Lee-news stream with every update arm), at 1e-4 it does not (1.58).
        exploration: the default bandit's UCB bonus scale, in paired-Δτ units.
        score_updates: measure each update's paired Δτ (what the bandit learns from). ``False`` only for a
            fixed update schedule (a bandit that ignores gains), where scoring would be wasted decode time.

    .. code-block:: python

        drafter = BanditAdaptiveDrafter(SpecBlockDrafter(net), interval=8, steps=2)
    """

    def __init__(self, drafter: Drafter, bandit: CostAwareUpdateBandit | None = None, interval: int = 8,
                 window: int = 48, steps: int = 2, lr: float = 1e-4,
                 exploration: float = 0.05, score_updates: bool = True) -> None:
        net = getattr(drafter, "net", None)
        if not isinstance(net, BlockDrafterNet):
            raise TypeError(f"BanditAdaptiveDrafter: `drafter` must have a BlockDrafterNet `net`, got "
                            f"{type(drafter).__name__} with net={type(net).__name__}.")
        if interval < 1 or window < 3 or steps < 1 or lr <= 0:
            raise ValueError(f"BanditAdaptiveDrafter: expected interval >= 1, window >= 3, steps >= 1, lr > 0; got "
                             f"interval={interval}, window={window}, steps={steps}, lr={lr}.")
        self.drafter, self.net = drafter, net
        self.feature_layers = getattr(drafter, "feature_layers", None)  # what the verifier must return
        # paired Δτ is a low-noise signal (spread ~0.05 token per update on SmolLM2), so the UCB bonus is scaled to it
        self.bandit = bandit or CostAwareUpdateBandit(UPDATE_ARMS, horizon=4.0 * interval, gain_cap=2.0,
                                                      exploration=exploration)
        if len(self.bandit.arms) != len(UPDATE_ARMS):
            raise ValueError(f"BanditAdaptiveDrafter: the bandit must have the arms {UPDATE_ARMS}, "
                             f"got {self.bandit.arms}.")
        self.interval, self.window, self.steps, self.lr = interval, window, steps, lr
        self.score_updates = score_updates
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
        self._epoch_positions = 0  # decoded positions (features) added since the epoch began
        self._pending_arm: int | None = None
        self._before: list[Tensor] | None = None  # the pending update's scope before it (for the paired Δτ)
        self.gains: list[tuple[str, float]] = []  # (arm, paired Δτ) of every update measured
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
        self._epoch_positions += len(path)
        self._epoch_taus.append(len(feedback.accepted) + 1.0)
        if len(self._epoch_taus) >= self.interval:
            self._end_epoch()
        self._last_time = time.perf_counter()

    # ------------------------------------------------------------------ bandit epoch
    def _end_epoch(self) -> None:
        tau = sum(self._epoch_taus) / len(self._epoch_taus)
        self._epoch_taus = []
        fresh, self._epoch_positions = self._epoch_positions, 0
        start = time.perf_counter()
        if self._pending_arm and self.score_updates:
            gain = self._paired_gain(UPDATE_ARMS[self._pending_arm], fresh)
            if gain is not None:  # None: too few fresh positions (e.g. a new prompt began); the pull stays unscored
                self.bandit.update(self._pending_arm, gain)
                self.gains.append((UPDATE_ARMS[self._pending_arm], gain))
        elif self._pending_arm == 0:
            self.bandit.update(0, 0.0)
        self._before = None
        tokens_per_second = tau / self._round_seconds if self._round_seconds > 0 else 0.0
        arm = self.bandit.select([c * tokens_per_second for c in self.cost_seconds])
        self.pulls.append(UPDATE_ARMS[arm])
        self._pending_arm = arm
        if arm:
            if self.score_updates:
                self._before = [p.detach().clone() for p in update_scopes(self.net)[UPDATE_ARMS[arm]]]
            self._update(UPDATE_ARMS[arm])
        took = time.perf_counter() - start  # an update's cost includes scoring it (both are decode time)
        self.update_seconds += took
        if arm:
            old = self.cost_seconds[arm]
            self.cost_seconds[arm] = took if old == 0 else 0.5 * old + 0.5 * took

    def _batch(self, take: int) -> tuple[Tensor, Tensor, Tensor] | None:
        """(embeds, features, labels) of the last ``take`` decoded positions, batch of one (None if < 3)."""
        n = len(self.features)
        take = min(take, n)
        if take < 3 or self._target is None:
            return None
        decoded_start = len(self.tokens) - n  # features/argmax cover the last n committed positions
        dtype = self.net.fc.weight.dtype
        ids = torch.tensor(self.tokens[decoded_start + n - take: decoded_start + n], dtype=torch.long)
        feats = torch.stack(self.features[n - take:]).to(dtype)[None]
        labels = torch.tensor(self.argmax[n - take:], dtype=torch.long)[None]
        with torch.no_grad():
            embeds = self._target.embed(ids.to(self._target.device)).to(dtype).cpu()[None]
        return embeds.to(feats.device), feats, labels.to(feats.device)

    @torch.no_grad()
    def _chain_tau(self, batch: tuple[Tensor, Tensor, Tensor]) -> float:
        """Teacher-forced chain acceptance of the current weights: block size x valid-prefix fraction."""
        self.net.eval()
        _, parts = self.net.training_loss(*batch, expand_at=None)
        return float(parts["valid_fraction"]) * self.net.block_size

    @torch.no_grad()
    def _paired_gain(self, scope: str, fresh: int) -> float | None:
        """Chain-τ of the updated weights minus that of the weights before the update, on the
        ``fresh`` positions decoded since (earlier positions are context only)."""
        if self._before is None or fresh < 3:
            return None
        batch = self._batch(fresh + self.net.context_window)
        if batch is None:
            return None
        embeds, feats, labels = batch
        fresh = min(fresh, labels.shape[1] - 1)
        labels = labels.clone()
        labels[:, : labels.shape[1] - fresh] = -100  # score only labels the update never trained on
        batch = (embeds, feats, labels)
        params = update_scopes(self.net)[scope]
        after = [p.detach().clone() for p in params]
        tau_after = self._chain_tau(batch)
        for p, old in zip(params, self._before):
            p.copy_(old)
        tau_before = self._chain_tau(batch)
        for p, new in zip(params, after):
            p.copy_(new)
        return tau_after - tau_before

    def _update(self, scope: str) -> None:
        """``steps`` AdamW steps on the last ``window`` decoded positions, training ``scope`` only."""
        batch = self._batch(self.window)
        if batch is None:
            return
        net = self.net
        params = update_scopes(net)[scope]
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=0.0)
        net.train()
        with torch.enable_grad():
            for _ in range(self.steps):
                loss, _ = net.training_loss(*batch)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
        net.eval().requires_grad_(False)
        self.drafter.reset()  # its KV cache over the context was computed with the old weights
