"""MoRA: the compression / decompression math (ops/mora.py) and its PEFT layer (adapters/mora.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lit_lowrank.adapters import inject_adapters
from lit_lowrank.ops.mora import mora_apply, mora_delta_weight, mora_rank


def _reference(x: torch.Tensor, m: torch.Tensor, out: int, kind: str) -> torch.Tensor:
    """The paper's operators written out chunk by chunk (Eq. 6 / Eq. 9), one sample at a time."""
    r_hat, n = m.shape[0], x.shape[-1]
    k = math.ceil(n / r_hat)
    padded = torch.cat([x, x[: k * r_hat - n]]) if k * r_hat > n else x
    chunks = [padded[j * r_hat:(j + 1) * r_hat] for j in range(k)]
    if kind == "sharing":
        y = m @ sum(chunks)
    else:
        ys = []
        for j, c in enumerate(chunks):
            rot = torch.zeros(r_hat, r_hat, dtype=x.dtype)
            for i in range(r_hat // 2):  # RoPE: pairs (i, i + r̂/2) rotated by angle j·θ_i
                theta = j / 10000 ** (2 * i / r_hat)
                a, b = i, i + r_hat // 2
                rot[a, a], rot[a, b], rot[b, a], rot[b, b] = math.cos(theta), -math.sin(theta), math.sin(theta), math.cos(theta)
            ys.append(m @ (rot @ c))
        y = torch.cat(ys)
    return torch.cat([y] * math.ceil(out / y.numel()))[:out]


@pytest.mark.parametrize("kind", ["sharing", "rope"])
@pytest.mark.parametrize("n, out, r_hat", [(12, 12, 4), (13, 7, 4), (10, 30, 6), (5, 9, 8)])
def test_apply_matches_the_papers_operators_and_the_explicit_matrix(kind, n, out, r_hat):
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(r_hat, r_hat, generator=gen, dtype=torch.float64)
    x = torch.randn(3, n, generator=gen, dtype=torch.float64)
    y = mora_apply(x, m, out, kind)
    torch.testing.assert_close(y, torch.stack([_reference(row, m, out, kind) for row in x]))
    torch.testing.assert_close(y, x @ mora_delta_weight(m, n, out, kind).T)


def test_rank_budget_never_exceeds_loras_and_rope_reaches_above_r_hat():
    assert mora_rank(64, 64, 4, "sharing") == 22 and 22 ** 2 <= 4 * 128
    assert mora_rank(384, 384, 8, "rope") == 78 and 78 ** 2 <= 8 * 768
    assert mora_rank(64, 64, 4, "rope") == 22
    m = torch.randn(22, 22, dtype=torch.float64)
    sharing = torch.linalg.matrix_rank(mora_delta_weight(m, 64, 64, "sharing"))
    rope = torch.linalg.matrix_rank(mora_delta_weight(m, 64, 64, "rope"))
    assert sharing <= 22 < rope
    with pytest.raises(ValueError, match="kind"):
        mora_rank(8, 8, 1, "square")


def test_layer_starts_at_zero_trains_merges_and_counts_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64))
    x = torch.randn(5, 64)
    before = model(x).detach()
    inject_adapters(model, method="mora", target_modules=["0"], rank=4)
    layer = model[0]
    torch.testing.assert_close(model(x), before)  # M = 0
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == 22 * 22 <= 4 * (64 + 64)
    opt = torch.optim.SGD(trainable, lr=0.1)
    loss = model(x).pow(2).sum()
    loss.backward()
    opt.step()
    out = model(x).detach()
    torch.testing.assert_close(out, x @ (layer.get_base_layer().weight + layer.get_delta_weight("default")).T
                               + layer.get_base_layer().bias)
    layer.merge()
    torch.testing.assert_close(model(x), out, rtol=1e-5, atol=1e-5)
    layer.unmerge()
    torch.testing.assert_close(model(x), out, rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="mora_type"):
        inject_adapters(nn.Sequential(nn.Linear(8, 8)), method="mora", target_modules=["0"], rank=2, mora_type="x")
    with pytest.raises(ValueError, match="mora_rank"):
        inject_adapters(nn.Sequential(nn.Linear(8, 8)), method="mora", target_modules=["0"], rank=2, mora_rank=3)
