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


def test_basin_growth_is_the_ratio_of_basin_ratios_across_bank_sizes():
    from lit_lowrank.benchmarks.camel import basin_growth

    def row(method, unit, d32, d512):
        return {"method": method, "unit": unit, "basin_dist_32": d32, "basin_dist_512": d512}

    rows = [row("class_embedding", "a", 2.0, 1.0), row("class_embedding", "b", 3.0, 2.0),
            row("inside", "a", 2.2, 1.1), row("inside", "b", 3.3, 2.2),      # shrinks with vanilla's spread
            row("outside", "a", 4.0, 4.0), row("outside", "b", 6.0, 6.0)]    # does not shrink
    growth, units = basin_growth(rows, {"method": "inside"}, 32, 512)
    assert units == ["a", "b"] and growth == [pytest.approx(1.0), pytest.approx(1.0)]
    growth, _ = basin_growth(rows, {"method": "outside"}, 32, 512)
    assert growth == [pytest.approx(2.0), pytest.approx(1.5)]
