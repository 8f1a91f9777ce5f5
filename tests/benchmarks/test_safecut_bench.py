"""The SafeCut benchmark's controls and second model: the shuffled gate is a coin flip in
direction, the permuted second model renames classes, the cross-dataset model transfers."""

from __future__ import annotations

import torch
from torch import nn

from lit_lowrank.benchmarks.safecut import OracleGateSafeCut, PermutedLabels, ShuffledGateSafeCut
from lit_lowrank.ops.safecut_gate import safecut_gate


class _Fixed(nn.Module):
    def __init__(self, logits: torch.Tensor, feats: torch.Tensor) -> None:
        super().__init__()
        self.logits, self.feats = logits, feats

    def forward(self, x):
        return self.logits

    def forward_features(self, x):
        return self.feats


def test_shuffled_gate_direction_is_a_fair_coin():
    """A gate whose statistics always let model a teach b becomes ~50/50 once shuffled across models."""
    torch.manual_seed(0)
    n, c = 400, 4
    y = torch.arange(c).repeat_interleave(n // c)
    clustered = nn.functional.one_hot(y, c).float() * 5 + 0.1 * torch.randn(n, c)
    labels_b = torch.randint(0, c, (n,))  # b's labels are noise on every graph
    cb = ShuffledGateSafeCut(_Fixed(nn.functional.one_hot(labels_b, c).float(), torch.randn(n, c)),
                             graph_features="first", adapt_second=False, shuffle_seed=0)
    z_a, z_b = cb.reliability({"x": y}, clustered, torch.randn(n, c), y, labels_b, c)
    to_a, to_b = safecut_gate(z_a.z, z_b.z)
    plain = ShuffledGateSafeCut.__mro__[1].reliability(cb, {"x": y}, clustered, torch.randn(n, c), y, labels_b, c)
    plain_to_a, plain_to_b = safecut_gate(plain[0].z, plain[1].z)
    assert (plain_to_b > 0).float().mean() > 0.8 and (plain_to_a > 0).sum() < 10  # unshuffled: a teaches
    share = float((to_a > 0).sum()) / float(((to_a > 0) | (to_b > 0)).sum())
    assert 0.35 < share < 0.65


def test_permuted_labels_rename_every_class():
    logits = torch.eye(10)
    wrapped = PermutedLabels(_Fixed(logits, torch.zeros(10, 3)))
    assert torch.equal(wrapped(None).argmax(-1), (torch.arange(10) + 1) % 10)
    assert torch.equal(wrapped.forward_features(None), torch.zeros(10, 3))


def test_oracle_gate_teaches_only_right_labels_to_wrong_ones():
    torch.manual_seed(0)
    n, c = 90, 3
    y = torch.arange(c).repeat_interleave(n // c)
    labels_a, labels_b = y.clone(), y.clone()
    labels_a[:30] = (labels_a[:30] + 1) % c  # a wrong on 0..29
    labels_b[20:50] = (labels_b[20:50] + 1) % c  # b wrong on 20..49 (both wrong on 20..29)
    feats = torch.randn(n, 4)
    cb = OracleGateSafeCut(_Fixed(nn.functional.one_hot(labels_b, c).float(), feats), graph_features="first",
                           adapt_second=False)
    z_a, z_b = cb.reliability({"x": y, "y": y}, feats, feats, labels_a, labels_b, c)
    to_a, to_b = safecut_gate(z_a.z, z_b.z)
    assert torch.equal(to_a > 0.99, torch.arange(n) < 20)  # b right, a wrong
    assert torch.equal(to_b > 0.99, (torch.arange(n) >= 30) & (torch.arange(n) < 50))  # a right, b wrong
    assert int(((to_a > 0) | (to_b > 0)).sum()) == 40
