"""The SARA benchmark's claims from rows: premises gate the claims, competitors sit in the method's place."""

from __future__ import annotations

import numpy as np

from lit_lowrank.benchmarks import sara as bench
from lit_lowrank.benchmarks.harness import resolve


def _rows(model: str, erank_spread: float) -> list[dict]:
    rng = np.random.default_rng(0)
    errors = {"full": 0.0, "uniform": 0.20, "static": 0.19, "sara_dp": 0.12, "sara_dp_output": 0.14,
              "sara_dp_shuffled": 0.21, "sara_online": 0.15, "sara_online_first": 0.13, "online_shuffled": 0.18,
              "fewer_steps": 0.05, "sara_dp+fewer_steps": 0.15, "uniform+fewer_steps": 0.2}
    rows = []
    for draw in range(6):
        for method, e in errors.items():
            rows.append({"model": model, "method": method, "draw": draw, "agree": 1,
                         "rel_error": e + 0.005 * rng.standard_normal()})
        for step in range(4):
            for method in ("output_erank", "signal_erank"):
                spread = erank_spread if method == "signal_erank" else 0.05
                rows.append({"model": model, "method": method, "draw": draw, "step": step,
                             "erank": 0.5 + spread * step / 3 + 0.001 * draw})
    for layer in range(5):
        for label, energy in (("trained", 0.6), ("init_0", 0.4), ("init_1", 0.4)):
            rows.append({"model": model, "method": f"spectrum_{label}", "layer": f"l{layer}",
                         "energy_25": energy + 0.01 * layer + (0.002 * (-1) ** layer if label == "init_1" else 0.0)})
    return rows


def test_online_claims_need_the_signals_rank_to_vary_and_competitors_are_attached():
    rows = _rows("m", erank_spread=0.3)
    claims, controls, premises, competitors = bench._claims(rows, "m", "M: ", timing=False, signal=True)
    by_name = {p["name"]: p for p in premises}
    assert by_name["m_output_rank_varies"]["verdict"] == "fails"  # the raw output barely moves
    assert by_name["m_rank_varies"]["verdict"] == "holds"  # the x0 signal does
    resolved = {c["name"]: c for c in resolve(claims, premises, competitors)}
    assert resolved["m_online_uniform"]["verdict"] == "holds"
    assert resolved["m_dp_uniform"]["competitors"][0]["competitor"].startswith("SARA-DP's levels")
    assert resolved["m_dp_uniform"]["matched_by"] == []  # the shuffled schedule does not beat uniform here
    assert all(c["verdict"] != "holds" for c in controls)
    # without a separate signal the online claims read the raw output's premise: no headroom here
    claims, controls, premises, competitors = bench._claims(rows, "m", "M: ", timing=False, signal=False)
    resolved = {c["name"]: c for c in resolve(claims, premises, competitors)}
    assert resolved["m_online_uniform"]["verdict"] == "no_headroom"
    assert resolved["m_dp_uniform"]["verdict"] == "holds"


def test_dp_additivity_sums_the_one_at_a_time_errors_of_each_schedule():
    import torch

    errors = np.arange(2 * 3 * 3, dtype=float).reshape(2, 3, 3) / 100  # (steps, blocks, levels)

    class Controller:
        calibration_errors, levels = errors, (0.25, 0.5, 1.0)

        def set_schedule(self, s):
            self.schedule = s

    class Bench:
        reference = torch.ones(4, 1, 2, 2)

        def sample(self):  # error grows with the level index the schedule holds everywhere
            return self.reference * (1 + 0.1 * (c.schedule[0, 0] + 1))

    c = Controller()
    schedule = np.array([[0, 1, 2], [2, 1, 0]])
    out = bench.dp_additivity(Bench(), c, schedule, Bench.reference * 1.5)
    assert out["dp"]["predicted"] == round(errors[0, 0, 0] + errors[0, 1, 1] + errors[0, 2, 2]
                                           + errors[1, 0, 2] + errors[1, 1, 1] + errors[1, 2, 0], 4)
    assert out["dp"]["realised"] == 0.5
    assert set(out) == {"dp", "level_0.25", "level_0.5"}  # full rank (the last level) predicts 0: skipped
    assert out["level_0.5"]["predicted"] == round(errors[:, :, 1].sum(), 4)
    assert out["level_0.5"]["realised"] == 0.2
