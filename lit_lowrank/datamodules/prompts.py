"""Prompt datasets for RL on language models (GRPO): a verifiable arithmetic task and a JSONL loader.

Batches are dicts of lists: ``{"prompt": [str, ...], "answer": [str, ...]}`` (``answer`` is
``""`` where the data has none). The embedded default is :func:`arithmetic_problems`, a seeded
set of small additions and subtractions with exact answers; :func:`arithmetic_reward` checks a
completion against them (TRL's reward-function interface, ``answer`` arrives as a keyword
column), so task accuracy can be measured without any learned reward.

.. code-block:: python

    dm = PromptDataModule(source="arithmetic", batch_size=4)
    dm = PromptDataModule(source="~/data/prompts.jsonl")      # {"prompt": ..., "answer": ...} per line
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any, Optional

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lit_lowrank.datamodules._paths import require_path

__all__ = ["PromptDataModule", "arithmetic_problems", "arithmetic_reward", "extract_number"]

ARITHMETIC_TEMPLATE = "What is {a} {op} {b}? Answer with the number only."


def arithmetic_problems(n: int, seed: int = 0, max_operand: int = 9,
                        ops: Sequence[str] = ("+", "-")) -> list[dict[str, str]]:
    """``n`` seeded problems ``{"prompt": "What is 3 + 4? ...", "answer": "7"}``.

    Args:
        n: number of problems.
        seed: seeds the operands and operators.
        max_operand: operands are drawn from ``[1, max_operand]``; subtraction keeps ``a >= b``.
        ops: operators among ``"+"``, ``"-"``, ``"*"``.
    """
    bad = [o for o in ops if o not in ("+", "-", "*")]
    if bad or not ops:
        raise ValueError(f"`ops`={tuple(ops)!r}: expected a non-empty subset of ('+', '-', '*').")
    if max_operand < 1:
        raise ValueError(f"`max_operand` must be >= 1, got {max_operand}.")
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        a, b, op = rng.randint(1, max_operand), rng.randint(1, max_operand), rng.choice(list(ops))
        if op == "-" and b > a:
            a, b = b, a
        value = a + b if op == "+" else a - b if op == "-" else a * b
        problems.append({"prompt": ARITHMETIC_TEMPLATE.format(a=a, op=op, b=b), "answer": str(value)})
    return problems


def extract_number(text: str) -> str | None:
    """The last integer in ``text`` (``"3 + 4 = 7."`` -> ``"7"``), or ``None``.

    The last one, because models often restate the question before answering.
    """
    matches = re.findall(r"-?\d+", text)
    return matches[-1] if matches else None


def _completion_text(completion: Any) -> str:
    # TRL passes conversational completions as [{"role": "assistant", "content": ...}]
    if isinstance(completion, list):
        return " ".join(str(m.get("content", "")) for m in completion)
    return str(completion)


def arithmetic_reward(prompts: list[Any], completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 where the last integer of the completion equals ``answer``, else 0.0 (TRL interface).

    .. code-block:: python

        arithmetic_reward(["What is 3 + 4? ..."], ["7"], answer=["7"])   # [1.0]
    """
    if len(answer) != len(completions):
        raise ValueError(f"`answer` has {len(answer)} entries for {len(completions)} completions.")
    return [float(extract_number(_completion_text(c)) == str(a)) for c, a in zip(completions, answer)]


def _collate(items: list[dict[str, str]]) -> dict[str, list[str]]:
    return {"prompt": [it["prompt"] for it in items], "answer": [it.get("answer", "") for it in items]}


class PromptDataModule(pl.LightningDataModule):
    """Prompts (with optional reference answers) for GRPO-style training.

    Args:
        source: ``"arithmetic"`` (embedded, :func:`arithmetic_problems`) or a local ``.jsonl`` file
            with one ``{"prompt": ..., "answer": ...}`` object per line (``answer`` optional).
        batch_size: prompts per batch (each is sampled ``group_size`` times by the GRPO module).
        num_train / num_val: problem counts of the embedded task.
        max_operand: operand range of the embedded task.
        seed: seeds the embedded task (validation uses ``seed + 1``); also splits a JSONL file
            (the last ``num_val`` lines are validation).

    .. code-block:: python

        trainer.fit(GRPOModule(...), datamodule=PromptDataModule("arithmetic", batch_size=4))
    """

    def __init__(self, source: str = "arithmetic", batch_size: int = 4, num_train: int = 64, num_val: int = 16,
                 max_operand: int = 9, seed: int = 0) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
        self.source, self.batch_size = source, batch_size
        self.num_train, self.num_val, self.max_operand, self.seed = num_train, num_val, max_operand, seed
        self.train_items: list[dict[str, str]] = []
        self.val_items: list[dict[str, str]] = []

    def setup(self, stage: Optional[str] = None) -> None:
        if self.source == "arithmetic":
            self.train_items = arithmetic_problems(self.num_train, self.seed, self.max_operand)
            self.val_items = arithmetic_problems(self.num_val, self.seed + 1, self.max_operand)
            return
        path = require_path(self.source, "source", "a .jsonl file with one {\"prompt\": ..., \"answer\": ...} per "
                            "line", "or use source='arithmetic'")
        items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for i, item in enumerate(items):
            if "prompt" not in item:
                raise ValueError(f"{path}: line {i + 1} has no 'prompt' key.")
            item["answer"] = str(item.get("answer", ""))
        if len(items) <= self.num_val:
            raise ValueError(f"{path} has {len(items)} prompts, not more than num_val={self.num_val}.")
        self.train_items, self.val_items = items[: -self.num_val], items[-self.num_val:]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_items, batch_size=self.batch_size, shuffle=True, collate_fn=_collate)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_items, batch_size=self.batch_size, shuffle=False, collate_fn=_collate)
