"""The layer-skipped self-draft that SPIRIT and its baselines share: sublayer skipping, matchness, timing.

The draft is the target itself with some attention / MLP sublayers left out
(:func:`skip_sublayers`; no weight copy), drafting on the verifier's own KV cache, which is
cropped back to the committed prefix afterwards (:class:`LayerSkipDrafter`, the fixed-pattern
baseline). :func:`pattern_matchness` / :func:`sequence_matchness` score a pattern by its
agreement with the target, :func:`calibrate_length_profile` times plain decode steps for the
length-normalised speed. The adaptive drafters are in :mod:`lit_lowrank.decoding.spirit`
(which re-exports everything here).

.. code-block:: python

    from lit_lowrank.decoding.spirit_skip import LayerSkipDrafter, skip_sublayers
    from lit_lowrank.ops.spirit import SkipPattern

    with skip_sublayers(model, SkipPattern(attn=frozenset({2, 3}), mlp=frozenset({3}))):
        logits = model(input_ids).logits
    engine = SpeculativeDecoder(TargetLM(model), LayerSkipDrafter(SkipPattern(attn=frozenset({2}))), budget=8)
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.decoding.engine import Drafter, DraftRequest, DraftTree, TargetLM, skip_decoder_layers
from lit_lowrank.ops.spirit import LengthProfile, SkipPattern, matchness

__all__ = ["LayerSkipDrafter", "calibrate_length_profile", "pattern_matchness", "sequence_matchness",
           "skip_sublayers"]


class _SkippedAttention(nn.Module):
    """Stands in for a skipped attention sublayer: adds nothing to the residual stream, no KV write."""

    def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, None]:
        return torch.zeros_like(hidden_states), None


class _SkippedMLP(nn.Module):
    """Stands in for a skipped MLP sublayer: adds nothing to the residual stream."""

    def forward(self, hidden_states: Tensor) -> Tensor:
        return torch.zeros_like(hidden_states)


@contextlib.contextmanager
def skip_sublayers(model: nn.Module, pattern: SkipPattern | None) -> Iterator[None]:
    """Run ``model`` with the sublayers of ``pattern`` left out (restored on exit).

    A layer with both sublayers skipped is dropped whole (:func:`skip_decoder_layers`); a
    single skipped sublayer is swapped for a module that adds zero to the residual stream
    (pre-norm decoders: ``h + attn(norm(h))`` becomes ``h``). Layers keep their ``layer_idx``,
    so the KV cache layout is the full model's. Needs decoder layers with ``self_attn`` and
    ``mlp`` (Llama, Mistral, Qwen, SmolLM, ...).

    .. code-block:: python

        with skip_sublayers(model, SkipPattern(attn=frozenset({2, 3}), mlp=frozenset({3}))):
            logits = model(input_ids).logits
    """
    if pattern is None or pattern.size == 0:
        yield
        return
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"skip_sublayers: {type(model).__name__} has no decoder `layers` ModuleList.")
    bad = sorted(i for i in pattern.attn | pattern.mlp if not 0 <= i < len(layers))
    if bad:
        raise ValueError(f"skip_sublayers: layer indices {bad} outside 0..{len(layers) - 1}.")
    swaps: list[tuple[nn.Module, str, nn.Module]] = []
    for ids, name, stub in ((pattern.attn - pattern.mlp, "self_attn", _SkippedAttention),
                            (pattern.mlp - pattern.attn, "mlp", _SkippedMLP)):
        for i in sorted(ids):
            if not hasattr(layers[i], name):
                raise ValueError(f"skip_sublayers: layer {i} ({type(layers[i]).__name__}) has no `{name}` sublayer.")
            swaps.append((layers[i], name, getattr(layers[i], name)))
            setattr(layers[i], name, stub())
    try:
        with skip_decoder_layers(model, set(pattern.whole_layers)):
            yield
    finally:
        for layer, name, original in swaps:
            setattr(layer, name, original)


def _crop(cache: Any, length: int) -> None:
    """Drop everything after ``length`` tokens in every layer (skipped layers may already be shorter)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4 and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def _prefix_view(cache: Any, length: int) -> Any:
    """A cache holding the first ``length`` tokens of ``cache`` (views; ``cache`` itself is not changed)."""
    view = copy.copy(cache)
    view.layers = [copy.copy(layer) for layer in cache.layers]
    _crop(view, length)
    return view


@torch.no_grad()
def pattern_matchness(target: TargetLM, tokens: Tensor, pattern: SkipPattern, window: int = 32) -> float | None:
    """SWIFT's matchness of ``pattern`` on the last ``window`` committed tokens (one parallel draft forward).

    Runs the layer-skipped draft over ``tokens[s:-1]`` on a prefix view of the verifier's cache
    (the verifier's cache is not changed) and compares its argmax with the tokens that
    actually followed. ``None`` when fewer than 2 committed tokens.
    """
    if target.cache is None:
        raise RuntimeError("pattern_matchness: the target has no cache (prefill a prompt first).")
    end = target.length  # tokens[:end] are in the cache; tokens[end] is the root
    if tokens.dim() != 1 or tokens.numel() != end + 1:
        raise ValueError(f"pattern_matchness: `tokens` must be the (T,) committed tokens with T = cached + 1 = "
                         f"{end + 1}, got shape {tuple(tokens.shape)}.")
    start = max(0, end - window)
    if end - start < 1:
        return None
    inputs = tokens[start:end].to(target.device)
    view = _prefix_view(target.cache, start)
    positions = torch.arange(start, end, device=target.device)
    with skip_sublayers(target.model, pattern):
        logits, _ = target.forward(inputs, positions, None, view)
    return matchness(logits.argmax(-1), tokens[start + 1: end + 1].to(target.device))


@torch.no_grad()
def calibrate_length_profile(target: TargetLM | nn.Module, lengths: tuple[int, ...] = (16, 64, 128, 256),
                             repeats: int = 5, vocab_size: int | None = None, seed: int = 0) -> LengthProfile:
    """Time plain one-token decode steps at several context lengths and fit a :class:`LengthProfile`.

    Uses its own cache (random tokens; timing only), so the target's cache is not touched.
    """
    target = target if isinstance(target, TargetLM) else TargetLM(target)
    if not lengths or min(lengths) < 1 or repeats < 1:
        raise ValueError(f"calibrate_length_profile: lengths={lengths} (>= 1 each) and repeats={repeats} >= 1.")
    vocab = vocab_size or int(target.model.config.vocab_size)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(vocab, (max(lengths) + 1,), generator=g).to(target.device)
    cache = target.new_cache()
    target.forward(prompt[:-1], torch.arange(max(lengths), device=target.device), None, cache)
    xs, ys = [], []
    for rep in range(repeats + 1):  # rep 0 warms up
        for n in lengths:
            view = _prefix_view(cache, n)
            t0 = time.perf_counter()
            target.forward(prompt[n:n + 1], torch.tensor([n], device=target.device), None, view)
            if rep:
                xs.append(n)
                ys.append(time.perf_counter() - t0)
    return LengthProfile.fit(xs, ys)


class LayerSkipDrafter(Drafter):
    """Self-speculative chain drafting with a fixed :class:`SkipPattern` (the fixed-ratio baseline).

    Each draft token is one forward of the layer-skipped target on the verifier's own KV cache
    (cropped back afterwards). With ``draft_vocab`` the draft's logits cover only those ids
    (FR-Spec's frequency-ranked draft vocabulary): the target's 49k-row head is a fifth of a
    small LM's weights, paid at every draft token otherwise. Verification uses the full
    vocabulary, so the output is unchanged; only acceptance can drop (a token outside the
    draft vocabulary is never drafted).

    Args:
        pattern: the sublayers to skip.
        draft_length: most draft tokens per round (also capped by the verifier budget).
        stop_confidence: stop the chain early once the draft's top-1 probability falls below
            this (SWIFT's confidence early stop); 0 = always draft ``draft_length``.
        draft_vocab: ids the draft may propose: a ``(Vd,)`` id tensor, an int ``N`` (ids
            ``0..N-1``: BPE ids are roughly in frequency order) or ``None`` (every id).

    .. code-block:: python

        from lit_lowrank.ops.spirit import random_pattern
        drafter = LayerSkipDrafter(random_pattern(12, ratio=0.4), draft_length=6)
        out, stats = SpeculativeDecoder(model, drafter, budget=8).generate(prompt, 64)
    """

    uses_features = False

    def __init__(self, pattern: SkipPattern | None = None, draft_length: int = 6, stop_confidence: float = 0.5,
                 draft_vocab: Tensor | int | None = None) -> None:
        if draft_length < 1:
            raise ValueError(f"`draft_length` must be >= 1, got {draft_length}.")
        if not 0.0 <= stop_confidence < 1.0:
            raise ValueError(f"`stop_confidence` must be in [0, 1), got {stop_confidence}.")
        if isinstance(draft_vocab, int):
            if draft_vocab < 1:
                raise ValueError(f"`draft_vocab` must be >= 1 ids, got {draft_vocab}.")
            draft_vocab = torch.arange(draft_vocab)
        self.pattern = pattern or SkipPattern()
        self.draft_length = draft_length
        self.stop_confidence = stop_confidence
        self.draft_vocab = None if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long).flatten()
        self._rows: tuple[int, Tensor] | None = None  # (id of the head weight, its draft-vocabulary rows)

    def _head_rows(self, target: TargetLM) -> Tensor | None:
        if self.draft_vocab is None or not target._split:
            return None
        weight = target.head.weight
        if self._rows is None or self._rows[0] != id(weight):
            if int(self.draft_vocab.max()) >= weight.shape[0]:
                raise ValueError(f"LayerSkipDrafter: draft_vocab ids up to {int(self.draft_vocab.max())} exceed the "
                                 f"target's vocabulary ({weight.shape[0]}).")
            self._rows = (id(weight), weight[self.draft_vocab.to(weight.device)].detach().clone())
        return self._rows[1]

    @torch.no_grad()
    def draft(self, request: DraftRequest) -> DraftTree:
        target = request.target
        prefix = target.length
        device = target.device
        rows = self._head_rows(target)
        token = request.tokens[-1:].to(device)
        out: list[int] = []
        try:
            with skip_sublayers(target.model, self.pattern):
                for j in range(min(self.draft_length, request.budget)):
                    position = torch.tensor([prefix + j], device=device)
                    if rows is None:
                        logits = target.forward(token, position, None, target.cache)[0][-1]
                    else:
                        logits = target.hidden(token, position, None, target.cache)[-1] @ rows.T
                    conf, nxt = torch.softmax(logits.float(), -1).max(-1)
                    if out and float(conf) < self.stop_confidence:
                        break
                    if rows is not None:
                        nxt = self.draft_vocab[int(nxt)]
                    out.append(int(nxt))
                    token = nxt.view(1).to(device)
        finally:
            _crop(target.cache, prefix)  # the verifier gets its cache back exactly
        tokens = torch.tensor(out, dtype=torch.long)
        return DraftTree(tokens, torch.arange(len(out)) - 1, forwards=len(out))


@torch.no_grad()
def sequence_matchness(model: nn.Module, sequences: list[Tensor], starts: list[int], pattern: SkipPattern) -> float:
    """Matchness of ``pattern`` on whole sequences: one parallel skipped forward each, no cache.

    The fraction of positions ``t >= starts[i]`` of ``sequences[i]`` where the draft's argmax
    after ``sequences[i][:t]`` equals ``sequences[i][t]`` (pooled over all sequences). With the
    target's own greedy continuations as ``sequences`` this is the draft's agreement with the
    verifier, i.e. what greedy verification accepts.
    """
    if len(sequences) != len(starts) or not sequences:
        raise ValueError(f"sequence_matchness: {len(sequences)} sequences and {len(starts)} starts (equal, >= 1).")
    hits, total = 0.0, 0
    device = next(model.parameters()).device
    with skip_sublayers(model, pattern):
        for seq, start in zip(sequences, starts):
            if not 1 <= start < seq.numel():
                raise ValueError(f"sequence_matchness: start={start} outside 1..{seq.numel() - 1}.")
            logits = model(input_ids=seq[None, :-1].to(device), use_cache=False).logits[0]
            pred = logits[start - 1:].argmax(-1).cpu()
            hits += float((pred == seq[start:]).sum())
            total += seq.numel() - start
    return hits / total
