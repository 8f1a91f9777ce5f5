"""CrossDatasetDigitClassifier checks its own training: inputs in the wrong units and a model at chance raise."""

from __future__ import annotations

import pytest

from lit_lowrank.models import CrossDatasetDigitClassifier


def test_standardisation_in_the_wrong_units_is_refused():
    # scikit-learn's 0-16 counts instead of pixel intensities in [0, 1]
    with pytest.raises(ValueError, match=r"`input_mean`=4\.9.*pixel intensity in \[0, 1\]"):
        CrossDatasetDigitClassifier(seed=0, input_mean=4.9, input_std=6.0, cache=False)


def test_a_model_at_chance_raises_instead_of_returning(monkeypatch):
    """Training that leaves the model at chance (here: skipped) is an error naming the settings."""
    monkeypatch.setattr(CrossDatasetDigitClassifier, "_train", lambda self, seed, epochs: None)
    with pytest.raises(RuntimeError, match=r"held-out accuracy 0\.\d+ < min_val_acc=0\.5"):
        CrossDatasetDigitClassifier(seed=0, input_mean=0.3, input_std=0.4, cache=False)


def test_a_trained_model_reports_its_held_out_accuracy(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_LOWRANK_CACHE", str(tmp_path))
    model = CrossDatasetDigitClassifier(seed=0, epochs=1, input_mean=0.3, input_std=0.4)
    assert model.val_acc > 0.5
    again = CrossDatasetDigitClassifier(seed=0, epochs=1, input_mean=0.3, input_std=0.4)  # from the cache
    assert again.val_acc == pytest.approx(model.val_acc)
