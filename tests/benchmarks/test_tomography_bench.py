"""tomography benchmark: claims and the scrambled-phase control read per-seed rows; the scramble is a derangement;
the parity probe tells the even cat from the odd one on low-noise records."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.benchmarks.harness import resolve
from lit_lowrank.benchmarks.tomography import (
    HEADLINE,
    NOISE,
    SHOTS,
    claims_and_controls,
    parity_margin,
    scrambled,
    summary,
)
from lit_lowrank.ops.homodyne import phase_settings, sample_homodyne, two_mode_cat_state


def _rows(msw1: dict[int, float], others: dict[str, float], scrambled_fid: float, margin: float = 0.01,
          high_margin: float | None = None) -> list[dict]:
    rows = []
    for seed, jitter in enumerate((0.0, 0.01, -0.01)):
        for shots in SHOTS:
            rows.append({"method": "nn_msw1", "noise": HEADLINE, "shots": shots, "seed": seed,
                         "fidelity": msw1[shots] + jitter})
            rows.append({"method": "parity_probe", "noise": HEADLINE, "shots": shots, "seed": seed,
                         "parity_margin_max": margin + jitter / 10})
            if high_margin is not None:  # quick mode's other setting: probes only, no fits
                rows.append({"method": "parity_probe", "noise": "high", "shots": shots, "seed": seed,
                             "parity_margin_max": high_margin + jitter / 10})
            for method, value in others.items():
                rows.append({"method": method, "noise": HEADLINE, "shots": shots, "seed": seed,
                             "fidelity": value + jitter / 2})
        rows.append({"method": "nn_msw1_scrambled", "noise": HEADLINE, "shots": SHOTS[-1], "seed": seed,
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
    assert {c["for"] for c in competitors} == {"improves_1000_100000", "improves_10000_100000", "continuous",
                                               "vs_imle", "vs_lc"}
    # the warm start is flat over shots here (0.7): it does not match the improvement claims
    resolved = resolve(claims, premises, competitors)
    assert resolved[0]["name"] == "improves_1000_100000" and resolved[0]["matched_by"] == []
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


def test_other_settings_parity_is_reported_but_required_by_no_claim():
    others = {"nn_nll": 0.6, "imle": 0.5, "imle_rank1": 0.7, "imle_lc_rank1": 0.75}
    rows = _rows({1_000: 0.7, 10_000: 0.8, 100_000: 0.9}, others, 0.2, high_margin=-0.01)
    premises, claims, competitors, _ = claims_and_controls(rows)
    names = [p["name"] for p in premises]
    assert names == ["noise_floor", "msw1_parity_1000", "msw1_parity_100000", "msw1_parity_1000_high",
                     "msw1_parity_100000_high"]
    assert [p["verdict"] for p in premises[3:]] == ["fails", "fails"]
    # the claims read the headline setting's premises only: the failing "high" ones change no verdict
    assert [c["verdict"] for c in resolve(claims, premises, competitors)] == ["holds"] * 6
    # summary rows skip the probes (they have no fidelity)
    assert "parity_probe" not in {r["method"] for r in summary(rows)}


@pytest.mark.parametrize("parity", [1, -1])
def test_parity_probe_prefers_the_cat_that_made_the_records(parity):
    """Low-noise records (the headline setting) of the even cat give MSW1(odd) > MSW1(even); of the odd cat, <."""
    noise = NOISE[HEADLINE]
    theta = phase_settings([k * math.pi / 4 for k in range(4)], 2)
    x = sample_homodyne(two_mode_cat_state(1.5, 16, parity), theta, 4000, efficiency=noise["efficiency"],
                        additive_noise=noise["additive_noise"], generator=torch.Generator().manual_seed(0))
    batch = {"theta": theta.float(), "x": x.float(), "mask": torch.ones(x.shape[:2], dtype=torch.bool)}
    margin = parity_margin(batch, 1.5, cutoff=8, grid_size=48, num_angles=16, refine_steps=4,
                           efficiency=noise["efficiency"], additive_noise=noise["additive_noise"])
    assert parity * margin["parity_margin_max"] > 0.02
    assert parity * margin["parity_margin_mean"] > 0


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
