"""The stable_rank benchmark's tiny arithmetic policy: target format, caching by config + seed."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.benchmarks.stable_rank import arithmetic_target, tiny_arithmetic_policy
from lit_lowrank.datamodules.prompts import arithmetic_problems, extract_number

SMALL = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 2}


def test_arithmetic_target_restates_and_answers():
    for problem in arithmetic_problems(20, seed=3, ops=("+", "-", "*")):
        target = arithmetic_target(problem)
        a, op, b, eq, value = target.split()
        assert eq == "=" and value == problem["answer"] and extract_number(target) == problem["answer"]
        assert f"What is {a} {op} {b}?" in problem["prompt"]
    with pytest.raises(ValueError, match="problem"):
        arithmetic_target({"prompt": "Name a planet.", "answer": ""})


def test_tiny_policy_is_cached_by_config_and_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_LOWRANK_CACHE", str(tmp_path))
    first = tiny_arithmetic_policy(seed=0, steps=3, config=SMALL)
    files = list((tmp_path / "stable_rank").glob("*.pt"))
    assert len(files) == 1
    again = tiny_arithmetic_policy(seed=0, steps=3, config=SMALL)  # loaded, not retrained
    for (k, a), b in zip(first.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    untrained = tiny_arithmetic_policy(seed=0, steps=0, config=SMALL, cache=False)
    assert any(not torch.equal(a, b) for a, b in zip(first.state_dict().values(), untrained.state_dict().values()))
    tiny_arithmetic_policy(seed=1, steps=3, config=SMALL)
    assert len(list((tmp_path / "stable_rank").glob("*.pt"))) == 2
