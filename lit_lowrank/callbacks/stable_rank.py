"""StableRankMonitor: log the stable rank of a language model's responses during training and validation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor
from typing_extensions import override

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.loss_hooks import MethodCallback
from lit_lowrank.ops.stable_rank import Normalization, stable_rank

DEFAULT_PROMPTS: tuple[str, ...] = (
    "The government said on Monday that",
    "Scientists have found that",
    "The match ended when",
    "Police are investigating",
)


class StableRankMonitor(MethodCallback):
    """Logs stable rank (arXiv 2512.02807) as a label-free quality diagnostic of an LM in training.

    Two readings, both under ``method/stable_rank/...``:

    - ``train_hidden``: every ``every_n_steps`` training steps, the mean stable rank of the training
      batch's final hidden states (``outputs["hidden_states"]`` of the loss-hook protocol, rows where
      ``labels != -100``); costs one batched SVD, no forward pass.
    - ``generated`` (and ``generated_tokens``): at the end of each validation epoch (and every
      ``generate_every_n_steps`` training steps if set), the module's LM greedily continues ``prompts``
      and the stable rank of the generated tokens' final hidden states is logged — a falling value
      flags repetition loops and collapse without any reference text.

    Requirements: the module's causal LM is ``getattr(pl_module, model_attr)`` (``model`` for
    :class:`~lit_lowrank.tasks.CausalLMModule`, ``policy`` for :class:`~lit_lowrank.tasks.grpo.GRPOModule`)
    and supports transformers' ``generate`` and ``output_hidden_states``. Generation runs on global rank 0
    only (a diagnostic, logged with ``rank_zero_only``).

    Args:
        prompts: texts to continue.
        tokenizer: a tokenizer object or a name for :func:`~lit_lowrank.datamodules.get_tokenizer`
            (``"byte"``, ``"smollm2"``, a local path); it must match the module's vocabulary.
        max_new_tokens: generated tokens per prompt.
        every_n_steps: period of ``train_hidden`` (0 disables it).
        generate_every_n_steps: period of ``generated`` during training (0: only at validation end).
        center / normalize: options of :func:`~lit_lowrank.ops.stable_rank.stable_rank`.
        model_attr: attribute of the module that holds the causal LM.

    .. code-block:: python

        trainer = L.Trainer(callbacks=[StableRankMonitor(tokenizer="byte", max_new_tokens=32)])
        trainer.fit(CausalLMModule(), datamodule=PackedTextDataModule(corpus="lee"))
    """

    method_name = "stable_rank"

    def __init__(self, prompts: Sequence[str] = DEFAULT_PROMPTS, tokenizer: str | Any = "byte",
                 max_new_tokens: int = 32, every_n_steps: int = 10, generate_every_n_steps: int = 0,
                 center: bool = False, normalize: Normalization = "none", model_attr: str = "model") -> None:
        if not prompts:
            raise ValueError("`prompts` must hold at least one text.")
        if max_new_tokens < 1 or every_n_steps < 0 or generate_every_n_steps < 0:
            raise ValueError(f"`max_new_tokens` must be >= 1 and the periods >= 0; got max_new_tokens={max_new_tokens}, "
                             f"every_n_steps={every_n_steps}, generate_every_n_steps={generate_every_n_steps}.")
        if normalize not in ("none", "max_rank"):
            raise ValueError(f"`normalize`={normalize!r}, expected 'none' or 'max_rank'.")
        self.prompts, self.tokenizer_spec = list(prompts), tokenizer
        self.max_new_tokens, self.every_n_steps, self.generate_every_n_steps = max_new_tokens, every_n_steps, \
            generate_every_n_steps
        self.center, self.normalize, self.model_attr = center, normalize, model_attr
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from lit_lowrank.datamodules.tokenizers import get_tokenizer

            spec = self.tokenizer_spec
            self._tokenizer = get_tokenizer(spec) if isinstance(spec, str) else spec
        return self._tokenizer

    def _model(self, pl_module: "pl.LightningModule") -> Any:
        model = getattr(pl_module, self.model_attr, None)
        if model is None or not hasattr(model, "generate"):
            raise ValueError(f"StableRankMonitor: `{type(pl_module).__name__}.{self.model_attr}` must be a transformers "
                             f"causal LM (with `generate`); got {type(model).__name__}. Set `model_attr`.")
        return model

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._model(pl_module)  # fail before training, not at the first validation

    # ------------------------------------------------------------------ training batch
    @override
    def on_loss(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, outputs: dict[str, Any],
                loss: Tensor) -> Tensor:
        step = trainer.global_step
        states = outputs.get("hidden_states")
        if self.every_n_steps and step % self.every_n_steps == 0 and isinstance(states, Tensor) and states.dim() == 3:
            labels = outputs.get("labels")
            mask = labels != -100 if isinstance(labels, Tensor) and labels.shape == states.shape[:2] else None
            with torch.no_grad():
                value = stable_rank(states.detach(), mask, self.center, self.normalize).mean()
            log_method(pl_module, self.method_name, "train_hidden", value, batch_size=states.shape[0])
        return loss

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        n = self.generate_every_n_steps
        if n and trainer.global_step % n == 0:
            self._log_generated(pl_module, on_step=True)

    @override
    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not trainer.sanity_checking:
            self._log_generated(pl_module, on_step=False)

    # ------------------------------------------------------------------ generated responses
    @torch.no_grad()
    def generated_stable_rank(self, pl_module: "pl.LightningModule") -> tuple[Tensor, Tensor]:
        """Greedy continuations of ``prompts``: per-prompt stable rank ``(P,)`` and generated lengths ``(P,)``."""
        from lit_lowrank.decoding.stable_rank import ResponseScorer, eos_token_ids, sample_responses

        model = self._model(pl_module)
        scorer = ResponseScorer(model, self.tokenizer, center=self.center, normalize=self.normalize)
        prompt_ids = [scorer.prompt_ids(p) for p in self.prompts]
        eos = eos_token_ids(model, self.tokenizer)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        pad = pad if pad is not None else min(eos, default=0)
        completions = sample_responses(model, prompt_ids, 1, self.max_new_tokens, eos, pad, do_sample=False)
        ranks = scorer.score_ids(prompt_ids, completions, ("stable_rank",))["stable_rank"]
        return ranks, torch.tensor([float(len(c)) for c in completions])

    def _log_generated(self, pl_module: "pl.LightningModule", on_step: bool) -> None:
        ranks, lengths = self._generate_on_rank_zero(pl_module)
        if ranks is None:
            return
        kwargs = {"on_step": on_step, "on_epoch": not on_step, "rank_zero_only": True, "batch_size": len(self.prompts)}
        log_method(pl_module, self.method_name, "generated", ranks.mean(), **kwargs)
        log_method(pl_module, self.method_name, "generated_tokens", lengths.mean(), **kwargs)

    def _generate_on_rank_zero(self, pl_module: "pl.LightningModule") -> tuple[Tensor | None, Tensor | None]:
        @rank_zero_only
        def run() -> tuple[Tensor, Tensor]:
            return self.generated_stable_rank(pl_module)

        out = run()
        return out if out is not None else (None, None)
