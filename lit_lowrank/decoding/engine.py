"""A lossless speculative-decoding engine for transformers causal LMs with a KV cache.

One round: the drafter proposes a tree of candidate tokens below the *root* (the token
the target already chose); the target verifies the root and the whole tree in one
forward with a tree attention mask and tree position ids; the accepted path is kept in
the target's KV cache, the rest is dropped; the target's token after the accepted path
(the *bonus*) becomes the next root. Greedy verification follows the target's argmax;
sampling uses the multi-candidate speculative sampling rule
(:func:`~lit_lowrank.ops.speculative.sampling_tree_accept`), so the output is
distributed exactly as the target's own sampling, whatever the drafter proposes.

Drafters plug in behind :class:`Drafter`: ``draft(request) -> DraftTree``. A request
carries the committed tokens, the target's last hidden states at the committed
positions (EAGLE-style feature drafters read them), the verifier budget and the
:class:`TargetLM` itself, so a *self*-drafter can run the target with layers skipped
(:meth:`TargetLM.forward` with ``skip_layers``, its own :meth:`TargetLM.new_cache`).
After each round :meth:`Drafter.observe` receives the verifier's feedback (accepted
nodes, the target's tokens and hidden states at every node): free labels for online
adaptation.

Batch size 1 (one sequence), as in the speculative-decoding papers.

.. code-block:: python

    from lit_lowrank.decoding import SpeculativeDecoder, TargetLM, plain_decode

    target = TargetLM(model)                                  # any transformers causal LM
    engine = SpeculativeDecoder(target, drafter, budget=24)
    out, stats = engine.generate(prompt_ids, max_new_tokens=64, eos_token_id=2)
    ref, _ = plain_decode(target, prompt_ids, max_new_tokens=64, eos_token_id=2)
    assert torch.equal(out, ref)                              # greedy: identical
    print(stats.mean_acceptance_length, stats.tokens_per_second)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.decoding.stats import DecodeStats
from lit_lowrank.ops.speculative import (
    TreeLayout,
    accept_greedy,
    accept_sampling,
    additive_mask,
    tree_layout,
)


@contextlib.contextmanager
def skip_decoder_layers(model: nn.Module, skip: set[int] | None) -> Iterator[None]:
    """Run ``model`` with the decoder layers in ``skip`` left out (restored on exit).

    The kept layers keep their own ``layer_idx``, so a KV cache stays indexed by the full
    model's layer numbers: a self-drafter (SPIRIT, SWIFT) can share one cache layout
    with the verifier. Needs a model whose decoder exposes ``layers`` (Llama, Mistral,
    Qwen, SmolLM, ...).

    .. code-block:: python

        with skip_decoder_layers(model, {3, 4, 7}):
            logits = model(input_ids).logits      # the layer-skipped draft model
    """
    if not skip:
        yield
        return
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"skip_layers: {type(model).__name__} has no decoder `layers` ModuleList to skip.")
    bad = [i for i in skip if not 0 <= i < len(layers)]
    if bad:
        raise ValueError(f"skip_layers: indices {bad} outside 0..{len(layers) - 1}.")
    decoder.layers = nn.ModuleList([layer for i, layer in enumerate(layers) if i not in skip])
    try:
        yield
    finally:
        decoder.layers = layers


def _plain_head(model: nn.Module) -> bool:
    """Whether ``model``'s logits are exactly ``lm_head(decoder(x).last_hidden_state)`` (no scale or cap)."""
    cfg = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale"):
        value = getattr(cfg, name, None)
        if value not in (None, 1, 1.0):
            return False
    return callable(getattr(model, "get_decoder", None)) and callable(getattr(model, "get_output_embeddings", None))


def check_feature_layers(feature_layers: tuple[int, ...] | list[int] | None, num_layers: int) -> tuple[int, ...] | None:
    """``feature_layers`` as a validated tuple: increasing indices into ``hidden_states``, the last = ``num_layers``.

    The last one must be the final (normed) output, so the fused features end with what the target's
    own LM head reads (a drafter's output state imitates it). ``None`` / a lone final layer -> ``None``.
    """
    if feature_layers is None:
        return None
    layers = tuple(int(x) for x in feature_layers)
    if not layers or list(layers) != sorted(set(layers)) or layers[0] < 0 or layers[-1] != num_layers:
        raise ValueError(f"`feature_layers`={list(feature_layers)}: expected increasing hidden-state indices in "
                         f"0..{num_layers}, ending with {num_layers} (the final, normed output).")
    return None if len(layers) == 1 else layers


def fused_features(hidden_states: tuple[Tensor, ...], last: Tensor, layers: tuple[int, ...] | None) -> Tensor:
    """EAGLE-3's features: ``hidden_states[l]`` for the lower ``layers`` and ``last`` (the final normed
    output), concatenated on the last dimension; ``last`` alone when ``layers`` is ``None``."""
    if layers is None:
        return last
    return torch.cat([hidden_states[layer] for layer in layers[:-1]] + [last], -1)


class TargetLM:
    """The verifier: a transformers causal LM with a KV cache it manages for one sequence.

    Runs the decoder and the LM head separately where the model allows (Llama, Mistral, Qwen,
    SmolLM, ...: logits are ``lm_head(last hidden state)``), so logits are computed only where
    they are needed: the last prompt position at prefill, every node of a verified tree.
    The vocabulary head is a large share of a small LM's weights (SmolLM2-135M: ~21%).

    Args:
        model: a transformers ``*ForCausalLM`` (put in eval mode; gradients are off here).
        feature_layers: the features returned beside the logits: ``None`` = the last hidden state
            ``(N, H)``; indices into transformers' ``hidden_states`` ending with ``num_hidden_layers``
            = those states concatenated ``(N, H * L)`` (EAGLE-3's fused features; the last ``H``
            columns are still the last hidden state). The engine sets it from its drafter's
            ``feature_layers``.

    .. code-block:: python

        target = TargetLM(model)
        logits, hidden = target.start(prompt_ids)             # (1, V) last position, (T, H)
        logits, hidden = target.extend(tokens, parents)       # tree verify after the prefix: (N, V), (N, H)
        target.keep([0, 2, 5])                                 # keep the accepted path only
    """

    def __init__(self, model: nn.Module, feature_layers: tuple[int, ...] | list[int] | None = None) -> None:
        self.model = model.eval()
        self.feature_layers = feature_layers
        self._split = _plain_head(model)
        self.decoder = model.get_decoder() if self._split else None
        self.head = model.get_output_embeddings() if self._split else None
        if self._split and (self.decoder is None or self.head is None):
            self._split, self.decoder, self.head = False, None, None
        self.cache: Any = None
        self._pending = 0

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        """The hidden states fused into the returned features (``None``: the last one)."""
        return self._feature_layers

    @feature_layers.setter
    def feature_layers(self, layers: tuple[int, ...] | list[int] | None) -> None:
        if layers is not None:
            layers = check_feature_layers(layers, int(self.model.config.num_hidden_layers))
        self._feature_layers = layers

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def length(self) -> int:
        """Tokens in the cache (the committed prefix, plus the last extend's nodes until :meth:`keep`)."""
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def new_cache(self) -> Any:
        """An empty transformers ``DynamicCache`` for this model."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def embed(self, tokens: Tensor) -> Tensor:
        """The target's input embeddings of ``tokens`` (drafters share them)."""
        return self.model.get_input_embeddings()(tokens)

    def logits(self, hidden: Tensor) -> Tensor:
        """The LM head on last hidden states ``(..., H)`` or fused features (their last ``H`` columns)."""
        if not self._split:
            raise RuntimeError(f"TargetLM.logits: {type(self.model).__name__} scales or caps its logits; "
                               "use forward() for its logits.")
        return self.head(hidden[..., hidden.shape[-1] - self.head.in_features:])

    @torch.no_grad()
    def forward(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None, cache: Any,
                skip_layers: set[int] | None = None, last_only: bool = False) -> tuple[Tensor, Tensor]:
        """One forward of ``input_ids`` ``(N,)`` after what ``cache`` holds (the cache is extended).

        Args:
            input_ids: ``(N,)`` tokens.
            position_ids: ``(N,)`` positions.
            attention_mask: ``(N, cached + N)`` bool, or ``None`` for plain causal.
            cache: a ``DynamicCache`` (see :meth:`new_cache`).
            skip_layers: decoder layers to leave out (self-speculative drafting).
            last_only: logits of the last position only (``(1, V)``).

        Returns:
            ``(logits (N or 1, V), features (N, H))``: the last hidden state (after the final norm), or
            the fused features of :attr:`feature_layers` ``(N, H * L)``.
        """
        mask = None if attention_mask is None else additive_mask(attention_mask, self.dtype)
        layers = self.feature_layers
        with skip_decoder_layers(self.model, skip_layers):
            if self._split:
                out = self.decoder(input_ids=input_ids[None], position_ids=position_ids[None], attention_mask=mask,
                                   cache=cache, use_cache=True, output_hidden_states=layers is not None)
                hidden = out.last_hidden_state[0]
                feats = hidden if layers is None else fused_features(tuple(h[0] for h in out.hidden_states), hidden,
                                                                     layers)
                return self.head(hidden[-1:] if last_only else hidden), feats
            out = self.model(input_ids=input_ids[None], position_ids=position_ids[None], attention_mask=mask,
                             cache=cache, use_cache=True, output_hidden_states=True)
        logits = out.logits[0]
        states = tuple(h[0] for h in out.hidden_states)
        return (logits[-1:] if last_only else logits), fused_features(states, states[-1], layers)

    @torch.no_grad()
    def hidden(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None, cache: Any) -> Tensor:
        """The decoder's last hidden states ``(N, H)`` of ``input_ids`` ``(N,)`` (no LM head; extends ``cache``).

        For drafters that apply their own (e.g. reduced-vocabulary) head; needs a model with a plain head.
        """
        if not self._split:
            raise RuntimeError(f"TargetLM.hidden: {type(self.model).__name__} scales or caps its logits; "
                               "use forward().")
        mask = None if attention_mask is None else additive_mask(attention_mask, self.dtype)
        return self.decoder(input_ids=input_ids[None], position_ids=position_ids[None], attention_mask=mask,
                            cache=cache, use_cache=True).last_hidden_state[0]

    def start(self, input_ids: Tensor, all_logits: bool = False) -> tuple[Tensor, Tensor]:
        """Reset the cache and prefill ``input_ids`` ``(T,)``.

        Returns the logits of the last position ``(1, V)`` (every position ``(T, V)`` with
        ``all_logits``) and the hidden states ``(T, H)``.
        """
        if input_ids.dim() != 1 or input_ids.numel() == 0:
            raise ValueError(f"`input_ids` must be a non-empty (T,) tensor, got shape {tuple(input_ids.shape)}.")
        self.cache = self.new_cache()
        self._pending = 0
        positions = torch.arange(input_ids.numel(), device=input_ids.device)
        return self.forward(input_ids, positions, None, self.cache, last_only=not all_logits)

    def extend(self, tokens: Tensor, parents: Tensor) -> tuple[Tensor, Tensor]:
        """Verify a tree ``(tokens, parents)`` after the cached prefix (one forward).

        ``parents[0]`` must be ``-1`` (node 0 is the root: the last committed token) and every
        other node lies below it. Node ``i`` sits at position ``prefix + depth(i)`` and sees
        the prefix and its ancestors. The cache then holds the prefix and every node until
        :meth:`keep`.
        """
        return self.verify(tree_layout(tokens, parents))

    def verify(self, layout: TreeLayout) -> tuple[Tensor, Tensor]:
        """:meth:`extend` on an already validated :class:`~lit_lowrank.ops.speculative.TreeLayout`.

        A chain runs on the plain causal path (no mask is built). Returns ``(N, V)`` logits and
        ``(N, H)`` hidden states.
        """
        if self.cache is None:
            raise RuntimeError("TargetLM.extend before start(): prefill a prompt first.")
        if self._pending:
            raise RuntimeError("TargetLM.extend twice without keep(): keep the accepted nodes first.")
        prefix = self.length
        device = layout.tokens.device
        self._pending = layout.size  # what keep() may select from
        return self.forward(layout.tokens, layout.position_ids(prefix).to(device), layout.attention_mask(prefix),
                            self.cache)

    def step(self, token: int) -> Tensor:
        """Plain decoding: append one token, return its logits ``(V,)`` (no tree bookkeeping)."""
        if self.cache is None:
            raise RuntimeError("TargetLM.step before start(): prefill a prompt first.")
        device = self.device
        prefix = self.length
        logits, _ = self.forward(torch.tensor([token], device=device), torch.tensor([prefix], device=device), None,
                                 self.cache)
        return logits[0]

    def keep(self, nodes: list[int]) -> None:
        """Keep only the nodes ``nodes`` (in this order) of the last :meth:`extend` in the cache.

        The cache is cut back to the prefix and only the kept nodes' keys / values are written
        after it (in place): the work is proportional to the kept nodes, not to the cache.
        """
        pending = self._pending
        if pending == 0:
            raise RuntimeError("TargetLM.keep without a preceding extend().")
        bad = [n for n in nodes if not 0 <= n < pending]
        if bad:
            raise ValueError(f"keep: nodes {bad} outside the last extend's 0..{pending - 1}.")
        self._pending = 0
        prefix = self.length - pending
        n = len(nodes)
        index = None
        if nodes != list(range(n)):
            index = prefix + torch.tensor(nodes, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() != 4 or keys.shape[-2] < prefix + pending:
                continue  # a layer the forward skipped keeps what it had
            if index is not None:
                layer.keys[..., prefix: prefix + n, :] = keys[..., index, :]
                layer.values[..., prefix: prefix + n, :] = layer.values[..., index, :]
            layer.keys = layer.keys[..., : prefix + n, :]
            layer.values = layer.values[..., : prefix + n, :]


@dataclass
class DraftTree:
    """A drafter's proposal below the root.

    Attributes:
        tokens: ``(N,)`` drafted tokens.
        parents: ``(N,)`` parent indices into ``tokens``, ``-1`` = a child of the root;
            topologically ordered; siblings carry distinct tokens.
        forwards: drafter forward passes spent on this tree.
        info: anything the drafter wants back in :meth:`Drafter.observe`.
    """

    tokens: Tensor
    parents: Tensor
    forwards: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens.shape != self.parents.shape or self.tokens.dim() != 1:
            raise ValueError(f"DraftTree: tokens {tuple(self.tokens.shape)} and parents {tuple(self.parents.shape)} "
                             "must both be (N,).")


@dataclass
class DraftRequest:
    """What a drafter sees each round.

    Attributes:
        tokens: ``(T,)`` committed tokens; ``tokens[-1]`` is the root (chosen by the target,
            not yet in its cache). A view of the engine's buffer: read it, do not keep it.
        features: ``(T - 1, H)`` the target's last hidden state at positions ``0..T-2``
            (``features[i]`` produced ``tokens[i + 1]``; ``(T - 1, H * L)`` fused states for a drafter
            with ``feature_layers``); ``None`` for a drafter whose ``uses_features`` is ``False``.
        budget: most draft nodes the verifier will take.
        target: the verifier (for self-drafters and the shared embeddings).
    """

    tokens: Tensor
    features: Tensor | None
    budget: int
    target: TargetLM


@dataclass
class RoundFeedback:
    """What the verifier tells the drafter after a round (free labels for adaptation).

    Attributes:
        request: the round's request.
        tree: the drafted tree.
        accepted: accepted draft-node indices (into ``tree.tokens``), root to leaf.
        target_tokens: ``(N + 1,)`` the target's argmax at the root and every node.
        target_features: ``(N + 1, H)`` the target's hidden states there.
        bonus: the token after the accepted path.
    """

    request: DraftRequest
    tree: DraftTree
    accepted: list[int]
    target_tokens: Tensor
    target_features: Tensor
    bonus: int


class Drafter:
    """The drafter interface: override :meth:`draft`; :meth:`reset` / :meth:`observe` are optional.

    ``uses_features``: whether :meth:`draft` reads ``request.features`` (the target's hidden
    states at the committed positions). A drafter that does not (a self-drafter, prompt
    lookup, an n-gram table) sets it to ``False`` and the engine does not keep them.

    .. code-block:: python

        class ChainDrafter(Drafter):
            uses_features = False

            def draft(self, request):
                toks = my_guess(request.tokens, n=request.budget)
                return DraftTree(toks, torch.arange(len(toks)) - 1, forwards=len(toks))
    """

    uses_features: bool = True
    #: the target hidden states the drafter's features fuse (EAGLE-3); ``None``: the last one
    feature_layers: tuple[int, ...] | None = None

    def reset(self) -> None:
        """A new sequence starts."""

    def draft(self, request: DraftRequest) -> DraftTree:
        raise NotImplementedError

    def observe(self, feedback: RoundFeedback) -> None:
        """The verifier's feedback for the last round."""


def _stop_set(eos_token_id: int | list[int] | tuple[int, ...] | set[int] | None) -> frozenset[int]:
    """The stop tokens as a set (``None``: none); ``eos_token_id`` may be one id or several."""
    if eos_token_id is None:
        return frozenset()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"`eos_token_id` must be a token id >= 0 or a list of them, got {eos_token_id!r}.")
    return frozenset(ids)


def _check_generate_args(input_ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None = None,
                         top_p: float | None = None) -> Tensor:
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise ValueError(f"`input_ids`: batch size 1 only, got shape {tuple(input_ids.shape)}.")
        input_ids = input_ids[0]
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise ValueError(f"`input_ids` must be (T,) or (1, T) with T >= 1, got shape {tuple(input_ids.shape)}.")
    if max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be >= 1, got {max_new_tokens}.")
    if temperature <= 0:
        raise ValueError(f"`temperature` must be > 0 (use do_sample=False for greedy), got {temperature}.")
    if top_k is not None and top_k < 0:
        raise ValueError(f"`top_k` must be >= 0 (0 or None: off), got {top_k}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"`top_p` must be in (0, 1], got {top_p}.")
    return input_ids


class _Committed:
    """The committed tokens (and, if asked, the target's features) in preallocated buffers.

    Appending a round's tokens writes into the buffer (O(accepted) per round); the views
    handed to drafters are slices, never concatenations of the whole history.
    """

    def __init__(self, prompt: Tensor, max_new_tokens: int, slack: int, features: Tensor | None,
                 eos_token_id: int | list[int] | None) -> None:
        cap = prompt.numel() + max_new_tokens + slack + 1
        self.max_new_tokens, self.stops = max_new_tokens, _stop_set(eos_token_id)
        self.eos_index: int | None = None  # buffer index of the first new EOS
        self.tokens = torch.empty(cap, dtype=torch.long, device=prompt.device)
        self.tokens[: prompt.numel()] = prompt
        self.length = prompt.numel()
        self.prompt_length = prompt.numel()
        self.features: Tensor | None = None
        if features is not None:
            self.features = features.new_empty(cap, features.shape[-1])
            self.features[: features.shape[0]] = features

    def append(self, tokens: list[int], features: Tensor | None = None) -> None:
        n = len(tokens)
        if self.eos_index is None and self.stops:
            hit = next((i for i, t in enumerate(tokens) if t in self.stops), None)
            if hit is not None:
                self.eos_index = self.length + hit
        self.tokens[self.length: self.length + n] = torch.tensor(tokens, dtype=torch.long)
        if self.features is not None and features is not None:  # features of the positions before the new root
            self.features[self.length - 1: self.length - 1 + features.shape[0]] = features
        self.length += n

    @property
    def new_tokens(self) -> int:
        return self.length - self.prompt_length

    def request(self, budget: int, target: TargetLM) -> DraftRequest:
        feats = None if self.features is None else self.features[: self.length - 1]
        return DraftRequest(self.tokens[: self.length], feats, budget, target)

    def result(self) -> tuple[Tensor, bool]:
        """The committed sequence cut at ``max_new_tokens`` and after the first new EOS; whether decoding is over."""
        end = min(self.length, self.prompt_length + self.max_new_tokens)
        if self.eos_index is not None and self.eos_index < end:
            return self.tokens[: self.eos_index + 1], True
        return self.tokens[:end], end - self.prompt_length >= self.max_new_tokens


def sampling_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """The distribution transformers ``generate`` samples from: ``logits / temperature``, then top-k,
    then top-p (nucleus) filtering, exactly as its logits warpers (in float64), softmax over the last dim.

    .. code-block:: python

        probs = sampling_probs(logits, temperature=0.7, top_k=50)     # (..., V), rows sum to 1
    """
    scores = logits.double() / temperature
    if top_k is not None and 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        remove = sorted_scores.softmax(-1).cumsum(-1) <= (1 - top_p)
        remove[..., -1:] = False  # keep at least one token
        scores = scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return torch.softmax(scores, -1)


def _choose(logits: Tensor, do_sample: bool, temperature: float, generator: torch.Generator | None,
            top_k: int | None = None, top_p: float | None = None) -> int:
    if not do_sample:
        return int(logits.argmax())
    probs = sampling_probs(logits, temperature, top_k, top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def plain_decode(target: TargetLM, input_ids: Tensor, max_new_tokens: int, eos_token_id: int | list[int] | None = None,
                 do_sample: bool = False, temperature: float = 1.0,
                 generator: torch.Generator | None = None, top_k: int | None = None,
                 top_p: float | None = None) -> tuple[Tensor, DecodeStats]:
    """Plain autoregressive decoding with the target's KV cache (the baseline; one forward per token).

    Returns the prompt followed by the new tokens (cut after the first stop token: ``eos_token_id``
    is one id or a list) and the stats.

    .. code-block:: python

        out, stats = plain_decode(TargetLM(model), prompt, max_new_tokens=32)
    """
    input_ids = _check_generate_args(input_ids, max_new_tokens, temperature, top_k, top_p)
    stops = _stop_set(eos_token_id)
    start = time.perf_counter()
    logits, _ = target.start(input_ids)
    stats = DecodeStats(prefill_seconds=time.perf_counter() - start)
    generated = [_choose(logits[-1], do_sample, temperature, generator, top_k, top_p)]
    while len(generated) < max_new_tokens and generated[-1] not in stops:
        t0 = time.perf_counter()
        logits = target.step(generated[-1])
        stats.verify_seconds += time.perf_counter() - t0
        stats.rounds += 1
        stats.accepted.append(0)
        generated.append(_choose(logits, do_sample, temperature, generator, top_k, top_p))
    stats.total_seconds = time.perf_counter() - start
    stats.new_tokens = len(generated)
    return torch.cat([input_ids, torch.tensor(generated, dtype=torch.long, device=input_ids.device)]), stats


class SpeculativeDecoder:
    """Draft a tree, verify it in one target forward, keep the accepted path (lossless).

    Args:
        target: the verifier (:class:`TargetLM`) or a transformers causal LM.
        drafter: a :class:`Drafter`.
        budget: verifier token budget: the most draft nodes per round (the root is extra).

    .. code-block:: python

        engine = SpeculativeDecoder(model, SpecBlockDrafter(net, block_size=4), budget=24)
        out, stats = engine.generate(prompt_ids, max_new_tokens=128, do_sample=True, temperature=0.7)
    """

    def __init__(self, target: TargetLM | nn.Module, drafter: Drafter, budget: int = 24) -> None:
        if budget < 1:
            raise ValueError(f"`budget` must be >= 1 draft node, got {budget}.")
        if not isinstance(drafter, Drafter):
            raise TypeError(f"`drafter` must be a lit_lowrank.decoding.Drafter, got {type(drafter).__name__}.")
        self.target = target if isinstance(target, TargetLM) else TargetLM(target)
        self.drafter = drafter
        self.budget = budget

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, eos_token_id: int | list[int] | None = None,
                 do_sample: bool = False, temperature: float = 1.0,
                 generator: torch.Generator | None = None, top_k: int | None = None,
                 top_p: float | None = None) -> tuple[Tensor, DecodeStats]:
        """Decode up to ``max_new_tokens`` after ``input_ids`` ``(T,)`` or ``(1, T)``.

        Returns the prompt followed by the new tokens (cut after the first stop token, exactly
        like plain decoding; ``eos_token_id`` is one id or a list) and the :class:`DecodeStats`.
        The prompt is 1-D here; :func:`~lit_lowrank.decoding.generate.speculative_generate`
        returns ``(1, T)`` like transformers ``generate``.
        """
        input_ids = _check_generate_args(input_ids, max_new_tokens, temperature, top_k, top_p)
        device = input_ids.device
        start = time.perf_counter()
        target, drafter, budget = self.target, self.drafter, self.budget
        uses_features = bool(getattr(drafter, "uses_features", True))
        target.feature_layers = getattr(drafter, "feature_layers", None) if uses_features else None
        logits, hidden = target.start(input_ids)
        stats = DecodeStats(prefill_seconds=time.perf_counter() - start)
        committed = _Committed(input_ids, max_new_tokens, budget + 1, hidden if uses_features else None, eos_token_id)
        committed.append([_choose(logits[-1], do_sample, temperature, generator, top_k, top_p)])
        drafter.reset()
        root_parent = torch.full((1,), -1, dtype=torch.long, device=device)
        while True:
            out, done = committed.result()
            if done:
                break
            request = committed.request(budget, target)
            t0 = time.perf_counter()
            tree = drafter.draft(request)
            t1 = time.perf_counter()
            if tree.tokens.numel() > budget:
                raise ValueError(f"{type(drafter).__name__} drafted {tree.tokens.numel()} nodes > budget {budget}.")
            layout = tree_layout(torch.cat([request.tokens[-1:], tree.tokens.to(device)]),
                                 torch.cat([root_parent, tree.parents.to(device) + 1]))
            logits, hidden = target.verify(layout)
            argmax = logits.argmax(-1)
            if do_sample:
                path, bonus = accept_sampling(layout, sampling_probs(logits, temperature, top_k, top_p), generator)
            else:
                path, bonus = accept_greedy(layout, argmax)
            target.keep(path)
            stats.verify_seconds += time.perf_counter() - t1
            stats.draft_seconds += t1 - t0
            accepted = layout.tokens[path[1:]].tolist() if len(path) > 1 else []
            committed.append(accepted + [bonus], hidden[path] if uses_features else None)
            stats.rounds += 1
            stats.accepted.append(len(path) - 1)
            stats.drafter_forwards += tree.forwards
            stats.draft_nodes += tree.tokens.numel()
            drafter.observe(RoundFeedback(request, tree, [p - 1 for p in path[1:]], argmax, hidden, bonus))
        stats.total_seconds = time.perf_counter() - start
        stats.new_tokens = out.numel() - input_ids.numel()
        return out.clone(), stats
