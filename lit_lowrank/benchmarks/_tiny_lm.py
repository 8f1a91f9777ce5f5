"""Training the small causal LMs that benchmarks use as targets, cached on disk (shared by specblock and spirit)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch


def load_cached(model: torch.nn.Module, path: Path) -> bool:
    """Load ``path`` into ``model`` (and set eval mode) if it exists; return whether it did."""
    if not path.is_file():
        return False
    model.load_state_dict(torch.load(path, weights_only=True))
    model.eval()
    return True


def train_and_cache(model: torch.nn.Module, windows: torch.Tensor, steps: int, lr: float, seed: int, path: Path,
                    batch_size: int = 8,
                    step_context: Callable[[torch.Generator], AbstractContextManager] | None = None) -> torch.nn.Module:
    """Next-token training on random ``windows`` rows (AdamW + one-cycle, clipped), then an atomic save to ``path``.

    Args:
        step_context: called with the sampling generator after each batch is drawn; the loss is computed inside
            the context it returns (e.g. a random layer-skip pattern for layer-drop training).
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        batch = windows[torch.randint(0, windows.shape[0], (batch_size,), generator=g)]
        with step_context(g) if step_context is not None else contextlib.nullcontext():
            loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    # a per-process temporary name so concurrent benchmark runs never read a half-written file
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, path)
    return model.eval()
