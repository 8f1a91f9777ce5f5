"""The SpecDrop benchmark's pieces: matched parameters, the HydraLoRA count, unit tags, the permuted-map
control, the equivalence verdict, the claims' structure, and a fast end-to-end row."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lit_lowrank.benchmarks import specdrop as bench
from lit_lowrank.benchmarks._claims import claim, verdict_of
from lit_lowrank.benchmarks.specdrop import models


@pytest.fixture(scope="module")
def hierarchical():
    return bench.make_hierarchical(0, per_class_train=2, per_class_val=1, per_class_test=2)


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("k", [5, 20])
def test_hydra_parameter_formula_matches_the_built_block(hierarchical, k):
    model = bench.build_token_model("hydra_lora", hierarchical, k, [c * k // 20 for c in range(20)])
    width = model.block[0].base.out_features
    assert _params(model.block) == models.hydra_params(models.D_MODEL, width, k)


@pytest.mark.parametrize("k", [5, 20])  # 20: the benchmark's one branch per category; 5: four categories a branch
def test_token_methods_are_parameter_matched(hierarchical, k):
    mapping = [c * k // 20 for c in range(20)]
    counts = {m: _params(bench.build_token_model(m, hierarchical, k, mapping)) for m in (*bench.TUNED, *bench.CONTROLS)}
    reference = counts["specdrop"]
    for method, count in counts.items():
        assert abs(count - reference) / reference < 0.05, (method, count, reference)


def _category_from_input(data: dict) -> float:
    """Test accuracy of the nearest category centroid in input space (how cheaply x gives the tag)."""
    centroids = torch.stack([data["x_train"][data["c_train"] == c].mean(0) for c in range(data["num_categories"])])
    return float((torch.cdist(data["x_test"], centroids).argmin(1) == data["c_test"]).double().mean())


def test_hierarchical_default_regime_hides_the_category_that_the_old_regime_gave_away():
    # the tag must carry information the input does not give cheaply: mostly shared transforms, no offset
    weak = [_category_from_input(bench.make_hierarchical(s)) for s in range(3)]
    plain = [_category_from_input(bench.make_hierarchical(s, shared_transform=0.0, category_offset=0.5))
             for s in range(3)]
    assert max(weak) < 0.6 < 0.9 < min(plain), (weak, plain)  # chance is 1/20
    # fully shared transforms: categories indistinguishable from the input
    same = [_category_from_input(bench.make_hierarchical(s, shared_transform=1.0)) for s in range(3)]
    assert sum(same) / 3 < 0.1
    data = bench.make_hierarchical(0, per_class_train=2, per_class_val=1, per_class_test=3)
    assert data["x_train"].shape == (200, 32) and data["y_test"].tolist() == [
        5 * c + f for c in range(20) for f in range(5) for _ in range(3)]
    assert torch.equal(data["c_val"], data["y_val"] // 5)
    with pytest.raises(ValueError, match="shared_transform"):
        bench.make_hierarchical(0, shared_transform=1.5)


def test_unit_tags_give_every_member_of_a_unit_one_members_category():
    category = torch.arange(20).repeat(10)  # 200 samples, 20 categories
    tags = bench.unit_tags(category, 8, torch.Generator().manual_seed(0))
    assert tags.shape == category.shape
    # each tag is some sample's category, and a unit of 8 spanning ~8 categories names its own rarely
    agreement = float((tags == category).double().mean())
    assert 0.05 < agreement < 0.35
    assert torch.equal(bench.unit_tags(category, 1, torch.Generator().manual_seed(0)), category)  # span 1: aligned
    values, counts = tags.unique(return_counts=True)
    assert (counts % 8 == 0).sum() >= len(values) // 2  # tags come in whole units (the last unit may be short)
    with pytest.raises(ValueError, match="span"):
        bench.unit_tags(category, 0, torch.Generator())


def test_permuted_mapping_moves_every_category_to_another_branch():
    tasks = bench._tasks(bench.QUICK)
    hier, digits = bench.permuted_mapping(tasks["hierarchical"], 20), bench.permuted_mapping(tasks["digits"], 3)
    assert tasks["hierarchical"].k == 20 and tasks["hierarchical"].mapping is None  # one branch per category
    assert all(w != c for c, w in enumerate(hier)) and sorted(set(hier)) == list(range(20))
    assert digits == [1, 2, 0]


def test_within_verdict_is_an_equivalence_test():
    assert verdict_of((-0.005, 0.008), 0.01, "within") == "holds"
    assert verdict_of((-0.02, 0.005), 0.01, "within") == "inconclusive"
    assert verdict_of((0.012, 0.03), 0.01, "within") == "fails"
    assert verdict_of((-0.05, -0.02), 0.01, "within") == "fails"
    c = claim("x", paper="p", quantity="q", values=[0.001, -0.002, 0.0], target=0.01, op="within")
    assert c["verdict"] == "holds"


def test_a_unit_tagged_row_trains_on_unit_tags_and_tests_with_true_tags_and_the_uniform_merge(hierarchical):
    task = dataclasses.replace(bench._tasks(bench.QUICK)["hierarchical"], epochs=1)
    row = bench.train_and_measure(task, "specdrop_units", hierarchical, 0, 1e-2)
    assert row["train_tag_agreement"] < 0.5  # units of 8 over 20 categories: the tag is mostly another's
    assert {"test_acc_uniform", "specialization_gap_permuted", "diag_dominance_permuted", "mean_sensitivity"} <= set(row)
    aligned = bench.train_and_measure(task, "specdrop", hierarchical, 0, 1e-2)
    assert aligned["train_tag_agreement"] == 1.0


def test_claims_carry_premises_competitors_and_controls_that_can_hold():
    from lit_lowrank.benchmarks.harness import resolve

    rows = []
    for task in ("t",):
        for seed in range(4):
            for method in (*bench.TUNED, *bench.CONTROLS):
                good = method in ("specdrop", "demix", "dense_tagged")
                row = {"task": task, "method": method, "seed": seed, "lr": 0.03, "selected": True,
                       "val_acc": 0.8 + 0.1 * good, "test_acc": 0.8 + 0.1 * good + 0.001 * seed}
                if method in bench.BRANCH_FAMILY:
                    row.update(test_acc_uniform=0.8 + 0.001 * seed, specialization_gap=0.3 * good + 0.01 * seed,
                               diag_dominance=1.0 * good, mean_sensitivity=0.05, specialization_gap_permuted=-0.1,
                               diag_dominance_permuted=0.0)
                rows.append(row)
    claims, controls, premises, competitors = bench._claims(rows)
    resolved = {c["name"]: c for c in resolve(claims, premises, competitors)}
    assert all(p["verdict"] == "holds" for p in premises)
    # tag-aware dense in SpecDrop's place wins as much: the claims say so
    assert resolved["t_dense"]["verdict"] == "holds" and resolved["t_dense"]["matched_by"]
    assert resolved["t_broken_1"]["verdict"] == "holds"  # the uniform merge of unit-tagged SpecDrop = No-Routing
    assert all(c["verdict"] != "holds" for c in controls)
