"""A ``generate``-shaped entry point: speculative decoding as a drop-in for transformers ``model.generate``.

:func:`speculative_generate` takes what ``generate`` takes for one sequence (``input_ids``
``(1, T)``, ``attention_mask``, ``max_new_tokens``, ``do_sample``, ``temperature``,
``top_k``, ``top_p``, ``eos_token_id`` — one id or a list of stop tokens — and the model's
``generation_config`` for whatever is not given) and returns what ``generate`` returns: a
``(1, T + new)`` tensor of the prompt followed by the new tokens. Greedy output is
identical to ``generate``'s; sampling draws from the same distribution (temperature, top-k
then top-p, as transformers' warpers). Options it cannot honour raise (batch > 1, beams,
repetition penalties, ...) instead of being ignored.

.. code-block:: python

    from lit_lowrank.decoding import speculative_generate

    out = speculative_generate(model, input_ids, max_new_tokens=64)          # prompt lookup in the engine
    assert torch.equal(out, model.generate(input_ids, max_new_tokens=64, do_sample=False))
    drafter = load_specblock_hybrid(model)                                   # the shipped SmolLM2 drafter
    out = speculative_generate(model, input_ids, max_new_tokens=64, drafter=drafter)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_lowrank.decoding.engine import DecodeStats, Drafter, SpeculativeDecoder, TargetLM

#: ``generate`` options that are accepted when they keep their neutral value (anything else raises).
_NEUTRAL: dict[str, Any] = {
    "num_beams": 1, "num_return_sequences": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "min_new_tokens": 0, "min_length": 0, "length_penalty": 1.0, "typical_p": 1.0, "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0, "min_p": None, "bad_words_ids": None, "force_words_ids": None, "num_beam_groups": 1,
    "diversity_penalty": 0.0, "output_scores": False, "output_logits": False, "return_dict_in_generate": False,
    "output_attentions": False, "output_hidden_states": False, "use_cache": True, "streamer": None,
    "logits_processor": None, "stopping_criteria": None, "prefix_allowed_tokens_fn": None, "assistant_model": None,
    "prompt_lookup_num_tokens": None, "pad_token_id": None, "bos_token_id": None, "max_length": None,
    "renormalize_logits": False, "suppress_tokens": None, "begin_suppress_tokens": None, "sequence_bias": None,
    "guidance_scale": None, "penalty_alpha": None, "constraints": None,
}


def _config_value(config: Any, name: str, given: Any) -> Any:
    return given if given is not None else getattr(config, name, None)


def _strip_left_padding(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """``(T',)`` the prompt without its left padding; the mask must be ones after leading zeros."""
    ids = input_ids[0]
    if attention_mask is None:
        return ids
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"`attention_mask` {tuple(attention_mask.shape)} must have the shape of `input_ids` "
                         f"{tuple(input_ids.shape)}.")
    mask = attention_mask[0].bool()
    first = int(mask.long().argmax()) if mask.any() else mask.numel()
    if first == mask.numel() or not mask[first:].all():
        raise ValueError("`attention_mask`: expected ones after optional left padding (zeros first), got "
                         f"{attention_mask[0].tolist()}; right or inner padding is not supported.")
    return ids[first:]


@torch.no_grad()
def speculative_generate(model: nn.Module | TargetLM, input_ids: Tensor, max_new_tokens: int | None = None,
                         drafter: Drafter | None = None, *, attention_mask: Tensor | None = None,
                         do_sample: bool | None = None, temperature: float | None = None, top_k: int | None = None,
                         top_p: float | None = None, eos_token_id: int | list[int] | None = None,
                         generation_config: Any = None, budget: int = 32,
                         generator: torch.Generator | None = None, return_stats: bool = False,
                         **generate_kwargs: Any) -> Tensor | tuple[Tensor, DecodeStats]:
    """Speculative decoding with ``generate``'s signature and return value, for one sequence.

    Args:
        model: a transformers causal LM (or a :class:`~lit_lowrank.decoding.TargetLM` around one).
        input_ids: ``(1, T)`` prompt (batch size 1; a left-padded row is accepted with its mask).
        max_new_tokens: tokens to generate at most (default: the model's ``generation_config``).
        drafter: any :class:`~lit_lowrank.decoding.Drafter`; ``None`` = prompt lookup in the engine
            (:class:`~lit_lowrank.decoding.hybrid.HybridDrafter` over an
            :class:`~lit_lowrank.decoding.hybrid.NgramDrafter`, sized by the default cost model, a
            2-core CPU's; on other hardware build the drafter with a cost from
            :func:`~lit_lowrank.decoding.cost.fit_verify_cost`).
        attention_mask: ``(1, T)``: ones, or zeros then ones (left padding, dropped).
        do_sample / temperature / top_k / top_p: as ``generate`` (defaults from ``generation_config``;
            transformers' defaults otherwise: greedy, temperature 1, top-k 50 when sampling).
        eos_token_id: one stop token or a list (default: ``generation_config.eos_token_id``).
        generation_config: a transformers ``GenerationConfig`` used instead of the model's for the
            defaults above (as ``generate(generation_config=...)``).
        budget: most draft nodes the verifier checks per round.
        generator: random generator for sampling.
        return_stats: also return the :class:`~lit_lowrank.decoding.DecodeStats`.
        **generate_kwargs: other ``generate`` options; accepted only at their neutral value
            (e.g. ``num_beams=1``, ``pad_token_id``), anything else raises ``ValueError``.

    Returns:
        ``(1, T + new)`` long tensor (``generate``'s layout; the left padding removed), and the
        stats with ``return_stats``.
    """
    target = model if isinstance(model, TargetLM) else TargetLM(model)
    config = generation_config if generation_config is not None else getattr(target.model, "generation_config", None)
    for name, value in generate_kwargs.items():
        if name not in _NEUTRAL:
            raise TypeError(f"speculative_generate: unknown option {name!r}.")
        if name in ("pad_token_id", "bos_token_id", "max_length") or value == _NEUTRAL[name] or value is None:
            if name == "max_length" and value is not None:
                raise ValueError("speculative_generate: `max_length` is not supported; give `max_new_tokens`.")
            continue
        raise ValueError(f"speculative_generate: `{name}`={value!r} is not supported (one sequence, greedy or "
                         f"temperature/top-k/top-p sampling); expected {_NEUTRAL[name]!r}.")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"speculative_generate: `input_ids` must be (1, T) with T >= 1 (batch size 1), got "
                         f"{tuple(input_ids.shape)}.")
    prompt = _strip_left_padding(input_ids, attention_mask)
    max_new_tokens = _config_value(config, "max_new_tokens", max_new_tokens)
    if max_new_tokens is None:
        raise ValueError("speculative_generate: give `max_new_tokens` (the model's generation_config has none).")
    do_sample = bool(_config_value(config, "do_sample", do_sample))
    temperature = _config_value(config, "temperature", temperature)
    temperature = 1.0 if temperature is None else float(temperature)
    if do_sample:
        top_k = _config_value(config, "top_k", top_k)
        top_k = 50 if top_k is None else top_k  # transformers' default when sampling
        top_p = _config_value(config, "top_p", top_p)
    eos = _config_value(config, "eos_token_id", eos_token_id)
    if drafter is None:
        from lit_lowrank.decoding.cost import VerifyCost
        from lit_lowrank.decoding.hybrid import HybridDrafter, NgramDrafter

        drafter = HybridDrafter(None, NgramDrafter(), cost=VerifyCost())
    engine = SpeculativeDecoder(target, drafter, budget)
    out, stats = engine.generate(prompt.to(target.device), int(max_new_tokens), eos, do_sample, temperature,
                                 generator, top_k=top_k if do_sample else None, top_p=top_p if do_sample else None)
    out = out[None]
    return (out, stats) if return_stats else out
