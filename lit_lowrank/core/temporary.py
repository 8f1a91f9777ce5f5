"""Temporarily set one attribute on many objects (modules' mode flags), restoring each one's own value after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any


@contextlib.contextmanager
def temporarily_set(objects: Iterable[Any], attr: str, value: Any) -> Iterator[None]:
    """Set ``obj.<attr> = value`` on every object for the block; restore the previous values even on error.

    .. code-block:: python

        with temporarily_set(lora_layers, "_disable_adapters", True):
            base_logits = model(x)
    """
    objects = list(objects)
    previous = [getattr(obj, attr) for obj in objects]
    for obj in objects:
        setattr(obj, attr, value)
    try:
        yield
    finally:
        for obj, old in zip(objects, previous):
            setattr(obj, attr, old)
