"""A causal LM as a multiple-choice feature extractor: one forward, the last prompt token's hidden state.

With :class:`~lit_lowrank.datamodules.multiple_choice.MultipleChoiceDataModule` prompts (ending in
``"Answer:"``), the LM's next-token logits restricted to the option letters ``" A"``, ``" B"``, ... are
``h W_letters^T`` with ``h`` the final hidden state (after the last norm). :meth:`MultipleChoiceLM.make_head`
returns exactly that as an ``nn.Linear(hidden, num_choices)``, so the classification head over the answer
options starts as the pretrained model's own choice scores (zero-shot) and is then fine-tuned, or replaced
by a VBLL head whose posterior mean starts there (:func:`~lit_lowrank.adapters.polar_vbll.apply_polar_vbll`).

With ``scoring="options"`` (batches of
:class:`~lit_lowrank.datamodules.multiple_choice.MultipleChoiceDataModule` with ``scoring="options"``) the
features are instead the LM's mean log-probability of each option's answer text, centred over the item's
options, ``(B, C)``, and the head starts at the identity: before training the prediction is the LM's own cloze
ranking of the options.

.. code-block:: python

    backbone = MultipleChoiceLM(pretrained="smollm2")
    model = ClassificationModule(backbone, num_classes=4)   # head = backbone.make_head(4)
    backbone = MultipleChoiceLM(pretrained="smollm2", scoring="options", num_choices=4)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.datamodules.multiple_choice import LETTERS, SCORINGS


class MultipleChoiceLM(nn.Module):
    """Token ids ``(B, L)`` right-padded with ``-1`` -> final hidden state at the last real token ``(B, H)``;
    with ``scoring="options"``, ``(B, C, 1 + L)`` cloze items -> mean answer-token log-probabilities ``(B, C)``.

    Args:
        pretrained: ``"smollm2"`` (the offline SmolLM2-135M) or a local Hugging Face model folder;
            ``None`` builds a random model from ``model_config`` (tests, smoke configs).
        model_config: transformers config keyword arguments with ``model_type`` (``pretrained=None``).
        tokenizer: for :meth:`make_head` with a random model (``"byte"`` by default); pretrained models
            use their own tokenizer.
        scoring: ``"letter"`` (features = the hidden state after ``"Answer:"``) or ``"options"``
            (features = each option's mean token log-probability minus the item's mean over its options;
            ``num_features = num_choices``).
        num_choices: options per item with ``scoring="options"``.

    .. code-block:: python

        net = MultipleChoiceLM(None, model_config={"model_type": "llama", "hidden_size": 64,
                                                   "intermediate_size": 128, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4, "vocab_size": 258})
        features = net(torch.tensor([[5, 6, 7, -1]]))   # (1, 64)
    """

    def __init__(self, pretrained: str | None = "smollm2", model_config: dict[str, Any] | None = None,
                 tokenizer: str = "byte", scoring: str = "letter", num_choices: int = 4) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM

        if scoring not in SCORINGS:
            raise ValueError(f"`scoring`={scoring!r}, expected one of {SCORINGS}.")
        if num_choices < 2:
            raise ValueError(f"`num_choices`={num_choices}, expected an integer >= 2.")
        self.scoring, self.num_choices = scoring, int(num_choices)

        self.tokenizer_name = tokenizer
        if pretrained == "smollm2":
            from lit_lowrank.models.pretrained import load_smollm2

            model, _ = load_smollm2()
            self.tokenizer_name = "smollm2"
        elif pretrained is not None:
            model = AutoModelForCausalLM.from_pretrained(pretrained, local_files_only=True)
            self.tokenizer_name = pretrained
        else:
            if not model_config or "model_type" not in model_config:
                raise ValueError(f"`model_config`={model_config!r}: with pretrained=None, expected transformers "
                                 "config keyword arguments with a 'model_type'.")
            kwargs = dict(model_config)
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))
        self.lm = model
        self.num_features = self.num_choices if scoring == "options" else int(model.config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        if self.scoring == "options":
            # Centred: a softmax over the options ignores an item-wide offset, but a head's weight posterior
            # does not — uncentred, the item's overall log-probability level (-2 to -10 nats, set by the
            # question's wording) multiplies every weight's variance. Measured on SmolLM2 (fold 0 of 2,
            # 12 steps): VBLL NLL 0.92 -> 0.78 (PoLAR), 0.83 -> 0.50 (LoRA adapters).
            scores = self.option_scores(x)
            return scores - scores.mean(-1, keepdim=True)
        if x.dim() != 2 or x.dtype != torch.long:
            raise ValueError(f"MultipleChoiceLM expects (B, L) int64 token ids padded with -1, got "
                             f"{tuple(x.shape)} {x.dtype}.")
        mask = x >= 0
        lengths = mask.sum(1)
        if (lengths == 0).any():
            raise ValueError("MultipleChoiceLM: a prompt has no tokens (all -1).")
        out = self.lm.model(input_ids=x.clamp_min(0), attention_mask=mask.long())  # the decoder, no LM head
        hidden = out.last_hidden_state
        return hidden[torch.arange(x.shape[0], device=x.device), lengths - 1]

    def option_scores(self, x: Tensor) -> Tensor:
        """``(B, C, 1 + L)`` cloze items -> ``(B, C)`` mean log-probability of each option's answer tokens.

        The LM head runs only on the positions that predict answer tokens (a few per option, not the
        whole prompt), so the vocabulary projection costs ``O(answer tokens)``.
        """
        if x.dim() != 3 or x.dtype != torch.long or x.shape[1] != self.num_choices:
            raise ValueError(f"MultipleChoiceLM(scoring='options') expects (B, {self.num_choices}, 1 + L) int64 "
                             f"cloze items (MultipleChoiceDataModule(scoring='options')), got {tuple(x.shape)} "
                             f"{x.dtype}.")
        batch, choices = x.shape[:2]
        flat = x.reshape(batch * choices, -1)
        k, ids = flat[:, 0], flat[:, 1:]
        mask = ids >= 0
        lengths = mask.sum(1)
        if (k < 1).any() or (lengths <= k).any():
            raise ValueError("MultipleChoiceLM: every option needs >= 1 answer token after >= 1 context token "
                             "(column 0 = answer-token count).")
        width = int(lengths.max())  # drop the columns that are padding in every row
        tokens, mask = ids[:, :width].clamp_min(0), mask[:, :width]
        hidden = self.lm.model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        pos = torch.arange(width, device=x.device)
        # position p predicts token p + 1; the answer is the last k real tokens
        sel = (pos >= (lengths - k - 1)[:, None]) & (pos <= (lengths - 2)[:, None])
        nxt = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)[sel]
        logits = self.lm.get_output_embeddings()(hidden[sel]).float()
        logp = logits.log_softmax(-1).gather(1, nxt[:, None])[:, 0]
        row = torch.arange(flat.shape[0], device=x.device)[:, None].expand_as(sel)[sel]
        total = torch.zeros(flat.shape[0], dtype=logp.dtype, device=x.device).index_add(0, row, logp)
        return (total / k).view(batch, choices)

    def letter_ids(self, num_choices: int) -> list[int]:
        """Token id of ``" A"``, ``" B"``, ... (the token that follows ``"Answer:"``)."""
        from lit_lowrank.datamodules.tokenizers import encode_batch, get_tokenizer

        tokenizer = get_tokenizer(self.tokenizer_name)
        ids = encode_batch(tokenizer, [f" {LETTERS[i]}" for i in range(num_choices)])
        return [seq[-1] for seq in ids]  # the letter itself when " A" splits into space + letter

    @torch.no_grad()
    def make_head(self, num_classes: int) -> nn.Linear:
        """``nn.Linear(H, num_classes)`` whose rows are the LM's output rows of the option letters
        (``scoring="options"``: the identity ``nn.Linear(C, C)``, so logits = the LM's option scores)."""
        if self.scoring == "options":
            if num_classes != self.num_choices:
                raise ValueError(f"`num_classes`={num_classes} with MultipleChoiceLM(num_choices="
                                 f"{self.num_choices}); expected them equal (one logit per option).")
            head = nn.Linear(self.num_choices, num_classes)
            head.weight.copy_(torch.eye(num_classes))
            head.bias.zero_()
            return head
        weight = self.lm.get_output_embeddings().weight
        rows = weight[self.letter_ids(num_classes)].detach().clone()
        head = nn.Linear(self.num_features, num_classes)
        head.weight.copy_(rows)
        bias = getattr(self.lm.get_output_embeddings(), "bias", None)
        head.bias.copy_(bias[self.letter_ids(num_classes)] if bias is not None else torch.zeros(num_classes))
        return head


def mc_lm(in_chans: int = 3, **kwargs: Any) -> MultipleChoiceLM:
    """Builder for :data:`lit_lowrank.models.BACKBONES` (``in_chans`` is ignored: token inputs)."""
    return MultipleChoiceLM(**kwargs)
