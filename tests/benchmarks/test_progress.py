"""Progress of long benchmark runs: stages and ticks inside a run, silent outside it and when quiet."""

from __future__ import annotations

from lit_lowrank.benchmarks import _progress
from lit_lowrank.benchmarks._progress import reporting, stage, track
from lit_lowrank.benchmarks._workers import map_jobs


def _square(x):
    return x * x


def test_stages_tick_units_inside_a_run_and_are_no_ops_outside(monkeypatch):
    monkeypatch.delenv("LIT_LOWRANK_QUIET", raising=False)
    assert list(track([1, 2, 3], "outside")) == [1, 2, 3]  # no display: plain iteration
    with reporting("toy (quick)"):
        progress = _progress._ACTIVE
        assert progress is not None
        with stage("tuning", total=4) as tick:
            tick()
            tick(2)
            task = progress.tasks[-1]
            assert task.description.strip() == "tuning" and task.completed == 3 and task.total == 4
        assert list(track(["a", "b"], "decoding")) == ["a", "b"]
        assert progress.tasks[-1].completed == 2
        assert map_jobs(_square, [(2,), (3,)], processes=1) == [4, 9]
        assert progress.tasks[-1].description.strip() == "_square (2 jobs)" and progress.tasks[-1].completed == 2
    assert _progress._ACTIVE is None


def test_quiet_draws_nothing(monkeypatch, capsys):
    monkeypatch.setenv("LIT_LOWRANK_QUIET", "1")
    with reporting("toy"):
        assert _progress._ACTIVE is None
        with stage("x", total=1) as tick:
            tick()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
