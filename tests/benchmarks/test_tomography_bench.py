"""tomography benchmark: claims and the scrambled-phase control read per-seed rows; the scramble is a derangement."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.benchmarks.harness import resolve
from lit_lowrank.benchmarks.tomography import SHOTS, claims_and_controls, scrambled, summary


def _rows(msw1: dict[int, float], others: dict[str, float], scrambled_fid: float, margin: float = 0.01
          ) -> list[dict]:
    rows = []
    for seed, jitter in enumerate((0.0, 0.01, -0.01)):
        for shots in SHOTS:
            rows.append({"method": "nn_msw1", "noise": "high", "shots": shots, "seed": seed,
                         "fidelity": msw1[shots] + jitter, "parity_margin_max": margin + jitter / 10})
            for method, value in others.items():
                rows.append({"method": method, "noise": "high", "shots": shots, "seed": seed,
                             "fidelity": value + jitter / 2})
        rows.append({"method": "nn_msw1_scrambled", "noise": "high", "shots": SHOTS[-1], "seed": seed,
                     "fidelity": scrambled_fid + jitter})
    return rows


def test_claims_and_control_follow_the_rows():
    others = {"nn_nll": 0.6, "imle": 0.5, "imle_rank1": 0.7, "imle_lc_rank1": 0.75}
    premises, claims, competitors, controls = claims_and_controls(_rows({1_000: 0.7, 10_000: 0.8, 100_000: 0.9},
                                                                        others, 0.2))
    assert [p["verdict"] for p in premises] == ["holds"] * 3
    assert [c["verdict"] for c in claims] == ["holds"] * len(claims) and len(claims) == 6
    assert all(c["n"] == 3 and c["unit"] == "seed" for c in claims)
    assert [c["verdict"] for c in controls] == ["fails"]
    assert {c["for"] for c in competitors} == {"continuous", "vs_imle", "vs_lc"}
    # the improvement beyond standard iMLE's is the NN's gain minus iMLE's (flat here): 0.2
    continuous = next(c for c in claims if c.get("name") == "continuous")
    assert continuous["estimate"] == pytest.approx(0.2)
    # a loss that cannot tell the parity partner apart: the claims that need it read no_headroom
    premises, claims, _, _ = claims_and_controls(_rows({1_000: 0.7, 10_000: 0.8, 100_000: 0.9}, others, 0.2,
                                                       margin=-0.01))
    assert resolve(claims, premises)[0]["verdict"] == "no_headroom"
    # a plateau after 10⁴ shots makes the "still improves" claim fail; a scramble that fits as well holds
    _, claims, _, controls = claims_and_controls(_rows({1_000: 0.7, 10_000: 0.9, 100_000: 0.8}, others, 0.9))
    assert {c["claim"].split(" shots")[0]: c["verdict"] for c in claims}["NN + MSW1 fidelity still improves from "
                                                                        "10000 to 100000"] == "fails"
    assert controls[0]["verdict"] == "holds"
    assert {r["method"] for r in summary(_rows({1_000: 0.7, 10_000: 0.8, 100_000: 0.9}, others, 0.2))} >= {"imle"}


def test_unpaired_seeds_raise():
    rows = _rows({1_000: 0.7, 10_000: 0.8, 100_000: 0.9}, {"nn_nll": 0.6, "imle": 0.5, "imle_rank1": 0.7,
                                                           "imle_lc_rank1": 0.75}, 0.2)
    rows = [r for r in rows if not (r["method"] == "imle" and r["seed"] == 2)]
    with pytest.raises(ValueError, match="unpaired"):
        claims_and_controls(rows)


def test_scrambled_is_a_derangement_of_the_phase_labels():
    theta = torch.arange(16, dtype=torch.float64).reshape(16, 1).expand(16, 2).clone()
    batch = {"theta": theta, "x": torch.zeros(16, 5, 2)}
    out = scrambled(batch, seed=3)
    assert not (out["theta"][:, 0] == theta[:, 0]).any()           # no setting keeps its label
    assert sorted(out["theta"][:, 0].tolist()) == theta[:, 0].tolist()   # a permutation
    assert out["x"] is batch["x"]                                     # the records are untouched
