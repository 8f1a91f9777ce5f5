"""The offline pretrained all-MiniLM-L6-v2 as a classification backbone (token ids -> sentence features).

:class:`ClassificationModule` calls ``backbone(x)`` with the token ids only, so the padding mask is recovered
from the pad id (MiniLM's ``[PAD]`` = 0, which :class:`~lit_lowrank.datamodules.TextClassificationDataModule`
with ``tokenizer: minilm`` pads with). Features are the masked mean of the token states (sentence-transformers'
pooling for this model), width 384. ``num_layers`` keeps only the first layers (a cheaper pretrained encoder for
CPU tests and benchmarks).

.. code-block:: python

    from lit_lowrank.tasks import ClassificationModule

    module = ClassificationModule("minilm", num_classes=3, backbone_kwargs={"num_layers": 2})
    # adapter targets inside it: r"backbone\\.encoder\\.encoder\\.layer\\.\\d+\\.attention\\.self\\.(query|value)"
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class MiniLMEncoder(nn.Module):
    """Pretrained MiniLM (transformers ``BertModel``) with masked mean pooling.

    Args:
        num_layers: keep the first ``num_layers`` of the 6 transformer layers (``None``: all).
        pad_token_id: the id marking padding in the input (MiniLM's tokenizer: 0).

    .. code-block:: python

        enc = MiniLMEncoder(num_layers=2)
        features = enc(torch.tensor([[101, 2023, 102, 0]]))   # (1, 384)
    """

    def __init__(self, num_layers: int | None = None, pad_token_id: int = 0) -> None:
        super().__init__()
        from lit_lowrank.models.pretrained import load_minilm

        model, _ = load_minilm()
        total = len(model.encoder.layer)
        if num_layers is not None:
            if not 1 <= num_layers <= total:
                raise ValueError(f"`num_layers`={num_layers!r}: expected an integer in [1, {total}].")
            model.encoder.layer = model.encoder.layer[:num_layers]
            model.config.num_hidden_layers = num_layers
        # from_pretrained returns eval mode; a fine-tuned backbone trains with its dropout like any nn.Module
        self.encoder = model.train()
        self.pad_token_id = pad_token_id
        self.num_features = int(model.config.hidden_size)

    def forward(self, input_ids: Tensor) -> Tensor:
        if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise TypeError(f"MiniLMEncoder expects token ids (long), got dtype {input_ids.dtype}.")
        mask = input_ids != self.pad_token_id
        states = self.encoder(input_ids=input_ids, attention_mask=mask.long()).last_hidden_state
        weights = mask.unsqueeze(-1).to(states.dtype)
        return (states * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def minilm(num_layers: int | None = None, pad_token_id: int = 0) -> MiniLMEncoder:
    """Builder for :class:`MiniLMEncoder` (registered as backbone ``"minilm"``).

    .. code-block:: python

        net = minilm(num_layers=2)
    """
    return MiniLMEncoder(num_layers=num_layers, pad_token_id=pad_token_id)
