"""federated_ids benchmark: claims and controls computed from per-unit rows; per-client episodes are paired."""

from __future__ import annotations

import numpy as np
import pytest

from lit_lowrank.benchmarks.federated_ids import DEFAULTS, SPACES, TRIALS, candidates, claims_and_controls, summary
from lit_lowrank.benchmarks.harness import resolve
from lit_lowrank.datamodules.flows import FlowsDataModule
from lit_lowrank.federated.phrases import phrase_embeddings
from lit_lowrank.federated.server import METHODS, evaluate_client_episodes, run_federation

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(gain_high: float, gain_low: float, retrieval: float, shuffled: float, closer: float = 1.0) -> list[dict]:
    rows = []
    for u, jitter in enumerate((0.0, 0.01, -0.01, 0.02)):
        unit = {"unit": f"split{u}-seed0", "encoder": "mlp", "world": "families", "settings": {"gate_threshold": 0.5}}
        for alpha in (0.05, 1.0):
            for shots in (1, 5):
                gain = (gain_high if alpha == 0.05 else gain_low) * (1.0 if shots == 1 else 0.3)
                base = 0.7 + jitter
                f1 = {"prototype": base, "finetuned_head": base - 0.05, "best_fedavg": base,
                      "global_prior": base + gain - retrieval, "prior_bank": base + gain, "oracle_prior": 1.0,
                      "prior_bank_shuffled": base + gain - retrieval + shuffled}
                for method, value in f1.items():
                    rows.append({**unit, "alpha": alpha, "shots": shots, "method": method, "f1": value,
                                 "dist_global": 3.0 + jitter, "dist_retrieved": 3.0 - closer,
                                 "dist_gated": 3.0 - closer / 2})
    return rows


def test_claims_follow_the_per_unit_rows():
    premises, claims, competitors, controls = claims_and_controls(_rows(0.1, 0.02, 0.05, -0.03), low=1.0, high=0.05)
    assert [p["verdict"] for p in premises] == ["holds"] * 4
    assert [c["verdict"] for c in claims] == ["holds"] * 5
    assert all(c["n"] == 4 and c["unit"] == "split×seed" for c in claims)
    assert [c["verdict"] for c in controls] == ["fails"]
    assert {c["for"] for c in competitors} == {"fedavg_0.05", "fedavg_1", "retrieval"}
    bad_premises, bad_claims, _, bad_controls = claims_and_controls(_rows(-0.1, 0.02, -0.05, 0.04, closer=-1.0),
                                                                    low=1.0, high=0.05)
    assert bad_claims[0]["verdict"] == "fails" and bad_claims[-1]["verdict"] == "fails"
    assert bad_premises[-2]["verdict"] == "fails"               # retrieval farther than the global prior
    assert {c["verdict"] for c in bad_controls} == {"holds"}
    resolved = resolve(bad_claims, bad_premises, [])
    assert resolved[-1]["verdict"] == "no_headroom"            # the retrieval claim then reads no_headroom
    assert {r["world"] for r in summary(_rows(0.1, 0.02, 0.05, -0.03))} == {"families"}


def test_candidates_give_every_tuned_method_the_same_budget():
    rng = np.random.default_rng(0)
    drawn = {m: candidates(m, 32, rng) for m in SPACES}
    assert {len(v) for v in drawn.values()} == {TRIALS}
    assert drawn["prior_bank"][0]["nu0"] == 32 + 1 + DEFAULTS["prior_bank"]["nu0"]   # ν₀ − d − 1 on the grid
    assert all(len({tuple(sorted(c.items())) for c in v}) == TRIALS for v in drawn.values())
    assert candidates("prototype", 32, rng) == [{}]


def test_per_client_episodes_are_local_and_paired():
    dm = FlowsDataModule(num_clients=3, alpha=0.5, samples_per_class=60, seed=0)
    result = run_federation(dm, rounds=1, local_epochs=1, feature_dim=8, phrase_encoder="tfidf")
    keys = phrase_embeddings(dm.novel_names, "tfidf")
    scores = evaluate_client_episodes(result, dm, keys, METHODS, episodes_per_client=2, queries=5, seed=0)
    clients = sum(1 for k in range(3) if (np.bincount(dm.client_novel(k)[1].numpy(), minlength=5) >= 10).sum() >= 2)
    assert clients >= 1
    assert all(len(v) == 2 * clients for v in scores.values())     # every method, the same episodes
    assert all(0.0 <= f <= 1.0 for v in scores.values() for f in v)
