"""DistillWindows scores only the positions that predict the target's own answer (assistant-only loss)."""

from __future__ import annotations

import torch

from lit_lowrank.decoding.distill_data import DistillWindows


def _data() -> dict:
    prompts, conts = [[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10]]
    lengths = [len(p) + len(c) for p, c in zip(prompts, conts)]
    return {"prompt_ids": prompts, "continuations": conts,
            "features": [torch.randn(n, 4) for n in lengths],
            "target_ids": [torch.arange(10, 10 + n) for n in lengths]}


def test_assistant_only_masks_prompt_predictions():
    masked = DistillWindows(_data(), seq_len=10)[0]
    full = DistillWindows(_data(), seq_len=10, assistant_only=False)[0]
    # sequence 1: positions 0..4, prompt length 3 -> positions 2, 3, 4 predict answer tokens (2 predicts token 3)
    # sequence 2: positions 5..9, prompt length 2 -> positions 6, 7, 8, 9
    scored = [2, 3, 4, 6, 7, 8, 9]
    assert (masked["target_ids"] >= 0).nonzero().flatten().tolist() == scored
    assert torch.equal(masked["target_ids"][scored], full["target_ids"][scored])
    assert (full["target_ids"] >= 0).all()
    assert torch.equal(masked["input_ids"], full["input_ids"])  # the prompt stays as context
