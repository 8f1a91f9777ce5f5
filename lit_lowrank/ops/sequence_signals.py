"""Per-response confidence signals from an LM's logits: the baselines stable rank is compared with.

All take next-token ``logits (B, T, V)`` aligned with ``targets (B, T)`` (``logits[:, t]`` is the
prediction of ``targets[:, t]``) and a response ``mask (B, T)``; they average over the masked
tokens in float32 and return ``(B,)``. Higher means "more confident / better" for every one of
them, so a selector takes the argmax of any of them:

- :func:`mean_log_prob`: mean log-probability of the response's tokens;
- :func:`negative_entropy`: minus the mean entropy of the next-token distributions;
- :func:`self_certainty`: mean KL(uniform ‖ p) of the next-token distributions (Kang et al.,
  2025, "Scalable Best-of-N Selection for LLMs via Self-Certainty").

.. code-block:: python

    logits = model(input_ids).logits[:, :-1]
    targets = input_ids[:, 1:]
    score = mean_log_prob(logits, targets, response_mask[:, 1:])
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["mean_log_prob", "negative_entropy", "self_certainty", "token_log_probs"]


def _check(logits: Tensor, mask: Tensor) -> Tensor:
    if logits.dim() != 3 or mask.shape != logits.shape[:2]:
        raise ValueError(f"`logits` must be (B, T, V) and `mask` (B, T); got {tuple(logits.shape)} and "
                         f"{tuple(mask.shape)}.")
    return mask.to(device=logits.device, dtype=torch.float32)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def token_log_probs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log p(targets[b, t])`` under ``logits[b, t]``: ``(B, T)`` float32.

    Computed as ``logit − logsumexp`` so the full ``(B, T, V)`` log-softmax is never stored.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"`targets` must have shape {tuple(logits.shape[:-1])}, got {tuple(targets.shape)}.")
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1).long()).squeeze(-1) - torch.logsumexp(logits, -1)


def mean_log_prob(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Mean log-probability of the masked target tokens, ``(B,)``."""
    m = _check(logits, mask)
    return _masked_mean(token_log_probs(logits, targets), m)


def negative_entropy(logits: Tensor, mask: Tensor) -> Tensor:
    """Minus the mean next-token entropy over the masked positions, ``(B,)``."""
    m = _check(logits, mask)
    logp = torch.log_softmax(logits.float(), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return -_masked_mean(entropy, m)


def self_certainty(logits: Tensor, mask: Tensor) -> Tensor:
    """Mean ``KL(U ‖ p) = −log V − (1/V) Σ_j log p_j`` over the masked positions, ``(B,)``."""
    m = _check(logits, mask)
    logp = torch.log_softmax(logits.float(), -1)
    vocab = logits.shape[-1]
    kl = -math.log(vocab) - logp.mean(-1)
    return _masked_mean(kl, m)
