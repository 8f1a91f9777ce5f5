"""lora_variants benchmark: the condition-number sweep's dynamics (pure factor-gradient descent, no training loop)."""

from __future__ import annotations

from lit_lowrank.benchmarks.lora_variants import _condition_run, _loglog_slope


def test_sds_convergence_does_not_degrade_with_the_factors_condition_number():
    lora = {k: _condition_run("lora", k, 0.05, 100, seed=0)[1] for k in (1, 100, 1000)}
    sds = {k: _condition_run("sds_lora", k, 0.05, 100, seed=0)[1] for k in (1, 100, 1000)}
    assert lora[1] < lora[100] < lora[1000]        # LoRA slows down as the factors get ill-conditioned
    assert max(sds.values()) < 0.01 < min(lora.values())
    assert sds[1000] <= 2 * sds[1]                 # SDS: no degradation (the factors' scales never enter)


def test_loglog_slope_recovers_a_power_law():
    xs = [1.0, 2.0, 4.0, 8.0]
    assert abs(_loglog_slope(xs, [3 * x**2 for x in xs]) - 2.0) < 1e-9
    assert abs(_loglog_slope(xs, xs) - 1.0) < 1e-9
