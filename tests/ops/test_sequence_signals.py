"""Logit baselines of stable rank: hand cases (uniform and one-hot predictions, masking)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.sequence_signals import mean_log_prob, negative_entropy, self_certainty, token_log_probs


def test_uniform_and_peaked_predictions():
    v = 5
    uniform = torch.zeros(1, 3, v)
    peaked = torch.full((1, 3, v), -1e4)
    peaked[..., 2] = 0.0
    logits = torch.cat([uniform, peaked])  # (2, 3, 5)
    targets = torch.full((2, 3), 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(mean_log_prob(logits, targets, mask), torch.tensor([-math.log(v), 0.0]))
    torch.testing.assert_close(negative_entropy(logits, mask), torch.tensor([-math.log(v), 0.0]), atol=1e-5, rtol=0)
    sc = self_certainty(logits, mask)
    assert float(sc[0]) == pytest.approx(0.0, abs=1e-6)  # KL(U || U) = 0
    assert float(sc[1]) > 1000  # a one-hot prediction is far from uniform


def test_masked_positions_do_not_count_and_shapes_are_checked():
    logits = torch.randn(1, 4, 7)
    targets = torch.randint(0, 7, (1, 4))
    mask = torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)
    changed = logits.clone()
    changed[0, 2:] = 50 * torch.randn(2, 7)
    torch.testing.assert_close(mean_log_prob(logits, targets, mask), mean_log_prob(changed, targets, mask))
    expected = torch.log_softmax(logits[0, :2], -1).gather(-1, targets[0, :2, None]).mean()
    assert float(mean_log_prob(logits, targets, mask)) == pytest.approx(float(expected), rel=1e-6)
    assert token_log_probs(logits, targets).shape == (1, 4)
    with pytest.raises(ValueError, match="mask"):
        negative_entropy(logits, torch.ones(1, 3, dtype=torch.bool))
