"""A small decoder-only Hyena LM whose convolutions respect packed document boundaries.

Architecture (Poli et al. 2023, "Hyena Hierarchy", order 2), top to bottom:

- token embedding -> ``num_layers`` pre-norm blocks -> final LayerNorm -> tied LM head;
- each block: ``x + HyenaOperator(LN(x))`` then ``x + MLP(LN(x))``;
- ``HyenaOperator``: ``in_proj`` to ``(x0, x1, v)``; a short depthwise causal conv (width
  3) on all three; ``v <- v * x1``; a long causal conv of ``v`` with an *implicit* filter
  (a sine-activated MLP of positional features, times an exponential decay window, one
  filter per channel) plus a skip ``D * v``; ``y = v * x0``; ``out_proj``.

Both convolutions restart at every document of a packed row: the long one is
:func:`lit_lowrank.ops.packed_long_conv` (RubiConv), the short one
:func:`lit_lowrank.ops.packed_short_conv`. The documents come from ``cu_seqlens``,
``doc_ids`` or ``position_ids`` (in that order). With ``respect_boundaries=False`` each
row is one sequence — the whole-pack convolution that leaks across documents — through
the same code.

.. code-block:: python

    from lit_lowrank.models.hyena_lm import HyenaLM

    model = HyenaLM(vocab_size=258, hidden_size=128, num_layers=2, max_seq_len=1024)
    out = model(input_ids, doc_ids=doc_ids)            # (B, T) each
    out.logits                                         # (B, T, 258)

    # or through the task module: model_config: {model_type: rubiconv_hyena, hidden_size: 128}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.ops.rubiconv import (
    RubiConvPlan,
    cu_seqlens_for_rows,
    packed_long_conv,
    packed_short_conv,
    plan_packed_conv,
)


@dataclass
class HyenaLMOutput:
    """What :class:`HyenaLM` returns, named like a transformers ``CausalLMOutput``."""

    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    loss: Tensor | None = None


class ImplicitFilter(nn.Module):
    """Hyena's implicit long filter: ``h_c(t) = MLP(PE(t))_c * exp(-a_c t)``, one per channel.

    ``t = lag / max_len`` so a lag has the same tap whatever the sequence length (a
    document alone and inside a pack see the same filter).

    Args:
        channels: filters to produce (the model width).
        max_len: the longest filter (taps beyond are zero).
        emb_bands: sine/cosine bands of the positional features, ``f`` from ~0 to
            ``emb_bands - 1`` cycles over ``max_len`` (Hyena's positional embedding).
        order: hidden width of the filter MLP.
        frequency: frequency of the MLP's sine activations.
        fast_decay, slow_decay: at ``t = fast_decay`` (``slow_decay``) the fastest
            (slowest) channel's window has fallen to 1% (Hyena's exponential modulation).
    """

    def __init__(self, channels: int, max_len: int, emb_bands: int = 8, order: int = 64, frequency: float = 1.0,
                 fast_decay: float = 0.3, slow_decay: float = 1.5) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("bands", torch.linspace(1e-4, emb_bands - 1, emb_bands))
        self.mlp = nn.Sequential(nn.Linear(1 + 2 * emb_bands, order), _Sin(frequency), nn.Linear(order, order),
                                 _Sin(frequency), nn.Linear(order, channels, bias=False))
        target = math.log(1e-2)
        self.register_buffer("decay", torch.linspace(target / slow_decay, target / fast_decay, channels).abs())

    def forward(self, length: int) -> Tensor:
        """The first ``min(length, max_len)`` taps: ``(channels, taps)``."""
        taps = min(length, self.max_len)
        t = torch.arange(taps, device=self.decay.device, dtype=torch.float32)[:, None] / self.max_len
        angle = 2 * math.pi * t * self.bands
        features = torch.cat([t, torch.cos(angle), torch.sin(angle)], dim=-1)     # (taps, 1 + 2 bands)
        return (self.mlp(features) * torch.exp(-t * self.decay)).T


class _Sin(nn.Module):
    """``sin(w x)`` with a learnable frequency ``w`` (the implicit filter's activation)."""

    def __init__(self, frequency: float) -> None:
        super().__init__()
        self.frequency = nn.Parameter(torch.full((1,), frequency))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(self.frequency * x)


class HyenaOperator(nn.Module):
    """Order-2 Hyena mixer on ``(B, T, d)``: gates around a long and a short convolution."""

    def __init__(self, hidden_size: int, max_seq_len: int, short_conv_width: int = 3, filter_order: int = 64) -> None:
        super().__init__()
        self.in_proj = nn.Linear(hidden_size, 3 * hidden_size)
        self.short_weight = nn.Parameter(torch.randn(3 * hidden_size, short_conv_width) / math.sqrt(short_conv_width))
        self.short_bias = nn.Parameter(torch.zeros(3 * hidden_size))
        self.filter = ImplicitFilter(hidden_size, max_seq_len, order=filter_order)
        self.skip = nn.Parameter(torch.randn(hidden_size))                        # Hyena's D
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, u: Tensor, cu_seqlens: Tensor, plan: RubiConvPlan) -> Tensor:
        z = packed_short_conv(self.in_proj(u), self.short_weight, cu_seqlens, self.short_bias)
        x0, x1, v = z.chunk(3, dim=-1)
        v = packed_long_conv(v * x1, self.filter(u.shape[1]), cu_seqlens, bias=self.skip, plan=plan)
        return self.out_proj(v * x0)


class HyenaBlock(nn.Module):
    """Pre-norm residual block: ``x + HyenaOperator(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, hidden_size: int, max_seq_len: int, short_conv_width: int, filter_order: int,
                 mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden_size), nn.LayerNorm(hidden_size)
        self.mixer = HyenaOperator(hidden_size, max_seq_len, short_conv_width, filter_order)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, mlp_ratio * hidden_size), nn.GELU(),
                                 nn.Linear(mlp_ratio * hidden_size, hidden_size))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, cu_seqlens: Tensor, plan: RubiConvPlan) -> Tensor:
        x = x + self.dropout(self.mixer(self.norm1(x), cu_seqlens, plan))
        return x + self.dropout(self.mlp(self.norm2(x)))


class HyenaLM(nn.Module):
    """Decoder-only Hyena LM on packed batches (``model_type: rubiconv_hyena``).

    Args:
        vocab_size: tokens (the byte tokenizer has 258).
        hidden_size: model width d.
        num_layers: Hyena blocks.
        max_seq_len: longest filter; rows may be longer (taps beyond are zero).
        short_conv_width: taps of the short depthwise convolution (3 or 4).
        filter_order: hidden width of the implicit filter MLP.
        mlp_ratio: MLP width as a multiple of d.
        dropout: residual dropout.
        block_size: RubiConv's FFT size for pieces of documents longer than it allows
            (default: its own, see :func:`~lit_lowrank.ops.plan_packed_conv`).

    .. code-block:: python

        model = HyenaLM(vocab_size=258, hidden_size=64, num_layers=2, max_seq_len=512)
        logits = model(input_ids, doc_ids=doc_ids).logits                 # documents kept apart
        leaky = model(input_ids, doc_ids=doc_ids, respect_boundaries=False).logits
    """

    def __init__(self, vocab_size: int = 258, hidden_size: int = 128, num_layers: int = 2, max_seq_len: int = 1024,
                 short_conv_width: int = 3, filter_order: int = 64, mlp_ratio: int = 2, dropout: float = 0.0,
                 block_size: int | None = None) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
                            ("max_seq_len", max_seq_len), ("short_conv_width", short_conv_width)):
            if value < 1:
                raise ValueError(f"HyenaLM: `{name}`={value}, expected >= 1.")
        self.vocab_size, self.max_seq_len, self.block_size = vocab_size, max_seq_len, block_size
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.blocks = nn.ModuleList(HyenaBlock(hidden_size, max_seq_len, short_conv_width, filter_order, mlp_ratio,
                                               dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden_size)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)
        self._diagnostics: dict[str, float] = {}

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def document_offsets(self, input_ids: Tensor, position_ids: Tensor | None = None, doc_ids: Tensor | None = None,
                         cu_seqlens: Tensor | Sequence[Tensor] | None = None,
                         respect_boundaries: bool = True) -> Tensor:
        """Flat ``cu_seqlens`` over the ``B * T`` tokens: from ``cu_seqlens`` (flat, or a list of
        per-row offsets), else ``doc_ids`` runs, else ``position_ids == 0`` starts, else one
        document per row. ``respect_boundaries=False``: one document per row, always."""
        rows, length = input_ids.shape
        if not respect_boundaries:
            return torch.arange(rows + 1, device=input_ids.device) * length
        if cu_seqlens is not None:
            if isinstance(cu_seqlens, Tensor):
                return cu_seqlens.to(input_ids.device)
            if len(cu_seqlens) != rows:
                raise ValueError(f"cu_seqlens: expected {rows} per-row offset tensors, got {len(cu_seqlens)}.")
            shifted = [c.to(input_ids.device).long()[1:] + i * length for i, c in enumerate(cu_seqlens)]
            return torch.cat([torch.zeros(1, dtype=torch.long, device=input_ids.device), *shifted])
        if doc_ids is not None:
            return cu_seqlens_for_rows(doc_ids.to(input_ids.device))
        if position_ids is not None:
            # a document starts wherever its position restarts at 0
            return cu_seqlens_for_rows(torch.cumsum(position_ids == 0, dim=-1))
        return torch.arange(rows + 1, device=input_ids.device) * length

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, doc_ids: Tensor | None = None,
                cu_seqlens: Tensor | Sequence[Tensor] | None = None, respect_boundaries: bool = True,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                attention_mask: Tensor | None = None, **unused: Any) -> HyenaLMOutput:
        """Logits ``(B, T, V)`` for ``input_ids`` ``(B, T)``; see :meth:`document_offsets` for documents.

        ``attention_mask`` is accepted for transformers compatibility and ignored (padding
        is its own document in packed batches). ``labels`` (``-100`` ignored) adds ``loss``.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected shape (B, T), got {tuple(input_ids.shape)}.")
        rows, length = input_ids.shape
        cu = self.document_offsets(input_ids, position_ids, doc_ids, cu_seqlens, respect_boundaries)
        # one plan per batch, shared by every layer (the filters all have min(T, max_seq_len) taps)
        plan = plan_packed_conv(cu, min(length, self.max_seq_len), rows * length, self.block_size,
                                device=input_ids.device)
        self._record(plan, rows, length)
        hidden = self.embed(input_ids)
        states = [hidden]
        for block in self.blocks:
            hidden = block(hidden, cu, plan)
            states.append(hidden)
        hidden = self.norm(hidden)
        states[-1] = hidden
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return HyenaLMOutput(logits, tuple(states) if output_hidden_states else None, loss)

    def _record(self, plan: RubiConvPlan, rows: int, length: int) -> None:
        """Cheap per-batch numbers from the plan (host ints, no device sync)."""
        taps = plan.kernel_len
        # taps a whole-row convolution would use: sum_{t < T} min(t + 1, L) per row
        row_taps = rows * (taps * (taps + 1) // 2 + (length - taps) * taps)
        self._diagnostics = {
            "fft_buckets": float(plan.num_buckets),
            "documents_per_row": plan.num_documents / max(rows, 1),
            "taps_used_fraction": plan.taps_used / max(row_taps, 1),
            "fft_slots_per_token": plan.padded_slots / max(plan.num_tokens, 1),
        }

    def method_diagnostics(self) -> dict[str, dict[str, float]]:
        """``{"rubiconv": {...}}`` of the last forward: FFT buckets, documents per row, the
        fraction of the whole-row filter taps that boundaries leave, FFT slots per token."""
        return {"rubiconv": dict(self._diagnostics)}

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int = 32, do_sample: bool = False, temperature: float = 1.0,
                 attention_mask: Tensor | None = None, **unused: Any) -> Tensor:
        """Greedy (or sampled) decoding by re-running the forward (small models only)."""
        out = input_ids
        for _ in range(max_new_tokens):
            logits = self(out[:, -self.max_seq_len:]).logits[:, -1].float()
            if do_sample:
                nxt = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1)
            else:
                nxt = logits.argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
        return out
