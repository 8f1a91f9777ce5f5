"""The CAMEL benchmark's matched-unfamiliarity comparison (pure bookkeeping on rows)."""

from __future__ import annotations

import pytest

from lit_lowrank.benchmarks.camel import matched_lk_gap


def _rows(method, unit, points):
    return [{"method": method, "unit": unit, "radius": r, "l0": l0, "lk": lk} for r, (l0, lk) in points.items()]


def test_matched_lk_gap_interpolates_the_reference_sweep_at_the_methods_l0():
    radii = (0.5, 1.0)
    rows = (_rows("class_embedding", "u", {0.0: (0.1, 0.1)})
            + _rows("novelty", "u", {0.5: (0.3, 0.3), 1.0: (0.5, 0.5)})       # L_K = L0 along the sweep
            + _rows("camel", "u", {0.5: (0.2, 0.1), 1.0: (0.4, 0.2)}))
    gaps, units = matched_lk_gap(rows, "camel", "novelty", radii)
    # at L0 0.2 the reference has L_K 0.2 (gap -0.1); at 0.4, 0.4 (gap -0.2)
    assert units == ["u"] and gaps == [pytest.approx(-0.15)]
    # beyond the sweep's ends the reference is held constant: no extrapolation in the method's favour
    rows += _rows("far", "u", {0.5: (0.9, 0.6), 1.0: (0.05, 0.0)})
    gaps, _ = matched_lk_gap(rows, "far", "novelty", radii)
    assert gaps == [pytest.approx(((0.6 - 0.5) + (0.0 - 0.1)) / 2)]
    # a method identical to the reference has no gap
    rows += _rows("same", "u", {0.5: (0.3, 0.3), 1.0: (0.5, 0.5)})
    assert matched_lk_gap(rows, "same", "novelty", radii)[0] == [pytest.approx(0.0)]
