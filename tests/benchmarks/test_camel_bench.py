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


def test_claims_put_a_same_radius_random_move_beside_every_claim_and_catch_collapse():
    import numpy as np

    from lit_lowrank.benchmarks import camel as bench
    from lit_lowrank.benchmarks.harness import resolve

    rng = np.random.default_rng(0)
    rows = []
    for u in range(6):
        def add(method, radius, diversity, basin, l0, lk, rec=0.9):
            rows.append({"method": method, "radius": radius, "unit": f"u{u}", "l0": l0, "lk": lk,
                         "reward": l0 - lk, "reward_insample": l0 - lk + 0.01 * (method == "camel"),
                         "recognised": rec, "recognised_wrong": 0.02, "diversity": diversity,
                         "basin_dist": basin[1], "basin_dist_32": basin[0], "basin_dist_512": basin[1]})
        noise = 1 + 0.01 * rng.standard_normal(8)
        add("class_embedding", 0.0, 4.0 * noise[0], (2.9, 2.4), 0.09, 0.10)
        add("class_embedding_2", 0.0, 4.0 * noise[1], (2.9 * noise[2], 2.4 * noise[3]), 0.09, 0.10)
        for r in bench.RADII:
            add("random", r, 4.0 * noise[4], (3.0 + r / 3, 2.5 + r / 3), 0.09 + r / 50, 0.10)
            add("random_b", r, 4.0 * noise[5], (3.0 + r / 3, 2.5 + r / 3), 0.09 + r / 50, 0.10 * noise[6])
            add("novelty", r, 4.0, (3.5 + r, 3.0 + r), 0.09 + r / 5, 0.09 + r / 6)
            add("camel", r, 2.8 * noise[7], (3.1 + r / 2, 2.7 + r / 2), 0.09 + r / 20, 0.08)  # collapsed: 70%
    claims, controls, premises, competitors = bench._claims(rows)
    resolved = {c["name"]: c for c in resolve(claims, premises, competitors)}
    assert set(resolved) == {c["for"] for c in competitors}  # every claim has its random-move competitor
    assert all(p["verdict"] == "holds" for p in premises)
    assert resolved["diversity"]["verdict"] == "fails"
    assert resolved["diversity"]["estimate"] == pytest.approx(0.7, abs=0.02)
    assert resolved["basin"]["matched_by"] == ["a random move of the same radius (draw B)"]  # random leaves too
    assert resolved["basin_vs_random"]["verdict"] == "holds"
    assert all(c["verdict"] != "holds" for c in controls)
