"""GRPOModule: Group Relative Policy Optimization of a causal LM, with stable rank as the default reward (SR-GRPO).

Per batch of prompts: sample ``group_size`` completions per prompt from the policy, score them with
the reward function (TRL's interface ``f(prompts, completions, **columns) -> list[float]``), turn
the rewards into group-normalised advantages (:func:`~lit_lowrank.ops.grpo.group_advantages`) and
take ``updates_per_batch`` optimiser steps on the clipped, KL-to-reference objective
(:func:`~lit_lowrank.ops.grpo.grpo_loss`). Optimisation is manual (several updates per sampled
batch, as in PPO/GRPO); Lightning still owns devices, logging and checkpoints.

With ``reward="stable_rank"`` (default) the reward is the stable rank of the completion's
final-layer hidden states under a frozen scorer (by default the reference policy, i.e. the initial
weights, so the policy cannot reshape the geometry that grades it): no annotation, no learned
reward model. ``eval_reward`` (e.g. the verifiable ``"arithmetic"`` exact-match check) is logged on
greedy validation completions as ``val/task_reward``.

.. code-block:: python

    module = GRPOModule(policy="smollm2", reward="stable_rank", eval_reward="arithmetic", group_size=4,
                        max_new_tokens=16, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-6))
    L.Trainer(max_steps=20).fit(module, datamodule=PromptDataModule("arithmetic", batch_size=2))
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.core.surgery import import_object
from lit_lowrank.decoding.stable_rank import (
    ResponseScorer,
    StableRankReward,
    decode_completion,
    eos_token_ids,
    sample_responses,
)
from lit_lowrank.ops.grpo import LossAggregation, group_advantages, grpo_loss
from lit_lowrank.ops.sequence_signals import token_log_probs
from lit_lowrank.tasks.base import TaskModule

RewardFn = Callable[..., list[float]]


def _build_policy(policy: str | dict[str, Any] | nn.Module, tokenizer: str | Any | None) -> tuple[nn.Module, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lit_lowrank.datamodules.tokenizers import get_tokenizer

    if isinstance(policy, nn.Module):
        if tokenizer is None:
            raise ValueError("`tokenizer` is required when `policy` is a module.")
        return policy, get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if isinstance(policy, dict):
        kwargs = dict(policy)
        model_type = kwargs.pop("model_type", None)
        if model_type is None:
            raise ValueError(f"`policy` as a dict needs a 'model_type' (a transformers config); got {policy!r}.")
        tok = get_tokenizer(tokenizer or "byte") if not hasattr(tokenizer, "decode") else tokenizer
        kwargs.setdefault("vocab_size", len(tok))
        for key in ("pad_token_id", "eos_token_id"):
            kwargs.setdefault(key, getattr(tok, key, None))
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs)), tok
    path = policy
    if policy == "smollm2":
        from lit_lowrank.models.pretrained import smollm2_path

        path = smollm2_path()
    if not Path(path).is_dir():
        raise FileNotFoundError(f"`policy`={policy!r}: expected 'smollm2', a local transformers folder, a config "
                                "dict with 'model_type', or a module.")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tok = tokenizer if tokenizer is not None and not isinstance(tokenizer, str) else \
        AutoTokenizer.from_pretrained(tokenizer or path, local_files_only=True)
    return model, tok


class GRPOModule(TaskModule):
    """GRPO for a causal LM; SR-GRPO with the default ``reward="stable_rank"``.

    Batches are ``{"prompt": [...], other columns: [...]}`` (e.g.
    :class:`~lit_lowrank.datamodules.prompts.PromptDataModule`); the other columns reach the
    reward functions as keyword arguments, repeated per sample, as in TRL.

    Args:
        policy: ``"smollm2"`` (the offline SmolLM2-135M-Instruct), a local transformers folder, a
            transformers config dict with ``model_type`` (random init, e.g. a tiny Llama), or a module.
        tokenizer: a tokenizer object, a name for :func:`~lit_lowrank.datamodules.get_tokenizer`
            (``"byte"``, ``"smollm2"``), or ``None`` (the policy folder's).
        reward: ``"stable_rank"``, ``"arithmetic"`` (exact match against the ``answer`` column), a
            dotted path to a reward function, or a callable with TRL's interface.
        reward_kwargs: options of the stable-rank scorer (:class:`~lit_lowrank.decoding.ResponseScorer`:
            ``center``, ``normalize``, ``final_norm`` ...).
        scorer: which frozen weights score stable rank: ``"reference"`` (the initial policy) or
            ``"policy"`` (the current policy, read without gradients).
        eval_reward: a reward logged on greedy validation completions as ``val/task_reward`` (``None``: off).
        group_size: completions per prompt ``G``.
        max_new_tokens / temperature / top_p: sampling options.
        chat: wrap prompts in the tokenizer's chat template.
        clip_eps: PPO clip range. beta: KL coefficient to the reference (0 keeps no reference copy
            unless the scorer needs it).
        updates_per_batch: optimiser steps per sampled batch (``μ``); the ratio departs from 1 after the first.
            Each counts as a trainer step (``max_steps`` counts optimiser steps).
        scale_advantages: divide by the group's standard deviation (GRPO) or only center (Dr. GRPO).
        aggregation: ``"sequence"`` (GRPO) or ``"token"`` (DAPO) loss averaging.
        trainable: a regex; only parameters whose name matches are trained (``None``: all).
        max_grad_norm: gradient clipping (``None``: off).

    .. code-block:: python

        GRPOModule(policy={"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4}, tokenizer="byte", group_size=4)
    """

    def __init__(
        self,
        policy: str | dict[str, Any] | nn.Module = "smollm2",
        tokenizer: str | Any | None = None,
        reward: str | RewardFn = "stable_rank",
        reward_kwargs: dict[str, Any] | None = None,
        scorer: str = "reference",
        eval_reward: str | RewardFn | None = None,
        group_size: int = 4,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        chat: bool = True,
        clip_eps: float = 0.2,
        beta: float = 0.04,
        updates_per_batch: int = 1,
        scale_advantages: bool = True,
        aggregation: LossAggregation = "sequence",
        trainable: str | None = None,
        max_grad_norm: float | None = 1.0,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, "step")
        # objects (a module, a tokenizer, a reward callable) cannot go into hparams; names and dicts can
        objects = [k for k, v in {"policy": policy, "tokenizer": tokenizer, "reward": reward,
                                  "eval_reward": eval_reward}.items() if not isinstance(v, (str, dict, type(None)))]
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler", *objects])
        if group_size < 2:
            raise ValueError(f"`group_size` must be >= 2 (advantages are relative within a group), got {group_size}.")
        if scorer not in ("reference", "policy"):
            raise ValueError(f"`scorer`={scorer!r}, expected 'reference' or 'policy'.")
        if updates_per_batch < 1:
            raise ValueError(f"`updates_per_batch` must be >= 1, got {updates_per_batch}.")
        self.automatic_optimization = False
        self.policy, self.tokenizer = _build_policy(policy, tokenizer)
        if trainable is not None:
            pattern = re.compile(trainable)
            names = [n for n, p in self.policy.named_parameters() if pattern.search(n)]
            if not names:
                raise ValueError(f"`trainable`={trainable!r} matches no parameter of the policy.")
            for n, p in self.policy.named_parameters():
                p.requires_grad_(bool(pattern.search(n)))
        needs_reference = beta > 0 or (scorer == "reference" and reward == "stable_rank")
        # a frozen copy outside the module's parameters: neither trained nor saved in checkpoints
        # (it is the initial policy, rebuilt from the same config)
        self._reference = [copy.deepcopy(self.policy).eval().requires_grad_(False)] if needs_reference else []
        self.group_size, self.max_new_tokens, self.temperature, self.top_p = group_size, max_new_tokens, temperature, top_p
        self.clip_eps, self.beta, self.updates_per_batch = clip_eps, beta, updates_per_batch
        self.scale_advantages, self.aggregation, self.max_grad_norm = scale_advantages, aggregation, max_grad_norm
        self.encoder = ResponseScorer(self.policy, self.tokenizer, chat=chat)
        self.reward_fn = self._reward(reward, reward_kwargs or {}, scorer, chat)
        self.eval_reward_fn = self._reward(eval_reward, reward_kwargs or {}, scorer, chat) if eval_reward else None
        self.eos_ids = eos_token_ids(self.policy, self.tokenizer)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)

    @property
    def reference(self) -> nn.Module | None:
        return self._reference[0] if self._reference else None

    def _reward(self, reward: str | RewardFn, kwargs: dict[str, Any], scorer: str, chat: bool) -> RewardFn:
        if callable(reward):
            return reward
        if reward == "stable_rank":
            model = self.reference if scorer == "reference" else self.policy
            return StableRankReward(model, self.tokenizer, chat=chat, **kwargs)
        if reward == "arithmetic":
            from lit_lowrank.datamodules.prompts import arithmetic_reward

            return arithmetic_reward
        try:
            return import_object(reward)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(f"`reward`={reward!r}: expected 'stable_rank', 'arithmetic', a dotted path to a "
                             f"function or a callable ({err}).") from err

    def on_fit_start(self) -> None:
        if self.reference is not None:
            self.reference.to(self.device)

    # ------------------------------------------------------------------ helpers
    def _columns(self, batch: dict[str, Any], repeat: int) -> dict[str, list[Any]]:
        return {k: [v for v in values for _ in range(repeat)] for k, values in batch.items() if k != "prompt"}

    def _sequences(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
        """Right-padded ``ids``, ``attention`` and the completion ``mask`` on the module's device."""
        rows = [p + c for p, c in zip(prompt_ids, completion_ids)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, (p, r) in enumerate(zip(prompt_ids, rows)):
            ids[i, : len(r)] = torch.tensor(r)
            attention[i, : len(r)] = 1
            mask[i, len(p): len(r)] = True
        return ids.to(self.device), attention.to(self.device), mask.to(self.device)

    def _log_probs(self, model: nn.Module, ids: Tensor, attention: Tensor, keep: int) -> Tensor:
        """Log-probabilities of ``ids[:, -keep + 1:]`` (the completion window; the prompt's logits are never read)."""
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep).logits[:, :-1]
        return token_log_probs(logits, ids[:, ids.shape[1] - keep + 1:])

    def sample(self, prompts: list[Any], n: int, greedy: bool = False) -> tuple[list[list[int]], list[list[int]], list[str]]:
        """Prompt ids (repeated ``n`` times), completion ids (with their EOS when they ended) and texts."""
        prompt_ids = [self.encoder.prompt_ids(p) for p in prompts]
        completions = sample_responses(self.policy, prompt_ids, n, self.max_new_tokens, self.eos_ids, self.pad_id,
                                       do_sample=not greedy, temperature=self.temperature, top_p=self.top_p,
                                       keep_eos=True)
        texts = [decode_completion(self.tokenizer, c, self.eos_ids) for c in completions]
        return [p for p in prompt_ids for _ in range(n)], completions, texts

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        prompts = list(batch["prompt"])
        g = self.group_size
        prompt_ids, completion_ids, texts = self.sample(prompts, g)
        rewards = torch.tensor(self.reward_fn([p for p in prompts for _ in range(g)], texts, **self._columns(batch, g)),
                               dtype=torch.float32, device=self.device)
        advantages = group_advantages(rewards, g, scale=self.scale_advantages)
        ids, attention, mask = self._sequences(prompt_ids, completion_ids)
        width = ids.shape[1]
        keep = min(width, width - min(len(p) for p in prompt_ids) + 1)
        token_mask = mask[:, width - keep + 1:]
        with torch.no_grad():
            logp_old = self._log_probs(self.policy, ids, attention, keep)
            logp_ref = self._log_probs(self.reference, ids, attention, keep) if self.beta > 0 else None
        optimizer = self.optimizers()
        outputs: dict[str, Any] = {"completions": texts, "rewards": rewards, "advantages": advantages}
        for _ in range(self.updates_per_batch):
            logp = self._log_probs(self.policy, ids, attention, keep)
            loss, stats = grpo_loss(logp, logp_old, logp_ref, advantages, token_mask, self.clip_eps, self.beta,
                                    self.aggregation)
            loss = apply_loss_hooks(self, batch, {**outputs, "loss": loss}, loss)
            optimizer.zero_grad()
            self.manual_backward(loss)
            if self.max_grad_norm is not None:
                self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
            optimizer.step()
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        n = len(prompts)
        self.log_split("train", {"loss": loss, "reward": rewards.mean(), "reward_std": rewards.std()}, batch_size=n)
        log_method(self, "stable_rank", "grpo_kl", stats["kl"], batch_size=n)
        log_method(self, "stable_rank", "grpo_clip_fraction", stats["clip_fraction"], batch_size=n)
        log_method(self, "stable_rank", "completion_tokens", token_mask.sum(-1).float().mean(), batch_size=n)
        return loss

    @torch.no_grad()
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        prompts = list(batch["prompt"])
        _, _, texts = self.sample(prompts, 1, greedy=True)
        columns = self._columns(batch, 1)
        values = {"reward": torch.tensor(self.reward_fn(prompts, texts, **columns)).float().mean()}
        if self.eval_reward_fn is not None:
            values["task_reward"] = torch.tensor(self.eval_reward_fn(prompts, texts, **columns)).float().mean()
        self.log_split("val", values, batch_size=len(prompts))

    def generate_text(self, prompts: list[Any], greedy: bool = True) -> list[str]:
        """One completion per prompt (greedy by default), as text."""
        return self.sample(prompts, 1, greedy=greedy)[2]
