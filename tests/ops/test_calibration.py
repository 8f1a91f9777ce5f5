"""Calibration metrics (ops/calibration.py) against known values."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.ops.calibration import (
    OODAUROC,
    MulticlassBrierScore,
    MulticlassNLL,
    calibration_metrics,
    ood_score,
)

PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5], [0.9, 0.05, 0.05]])
Y = torch.tensor([0, 2, 2, 1])


def test_nll_known_value_and_batching():
    expected = -(math.log(0.7) + math.log(0.3) + math.log(0.5) + math.log(0.05)) / 4
    nll = MulticlassNLL()
    nll.update(PROBS[:1], Y[:1])
    nll.update(PROBS[1:], Y[1:])  # accumulates over batches, weighted by samples
    assert nll.compute().item() == pytest.approx(expected, rel=1e-6)
    assert MulticlassNLL(eps=1e-3)(torch.tensor([[1.0, 0.0]]), torch.tensor([1])).item() == pytest.approx(
        -math.log(1e-3))


def test_brier_known_value():
    rows = [(0.3**2 + 0.2**2 + 0.1**2), (0.1**2 + 0.6**2 + 0.7**2), (0.25**2 * 2 + 0.5**2), (0.9**2 + 0.95**2 + 0.05**2)]
    assert MulticlassBrierScore()(PROBS, Y).item() == pytest.approx(sum(rows) / 4, rel=1e-6)
    assert MulticlassBrierScore()(torch.eye(3), torch.arange(3)).item() == 0.0


def test_collection_ece_is_torchmetrics_15_bins():
    values = calibration_metrics(3)(PROBS, Y)
    assert set(values) == {"acc", "ece", "nll", "brier"}
    assert values["acc"].item() == pytest.approx(0.5)
    # 15 bins of width 1/15: confidences 0.7, 0.6, 0.5, 0.9 fall in 4 bins with 1 sample each;
    # |acc - conf| = 0.3 (right), 0.6 (wrong), 0.5 (right), 0.9 (wrong)
    assert values["ece"].item() == pytest.approx((0.3 + 0.6 + 0.5 + 0.9) / 4, rel=1e-5)


def test_ood_auroc_known_values():
    sharp = torch.tensor([[0.95, 0.05], [0.9, 0.1], [0.8, 0.2]])
    flat = torch.tensor([[0.55, 0.45], [0.6, 0.4], [0.85, 0.15]])
    auroc = OODAUROC()
    auroc.update(sharp, ood=False)
    auroc.update(flat, ood=True)
    # OOD scores 1 - max p: ID {0.05, 0.1, 0.2}, OOD {0.45, 0.4, 0.15}: 8 of 9 pairs ordered
    assert auroc.compute().item() == pytest.approx(8 / 9, rel=1e-6)
    reverse = OODAUROC()
    reverse.update(flat[:2], ood=False)
    reverse.update(sharp, ood=True)
    assert reverse.compute().item() == pytest.approx(0.0)
    entropy = ood_score(torch.tensor([[0.5, 0.5]]), "entropy")
    assert entropy.item() == pytest.approx(math.log(2))


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="score"):
        OODAUROC(score="energy")
    with pytest.raises(ValueError, match="target"):
        MulticlassNLL()(PROBS, Y[:2])
    with pytest.raises(ValueError, match="num_classes"):
        calibration_metrics(1)


def test_temperature_scaling_recovers_the_temperature_that_generated_the_labels():
    from lit_lowrank.ops.calibration import fit_temperature

    gen = torch.Generator().manual_seed(0)
    logits = 3.0 * torch.randn(4000, 5, generator=gen)
    labels = torch.multinomial((logits / 2.5).softmax(-1), 1, generator=gen).squeeze(1)  # true T = 2.5
    assert fit_temperature(logits, labels) == pytest.approx(2.5, rel=0.1)


def _blobs():
    gen = torch.Generator().manual_seed(0)
    centers = 2.0 * torch.randn(3, 6, generator=gen)
    y = torch.arange(60) % 3
    return centers[y] + torch.randn(60, 6, generator=gen), y


def test_last_layer_laplace_head_is_the_map_of_the_prior_it_reports():
    from lit_lowrank.ops.laplace_ll import fit_last_layer_laplace

    x, y = _blobs()
    predict, info = fit_last_layer_laplace(x, y, num_classes=3)
    head, delta = info["head"], info["prior_precision"]
    assert info["converged"] and delta > 0
    # the head is a stationary point of the log joint Σ CE + δ/2 ‖w‖² at (within 1% of) the reported precision
    params = list(head.parameters())
    data_grad = torch.autograd.grad(torch.nn.functional.cross_entropy(head(x), y, reduction="sum"), params)
    joint = [g + delta * p.detach() for g, p in zip(data_grad, params)]
    assert sum(float(g.norm()) for g in joint) < 0.05 * sum(float(g.norm()) for g in data_grad)
    probs = predict(x)
    torch.testing.assert_close(probs.sum(-1), torch.ones(60))
    assert float((probs.argmax(-1) == y).float().mean()) > 0.8


def test_marglik_precision_is_laplace_torchs_own_optimum():
    from laplace import Laplace

    from lit_lowrank.ops.laplace_ll import _map_head, marglik_precision

    x, y = _blobs()
    head = _map_head(x, y, 3, precision=1.0, init=None)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=60)
    la = Laplace(head, "classification", subset_of_weights="all", hessian_structure="full", prior_precision=1.0)
    la.fit(loader)
    ours = marglik_precision(la, torch.cat([p.detach().flatten() for p in head.parameters()]), 1.0)
    la.optimize_prior_precision(method="marglik", n_steps=300, lr=0.1)
    assert ours == pytest.approx(float(la.prior_precision), rel=0.02)
