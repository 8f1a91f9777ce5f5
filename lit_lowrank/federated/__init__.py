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

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.federated.client import FlowClassifier, FlowClient  # noqa: F401
    from lit_lowrank.federated.module import FedLowShotModule  # noqa: F401
    from lit_lowrank.federated.phrases import phrase_embeddings  # noqa: F401
    from lit_lowrank.federated.server import FederationResult, evaluate_episodes, run_federation  # noqa: F401

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
