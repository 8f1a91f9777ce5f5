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

    rows = sweep(["karate"], models=["castor", "mlp"], num_splits=2, epochs=5, quick_grid=True)
    assert {r["model"] for r in rows} == {"castor", "mlp"}
    assert all("karate" in r for r in rows)
    assert "castor sweep" in capsys.readouterr().out


def test_every_model_is_tuned_on_the_same_grid_plus_its_published_setting():
    from lit_lowrank.benchmarks.castor import ALL_BASELINES, PUBLISHED, tuning_grid

    for name in ("castor", *ALL_BASELINES):
        grid = tuning_grid(name, quick=True)
        assert {(c["lr"], c["weight_decay"]) for c in grid} >= {(0.01, 5e-4), (0.05, 5e-4)}
        published = [c for c in grid if c.get("published")]
        assert len(published) == 1 and published[0]["lr"] == PUBLISHED[name]["lr"]
        assert all(c["prop_weight_decay"] == 0.0 for c in grid if not c.get("published"))
    assert len(tuning_grid("mlp", quick=False)) == 3 * 3 + 1 - 1  # the published point is a grid point


def test_propagation_coefficients_get_their_own_group():
    import torch

    from lit_lowrank.benchmarks.castor import PUBLISHED, make_optimizer, model_factories

    model = model_factories(30)["gprgnn"](8, 2, **PUBLISHED["gprgnn"]["model"])
    opt = make_optimizer(model, "gprgnn", {"lr": 0.05, "weight_decay": 5e-4, "prop_weight_decay": 0.0})
    (rest, prop) = opt.param_groups
    assert prop["params"] == [model.gamma] and prop["weight_decay"] == 0.0 and rest["weight_decay"] == 5e-4
    castor = model_factories(30)["castor_no_momentum"](8, 2)
    groups = make_optimizer(castor, "castor_no_momentum", {"lr": 0.01, "weight_decay": 5e-4}).param_groups
    names = {id(p): n for n, p in castor.named_parameters()}
    assert {names[id(p)] for p in groups[1]["params"]} == {"router_weight", "router_bias", "gamma"}
    assert model.dprate == 0.5 and isinstance(model, torch.nn.Module)
