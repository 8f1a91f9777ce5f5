"""Ops modules that one method owns moved into its subpackage (issue #39); the old import paths keep working."""

from __future__ import annotations

import importlib

import pytest

MOVED = {
    "lit_lowrank.ops.svd_linear": "lit_lowrank.ops.sara.svd_linear",
    "lit_lowrank.ops.sphquant_feedback": "lit_lowrank.ops.sphquant.feedback",
    "lit_lowrank.ops.sphquant_triton": "lit_lowrank.ops.sphquant.triton_gemv",
    "lit_lowrank.ops.secure_sum": "lit_lowrank.ops.fed_lowshot.secure_sum",
    "lit_lowrank.ops.prior_bank": "lit_lowrank.ops.fed_lowshot.prior_bank",
    "lit_lowrank.ops.niw": "lit_lowrank.ops.fed_lowshot.niw",
    "lit_lowrank.ops.episodes": "lit_lowrank.ops.fed_lowshot.episodes",
    "lit_lowrank.ops.stac_r_rank": "lit_lowrank.ops.stac_r.rank",
    "lit_lowrank.ops.saved_surface": "lit_lowrank.ops.stac_r.saved_surface",
    "lit_lowrank.ops.saved_tensors": "lit_lowrank.ops.stac_r.saved_tensors",
    "lit_lowrank.ops.peak_memory": "lit_lowrank.ops.stac_r.peak_memory",
    # a package named as the old module re-exports it
    "lit_lowrank.ops.stac_r": "lit_lowrank.ops.stac_r.compress",
    "lit_lowrank.ops.sara": "lit_lowrank.ops.sara.rank",
    "lit_lowrank.ops.sphquant": "lit_lowrank.ops.sphquant.codec",
}


PACKAGES = {"lit_lowrank.ops.sara", "lit_lowrank.ops.sphquant", "lit_lowrank.ops.stac_r"}


@pytest.mark.parametrize("old", sorted(set(MOVED) - PACKAGES))
def test_old_flat_path_is_the_moved_module(old):
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])
    assert getattr(importlib.import_module("lit_lowrank.ops"), old.rsplit(".", 1)[1]) is importlib.import_module(MOVED[old])


@pytest.mark.parametrize("old", sorted(PACKAGES))
def test_package_named_as_the_old_module_exports_its_public_names(old):
    before, after = importlib.import_module(old), importlib.import_module(MOVED[old])
    public = [n for n, v in vars(after).items() if not n.startswith("_") and getattr(v, "__module__", None) == after.__name__]
    assert public, MOVED[old]
    missing = [n for n in public if getattr(before, n, None) is not getattr(after, n)]
    assert not missing, f"{old} no longer exports {missing} (moved to {MOVED[old]})"
    assert set(before.__all__) >= set(public)
