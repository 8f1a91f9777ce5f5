"""The SmolLM2 multiple-choice benchmark's per-question scores, pooled ECE and pass averaging (no model run)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.benchmarks.polar_vbll_mc import _ece, _mean_over_passes, _unit_scores


def test_unit_scores_are_nll_brier_and_correctness_per_question():
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    rows = _unit_scores(probs, torch.tensor([0, 2]))
    assert rows[0]["nll"] == pytest.approx(-math.log(0.7))
    assert rows[0]["brier"] == pytest.approx(0.3**2 + 3 * 0.1**2)
    assert rows[0]["acc"] == 1.0 and rows[1]["acc"] == 0.0  # a tie's argmax is option 0
    assert rows[1]["nll"] == pytest.approx(math.log(4)) and rows[1]["confidence"] == pytest.approx(0.25)


def test_ece_is_zero_when_confidence_matches_accuracy_and_the_gap_otherwise():
    calibrated = [{"confidence": 0.75, "acc": a} for a in (1, 1, 1, 0)]
    assert _ece(calibrated) == pytest.approx(0.0)
    overconfident = [{"confidence": 0.95, "acc": a} for a in (1, 0)] + [{"confidence": 0.35, "acc": 0.0}] * 2
    assert _ece(overconfident) == pytest.approx(0.5 * 0.45 + 0.5 * 0.35)


def test_passes_are_averaged_per_method_and_question():
    raw = [{"method": "m", "question": q, "pass": p, "nll": q + p, "brier": 0.0, "acc": float(p), "confidence": 0.5}
           for q in (0, 1) for p in (0, 1)]
    rows = _mean_over_passes(raw)
    assert [(r["question"], r["nll"], r["acc"]) for r in rows] == [(0, 0.5, 0.5), (1, 1.5, 0.5)]
