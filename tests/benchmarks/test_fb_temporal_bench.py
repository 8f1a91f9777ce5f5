"""fb_temporal benchmark: exact spectrum rows, and claims/controls computed from the rows (no training here)."""

from __future__ import annotations

import pytest

from lit_lowrank.benchmarks.fb_temporal import K_CLAIM, claims_and_controls, run_key, spectrum_rows

pytestmark = pytest.mark.usefixtures("one_thread")


def _fb_rows(err_over_bound: dict[int, float], sr: dict[tuple[float, int], float], ret: dict[int, float],
             shuffled: float) -> list[dict]:
    rows = []
    for seed, jitter in enumerate((0.0, 0.01, -0.01)):
        for k, ratio in err_over_bound.items():
            rows.append({"table": "fb", "mode": "evaluation", "gamma": 0.99, "k": k, "seed": seed,
                         "error_over_bound": ratio + jitter, "untrained_error_over_bound": 30.0 + jitter,
                         "sr_error": sr[(0.99, k)] + jitter})
        for k in (1, K_CLAIM):
            rows.append({"table": "fb", "mode": "evaluation", "gamma": 0.9, "k": k, "seed": seed,
                         "sr_error": sr[(0.9, k)] + jitter})
        for k, value in ret.items():
            rows.append({"table": "fb", "mode": "control", "gamma": 0.99, "k": k, "seed": seed,
                         "zero_shot_return": value + jitter, "shuffled_reward_return": shuffled + jitter})
    return rows


def test_spectral_claims_and_the_cycle_control_from_exact_rows():
    rows = spectrum_rows(gammas=(0.99,), grids=((8, 0.1), (8, 0.2), (8, 0.3)), cycles=(30, 40, 50))
    claims, controls = claims_and_controls(rows)
    by = {c["claim"]: c for c in claims}
    # per decision (the spec's setting) the SR's effective rank falls with k on every grid ...
    assert all(c["verdict"] == "holds" for t, c in by.items() if "per decision" in t)
    # ... the paper's bound σ_(d+1) shrinks with k (three 8×8 grids: the CI may straddle, never the wrong side) ...
    bound = next(c for t, c in by.items() if t.startswith("the paper's bound"))
    assert bound["estimate"] < 1.0 and bound["verdict"] != "fails"
    # ... and on deterministic cycles (nothing to filter) the same claim fails: the control
    assert [c["verdict"] for c in controls] == ["fails"]
    assert all(c["n"] == 3 and c["unit"] == "grid" for c in claims)


def test_learned_claims_read_the_rows():
    rows = _fb_rows({1: 4.0, K_CLAIM: 0.8}, {(0.99, 1): 0.5, (0.99, 4): 0.2, (0.9, 1): 0.3, (0.9, 4): 0.25},
                    {1: 0.7, 2: 0.8, 4: 0.85, 8: 0.6}, shuffled=0.1)
    claims, controls = claims_and_controls(rows)
    by = {c["claim"]: c["verdict"] for c in claims}
    assert by[f"learned FB (k={K_CLAIM}, γ=0.99) reaches the paper's value bound"] == "holds"
    assert by["learned FB (k=1, γ=0.99) reaches the paper's value bound"] == "fails"
    assert by[f"γ=0.99: FB fits the SR better at k={K_CLAIM} than at k=1 (same budget)"] == "holds"
    assert by[f"the SR-error gain of k={K_CLAIM} is larger at γ=0.99 than at γ=0.9"] == "holds"
    assert by[f"γ=0.99: FB's zero-shot return is higher at k={K_CLAIM} than at k=1"] == "holds"
    assert {c["verdict"] for c in controls} == {"fails"}
    # a learner as bad as an untrained one would make the bound control hold: the run turns invalid
    worse = _fb_rows({1: 4.0, K_CLAIM: 0.8}, {(0.99, 1): 0.5, (0.99, 4): 0.2, (0.9, 1): 0.3,
                     (0.9, 4): 0.25}, {1: 0.7, 2: 0.8, 4: 0.85, 8: 0.6}, shuffled=0.95)
    assert any(c["verdict"] == "holds" for c in claims_and_controls(worse)[1])


def test_cache_key_names_the_run():
    key = run_key("evaluation", 0.99, 4, 5000, 1)
    assert key.startswith("grid10-slip0.2-evaluation-g0.99-k4-d32-steps5000-seed1-")
    assert key != run_key("evaluation", 0.99, 4, 5000, 2) != run_key("control", 0.99, 4, 5000, 1)
