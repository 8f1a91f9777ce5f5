"""The spirit benchmark's ceiling summary: geometric mean over prompts and the break-even acceptance."""

from __future__ import annotations

import math

import pytest

from lit_lowrank.benchmarks.spirit import DRAFT_LENGTH, _ceiling
from lit_lowrank.ops.spirit import chain_speedup


def test_ceiling_summary_reads_its_rows_and_inverts_the_cost_model():
    cost = 0.5  # a draft token at half a target step: an always-right drafter reaches 7 / 4 = 1.75x
    top = chain_speedup(1.0, DRAFT_LENGTH, cost)
    rows = [{"method": "ceiling@0.5", "ratio_to_generate": top * f} for f in (0.9, 1 / 0.9)]
    rows += [{"method": "ceiling@0.05", "ratio_to_generate": x} for x in (0.9, 1.0)]
    rows += [{"method": "spirit", "ratio_to_generate": 9.0}]  # other methods are not read
    out = _ceiling(rows, {"0.5": 0.3, "0.05": 0.75, "0.3": 0.4})
    assert out["0.5"]["x_generate"] == pytest.approx(top, abs=1e-3)  # geometric mean of the two prompts
    need = out["0.5"]["break_even_acceptance"]
    assert chain_speedup(need, DRAFT_LENGTH, cost) == pytest.approx(1.0, abs=2e-3)
    assert out["0.5"]["matchness"] == 0.3
    assert out["0.05"]["x_generate"] == pytest.approx(math.sqrt(0.9), abs=1e-3)
    assert out["0.05"]["break_even_acceptance"] is None  # below 1x even when every draft is accepted
    assert "0.3" not in out  # a ratio without ceiling rows is left out, not reported as zero


def test_speed_claims_need_the_ceiling_at_the_chosen_ratio():
    """The premise per ceiling ratio is paired over prompts; the claims require the one nearest the skip ratio
    validation chose, and a claim whose premise does not hold is no_headroom, not fails."""
    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.spirit import _claims, _premises

    rows = []
    for p in range(4):
        domain = "lee" if p < 2 else "text8"
        rows.append({"method": "ceiling_generate", "prompt": p, "domain": domain, "tokens_per_s": 20.0 + p})
        rows.append({"method": "ceiling@0.2", "prompt": p, "domain": domain,
                     "tokens_per_s": (20.0 + p) * (1.0 + 0.01 * (-1) ** p)})
        rows.append({"method": "ceiling@0.5", "prompt": p, "domain": domain, "tokens_per_s": (20.0 + p) * 1.4})
        for name, speed in (("spirit", 12.0), ("generate", 20.0), ("agreement_only", 13.0), ("offline_bayes", 14.0),
                            ("random", 10.0)):
            rows.append({"method": name, "prompt": p, "domain": domain, "tokens_per_s": speed + p})
    premises, needed = _premises(rows, (0.2, 0.5), chosen=0.15)
    assert needed == "ceiling_0.2"
    claims, controls = _claims(rows, 2, requires=needed)
    resolved = resolve(claims, premises, [])
    assert [p["verdict"] for p in premises] == ["inconclusive", "holds"]
    assert [c["verdict"] for c in resolved] == ["no_headroom"] * 4
    assert all(c["premises_failed"] == ["ceiling_0.2"] for c in resolved)
    assert [c["measured_verdict"] for c in resolved[:3]] == ["fails"] * 3  # what the test measured, shown beside
    _, needed_far = _premises(rows, (0.2, 0.5), chosen=0.45)
    assert needed_far == "ceiling_0.5"
    assert [c["verdict"] for c in resolve(_claims(rows, 2, requires=needed_far)[0], premises, [])][:3] == ["fails"] * 3
    assert controls[0].get("requires") in (None, [], ())


def test_the_offline_pattern_competes_for_the_speed_claim():
    from lit_lowrank.benchmarks._claims import resolve
    from lit_lowrank.benchmarks.spirit import _claims, _competitors, _premises

    rows = []
    for p in range(4):
        domain = "lee" if p < 2 else "text8"
        rows.append({"method": "ceiling_generate", "prompt": p, "domain": domain, "tokens_per_s": 20.0 + p})
        rows.append({"method": "ceiling@0.2", "prompt": p, "domain": domain, "tokens_per_s": (20.0 + p) * 1.3})
        for name, speed in (("spirit", 26.0), ("generate", 20.0), ("agreement_only", 13.0), ("offline_bayes", 25.0),
                            ("random", 10.0)):
            rows.append({"method": name, "prompt": p, "domain": domain, "tokens_per_s": speed + p})
    premises, needed = _premises(rows, (0.2,), chosen=0.2)
    claims, _ = _claims(rows, 2, requires=needed)
    resolved = {c.get("name"): c for c in resolve(claims, premises, _competitors(rows))}
    beat = resolved["spirit_vs_generate"]
    assert beat["verdict"] == "holds" and beat["matched_by"]  # the offline pattern beats generate too
    assert beat["matched_by"][0].startswith("the pattern tuned offline")
