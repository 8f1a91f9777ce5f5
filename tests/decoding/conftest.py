"""One intra-op thread for the decoding tests: they run hundreds of tiny forwards, where a second
thread only spin-waits (8x slower on a shared 2-core machine)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _decoding_on_one_thread(one_thread):
    yield
