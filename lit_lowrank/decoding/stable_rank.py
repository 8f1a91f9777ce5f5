"""Stable rank as a reward: a scorer for any transformers causal LM, TRL's reward interface,
Best-of-N selection and the pairwise (RewardBench-style) evaluator.

A *scorer* model reads ``prompt + completion``; the final-layer hidden states of the completion's
tokens (prompt sliced off by a mask) give :func:`~lit_lowrank.ops.stable_rank.stable_rank`. The
same forward also yields the logit baselines of :mod:`lit_lowrank.ops.sequence_signals` (mean
log-prob, negative entropy, self-certainty), so every signal is scored on identical tokens.

.. code-block:: python

    from lit_lowrank.decoding import StableRankReward, best_of_n
    from lit_lowrank.models import load_smollm2

    model, tok = load_smollm2()
    reward = StableRankReward(model, tok)                 # f(prompts, completions, **kw) -> list[float]
    reward(["Explain tides."], ["The Moon's gravity pulls the oceans ..."])
    best = best_of_n(model, tok, ["What is 3 + 4?"], n=8, chat=True)   # highest stable rank of 8 samples
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_lowrank.datamodules.preference import PreferencePair, reference_texts
from lit_lowrank.ops.sequence_signals import mean_log_prob, negative_entropy, self_certainty
from lit_lowrank.ops.stable_rank import (
    DEFAULT_REFERENCE_LENGTHS,
    NORMALIZATIONS,
    LengthReference,
    Normalization,
    length_reference_from_ranks,
    prefix_stable_ranks,
    stable_rank,
)

__all__ = [
    "SIGNALS", "BestOfNResult", "ResponseScorer", "StableRankReward", "best_of_n", "evaluate_pairs", "padded_chunks",
    "decode_completion", "eos_token_ids", "pairwise_accuracy", "sample_responses", "select_best",
]

#: Signals :meth:`ResponseScorer.signals` computes; higher is better for each. ``stable_rank`` uses the
#: scorer's own ``normalize`` (default: length-normalised by the reference curve); ``stable_rank_raw``
#: (the paper's ``‖H‖_F²/‖H‖₂²``) and ``stable_rank_max_rank`` (``srank / min(T, d)``) come from the same
#: forward pass whatever ``normalize`` is, so tables report the variants side by side.
SIGNALS: tuple[str, ...] = ("stable_rank", "stable_rank_raw", "stable_rank_max_rank", "mean_log_prob",
                            "negative_entropy", "self_certainty", "length")
LOGIT_SIGNALS: tuple[str, ...] = ("mean_log_prob", "negative_entropy", "self_certainty")
#: The prompt the reference texts are scored under (their rows then sit where a response's rows sit).
REFERENCE_PROMPT = "Write a short news report."
REFERENCE_TOKENS = 96


@dataclass
class _ResponseView:
    """What one forward yields for a batch of responses: hidden states with the stable-rank rows, and the
    next-token logits aligned with the response's tokens (``logits[:, t]`` predicts ``targets[:, t]``)."""

    states: Tensor
    rank_mask: Tensor
    lengths: Tensor
    logits: Tensor | None = None
    targets: Tensor | None = None
    target_mask: Tensor | None = None


def _text(item: Any) -> str:
    # conversational items (TRL): a list of {"role", "content"} messages
    if isinstance(item, list):
        return "".join(str(m.get("content", "")) for m in item if isinstance(m, dict))
    return str(item)


class ResponseScorer:
    """Scores completions with a frozen causal LM: stable rank of their hidden states and logit signals.

    Args:
        model: a transformers causal LM (``output_hidden_states`` supported), used in eval mode
            without gradients.
        tokenizer: its tokenizer (a chat template is needed for ``chat=True`` or message prompts).
        batch_size: sequences per forward pass.
        center: center each response's hidden states before the stable rank (see
            :func:`~lit_lowrank.ops.stable_rank.stable_rank`).
        normalize: ``"reference"`` (default: divide by the mean stable rank of reference text of the
            same length under this model, :meth:`length_reference`), ``"none"`` (raw, the paper's
            ``‖H‖_F²/‖H‖₂²``, which grows with the response length) or ``"max_rank"`` (divide by ``min(T, d)``).
        final_norm: read the hidden states after the model's final norm (``True``, what
            ``hidden_states[-1]`` is) or before it (a hook on the decoder's ``norm`` module).
        include_special_tokens: count special tokens (end-of-turn, EOS) of the response as rows.
        chat: wrap plain-string prompts as a user message in the tokenizer's chat template (message
            lists always go through the template).
        max_response_tokens: truncate responses to this many tokens (``None``: no limit).
        reference: a fitted :class:`~lit_lowrank.ops.stable_rank.LengthReference` (skips calibration).
        reference_texts: texts whose stable rank defines the length curve (default:
            :func:`~lit_lowrank.datamodules.preference.reference_texts`, news articles disjoint from the
            embedded preference pairs), scored as completions of ``reference_prompt``, each cut to
            ``reference_tokens`` tokens.

    Completions that share a prompt are scored with the prompt run once and its KV cache repeated
    (Best-of-N samples, GRPO groups, preference pairs): the same numbers as separate sequences, for a
    fraction of the tokens.

    .. code-block:: python

        scorer = ResponseScorer(model, tokenizer, chat=True)
        scorer.signals(["Name a planet."], ["Mars is the fourth planet."])["stable_rank"]   # tensor([...])
    """

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 8, center: bool = False,
                 normalize: Normalization = "reference", final_norm: bool = True, include_special_tokens: bool = False,
                 chat: bool = False, max_response_tokens: int | None = None, reference: LengthReference | None = None,
                 reference_texts: Sequence[str] | None = None, reference_prompt: str = REFERENCE_PROMPT,
                 reference_tokens: int = REFERENCE_TOKENS) -> None:
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"`normalize`={normalize!r}, expected one of {NORMALIZATIONS}.")
        if reference_tokens < 2:
            raise ValueError(f"`reference_tokens` must be >= 2, got {reference_tokens}.")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.center, self.normalize = batch_size, center, normalize
        self.final_norm, self.include_special_tokens, self.chat = final_norm, include_special_tokens, chat
        self.max_response_tokens = max_response_tokens
        self.reference = reference
        self.reference_texts, self.reference_prompt, self.reference_tokens = reference_texts, reference_prompt, \
            reference_tokens
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])

    # ------------------------------------------------------------------ encoding
    def prompt_ids(self, prompt: Any) -> list[int]:
        """Token ids of a prompt: a string (verbatim, or chat-wrapped with ``chat=True``) or a message list."""
        if isinstance(prompt, list) or self.chat:
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self._encode(text, add_special_tokens=False)
        return self._encode(str(prompt), add_special_tokens=True)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # a list of one text: transformers tokenizers and ByteTokenizer both batch-encode lists
        return list(self.tokenizer([text], add_special_tokens=add_special_tokens)["input_ids"][0])

    def completion_ids(self, completion: Any) -> list[int]:
        """Token ids of a completion (string or message list), without added special tokens."""
        return self._encode(_text(completion), add_special_tokens=False)

    # ------------------------------------------------------------------ length reference
    def length_reference(self) -> LengthReference:
        """``E[srank | T]`` of the reference texts under this scorer (fitted once, then kept).

        Each reference text (cut to ``reference_tokens`` tokens) is scored as the completion of
        ``reference_prompt`` with the scorer's own options (chat wrapping, final norm, centring,
        special tokens), so the curve describes the rows the scorer reads from real responses.
        """
        if self.reference is None:
            with torch.no_grad():
                self.reference = self._fit_reference()
        return self.reference

    def _fit_reference(self) -> LengthReference:
        texts = list(self.reference_texts) if self.reference_texts is not None else reference_texts()
        if not texts:
            raise ValueError("`reference_texts` is empty: the length reference needs texts.")
        prompt = self.prompt_ids(self.reference_prompt)
        completions = [self.completion_ids(t)[: self.reference_tokens] for t in texts]
        lengths = [n for n in DEFAULT_REFERENCE_LENGTHS if n <= self.reference_tokens]
        ranks = []
        for start in range(0, len(completions), self.batch_size):
            chunk = completions[start:start + self.batch_size]
            view = self._forward([prompt] * len(chunk), chunk, logits=False)
            ranks.append(prefix_stable_ranks(view.states, view.rank_mask, lengths, self.center))
        return length_reference_from_ranks(torch.cat(ranks), lengths)

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score_ids(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                  signals: Sequence[str] = SIGNALS) -> dict[str, Tensor]:
        """Every requested signal for token-id pairs, each a ``(N,)`` float32 tensor (higher = better)."""
        unknown = [s for s in signals if s not in SIGNALS]
        if unknown:
            raise ValueError(f"`signals` has unknown names {unknown}, expected among {SIGNALS}.")
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"got {len(prompt_ids)} prompts for {len(completion_ids)} completions.")
        if not prompt_ids:
            return {s: torch.empty(0) for s in signals}
        if "stable_rank" in signals and self.normalize == "reference":
            self.length_reference()
        # completions sharing a (non-empty) prompt run as one group; the rest in padded batches
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(prompt_ids):
            groups.setdefault(tuple(int(t) for t in p), []).append(i)
        length = [len(c) if not self.max_response_tokens else min(len(c), self.max_response_tokens)
                  for c in completion_ids]
        chunks = [chunk for key, idx in groups.items() if key and len(idx) > 1
                  for chunk in padded_chunks(idx, length, len(key), self.batch_size)]
        singles = sorted((i for key, idx in groups.items() if not key or len(idx) == 1 for i in idx),
                         key=lambda i: len(prompt_ids[i]) + length[i])   # similar lengths share a padded batch
        chunks += [singles[s:s + self.batch_size] for s in range(0, len(singles), self.batch_size)]
        out = {s: torch.empty(len(prompt_ids)) for s in signals}
        need_logits = any(s in LOGIT_SIGNALS for s in signals)
        for chunk in chunks:
            view = self._forward([prompt_ids[i] for i in chunk], [completion_ids[i] for i in chunk], need_logits)
            for name, value in self._signals(view, signals).items():
                out[name][torch.tensor(chunk)] = value
        return out

    def _forward(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                 logits: bool) -> _ResponseView:
        completions = [list(c)[: self.max_response_tokens] if self.max_response_tokens else list(c)
                       for c in completions]
        was_training = self.model.training
        self.model.eval()
        try:
            if len(prompts) > 1 and len(prompts[0]) > 0 and all(list(p) == list(prompts[0]) for p in prompts):
                return self._forward_shared_prompt(list(prompts[0]), completions, logits)
            return self._forward_padded(prompts, completions, logits)
        finally:
            self.model.train(was_training)

    def _run(self, **kwargs: Any) -> tuple[Tensor, Any]:
        """One forward; returns (final hidden states, the model output), honouring ``final_norm``."""
        captured: list[Tensor] = []
        handle = None
        if not self.final_norm:
            decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
            norm = getattr(decoder, "norm", None)
            if norm is None:
                raise ValueError(f"final_norm=False needs a decoder with a `norm` module; {type(self.model).__name__} "
                                 "has none.")
            handle = norm.register_forward_hook(lambda m, args, out: captured.append(args[0]))
        try:
            out = self.model(output_hidden_states=True, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
        return (captured[-1] if captured else out.hidden_states[-1]), out

    def _forward_padded(self, prompts: Sequence[Sequence[int]], completions: list[list[int]],
                        logits: bool) -> _ResponseView:
        device = next(self.model.parameters()).device
        rows = [list(p) + c for p, c in zip(prompts, completions)]
        starts = [len(p) for p in prompts]
        width = max(max(len(r) for r in rows), 1)
        ids = torch.full((len(rows), width), self._pad(), dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        response = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, (row, s) in enumerate(zip(rows, starts)):  # right padding: positions 0..L-1 as usual
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention[i, : len(row)] = 1
            response[i, s: len(row)] = True
        ids, attention, response = ids.to(device), attention.to(device), response.to(device)
        # logits only for the last `keep` positions (the responses): the LM head is a large share of a small
        # model's cost and the prompt's logits are never read
        keep = min(width, width - min(starts) + 1) if logits else 1
        states, out = self._run(input_ids=ids, attention_mask=attention, logits_to_keep=keep)
        view = _ResponseView(states, self._rank_mask(ids, response), response.sum(-1))
        if logits:  # logits[:, j] predicts window[:, j + 1]
            window = ids[:, width - keep:]
            view.logits, view.targets, view.target_mask = out.logits[:, :-1], window[:, 1:], \
                response[:, width - keep + 1:]
        return view

    def _forward_shared_prompt(self, prompt: list[int], completions: list[list[int]], logits: bool) -> _ResponseView:
        device = next(self.model.parameters()).device
        first = self.model(input_ids=torch.tensor([prompt], device=device), use_cache=True, logits_to_keep=1)
        # transformers 5.2x names the KV cache `cache` (argument and output); earlier versions `past_key_values`
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # PEFT
        cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        cache = getattr(first, cache_arg)
        k, width = len(completions), max(max(len(c) for c in completions), 1)
        cache.batch_repeat_interleave(k)
        ids = torch.full((k, width), self._pad(), dtype=torch.long)
        response = torch.zeros(k, width, dtype=torch.bool)
        for i, c in enumerate(completions):
            ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            response[i, : len(c)] = True
        ids, response = ids.to(device), response.to(device)
        attention = torch.cat([torch.ones(k, len(prompt), dtype=torch.long, device=device), response.long()], 1)
        states, out = self._run(input_ids=ids, attention_mask=attention, use_cache=True,
                                logits_to_keep=width if logits else 1, **{cache_arg: cache})
        view = _ResponseView(states, self._rank_mask(ids, response), response.sum(-1))
        if logits:  # the prompt's last logit predicts the first response token
            view.logits = torch.cat([first.logits[:, -1:].expand(k, 1, -1), out.logits[:, :-1]], 1)
            view.targets, view.target_mask = ids, response
        return view

    def _pad(self) -> int:
        return getattr(self.tokenizer, "pad_token_id", None) or 0

    def _rank_mask(self, ids: Tensor, response: Tensor) -> Tensor:
        if self.include_special_tokens or not self.special_ids:
            return response
        return response & ~torch.isin(ids, torch.tensor(sorted(self.special_ids), device=ids.device))

    def _signals(self, view: _ResponseView, signals: Sequence[str]) -> dict[str, Tensor]:
        result: dict[str, Tensor] = {}
        for name, normalize in (("stable_rank", self.normalize), ("stable_rank_raw", "none"),
                                ("stable_rank_max_rank", "max_rank")):
            if name in signals:
                reference = self.length_reference() if normalize == "reference" else None
                result[name] = stable_rank(view.states, view.rank_mask, self.center, normalize, reference).cpu()
        if "mean_log_prob" in signals:
            result["mean_log_prob"] = mean_log_prob(view.logits, view.targets, view.target_mask).cpu()
        if "negative_entropy" in signals:
            result["negative_entropy"] = negative_entropy(view.logits, view.target_mask).cpu()
        if "self_certainty" in signals:
            result["self_certainty"] = self_certainty(view.logits, view.target_mask).cpu()
        if "length" in signals:
            result["length"] = view.lengths.float().cpu()
        return result

    def signals(self, prompts: Sequence[Any], completions: Sequence[Any],
                signals: Sequence[str] = SIGNALS) -> dict[str, Tensor]:
        """Every requested signal for text (or message-list) prompts and completions."""
        return self.score_ids([self.prompt_ids(p) for p in prompts], [self.completion_ids(c) for c in completions],
                              signals)


def padded_chunks(indices: Sequence[int], lengths: Sequence[int], prefix: int, max_size: int) -> list[list[int]]:
    """Split completions of one prompt into forward batches that pad least.

    A batch costs ``prefix + size * longest`` tokens (the prompt runs once per batch, completions are padded to
    the longest); sorted by length, the cheapest split into consecutive runs of at most ``max_size`` is found
    by dynamic programming (a looped 80-token response no longer pads seven 30-token ones).
    """
    order = sorted(indices, key=lambda i: lengths[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n          # best[j]: cheapest split of order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - max_size), j):
            cost = best[i] + prefix + (j - i) * max(lengths[order[j - 1]], 1)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    chunks, j = [], n
    while j > 0:
        chunks.append(order[cut[j]:j])
        j = cut[j]
    return chunks[::-1]


class StableRankReward:
    """Stable rank as a reward function with TRL's interface ``f(prompts, completions, **kwargs) -> list[float]``.

    Pass it to ``trl.GRPOTrainer(reward_funcs=[StableRankReward(scorer_model, tokenizer)])`` (SR-GRPO with
    TRL) or to :class:`~lit_lowrank.tasks.grpo.GRPOModule`. Extra dataset columns arrive as keyword
    arguments and are ignored. The scorer model is frozen; it may be the policy's initial weights.

    Args:
        model: the scorer causal LM.
        tokenizer: its tokenizer.
        **scorer_kwargs: options of :class:`ResponseScorer` (``center``, ``normalize``, ``chat`` ...).

    .. code-block:: python

        reward = StableRankReward(model, tokenizer, chat=True)
        reward(prompts=["What is 2 + 2?"], completions=["2 + 2 = 4."])   # [1.93...]
    """

    __name__ = "stable_rank"  # TRL logs each reward function under its __name__

    def __init__(self, model: Any, tokenizer: Any, **scorer_kwargs: Any) -> None:
        self.scorer = ResponseScorer(model, tokenizer, **scorer_kwargs)

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"StableRankReward: got {len(prompts)} prompts for {len(completions)} completions.")
        return self.scorer.signals(prompts, completions, ("stable_rank",))["stable_rank"].tolist()


# ---------------------------------------------------------------------------- sampling and Best-of-N


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The ids that end a completion: the model's generation config EOS id(s) and the tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = ids if isinstance(ids, (list, tuple)) else [ids]
    return {int(i) for i in [*ids, getattr(tokenizer, "eos_token_id", None)] if i is not None}


def decode_completion(tokenizer: Any, ids: Sequence[int], eos_ids: set[int]) -> str:
    """Text of a completion without its EOS / special tokens (transformers or :class:`ByteTokenizer`)."""
    ids = [int(t) for t in ids if int(t) not in eos_ids]
    try:
        return tokenizer.decode(ids, skip_special_tokens=True)
    except TypeError:  # ByteTokenizer.decode drops its special ids itself
        return tokenizer.decode(ids)


@torch.no_grad()
def sample_responses(model: Any, prompt_ids: Sequence[Sequence[int]], n: int, max_new_tokens: int,
                     eos_ids: set[int], pad_id: int, do_sample: bool = True, temperature: float = 1.0,
                     top_p: float = 1.0, generator_seed: int | None = None, keep_eos: bool = False) -> list[list[int]]:
    """``n`` completions per prompt from a transformers causal LM, as token ids cut at the first EOS
    (kept with ``keep_eos=True``: a policy gradient must also credit the decision to stop).

    Returns a list of ``len(prompt_ids) * n`` id lists, prompt by prompt (the ``n`` samples of prompt
    ``b`` at ``[b*n:(b+1)*n]``). Prompts are left-padded so every row continues at the same column.
    """
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"`n` and `max_new_tokens` must be >= 1, got n={n}, max_new_tokens={max_new_tokens}.")
    device = next(model.parameters()).device
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        attention[i, width - len(p):] = 1
    if generator_seed is not None:
        torch.manual_seed(generator_seed)
    kwargs: dict[str, Any] = {"do_sample": do_sample, "max_new_tokens": max_new_tokens, "pad_token_id": pad_id,
                              "num_return_sequences": n}
    if do_sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    was_training = model.training
    model.eval()
    try:
        out = model.generate(input_ids=ids.to(device), attention_mask=attention.to(device), **kwargs)
    finally:
        model.train(was_training)
    completions = []
    for row in out[:, width:].tolist():
        cut = next((j for j, t in enumerate(row) if t in eos_ids), len(row))
        completions.append(row[: cut + 1] if keep_eos and cut < len(row) else row[:cut])
    return completions


def select_best(scores: Tensor, n: int) -> Tensor:
    """Index (within its group) of the highest score in each group of ``n``: ``(B * n,) -> (B,)``.

    Ties go to the first sample.
    """
    if scores.dim() != 1 or scores.numel() % n:
        raise ValueError(f"`scores` must be 1-D with a length divisible by n={n}, got {tuple(scores.shape)}.")
    return scores.view(-1, n).argmax(-1)


@dataclass
class BestOfNResult:
    """What :func:`best_of_n` returns: every sample, every score and the selection."""

    samples: list[list[str]]
    scores: dict[str, Tensor]
    chosen_index: list[int]
    chosen: list[str] = field(default_factory=list)


def best_of_n(model: Any, tokenizer: Any, prompts: Sequence[Any], n: int = 8,
              selector: str | Callable[[list[Any], list[str]], Sequence[float]] = "stable_rank",
              scorer: ResponseScorer | None = None, max_new_tokens: int = 64, temperature: float = 1.0,
              top_p: float = 1.0, chat: bool = False, seed: int | None = None) -> BestOfNResult:
    """Sample ``n`` completions per prompt from ``model`` and keep the best by ``selector``.

    Args:
        model: any transformers causal LM (the policy that samples).
        tokenizer: its tokenizer.
        prompts: strings or message lists.
        n: samples per prompt.
        selector: a signal of :data:`SIGNALS` computed by ``scorer`` (default: stable rank), ``"random"``,
            or a reward function with TRL's interface.
        scorer: the model that scores (default: a :class:`ResponseScorer` on ``model`` itself).
        max_new_tokens / temperature / top_p: sampling options.
        chat: wrap string prompts in the chat template.
        seed: seeds the sampling (and the random selector).

    .. code-block:: python

        result = best_of_n(model, tok, ["What is 3 + 4? Answer with the number only."], n=8, chat=True)
        result.chosen[0]
    """
    scorer = scorer or ResponseScorer(model, tokenizer, chat=chat)
    prompt_ids = [scorer.prompt_ids(p) for p in prompts]
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else next(iter(eos_token_ids(model, tokenizer)), 0)
    ids = sample_responses(model, prompt_ids, n, max_new_tokens, eos_token_ids(model, tokenizer), pad,
                           temperature=temperature, top_p=top_p, generator_seed=seed)
    texts = [decode_completion(tokenizer, c, set()) for c in ids]
    repeated = [p for p in prompt_ids for _ in range(n)]
    scores: dict[str, Tensor] = {}
    if selector == "random":
        rng = random.Random(seed)
        scores["random"] = torch.tensor([rng.random() for _ in texts])
        key = "random"
    elif isinstance(selector, str):
        if selector not in SIGNALS:
            raise ValueError(f"`selector`={selector!r}, expected one of {SIGNALS}, 'random' or a callable.")
        scores = scorer.score_ids(repeated, ids)
        key = selector
    else:
        key = getattr(selector, "__name__", "reward")
        scores[key] = torch.tensor(list(selector([p for p in prompts for _ in range(n)], texts)), dtype=torch.float32)
    index = select_best(scores[key], n).tolist()
    samples = [texts[b * n:(b + 1) * n] for b in range(len(prompts))]
    return BestOfNResult(samples, scores, index, [samples[b][i] for b, i in enumerate(index)])


# ---------------------------------------------------------------------------- pairwise evaluation


def pairwise_accuracy(chosen: Tensor, rejected: Tensor) -> float:
    """Fraction of pairs with ``chosen > rejected`` (strict, RewardBench style: a tie counts as wrong)."""
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(f"`chosen` and `rejected` must be 1-D of one length, got {tuple(chosen.shape)} and "
                         f"{tuple(rejected.shape)}.")
    if chosen.numel() == 0:
        raise ValueError("pairwise_accuracy needs at least one pair.")
    return float((chosen > rejected).float().mean())


def score_pairs(scorer: ResponseScorer, pairs: Sequence[PreferencePair],
                signals: Sequence[str] = SIGNALS) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each signal of every pair's chosen and rejected response: ``(chosen, rejected)``, ``{signal: (P,)}``.

    Each distinct ``(prompt, response)`` is scored once (data sets reuse one chosen response across pairs).

    .. code-block:: python

        chosen, rejected = score_pairs(ResponseScorer(model, tok, chat=True), degradation_pairs(16), ["stable_rank"])
    """
    unique: dict[tuple[str, str], int] = {}
    for p in pairs:
        for response in (p.chosen, p.rejected):
            unique.setdefault((p.prompt, response), len(unique))
    keys = list(unique)
    scores = scorer.signals([k[0] for k in keys], [k[1] for k in keys], signals)
    chosen_idx = torch.tensor([unique[(p.prompt, p.chosen)] for p in pairs])
    rejected_idx = torch.tensor([unique[(p.prompt, p.rejected)] for p in pairs])
    return ({name: value[chosen_idx] for name, value in scores.items()},
            {name: value[rejected_idx] for name, value in scores.items()})


def evaluate_pairs(scorer: ResponseScorer, pairs: Sequence[PreferencePair],
                   signals: Sequence[str] = SIGNALS) -> dict[str, dict[str, float]]:
    """Pairwise accuracy of each signal, overall (``"all"``) and per ``subset``: ``{signal: {subset: acc}}``.

    .. code-block:: python

        evaluate_pairs(ResponseScorer(model, tok, chat=True), degradation_pairs(16))["stable_rank"]["all"]
    """
    chosen, rejected = score_pairs(scorer, pairs, signals)
    subsets = sorted({p.subset for p in pairs})
    table: dict[str, dict[str, float]] = {}
    for name in signals:
        table[name] = {"all": pairwise_accuracy(chosen[name], rejected[name])}
        for subset in subsets:
            idx = torch.tensor([i for i, p in enumerate(pairs) if p.subset == subset])
            table[name][subset] = pairwise_accuracy(chosen[name][idx], rejected[name][idx])
    return table
