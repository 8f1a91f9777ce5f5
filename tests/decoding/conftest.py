"""One intra-op thread for the decoding tests: they run hundreds of tiny forwards, where a second
thread only spin-waits (8x slower on a shared 2-core machine)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
