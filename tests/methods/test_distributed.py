"""Scale-out contract (issue #40): every fit-time method under 2-process CPU DDP and FSDP2, or a refusal at setup.

For each case of :data:`tests.methods.cases.CASES` and each strategy, the registry says what must happen
(``MethodSpec.ddp`` / ``fsdp``: it runs; ``refuses`` / ``refuses_if``: it refuses at ``setup`` with an error naming
the strategy). A run that must work ends with the single-process run's weights (both ranks see the same batches, so
the averaged gradient is the single-process one: the method acted exactly as on one process) and logs the same
``method/...`` diagnostics. The README's capability table is generated from the same registry fields
(``tests/test_readme.py``), so it says what these tests ran.

Both strategies' workers run every case in one launch (:mod:`tests.methods.distributed`); ``make test-dist`` runs
this file (``make test`` leaves it out: about five minutes on 2 cores).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lit_lowrank.core.registry import get_method
from tests.methods.cases import CASES
from tests.methods.distributed import launch

pytestmark = [pytest.mark.dist, pytest.mark.slow]
NAMES = sorted(CASES)
STRATEGY_CLASS = {"ddp": "DDPStrategy", "fsdp2": "ModelParallelStrategy"}
_RUNS: dict[str, Path] = {}


def _expected(name: str, strategy: str) -> str:
    """``"runs"`` or ``"refuses"``, from the registry (the reference method runs everywhere)."""
    family = "ddp" if strategy == "ddp" else "fsdp"
    if name == "reference":
        return "runs"
    spec = get_method(name)
    if family in spec.refuses or family in spec.refuses_if:
        return "refuses"
    assert getattr(spec, family), (f"{name}: the registry declares neither {family}=True nor a refusal; declare what "
                                   f"the method does under {STRATEGY_CLASS[strategy]}.")
    return "runs"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Any:
    def outcome(run: str, name: str) -> dict[str, Any]:
        """``run``: ``ddp``, ``fsdp2``, ``single`` or ``single.sharded`` (the reference with FSDP2's callbacks)."""
        strategy, _, suffix = run.partition(".")
        if strategy not in _RUNS:
            out = tmp_path_factory.mktemp(strategy)
            launch(strategy, out, NAMES)
            _RUNS[strategy] = out
        path = _RUNS[strategy] / f"{name}{'.' + suffix if suffix else ''}.pt"
        assert path.is_file(), f"{run} worker wrote no outcome for {name}"
        return torch.load(path, weights_only=False)  # written by this test's own workers

    return outcome


def _assert_refused_at_setup(outcome: dict[str, Any], strategy: str) -> None:
    assert outcome["error"], f"{outcome['case']} ran under {strategy}; the registry says it refuses"
    assert STRATEGY_CLASS[strategy] in outcome["error"], outcome["error"]
    assert outcome["steps_done"] == 0, f"refused only after {outcome['steps_done']} steps: {outcome['error']}"
    assert "_call_setup_hook" in outcome["traceback"] or "apply_loss_hooks" in outcome["traceback"], \
        outcome["traceback"][-2000:]


def _assert_same_as_single(outcome: dict[str, Any], single: dict[str, Any], name: str, strategy: str) -> None:
    assert outcome["error"] is None, f"{name} under {strategy}:\n{outcome.get('traceback', '')[-3000:]}"
    assert single["error"] is None, single.get("traceback")
    assert outcome["global_step"] == single["global_step"] == 3
    assert list(outcome["state"]) == list(single["state"]), "the structure differs from the single-process run"
    for key, value in single["state"].items():
        got = outcome["state"][key]
        if torch.is_tensor(value) and value.is_floating_point():
            torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {key}: {m}")
        else:
            assert torch.equal(got, value) if torch.is_tensor(value) else got == value, key
    assert sorted(outcome["metrics"]) == sorted(single["metrics"]), "the method's diagnostics differ"


@pytest.mark.parametrize("name", NAMES)
def test_ddp_two_process_cpu(name, runs):
    """A 2-process gloo DDP fit ends where the single-process fit ends, or the method refuses DDP at setup."""
    outcome = runs("ddp", name)
    if _expected(name, "ddp") == "refuses":
        _assert_refused_at_setup(outcome, "ddp")
    else:
        _assert_same_as_single(outcome, runs("single", name), name, "ddp")


@pytest.mark.parametrize("name", NAMES)
def test_fsdp2_two_process_cpu(name, runs):
    """A 2-process FSDP2 fit (ModelParallelStrategy, fully_shard in configure_model) ends where the single-process
    fit ends, or the method refuses FSDP at setup."""
    outcome = runs("fsdp2", name)
    if _expected(name, "fsdp2") == "refuses":
        _assert_refused_at_setup(outcome, "fsdp2")
    else:
        _assert_same_as_single(outcome, runs("single.sharded", name), name, "fsdp2")
