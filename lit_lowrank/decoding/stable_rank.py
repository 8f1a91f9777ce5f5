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

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_lowrank.datamodules.preference import PreferencePair
from lit_lowrank.ops.sequence_signals import mean_log_prob, negative_entropy, self_certainty
from lit_lowrank.ops.stable_rank import Normalization, stable_rank

__all__ = [
    "SIGNALS", "BestOfNResult", "ResponseScorer", "StableRankReward", "best_of_n", "evaluate_pairs",
    "decode_completion", "eos_token_ids", "pairwise_accuracy", "sample_responses", "select_best",
]

#: Signals :meth:`ResponseScorer.signals` computes; higher is better for each.
# "stable_rank_max_rank" is the length-normalised stable rank (srank / min(T, d)) from the same forward pass,
# whatever the scorer's own `normalize`: Best-of-N and pairwise tables report it next to the raw one
SIGNALS: tuple[str, ...] = ("stable_rank", "mean_log_prob", "negative_entropy", "self_certainty", "length",
                            "stable_rank_max_rank")


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
        normalize: ``"none"`` or ``"max_rank"`` (divide by ``min(T, d)``).
        final_norm: read the hidden states after the model's final norm (``True``, what
            ``hidden_states[-1]`` is) or before it (a hook on the decoder's ``norm`` module).
        include_special_tokens: count special tokens (end-of-turn, EOS) of the response as rows.
        chat: wrap plain-string prompts as a user message in the tokenizer's chat template (message
            lists always go through the template).
        max_response_tokens: truncate responses to this many tokens (``None``: no limit).

    .. code-block:: python

        scorer = ResponseScorer(model, tokenizer, chat=True)
        scorer.signals(["Name a planet."], ["Mars is the fourth planet."])["stable_rank"]   # tensor([...])
    """

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 8, center: bool = False,
                 normalize: Normalization = "none", final_norm: bool = True, include_special_tokens: bool = False,
                 chat: bool = False, max_response_tokens: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
        if normalize not in ("none", "max_rank"):
            raise ValueError(f"`normalize`={normalize!r}, expected 'none' or 'max_rank'.")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.center, self.normalize = batch_size, center, normalize
        self.final_norm, self.include_special_tokens, self.chat = final_norm, include_special_tokens, chat
        self.max_response_tokens = max_response_tokens
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
        out: dict[str, list[Tensor]] = {s: [] for s in signals}
        for start in range(0, len(prompt_ids), self.batch_size):
            chunk = self._score_batch(prompt_ids[start:start + self.batch_size],
                                      completion_ids[start:start + self.batch_size], signals)
            for name in signals:
                out[name].append(chunk[name])
        if not prompt_ids:
            return {s: torch.empty(0) for s in signals}
        return {s: torch.cat(v) for s, v in out.items()}

    def _final_states(self, input_ids: Tensor, attention_mask: Tensor, keep: int) -> tuple[Tensor, Tensor]:
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
            # logits only for the last `keep` positions (the responses): the LM head is a large share of a small
            # model's cost and the prompt's logits are never read
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                             logits_to_keep=keep)
        finally:
            if handle is not None:
                handle.remove()
        states = captured[0] if captured else out.hidden_states[-1]
        return states, out.logits

    def _score_batch(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                     signals: Sequence[str]) -> dict[str, Tensor]:
        device = next(self.model.parameters()).device
        rows, starts = [], []
        for p, c in zip(prompts, completions):
            c = list(c)[: self.max_response_tokens] if self.max_response_tokens else list(c)
            rows.append(list(p) + c)
            starts.append(len(p))
        width = max(max(len(r) for r in rows), 1)
        pad = getattr(self.tokenizer, "pad_token_id", None) or 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        response = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, (row, s) in enumerate(zip(rows, starts)):  # right padding: positions 0..L-1 as usual
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention[i, : len(row)] = 1
            response[i, s: len(row)] = True
        ids, attention, response = ids.to(device), attention.to(device), response.to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            keep = min(width, width - min(starts) + 1)
            states, logits = self._final_states(ids, attention, keep)
        finally:
            self.model.train(was_training)
        window = ids[:, width - keep:]  # logits[:, j] predicts window[:, j + 1]
        rank_mask = response.clone()
        if not self.include_special_tokens and self.special_ids:
            rank_mask &= ~torch.isin(ids, torch.tensor(sorted(self.special_ids), device=device))
        result: dict[str, Tensor] = {}
        if "stable_rank" in signals:
            result["stable_rank"] = stable_rank(states, rank_mask, self.center, self.normalize).cpu()
        if "stable_rank_max_rank" in signals:
            result["stable_rank_max_rank"] = stable_rank(states, rank_mask, self.center, "max_rank").cpu()
        # logits[t] predicts token t+1: the logit signals read the response's tokens from the shift
        shifted_logits, targets, target_mask = logits[:, :-1], window[:, 1:], response[:, width - keep + 1:]
        if "mean_log_prob" in signals:
            result["mean_log_prob"] = mean_log_prob(shifted_logits, targets, target_mask).cpu()
        if "negative_entropy" in signals:
            result["negative_entropy"] = negative_entropy(shifted_logits, target_mask).cpu()
        if "self_certainty" in signals:
            result["self_certainty"] = self_certainty(shifted_logits, target_mask).cpu()
        if "length" in signals:
            result["length"] = response.sum(-1).float().cpu()
        return result

    def signals(self, prompts: Sequence[Any], completions: Sequence[Any],
                signals: Sequence[str] = SIGNALS) -> dict[str, Tensor]:
        """Every requested signal for text (or message-list) prompts and completions."""
        return self.score_ids([self.prompt_ids(p) for p in prompts], [self.completion_ids(c) for c in completions],
                              signals)


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


def evaluate_pairs(scorer: ResponseScorer, pairs: Sequence[PreferencePair],
                   signals: Sequence[str] = SIGNALS) -> dict[str, dict[str, float]]:
    """Pairwise accuracy of each signal, overall (``"all"``) and per ``subset``: ``{signal: {subset: acc}}``.

    .. code-block:: python

        evaluate_pairs(ResponseScorer(model, tok, chat=True), degradation_pairs(16))["stable_rank"]["all"]
    """
    # score each distinct (prompt, response) once: data sets reuse one chosen response across pairs
    unique: dict[tuple[str, str], int] = {}
    for p in pairs:
        for response in (p.chosen, p.rejected):
            unique.setdefault((p.prompt, response), len(unique))
    keys = list(unique)
    scores = scorer.signals([k[0] for k in keys], [k[1] for k in keys], signals)
    chosen_idx = torch.tensor([unique[(p.prompt, p.chosen)] for p in pairs])
    rejected_idx = torch.tensor([unique[(p.prompt, p.rejected)] for p in pairs])
    chosen = {name: value[chosen_idx] for name, value in scores.items()}
    rejected = {name: value[rejected_idx] for name, value in scores.items()}
    subsets = sorted({p.subset for p in pairs})
    table: dict[str, dict[str, float]] = {}
    for name in signals:
        table[name] = {"all": pairwise_accuracy(chosen[name], rejected[name])}
        for subset in subsets:
            idx = torch.tensor([i for i, p in enumerate(pairs) if p.subset == subset])
            table[name][subset] = pairwise_accuracy(chosen[name][idx], rejected[name][idx])
    return table
