"""STAC-R's rank for a fidelity target: the closed-form cosine curve against brute force, the choice, errors."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.ops.stac_r.rank import rank_cosine_curve, select_rank


def _spread(n: int, d: int, decay: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scales = decay ** torch.arange(d, dtype=torch.float32)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    return (torch.randn(n, d, generator=g) * scales) @ q.T


@pytest.mark.parametrize("n", [40, 300])  # fewer rows than d (SVD path) and more (Gram eigh path)
def test_grad_cosine_curve_is_the_cosine_of_the_truncated_gradient(n):
    x = _spread(n, 64, 0.93)
    g = torch.randn(n, 12, generator=torch.Generator().manual_seed(1))
    curve, v = rank_cosine_curve(x, g, "grad_cosine")
    exact = (g.T @ x).flatten()
    for r in (1, 5, 17, 40):
        approx = (g.T @ (x @ v[:, :r] @ v[:, :r].T)).flatten()
        brute = float(approx @ exact / (approx.norm() * exact.norm()))
        assert float(curve[r - 1]) == pytest.approx(brute, abs=1e-4)
    assert float(curve[-1]) == pytest.approx(1.0, abs=1e-5)
    assert bool((curve[1:] >= curve[:-1] - 1e-6).all())  # adding directions never lowers it


def test_energy_curve_is_the_reconstruction_cosine():
    x = _spread(200, 48, 0.9)
    curve, v = rank_cosine_curve(x, criterion="energy")
    for r in (2, 10, 30):
        x_r = x @ v[:, :r] @ v[:, :r].T
        brute = float((x_r * x).sum() / (x_r.norm() * x.norm()))
        assert float(curve[r - 1]) == pytest.approx(brute, abs=1e-4)


def test_select_rank_is_the_smallest_multiple_reaching_target_plus_margin():
    x = _spread(256, 96, 0.95)
    g = torch.randn(256, 16, generator=torch.Generator().manual_seed(2))
    curve, _ = rank_cosine_curve(x, g)
    choice = select_rank(x, g, target=0.98, margin=0.005, multiple=8)
    need = int((curve >= 0.985 - 1e-6).nonzero()[0]) + 1
    assert choice.rank == 8 * -(-need // 8) and choice.rank % 8 == 0
    assert choice.cosine >= 0.985 - 1e-6
    assert choice.rank - 8 < need  # one multiple below does not reach it
    assert torch.allclose(choice.basis.T @ choice.basis, torch.eye(choice.rank), atol=1e-4)
    # a higher target needs at least as many directions; an unreachable one takes the cap
    assert select_rank(x, g, target=0.999, margin=0.0, multiple=1).rank >= select_rank(x, g, 0.98, multiple=1).rank
    assert select_rank(x, g, target=1.0, margin=0.0, multiple=1, max_rank=20).rank == 20


def test_select_rank_with_fewer_rows_than_the_rank_completes_the_basis():
    x = _spread(6, 32, 0.99)
    choice = select_rank(x, None, target=1.0, criterion="energy", margin=0.0, multiple=8)
    assert choice.rank == 8 and choice.basis.shape == (32, 8)
    assert torch.allclose(choice.basis.T @ choice.basis, torch.eye(8), atol=1e-5)


def test_select_rank_errors_name_the_parameter():
    x = torch.randn(10, 8)
    with pytest.raises(ValueError, match="target"):
        select_rank(x, torch.randn(10, 3), target=1.5)
    with pytest.raises(ValueError, match="grad_out"):
        select_rank(x, None, target=0.9)
    with pytest.raises(ValueError, match="criterion"):
        rank_cosine_curve(x, criterion="spectral")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_rank"):
        select_rank(x, None, target=0.9, criterion="energy", min_rank=9)
