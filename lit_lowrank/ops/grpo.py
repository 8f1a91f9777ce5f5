"""GRPO's math: group-normalised advantages and the clipped, KL-regularised policy loss.

Group Relative Policy Optimization (Shao et al., 2024, DeepSeekMath) samples ``G`` responses per
prompt, scores them, and uses each response's reward standardised within its group as the
advantage of every one of its tokens:

``A_i = (r_i − mean(r_group)) / (std(r_group) + eps)``

The loss per token is PPO's clipped surrogate plus a KL penalty to a frozen reference policy
(the unbiased ``k3`` estimator ``exp(q − p) − (q − p) − 1`` with ``p = log π_θ``, ``q = log π_ref``):

``ℓ_t = −min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A) + β k3_t``,   ``ρ_t = exp(log π_θ − log π_old)``.

.. code-block:: python

    adv = group_advantages(rewards, group_size=8)           # rewards: (B * 8,)
    loss, stats = grpo_loss(logp, logp_old, logp_ref, adv, mask, clip_eps=0.2, beta=0.04)
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["group_advantages", "grpo_loss"]

LossAggregation = Literal["sequence", "token"]


def group_advantages(rewards: Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> Tensor:
    """Group-normalised advantages for rewards laid out group by group.

    Args:
        rewards: ``(B * G,)`` rewards, the ``G`` responses of prompt ``b`` at ``[b*G:(b+1)*G]``.
        group_size: ``G`` (≥ 2).
        scale: divide by the group's standard deviation (unbiased, as in the GRPO paper); with
            ``False`` only the mean is subtracted (Dr. GRPO).
        eps: added to the standard deviation, so a group of equal rewards gets advantage 0.

    Returns:
        ``(B * G,)`` float32 advantages.

    .. code-block:: python

        group_advantages(torch.tensor([1., 0., 0., 1.]), group_size=2)   # [0.707, -0.707, -0.707, 0.707]
    """
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"`group_size` must be an integer >= 2, got {group_size!r}.")
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"`rewards` must be 1-D with a length divisible by group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}.")
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(-1, keepdim=True)
    if scale:
        centered = centered / (grouped.std(-1, keepdim=True) + eps)
    return centered.view(-1)


def grpo_loss(
    logp: Tensor,
    logp_old: Tensor,
    logp_ref: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    beta: float = 0.04,
    aggregation: LossAggregation = "sequence",
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO objective (to minimise) and its diagnostics.

    Args:
        logp: ``(N, T)`` log-probabilities of the sampled tokens under the current policy (with grad).
        logp_old: ``(N, T)`` the same under the sampling policy (no grad); equal to ``logp`` on the
            first update after sampling, where the ratio is 1 and only its gradient matters.
        logp_ref: ``(N, T)`` under the frozen reference policy, or ``None`` when ``beta == 0``.
        advantages: ``(N,)`` one advantage per response.
        mask: ``(N, T)`` True on the response's tokens.
        clip_eps: PPO clip range ``ε``.
        beta: KL coefficient ``β``.
        aggregation: ``"sequence"`` (GRPO: mean over each response's tokens, then over responses)
            or ``"token"`` (DAPO: mean over all tokens of the batch, so long responses weigh more).

    Returns:
        ``(loss, stats)`` with ``stats`` holding detached ``kl``, ``clip_fraction`` and ``ratio`` means.

    Raises:
        ValueError: on mismatched shapes, a missing reference with ``beta > 0`` or an unknown
            ``aggregation``.
    """
    if logp.shape != logp_old.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(f"`logp`, `logp_old` and `mask` must share one (N, T) shape; got {tuple(logp.shape)}, "
                         f"{tuple(logp_old.shape)}, {tuple(mask.shape)}.")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"`advantages` must be ({logp.shape[0]},), got {tuple(advantages.shape)}.")
    if beta > 0 and logp_ref is None:
        raise ValueError(f"`logp_ref` is required when beta={beta} > 0.")
    if aggregation not in ("sequence", "token"):
        raise ValueError(f"`aggregation`={aggregation!r}, expected 'sequence' or 'token'.")
    m = mask.float()
    adv = advantages.float().unsqueeze(-1)
    ratio = torch.exp(logp - logp_old.detach())
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    kl = torch.zeros_like(per_token)
    if beta > 0:
        diff = logp_ref.detach() - logp
        kl = torch.exp(diff) - diff - 1.0
        per_token = per_token + beta * kl
    if aggregation == "sequence":
        loss = ((per_token * m).sum(-1) / m.sum(-1).clamp_min(1.0)).mean()
    else:
        loss = (per_token * m).sum() / m.sum().clamp_min(1.0)
    total = m.sum().clamp_min(1.0)
    with torch.no_grad():
        stats = {
            "kl": (kl * m).sum() / total,
            "clip_fraction": (((ratio - clipped).abs() > 0).float() * m).sum() / total,
            "ratio": (ratio * m).sum() / total,
        }
    return loss, stats
