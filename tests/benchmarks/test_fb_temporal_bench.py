"""fb_temporal benchmark: exact spectrum rows and claims computed from rows (no training here)."""

from __future__ import annotations

from lit_lowrank.benchmarks.fb_temporal import KS, _claims, _spectrum_rows
from lit_lowrank.datamodules.rl_envs import SlipGridWorld


def _fb_row(env, k, gamma, err, ret, holds=True):
    return {"table": "fb", "env": env, "k": k, "gamma": gamma, "sr_error": err, "zero_shot_return": ret,
            "bound_holds": holds}


def test_claims_follow_the_rows():
    rows = _spectrum_rows(SlipGridWorld(size=10, slip=0.2).transition_tensor(), "gridworld", KS)
    per_decision = [r["sr_erank"] for r in rows if r["macro_discount"] == "per_decision" and r["gamma"] == 0.99]
    assert per_decision[0] == 13.486 and per_decision == sorted(per_decision, reverse=True)
    good = rows + [_fb_row("gridworld", 1, 0.99, 0.9, 0.5), _fb_row("gridworld", 4, 0.99, 0.6, 0.7),
                   _fb_row("gridworld", 1, 0.9, 0.5, 0.8), _fb_row("gridworld", 4, 0.9, 0.45, 0.8),
                   _fb_row("pointmass", 1, 0.99, None, 0.1, None), _fb_row("pointmass", 4, 0.99, None, 0.2, None)]
    assert all(c["holds"] for c in _claims(good))
    bad = [dict(r) for r in good]
    bad[-3]["sr_error"] = 0.1              # k>1 at γ=0.9 now gains more than at 0.99
    bad[-5]["bound_holds"] = False
    failed = {c["claim"][:30] for c in _claims(bad) if not c["holds"]}
    assert any(t.startswith("relative SR-error gain") for t in failed)
    assert any(t.startswith("value-error bound") for t in failed)
