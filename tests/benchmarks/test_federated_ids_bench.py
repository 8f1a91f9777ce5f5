"""federated_ids benchmark: claims and controls computed from per-unit rows; per-client episodes are paired."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lit_lowrank.benchmarks import federated_ids as bench
from lit_lowrank.benchmarks.federated_ids import DEFAULTS, SPACES, TRIALS, candidates, claims_and_controls, summary
from lit_lowrank.benchmarks.harness import resolve
from lit_lowrank.datamodules.flows import LABEL_FAMILIES, FlowsDataModule
from lit_lowrank.federated.phrases import phrase_embeddings
from lit_lowrank.federated.server import METHODS, evaluate_client_episodes, run_federation
from lit_lowrank.ops.fed_lowshot.prior_bank import PriorBank

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


def test_splits_give_novel_classes_relatives_and_one_gate_test():
    singles = set()
    for split in bench.SPLITS:
        base = [c for c in LABEL_FAMILIES["cicids2017"] if c not in split]
        lonely = [c for c in split if not bench.has_relative(c, base)]
        assert len(lonely) <= 1                                  # the others have a family-mate in the bank
        singles.update(lonely)
    assert all(len([c for c in s if not bench.has_relative(c, [b for b in LABEL_FAMILIES["cicids2017"] if b not in s])]) == 1
               for s in bench.SPLITS[1:])
    assert singles == {"PortScan", "Infiltration", "Bot", "Heartbleed"}   # every class with no relative is a gate test
    assert bench.has_relative("Web Attack XSS", ["Web Attack Sql Injection", "Bot"])
    assert not bench.has_relative("Web Attack XSS", ["Web Attack XSS", "Bot"])


def test_prior_distances_open_the_gate_for_a_relative_and_fall_back_without_one():
    d = 4
    mate, other = torch.tensor([4.0, 0, 0, 0]), torch.tensor([0, 0, 0, -4.0])
    keys = torch.eye(3, 8)                                           # unit phrase keys of the two base entries
    bank = PriorBank(keys=keys[:2], means=torch.stack([mate, other]), covs=torch.eye(d).repeat(2, 1, 1),
                     counts=torch.tensor([10, 10]), labels=["Web Attack Sql Injection", "PortScan"])
    q_rel = torch.nn.functional.normalize(keys[0] + 0.2 * keys[2], dim=0)   # cosine 0.98 to its mate
    q_none = torch.nn.functional.normalize(0.2 * keys[0] + keys[2], dim=0)  # cosine 0.2 to anything
    novel_x = torch.cat([mate + 0.5 + torch.zeros(3, d), torch.tensor([[0, 3.0, 0, 0]]).repeat(3, 1)])
    dm = SimpleNamespace(novel_x=novel_x, novel_y=torch.tensor([0, 0, 0, 1, 1, 1]),
                         novel_names=["Web Attack XSS", "Heartbleed"], base_names=bank.labels)
    result = SimpleNamespace(features=lambda x: x, bank=bank)
    out = bench.prior_distances(result, dm, torch.stack([q_rel, q_none]),
                          {"k": 1, "temperature": 0.1, "gate_threshold": 0.5})
    assert out["gate_related"] > 0.99 and out["gate_unrelated"] < 0.01
    assert out["dist_gated"] < out["dist_global"]                    # the mate's prior is the closer one
    assert out["dist_retrieved"] > out["dist_gated"]                 # the raw retrieval for Heartbleed is not
