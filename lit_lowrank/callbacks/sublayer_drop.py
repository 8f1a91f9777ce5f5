"""Sublayer drop: train a decoder LM to tolerate the layer skipping SPIRIT drafts with."""

from __future__ import annotations

import contextlib
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lit_lowrank.ops.spirit import random_pattern


class SublayerDrop(pl.Callback):
    """Skip a random pattern of attention/MLP sublayers of layers ``1..L-2`` on some training steps.

    With probability ``prob`` per training batch, a pattern at a skip ratio drawn from
    ``U(0, max_ratio)`` (:func:`~lit_lowrank.ops.spirit.random_pattern`) is left out for that
    batch's forward and backward (:func:`~lit_lowrank.decoding.skip_sublayers`, restored after
    the batch), so the full model stays good while its layer-skipped drafts agree with it more
    (LayerDrop / LayerSkip-style). No structural change persists: checkpoints are the plain model.

    Requires a module whose ``model`` attribute (or itself) is a transformers decoder LM with
    ``get_decoder().layers`` (e.g. :class:`~lit_lowrank.tasks.CausalLMModule` with a Llama config).
    Not for DDP: a skipped sublayer gets no gradient on that rank.

    Args:
        max_ratio: largest skip ratio sampled.
        prob: probability that a batch trains a skipped draft instead of the full model.
        seed: pattern sampling seed.

    .. code-block:: python

        trainer = L.Trainer(callbacks=[SublayerDrop(max_ratio=0.6, prob=0.5)])
        trainer.fit(CausalLMModule(model_config={"model_type": "llama", "num_hidden_layers": 12}), datamodule=dm)
    """

    def __init__(self, max_ratio: float = 0.6, prob: float = 0.5, seed: int = 0) -> None:
        if not 0.0 < max_ratio <= 1.0 or not 0.0 <= prob <= 1.0:
            raise ValueError(f"SublayerDrop: max_ratio={max_ratio} must be in (0, 1] and prob={prob} in [0, 1].")
        self.max_ratio, self.prob, self.seed = max_ratio, prob, seed
        self.generator = torch.Generator().manual_seed(seed)
        self._stack: contextlib.ExitStack | None = None

    @staticmethod
    def _lm(pl_module: pl.LightningModule) -> torch.nn.Module:
        lm = getattr(pl_module, "model", pl_module)
        decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else None
        if not isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList):
            raise ValueError(f"SublayerDrop: {type(pl_module).__name__}.model must be a transformers decoder LM "
                             "with get_decoder().layers (Llama, Qwen, SmolLM, ...).")
        return lm

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.world_size > 1:
            raise RuntimeError("SublayerDrop: single-process training only (skipped sublayers get no gradient).")
        self._lm(pl_module)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        from lit_lowrank.decoding.spirit_skip import skip_sublayers

        self._exit()
        if float(torch.rand((), generator=self.generator)) >= self.prob:
            return
        lm = self._lm(pl_module)
        ratio = float(torch.rand((), generator=self.generator)) * self.max_ratio
        pattern = random_pattern(int(lm.config.num_hidden_layers), ratio, self.generator)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(skip_sublayers(lm, pattern))

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT,
                           batch: Any, batch_idx: int) -> None:
        self._exit()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._exit()

    def _exit(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.generator.set_state(state_dict["generator"])
