"""Federated low-shot intrusion detection (``fed_lowshot``, docs/methods/fed_lowshot.md).

- :mod:`~lit_lowrank.federated.client`: the client (local Lightning training, class moments,
  masked upload) shared by every runtime;
- :mod:`~lit_lowrank.federated.server`: FedAvg, secure moment sum, prior bank, episodes, and
  :func:`run_federation` (the in-process federation);
- :class:`FedLowShotModule`: the same federation driven by ``lit-lowrank fit``;
- :mod:`~lit_lowrank.federated.flower_apps`: Flower ServerApp / ClientApp (needs ``flwr``,
  ``pip install 'lit_lowrank[federated]'``), with SecAgg+ for the moments.

Names are imported on first use (Lightning-free imports stay cheap).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FedLowShotModule": "lit_lowrank.federated.module",
    "FlowClassifier": "lit_lowrank.federated.client",
    "FlowClient": "lit_lowrank.federated.client",
    "FederationResult": "lit_lowrank.federated.server",
    "run_federation": "lit_lowrank.federated.server",
    "evaluate_episodes": "lit_lowrank.federated.server",
    "phrase_embeddings": "lit_lowrank.federated.phrases",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lit_lowrank.federated' has no attribute {name!r}")
