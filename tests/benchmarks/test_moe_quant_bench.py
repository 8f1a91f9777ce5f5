"""moe_quant benchmark wiring on synthetic rows: claims pair (seed, chunk) units, controls can fail, the summary."""

from __future__ import annotations

import math

import pytest

from lit_lowrank.benchmarks.moe_quant import _summary, claims_and_controls

#: per-method perplexity multiplier over FP (the method best; controls no better than their baselines)
EFFECT = {"fp": 1.0, "rtn": 1.04, "rtn_fp_routes": 1.02, "gptq_mxfp4": 1.03, "mixed_fp8": 1.035,
          "svd_uniform": 1.03, "svd_load": 1.02, "svd_random": 1.04,
          "qat_noreplay_load": 1.015, "qat_replay_uniform": 1.012, "qat_replay_load": 1.008,
          "qat_replay_shuffled": 1.03}
AGREEMENT = {"qat_noreplay_load": 0.95, "qat_replay_load": 0.97, "qat_replay_shuffled": 0.93}


def _rows():
    rows = []
    for seed in range(3):
        for chunk in range(6):
            base = 5.0 + 0.3 * chunk + 0.1 * seed  # chunks differ a lot; pairing removes it
            for m, f in EFFECT.items():
                jitter = 1 + 0.001 * ((seed * 7 + chunk * 3 + len(m)) % 5 - 2)
                rows.append({"method": m, "seed": seed, "chunk": chunk, "unit": f"s{seed}-c{chunk}",
                             "ppl": base * f * jitter, "agreement": AGREEMENT.get(m, 0.9) + 0.002 * (chunk % 3),
                             "flip_rate": 1 - AGREEMENT.get(m, 0.9),
                             "weighted_residual": 1.0, "compensator_params": 0, "bits_per_weight": 4.25})
    return rows


def test_claims_hold_and_controls_fail_on_rows_built_that_way():
    from lit_lowrank.benchmarks.harness import resolve

    claims, controls, premises, competitors = claims_and_controls(_rows())
    assert [p["verdict"] for p in premises] == ["holds", "holds"]
    claims = resolve(claims, premises, competitors)
    assert [c["verdict"] for c in claims] == ["holds"] * len(claims)
    assert [c["verdict"] for c in controls] == ["fails"] * len(controls)
    assert all(c["n"] == 18 and c["unit"] == "(seed, chunk)" for c in claims + controls)
    assert claims[0]["matched_by"] == [c["competitor"] for c in competitors if c["for"] == "below_rtn"]
    first = claims[0]  # geometric mean of the per-chunk ppl ratios, method over RTN
    assert first["estimate"] == pytest.approx(1.008 / 1.04, rel=2e-3)


def test_unpaired_rows_are_refused():
    rows = [r for r in _rows() if not (r["method"] == "rtn" and r["chunk"] == 0)]
    with pytest.raises(ValueError, match="unpaired"):
        claims_and_controls(rows)


def test_summary_reports_the_share_of_rtn_damage_repaired():
    summary = {r["method"]: r for r in _summary(_rows())}
    assert summary["fp"]["ppl_gap"] == pytest.approx(0.0)
    gap_rtn = summary["rtn"]["ppl_gap"]
    assert gap_rtn > 0 and summary["rtn"]["rtn_gap_repaired"] == pytest.approx(0.0)
    repaired = summary["qat_replay_load"]["rtn_gap_repaired"]
    assert repaired == pytest.approx(1 - summary["qat_replay_load"]["ppl_gap"] / gap_rtn)
    assert 0.7 < repaired < 0.85 and not math.isnan(repaired)


def test_without_route_flip_cost_the_replay_claims_read_no_headroom():
    from lit_lowrank.benchmarks.harness import resolve

    rows = [dict(r, ppl=r["ppl"] * (1.04 / 1.02)) if r["method"] == "rtn_fp_routes" else r for r in _rows()]
    claims, _, premises, competitors = claims_and_controls(rows)
    verdicts = {c["claim"]: c["verdict"] for c in resolve(claims, premises, competitors)}
    assert verdicts["routing replay's share: perplexity below QAT without replay (same load-aware ranks)"] == \
        "no_headroom"
    assert verdicts["replay-QAT + load-aware compensation (W4A8): perplexity below RTN-MXFP4"] == "holds"


def test_bench_runs_end_to_end_on_a_tiny_untrained_target(monkeypatch):
    """The real pipeline (every arm, callbacks, GPTQ-MXFP4, mixed MXFP8) on a 2-layer random model, 2 QAT steps."""
    import torch

    import lit_lowrank.benchmarks.moe_quant as bench
    from lit_lowrank.tasks import CausalLMModule

    config = {**bench.MODEL_CONFIG, "num_hidden_layers": 2}

    def tiny(dm, seed):
        torch.manual_seed(seed)
        return CausalLMModule(model_config=config).eval()

    monkeypatch.setattr(bench, "target_model", tiny)
    monkeypatch.setattr(bench, "_settings", lambda quick: {"seeds": 1, "qat_steps": 2, "chunks": 3,
                                                           "batches_per_chunk": 1, "calib_batches": 2})
    result = bench.run(quick=True)
    methods = {r["method"] for r in result.rows}
    assert {"rtn_fp_routes", "gptq_mxfp4", "mixed_fp8", "qat_replay_load"} <= methods
    by = {r["method"]: r for r in result.summary}
    assert by["rtn"]["bits_per_weight"] == pytest.approx(4.25)
    # equal bits: the competitor spends at most the compensators' bits
    assert by["rtn"]["bits_per_weight"] < by["mixed_fp8"]["bits_per_weight"] <= by["svd_load"]["bits_per_weight"]
    # forcing the FP routes changes what the RTN model computes, never its stored bits
    assert by["rtn_fp_routes"]["bits_per_weight"] == by["rtn"]["bits_per_weight"]
    assert len(result.notes["rtn_flip_rate_per_layer"]) == 2
