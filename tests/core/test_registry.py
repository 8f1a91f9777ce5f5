"""The method registry: all nineteen methods listed, specs validated, temporary entries."""

from __future__ import annotations

import pytest

from lit_lowrank.core import MethodSpec, all_methods, get_method, methods_table, register_method, unregister_method


def test_nineteen_methods_with_unique_names():
    names = [m.name for m in all_methods()]
    assert len(names) == 19 and len(set(names)) == 19


def test_table_rows_match_registry():
    rows = methods_table()
    assert [r["method"] for r in rows] == [m.name for m in all_methods()]
    assert {r["status"] for r in rows} <= {"planned", "implemented"}


def test_bad_kind_and_task_are_rejected():
    with pytest.raises(ValueError, match="kind='plugin'"):
        MethodSpec("x", "x", "plugin", ("classification",), 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown tasks"):
        MethodSpec("x", "x", "callback", ("vision",), 1)


def test_register_duplicate_and_unknown():
    spec = MethodSpec("tmp_method", "t", "callback", ("classification",), 1, component="a.b")
    register_method(spec)
    try:
        assert get_method("tmp_method").status == "implemented"
        with pytest.raises(ValueError, match="already registered"):
            register_method(spec)
    finally:
        unregister_method("tmp_method")
    with pytest.raises(KeyError, match="tmp_method"):
        get_method("tmp_method")
