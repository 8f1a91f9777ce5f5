"""Filters for third-party messages that are not about the user's run (issue #40: a clean CPU run prints nothing
it cannot act on). Each filter drops one known message at its source logger, never a whole logger or all warnings.

- bitsandbytes (imported by PEFT) logs ``Failed to load CPU gemm_4bit_forward from kernels-community: No module
  named 'kernels'`` on CPUs with AVX512-BF16: an optional kernel package for 4-bit CPU matmuls, which lit_lowrank
  never uses. Other bitsandbytes messages, and this one for any other cause, pass.
- The profiler's own status lines (Kineto, printed from C++) are dropped where the profiler runs:
  :mod:`lit_lowrank.ops.stac_r.peak_memory`.

:func:`install` runs when :mod:`lit_lowrank.core` is imported (every lit_lowrank component imports it).
"""

from __future__ import annotations

import logging

#: (logger name, message prefix, text its arguments must contain): the messages dropped.
DROPPED = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward", "No module named 'kernels'"),
)


class _DropKnownMessage(logging.Filter):
    def __init__(self, prefix: str, cause: str) -> None:
        super().__init__()
        self.prefix, self.cause = prefix, cause

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if not message.startswith(self.prefix):
            return True
        return self.cause not in record.getMessage()


def install() -> None:
    """Attach the filters (idempotent)."""
    for name, prefix, cause in DROPPED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownMessage) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropKnownMessage(prefix, cause))
