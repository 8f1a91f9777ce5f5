"""Decoding peers and the decode-rate clock shared by the ``specblock`` and ``spirit`` benchmarks.

Every method is timed the same way: **decode tokens/s after the first output token**. The
prefill (identical work for every method on a prompt) and the first token are left out; a
user who streams output sees exactly this rate. For transformers ``generate`` (greedy,
prompt lookup, assisted) a stopping criterion records ``(time, length)`` after every
step/round; for our engine the statistics already separate the prefill.

Peers a user would pick instead of a trained drafter:

- ``generate``: transformers greedy decoding with its KV cache — the reference of every speed-up;
- ``prompt_lookup``: transformers prompt-lookup decoding (``prompt_lookup_num_tokens``);
- ``assisted_early_exit``: transformers assisted generation whose assistant is the target
  itself cut after its first ``k`` layers (``assistant_early_exit=k``, LayerSkip-style);
- ``plain``: our :func:`~lit_lowrank.decoding.plain_decode`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from lit_lowrank.decoding import SpeculativeDecoder, TargetLM, plain_decode
from lit_lowrank.decoding.engine import Drafter


class _Clock:
    """A transformers stopping criterion that never stops and records ``(seconds, length)`` at each call."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, int]] = []

    def __call__(self, input_ids: Tensor, scores: Any = None, **kwargs: Any) -> Tensor:
        self.marks.append((time.perf_counter(), int(input_ids.shape[-1])))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _record(tokens: Tensor, prompt_len: int, decode_tokens: int, decode_seconds: float, **extra: Any) -> dict[str, Any]:
    out = {"tokens": tokens.cpu(), "new_tokens": int(tokens.numel() - prompt_len), "decode_tokens": int(decode_tokens),
           "decode_seconds": float(decode_seconds)}
    out.update(extra)
    return out


@torch.no_grad()
def hf_generate(model: torch.nn.Module, prompt: Tensor, max_new_tokens: int, eos_token_id: int | None,
                pad_token_id: int, **generate_kwargs: Any) -> dict[str, Any]:
    """transformers ``generate`` (greedy unless told otherwise), timed after its first step."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    clock = _Clock()
    criterion = type("DecodeClock", (StoppingCriteria,), {"__call__": lambda self, ids, scores, **kw: clock(ids)})()
    ids = prompt[None].to(next(model.parameters()).device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                         stopping_criteria=StoppingCriteriaList([criterion]), **generate_kwargs)[0]
    (t0, n0), (t1, n1) = clock.marks[0], clock.marks[-1]
    rounds = len(clock.marks) - 1
    return _record(out, prompt.numel(), n1 - n0, t1 - t0, rounds=rounds)


@torch.no_grad()
def engine_decode(target: TargetLM, drafter: Drafter | None, prompt: Tensor, max_new_tokens: int,
                  eos_token_id: int | None, budget: int = 8) -> dict[str, Any]:
    """Our engine (``drafter=None``: :func:`plain_decode`), timed after the first token."""
    if drafter is None:
        tokens, st = plain_decode(target, prompt, max_new_tokens, eos_token_id)
    else:
        tokens, st = SpeculativeDecoder(target, drafter, budget).generate(prompt, max_new_tokens, eos_token_id)
    return _record(tokens, prompt.numel(), st.new_tokens - 1, st.total_seconds - st.prefill_seconds,
                   rounds=st.rounds, accepted=sum(st.accepted), drafter_forwards=st.drafter_forwards,
                   draft_seconds=st.draft_seconds, verify_seconds=st.verify_seconds, draft_nodes=st.draft_nodes)


def decode_rate(record: dict[str, Any]) -> float:
    """Decode tokens per second of one timed run (0 when it emitted nothing after the first token)."""
    return record["decode_tokens"] / record["decode_seconds"] if record["decode_seconds"] > 0 else 0.0


def first_divergence(a: Tensor, b: Tensor) -> int:
    """Index of the first position where two sequences differ (``-1``: identical)."""
    n = min(a.numel(), b.numel())
    diff = torch.nonzero(a[:n] != b[:n]).flatten()
    if diff.numel():
        return int(diff[0])
    return -1 if a.numel() == b.numel() else n
