"""Training a feature drafter against a frozen target: Lightning module and the feature cache.

:class:`DrafterDistillModule` holds a frozen target causal LM and a trainable
:class:`~lit_lowrank.models.spec_drafter.BlockDrafterNet`. Each batch of packed windows
(:class:`~lit_lowrank.datamodules.PackedTextDataModule`) goes through the target once
(no gradient; block-diagonal causal attention over documents) for its last hidden
states and its argmax, and the drafter learns to predict that argmax
(:meth:`BlockDrafterNet.training_loss`: valid-prefix mask, feature regression, rank head).
A batch may instead carry cached ``features`` / ``target_ids`` (see
:func:`target_feature_cache`), which skips the target forward. Checkpoints hold the
drafter only (the frozen target is rebuilt from the hyperparameters).

.. code-block:: bash

    lit-lowrank fit --config configs/language_model/real/specblock_smollm2.yaml

.. code-block:: python

    module = DrafterDistillModule(pretrained_path="smollm2", drafter={"block_size": 4})
    L.Trainer(max_steps=300).fit(module, datamodule=PackedTextDataModule(corpus="lee", tokenizer="smollm2"))
    module.drafter.save("specblock.pt")          # BlockDrafterNet.load("specblock.pt") for the engine
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from lit_lowrank.core.logging import log_method
from lit_lowrank.decoding.engine import fused_features
from lit_lowrank.models.spec_drafter import BlockDrafterNet, MedusaHeads
from lit_lowrank.tasks.language_model import CausalLMModule, block_causal_attention_mask


def _draft_vocab_ids(draft_vocab: int | str | None, vocab_size: int) -> tuple[Tensor | None, int | None]:
    """``(ids or None, size)``: ``"top:N"`` has a size now and its ids later (from the data's counts)."""
    if draft_vocab is None:
        return None, None
    if isinstance(draft_vocab, str) and draft_vocab.startswith("top:"):
        n = int(draft_vocab[4:])
        if not 1 <= n <= vocab_size:
            raise ValueError(f"`draft_vocab`={draft_vocab!r}: expected 'top:N' with 1 <= N <= vocab_size={vocab_size}.")
        return None, n
    if isinstance(draft_vocab, int):
        if not 1 <= draft_vocab <= vocab_size:
            raise ValueError(f"`draft_vocab`={draft_vocab}: expected 1..vocab_size={vocab_size}.")
        return torch.arange(draft_vocab), draft_vocab
    path = Path(draft_vocab)
    if not path.is_file():
        raise FileNotFoundError(f"`draft_vocab`={draft_vocab!r}: expected an int, 'top:N' or the path of a saved (N,) "
                                "id tensor.")
    ids = torch.as_tensor(torch.load(path, weights_only=True), dtype=torch.long)
    return ids, ids.numel()


@torch.no_grad()
def target_outputs(target: torch.nn.Module, input_ids: Tensor, labels: Tensor | None = None,
                   doc_ids: Tensor | None = None, position_ids: Tensor | None = None,
                   feature_layers: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor]:
    """The target's features ``(B, T, H)`` and argmax ``(B, T)`` (``-100`` where ``labels`` is).

    Features: the last hidden state, or with ``feature_layers`` the fused states of those layers
    ``(B, T, H * L)``, exactly as :class:`~lit_lowrank.decoding.engine.TargetLM` returns them.
    """
    mask = None if doc_ids is None else block_causal_attention_mask(doc_ids, next(target.parameters()).dtype)
    out = target(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, output_hidden_states=True)
    argmax = out.logits.argmax(-1)
    if labels is not None:
        argmax = torch.where(labels == -100, torch.full_like(argmax, -100), argmax)
    return fused_features(out.hidden_states, out.hidden_states[-1], feature_layers), argmax


class DrafterDistillModule(pl.LightningModule):
    """Train a SpecBlock (or EAGLE-style, ``block_size=1``; or Medusa-style heads) drafter on a frozen target.

    Args:
        pretrained_path: the target: a local transformers folder or ``"smollm2"``.
        model_config: a random-init target instead (tests), as in :class:`CausalLMModule`.
        vocab_size: vocabulary of a random-init target.
        architecture: ``"block"`` (:class:`BlockDrafterNet`: EAGLE-style or SpecBlock) or ``"medusa"``
            (:class:`MedusaHeads`).
        drafter: keyword arguments of that network (``block_size``, ``layer_shift``, ``rank_head``,
            ``valid_prefix``, ``num_layers``, ``num_heads``, ``intermediate_size``, ``context_window``, ...;
            Medusa: ``num_heads``).
        draft_vocab: the drafter's vocabulary (EAGLE-3 / FR-Spec's reduced head): ``None`` = the target's
            whole vocabulary; ``"top:N"`` = the ``N`` ids the target outputs most often in the training
            data (from the datamodule's ``target_token_counts()`` at setup; the ids are saved in the
            checkpoint); an int ``N`` = ids ``0..N-1`` (BPE ids are roughly in merge order, i.e.
            frequency order); a path = a saved ``(N,)`` tensor of ids.
        train_head: train the drafter's LM head; by default it is the target's head
            (copied rows of the draft vocabulary) kept frozen, as in EAGLE. Medusa trains its heads.
        optimizer / lr_scheduler: callables, as in the task modules.

    Batches need ``input_ids`` and either ``features`` + ``target_ids`` (cached target outputs, e.g.
    from :class:`~lit_lowrank.decoding.distill_data.SelfDistillDataModule`: the target never runs)
    or ``labels`` (the target runs once per batch, no gradient); ``doc_ids`` optional.

    .. code-block:: python

        module = DrafterDistillModule(model_config={"model_type": "llama", "hidden_size": 64,
                                                    "intermediate_size": 128, "num_hidden_layers": 2,
                                                    "num_attention_heads": 4}, drafter={"block_size": 4})
    """

    def __init__(self, pretrained_path: str | None = None, model_config: dict[str, Any] | None = None,
                 vocab_size: int = 258, architecture: str = "block", drafter: dict[str, Any] | None = None,
                 draft_vocab: int | str | None = None, train_head: bool | None = None,
                 optimizer: OptimizerCallable = torch.optim.AdamW,
                 lr_scheduler: LRSchedulerCallable | None = None) -> None:
        super().__init__()
        if architecture not in ("block", "medusa"):
            raise ValueError(f"`architecture`={architecture!r}, expected 'block' or 'medusa'.")
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler"])
        self.optimizer_factory, self.lr_scheduler_factory = optimizer, lr_scheduler
        target = CausalLMModule._build(model_config, pretrained_path, vocab_size, "sdpa")
        self.target = target.eval().requires_grad_(False)
        cfg = target.config
        ids, size = _draft_vocab_ids(draft_vocab, cfg.vocab_size)
        self._vocab_from_data = ids is None and size is not None
        drafter_kwargs = dict(drafter or {})
        if "draft_vocab_size" in drafter_kwargs:
            raise ValueError("DrafterDistillModule: set the draft vocabulary with `draft_vocab`, "
                             "not drafter.draft_vocab_size.")
        drafter_kwargs["draft_vocab_size"] = size
        net_cls = MedusaHeads if architecture == "medusa" else BlockDrafterNet
        self.drafter = net_cls(cfg.hidden_size, cfg.vocab_size, **drafter_kwargs)
        if ids is not None:
            self.drafter.set_draft_vocab(ids)
        self._init_head()
        if train_head is None:
            train_head = architecture == "medusa"  # Medusa trains its heads; EAGLE keeps the target's frozen
        for head in self._heads():
            head.requires_grad_(train_head)
        self.strict_loading = False  # checkpoints carry the drafter only

    def _heads(self) -> list[torch.nn.Module]:
        return list(self.drafter.heads) if isinstance(self.drafter, MedusaHeads) else [self.drafter.head]

    def _init_head(self) -> None:
        # the drafter's own norm starts at 1: features are already after the target's final norm
        self.drafter.init_head_from(self.target.get_output_embeddings().weight)

    def setup(self, stage: str) -> None:
        if not self._vocab_from_data or stage != "fit":
            return
        counts = getattr(getattr(self.trainer, "datamodule", None), "target_token_counts", None)
        if not callable(counts):
            raise ValueError(f"DrafterDistillModule: draft_vocab={self.hparams.draft_vocab!r} needs a datamodule with "
                             "`target_token_counts()` (e.g. SelfDistillDataModule).")
        n = self.drafter.head.out_features
        self.drafter.set_draft_vocab(counts().argsort(descending=True, stable=True)[:n])
        self._init_head()
        self._vocab_from_data = False

    def train(self, mode: bool = True) -> DrafterDistillModule:
        super().train(mode)
        self.target.eval()  # frozen: never in training mode (dropout off)
        return self

    def _loss(self, batch: dict[str, Any], expand_at: int | None) -> tuple[Tensor, dict[str, Tensor]]:
        if "input_ids" not in batch:
            raise ValueError(f"DrafterDistillModule expects batch key 'input_ids'; got {sorted(batch)}.")
        input_ids = batch["input_ids"]
        doc_ids = batch.get("doc_ids")
        if "features" in batch and "target_ids" in batch:
            features, target_ids = batch["features"], batch["target_ids"]
        else:
            layers = None if isinstance(self.drafter, MedusaHeads) else self.drafter.feature_layers
            features, target_ids = target_outputs(self.target, input_ids, batch.get("labels"), doc_ids,
                                                  batch.get("position_ids"), layers)
        if isinstance(self.drafter, MedusaHeads):  # Medusa reads the last hidden state (the last H columns)
            return self.drafter.training_loss(features[..., -self.drafter.config["hidden_size"]:], target_ids, doc_ids)
        embeds = self.target.get_input_embeddings()(input_ids).detach()
        return self.drafter.training_loss(embeds, features.to(embeds.dtype), target_ids, doc_ids, expand_at)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss, parts = self._loss(batch, expand_at=-1)
        self.log("train/loss", loss, prog_bar=True)
        for name, value in parts.items():
            log_method(self, "specblock", name, value)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        block = getattr(self.drafter, "block_size", None)
        loss, parts = self._loss(batch, expand_at=block)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/acc1", parts["acc1"], sync_dist=True)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.lr_scheduler_factory(optimizer),
                                                         "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("target.")}


def target_feature_cache(target: torch.nn.Module, windows: Tensor, cache_dir: str | os.PathLike,
                         batch_size: int = 8, dtype: torch.dtype = torch.float16) -> dict[str, Tensor]:
    """The target's features and argmax over token windows ``(N, T)``, cached on disk.

    The file name hashes the windows and the target's config, so a changed corpus or
    model never reads a stale cache. Features are stored in ``dtype`` (half by default).

    Returns:
        ``{"input_ids": (N, T), "features": (N, T, H), "target_ids": (N, T)}``.

    .. code-block:: python

        data = target_feature_cache(model, windows, "/tmp/specblock-cache")
    """
    # the shape is part of the key: (96, 128) and (192, 64) windows of one stream have the same bytes
    key = hashlib.sha1(repr(tuple(windows.shape)).encode() + windows.numpy().tobytes()
                       + repr(sorted(target.config.to_dict().items())).encode())
    path = Path(cache_dir) / f"features-{key.hexdigest()[:16]}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    feats, argmax = [], []
    for start in range(0, windows.shape[0], batch_size):
        f, a = target_outputs(target, windows[start: start + batch_size])
        feats.append(f.to(dtype)), argmax.append(a)
    data = {"input_ids": windows, "features": torch.cat(feats), "target_ids": torch.cat(argmax)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(data, tmp)
    os.replace(tmp, path)
    return data
