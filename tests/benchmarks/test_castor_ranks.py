"""The Castor benchmark's average-rank arithmetic (ties share the mean rank)."""

from __future__ import annotations

from lit_lowrank.benchmarks.castor import PHIS, _mean_ranks


def test_mean_ranks_with_ties():
    acc = {"a": dict.fromkeys(PHIS, 0.9), "b": dict.fromkeys(PHIS, 0.8), "c": dict.fromkeys(PHIS, 0.8)}
    acc["c"][PHIS[0]] = 0.95  # c wins one setting
    avg, per_phi = _mean_ranks(acc, ["a", "b", "c"])
    assert per_phi["c"][PHIS[0]] == 1 and per_phi["a"][PHIS[0]] == 2 and per_phi["b"][PHIS[0]] == 3
    assert per_phi["b"][PHIS[1]] == 2.5 and per_phi["c"][PHIS[1]] == 2.5 and per_phi["a"][PHIS[1]] == 1
    assert avg["a"] == (2 + 1 * (len(PHIS) - 1)) / len(PHIS)


def test_sweep_runs_models_over_embedded_datasets(capsys):
    from lit_lowrank.benchmarks.castor import sweep

    rows = sweep(["karate"], models=["castor", "mlp"], num_splits=2, epochs=5)
    assert {r["model"] for r in rows} == {"castor", "mlp"}
    assert all("karate" in r for r in rows)
    assert "castor sweep" in capsys.readouterr().out
