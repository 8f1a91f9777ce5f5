"""GRPO advantages and loss on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.grpo import group_advantages, grpo_loss


def test_group_advantages_hand_case():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])  # two groups of 3
    adv = group_advantages(rewards, 3, eps=0.0)
    # group 1: mean 1/3, unbiased std sqrt(1/3); group 2: mean 2, std 2
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, -1.0, 0.0, 1.0])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(group_advantages(rewards, 3, scale=False),
                               torch.tensor([2 / 3, -1 / 3, -1 / 3, -2.0, 0.0, 2.0]))
    # equal rewards in a group: no signal
    assert torch.all(group_advantages(torch.tensor([5.0, 5.0, 1.0, 3.0]), 2)[:2] == 0)


def test_group_advantages_validates():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="divisible"):
        group_advantages(torch.zeros(5), 2)


def test_grpo_loss_hand_case():
    # two responses, three token slots; the second response has two tokens
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.1, 0.0]], requires_grad=True)
    logp_old = torch.tensor([[-1.0, -2.5, -0.5], [-0.2, -0.6, 0.0]])
    logp_ref = torch.tensor([[-1.0, -2.0, -1.5], [-0.7, -0.1, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    eps, beta = 0.2, 0.1
    # by hand, per token: ratio r = exp(logp - logp_old); surrogate = -min(r A, clip(r) A); k3 = e^d - d - 1, d = ref - logp
    r = [[1.0, math.exp(0.5), 1.0], [1.0, math.exp(0.5)]]
    d = [[0.0, 0.0, -1.0], [-0.5, 0.0]]
    a = [1.0, -2.0]
    per_seq = []
    for i in range(2):
        terms = []
        for j in range(len(r[i])):
            ri = r[i][j]
            clipped = min(max(ri, 1 - eps), 1 + eps)
            surrogate = -min(ri * a[i], clipped * a[i])
            k3 = math.exp(d[i][j]) - d[i][j] - 1
            terms.append(surrogate + beta * k3)
        per_seq.append(sum(terms) / len(terms))
    loss, stats = grpo_loss(logp, logp_old, logp_ref, adv, mask, eps, beta)
    assert float(loss.detach()) == pytest.approx(sum(per_seq) / 2, rel=1e-6)
    # token 1 of response 0: ratio 1.65 > 1.2 with A > 0 -> clipped (no gradient from the surrogate, k3 grad 0 there)
    # token 1 of response 1: ratio 1.65 with A < 0 -> min picks the unclipped term: gradient -r A / 2 / 2
    loss.backward()
    assert float(logp.grad[0, 1]) == pytest.approx(0.0, abs=1e-7)
    assert float(logp.grad[1, 1]) == pytest.approx(-(math.exp(0.5) * -2.0) / 2 / 2, rel=1e-6)
    assert float(logp.grad[1, 2]) == 0.0  # masked
    assert float(stats["clip_fraction"]) == pytest.approx(2 / 5)
    expected_kl = (0 + 0 + (math.exp(-1) + 1 - 1) + (math.exp(-0.5) + 0.5 - 1) + 0) / 5
    assert float(stats["kl"]) == pytest.approx(expected_kl, rel=1e-6)


def test_grpo_loss_token_aggregation_and_first_update_gradient():
    logp = torch.tensor([[-1.0, -1.0], [-1.0, 0.0]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    loss, _ = grpo_loss(logp, logp.detach(), None, adv, mask, beta=0.0, aggregation="token")
    assert float(loss.detach()) == pytest.approx(-(1 + 1 - 1) / 3)
    loss.backward()
    # on the first update (ratio 1) the gradient is the policy gradient: -A / n_tokens per token
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -1 / 3], [1 / 3, 0.0]]))


def test_grpo_loss_validates():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(x, x, None, torch.zeros(2), x.bool(), beta=0.1)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, x, x, torch.zeros(3), x.bool())
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(x, x, x, torch.zeros(2), x.bool(), aggregation="batch")
