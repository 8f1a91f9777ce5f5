"""The SpecDrop benchmark's pieces: matched parameters, the HydraLoRA count, the tied control,
the equivalence verdict, and a fast end-to-end row."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lit_lowrank.benchmarks import specdrop as bench
from lit_lowrank.benchmarks._claims import claim, verdict_of
from lit_lowrank.mixins import SpecDropBranches


@pytest.fixture(scope="module")
def hierarchical():
    return bench.make_hierarchical(0, per_class_train=2, per_class_val=1, per_class_test=2)


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_hydra_parameter_formula_matches_the_built_block(hierarchical):
    model = bench.build_token_model("hydra_lora", hierarchical, 5, [c // 4 for c in range(20)])
    width = model.block[0].base.out_features
    assert _params(model.block) == bench.hydra_params(bench.D_MODEL, width, 5)


def test_token_methods_are_parameter_matched(hierarchical):
    mapping = [c // 4 for c in range(20)]
    counts = {m: _params(bench.build_token_model(m, hierarchical, 5, mapping)) for m in (*bench.TUNED, *bench.CONTROLS)}
    reference = counts["specdrop"]
    for method, count in counts.items():
        if method == "specdrop_tied":  # one set of branch weights: the control, not a baseline
            assert count < reference
        else:
            assert abs(count - reference) / reference < 0.05, (method, count, reference)


def test_tied_branches_share_one_module(hierarchical):
    model = bench.build_token_model("specdrop_tied", hierarchical, 5, [c // 4 for c in range(20)])
    block = model.block
    assert isinstance(block, SpecDropBranches)
    assert all(b is block.branches[0] for b in block.branches)


def test_within_verdict_is_an_equivalence_test():
    assert verdict_of((-0.005, 0.008), 0.01, "within") == "holds"
    assert verdict_of((-0.02, 0.005), 0.01, "within") == "inconclusive"
    assert verdict_of((0.012, 0.03), 0.01, "within") == "fails"
    assert verdict_of((-0.05, -0.02), 0.01, "within") == "fails"
    c = claim("x", paper="p", quantity="q", values=[0.001, -0.002, 0.0], target=0.01, op="within")
    assert c["verdict"] == "holds"


def test_tied_control_cannot_look_specialised(hierarchical):
    """One short training of the tied control: with renormalised ablation its pruning matrix is zero."""
    task = dataclasses.replace(bench._tasks(bench.QUICK)["hierarchical"], epochs=1)
    row = bench.train_and_measure(task, "specdrop_tied", hierarchical, 0, 1e-2)
    assert row["specialization_gap"] == 0.0 and row["diag_dominance"] == 0.0
    assert 0.0 <= row["test_acc"] <= 1.0 and 0.0 <= row["val_acc"] <= 1.0
