"""temporarily_set: values set for the block, each object's own previous value restored, also on error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_lowrank.core import temporarily_set


def test_sets_then_restores_each_objects_own_value_even_on_error():
    objs = [SimpleNamespace(flag=1), SimpleNamespace(flag=2)]
    with temporarily_set((o for o in objs), "flag", 0):   # a generator is read once, before setting
        assert [o.flag for o in objs] == [0, 0]
    assert [o.flag for o in objs] == [1, 2]
    with pytest.raises(RuntimeError):
        with temporarily_set(objs, "flag", 9):
            raise RuntimeError
    assert [o.flag for o in objs] == [1, 2]
