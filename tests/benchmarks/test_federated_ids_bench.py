"""federated_ids benchmark: claims and controls computed from per-unit rows; per-client episodes are paired."""

from __future__ import annotations

import numpy as np
import pytest

from lit_lowrank.benchmarks.federated_ids import claims_and_controls, summary
from lit_lowrank.datamodules.flows import FlowsDataModule
from lit_lowrank.federated.phrases import phrase_embeddings
from lit_lowrank.federated.server import METHODS, evaluate_client_episodes, run_federation

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(gain_high: float, gain_low: float, retrieval: float, shuffled: float) -> list[dict]:
    rows = []
    for u, jitter in enumerate((0.0, 0.01, -0.01, 0.02)):
        unit = {"unit": f"split{u}-seed0", "encoder": "mlp"}
        for world, alpha in (("mechanisms", 0.05), ("mechanisms", 1.0), ("leaky", 0.05)):
            for shots in (1, 5):
                gain = (gain_high if alpha == 0.05 else gain_low) * (1.0 if shots == 1 else 0.3)
                base = 0.7 + jitter
                f1 = {"prototype": base, "finetuned_head": base - 0.05, "global_prior": base + gain - retrieval,
                      "prior_bank": base + gain, "oracle_prior": 1.0}
                for method, value in f1.items():
                    rows.append({**unit, "world": world, "alpha": alpha, "shots": shots, "keys": "phrases",
                                 "method": method, "f1": value})
                if alpha == 0.05:
                    for method, value in (("prior_bank", base + gain - retrieval + shuffled),
                                          ("global_prior", base + gain - retrieval)):
                        rows.append({**unit, "world": world, "alpha": alpha, "shots": shots,
                                     "keys": "shuffled_phrases", "method": method, "f1": value})
    return rows


def test_claims_follow_the_per_unit_rows():
    claims, controls = claims_and_controls(_rows(0.1, 0.02, 0.05, -0.03), low=1.0, high=0.05)
    assert [c["verdict"] for c in claims] == ["holds"] * 5
    assert all(c["n"] == 4 and c["unit"] == "split×seed" for c in claims)
    assert [c["verdict"] for c in controls] == ["fails", "fails"]
    bad_claims, bad_controls = claims_and_controls(_rows(-0.1, 0.02, -0.05, 0.04), low=1.0, high=0.05)
    assert bad_claims[0]["verdict"] == "fails" and bad_claims[-1]["verdict"] == "fails"
    assert {c["verdict"] for c in bad_controls} == {"holds"}
    assert {r["world"] for r in summary(_rows(0.1, 0.02, 0.05, -0.03))} == {"mechanisms", "leaky (upper bound)"}


def test_per_client_episodes_are_local_and_paired():
    dm = FlowsDataModule(num_clients=3, alpha=0.5, samples_per_class=60, seed=0)
    result = run_federation(dm, rounds=1, local_epochs=1, feature_dim=8, phrase_encoder="tfidf")
    keys = phrase_embeddings(dm.novel_names, "tfidf")
    scores = evaluate_client_episodes(result, dm, keys, METHODS, episodes_per_client=2, queries=5, seed=0)
    clients = sum(1 for k in range(3) if (np.bincount(dm.client_novel(k)[1].numpy(), minlength=5) >= 10).sum() >= 2)
    assert clients >= 1
    assert all(len(v) == 2 * clients for v in scores.values())     # every method, the same episodes
    assert all(0.0 <= f <= 1.0 for v in scores.values() for f in v)
