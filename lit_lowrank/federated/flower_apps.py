"""Flower ServerApp / ClientApp for fed_lowshot (needs ``pip install 'lit_lowrank[federated]'``).

The apps run the same client and server code as the in-process federation
(:func:`~lit_lowrank.federated.server.run_federation`):

1. ``num-rounds`` FedAvg rounds of the flow encoder (Flower's ``DefaultWorkflow`` with the legacy
   ``FedAvg`` strategy; each ClientApp trains with Lightning, :meth:`FlowClient.fit`);
2. one round of class moments under Flower's **SecAgg+** (``SecAggPlusWorkflow`` on the server,
   ``secaggplus_mod`` on the clients). SecAgg+ returns a weighted average of values clipped to
   ``±clipping_range``, so each client clips its features to ``±feature-bound``, prescales the
   three moment blocks by public bounds (``max-client-rows``, ``feature-bound``) into the
   clipping range and reports ``num_examples = 1``; the server multiplies back by the number
   of clients and the bounds (METHODS.md §5);
3. the server builds the prior bank and, if ``output`` is set, saves the
   :class:`~lit_lowrank.federated.server.FederationResult` there (``torch.save``).

Deployment (no Ray; one SuperLink, one SuperNode per client; see docs/methods/fed_lowshot.md)::

    flower-superlink --insecure
    flower-supernode --insecure --superlink 127.0.0.1:9092 --clientappio-api-address 127.0.0.1:9094 \\
        --node-config "partition-id=0 num-partitions=2"        # one per client, own ports
    flwr run lit_lowrank/federated/flower_app local-deployment --stream

In one process (tests, notebooks), :func:`run_flower_inprocess` runs both apps on Flower's
in-memory SuperLink state with the ClientApps executed in a thread (Flower's simulation
engine needs Ray; this does not).

.. code-block:: python

    from lit_lowrank.federated.flower_apps import client_app, run_flower_inprocess, server_app

    result = run_flower_inprocess(server_app, client_app, num_supernodes=3,
                                  run_config={"num-rounds": 2, "num-clients": 3, "samples-per-class": 80})
    result.bank.counts     # securely summed class counts
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from functools import lru_cache
from pathlib import Path
from queue import Empty, Queue
from typing import Any
from unittest import mock

import numpy as np
import torch

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("lit_lowrank.federated.flower_apps needs Flower: pip install 'lit_lowrank[federated]' "
                      "(flwr==1.42.0)") from exc

from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_PARAMS_RECORD
from flwr.serverapp import ServerApp

from lit_lowrank.datamodules.flows import FlowsDataModule
from lit_lowrank.federated.client import FlowClassifier, FlowClient, flatten_moments
from lit_lowrank.federated.server import FederationResult, build_prior_bank

#: Run-config defaults (``[tool.flwr.app.config]`` of ``flower_app/pyproject.toml`` mirrors them).
DEFAULT_RUN_CONFIG: dict[str, Any] = {
    "num-rounds": 3, "local-epochs": 1, "encoder": "mlp", "feature-dim": 32, "num-clients": 3, "alpha": 0.3,
    "samples-per-class": 400, "source": "simulated", "root": "", "seed": 0, "batch-size": 64, "lr": 1e-3,
    "phrase-encoder": "minilm", "feature-bound": 30.0, "max-client-rows": 5000, "clipping-range": 8.0,
    "output": "",
}


#: The Flower app folder (its pyproject.toml names the apps and the run-config defaults).
APP_DIR = Path(__file__).with_name("flower_app")


def _config(run_config) -> dict[str, Any]:
    cfg = {**DEFAULT_RUN_CONFIG, **dict(run_config)}
    unknown = sorted(set(cfg) - set(DEFAULT_RUN_CONFIG))
    if unknown:
        raise ValueError(f"fed_lowshot Flower run config: unknown keys {unknown}; expected {sorted(DEFAULT_RUN_CONFIG)}")
    return cfg


@lru_cache(maxsize=4)
def _datamodule(source: str, root: str, num_clients: int, alpha: float, samples_per_class: int,
                seed: int) -> FlowsDataModule:
    dm = FlowsDataModule(source=source, root=root or None, num_clients=num_clients, alpha=alpha,
                         samples_per_class=samples_per_class, seed=seed)
    dm.setup()
    return dm


def _dm(cfg: dict[str, Any]) -> FlowsDataModule:
    return _datamodule(cfg["source"], cfg["root"], int(cfg["num-clients"]), float(cfg["alpha"]),
                       int(cfg["samples-per-class"]), int(cfg["seed"]))


def _model_kwargs(cfg: dict[str, Any], num_classes: int) -> dict[str, Any]:
    return {"encoder": cfg["encoder"], "num_classes": num_classes, "in_features": 78,
            "feature_dim": int(cfg["feature-dim"]), "encoder_kwargs": {}}


def _moment_scales(cfg: dict[str, Any]) -> tuple[float, float, float]:
    # public bounds per block: counts <= N, |sums| <= N·B, |second| <= N·B² (features clipped to ±B)
    n, b, c = float(cfg["max-client-rows"]), float(cfg["feature-bound"]), float(cfg["clipping-range"])
    return n / c, n * b / c, n * b * b / c


def state_to_arrays(state: dict[str, torch.Tensor]) -> list[np.ndarray]:
    return [v.detach().cpu().numpy() for v in state.values()]


def arrays_to_state(arrays: list[np.ndarray], template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if len(arrays) != len(template):
        raise ValueError(f"arrays_to_state: {len(arrays)} arrays for {len(template)} state entries")
    return {k: torch.as_tensor(np.asarray(a)).to(v.dtype).reshape(v.shape) for (k, v), a in zip(template.items(),
                                                                                                  arrays)}


class FlowerFlowClient(NumPyClient):
    """Flower NumPyClient around :class:`FlowClient`: ``phase="train"`` or ``phase="moments"``."""

    def __init__(self, client: FlowClient, cfg: dict[str, Any]) -> None:
        self.client, self.cfg = client, cfg
        self.template = client.model().state_dict()

    def get_parameters(self, config):
        return state_to_arrays(self.template)

    def fit(self, parameters, config):
        state = arrays_to_state(parameters, self.template)
        if config.get("phase") == "moments":
            bound = float(self.cfg["feature-bound"])
            counts, sums, second = self.client.moments(state, clip=bound)
            scales = _moment_scales(self.cfg)
            blocks = [counts.numpy() / scales[0], sums.numpy() / scales[1], second.numpy() / scales[2]]
            return [b.astype(np.float64) for b in blocks], 1, {}  # num_examples = 1: SecAgg+ averages
        new_state, n = self.client.fit(state, int(self.cfg["local-epochs"]), round_idx=int(config.get("round", 0)))
        return state_to_arrays(new_state), n, {}


def _client_fn(context):
    cfg = _config(context.run_config)
    dm = _dm(cfg)
    k = int(context.node_config["partition-id"])
    client = FlowClient(k, *dm.client_data(k), num_classes=len(dm.base_names),
                        model_kwargs=_model_kwargs(cfg, len(dm.base_names)), batch_size=int(cfg["batch-size"]),
                        lr=float(cfg["lr"]), seed=int(cfg["seed"]))
    return FlowerFlowClient(client, cfg).to_client()


def moments_secaggplus_mod(msg, ctxt, call_next):
    """``secaggplus_mod`` for the SecAgg+ moment round only; plain FedAvg rounds pass through."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


client_app = ClientApp(client_fn=_client_fn, mods=[moments_secaggplus_mod])
server_app = ServerApp()


def _arrays(legacy: LegacyContext) -> list[np.ndarray]:
    return [a.numpy() for a in legacy.state.array_records[MAIN_PARAMS_RECORD].values()]


@server_app.main()
def _server_main(grid, context) -> None:
    cfg = _config(context.run_config)
    dm = _dm(cfg)  # the server reads only the public label vocabulary and shapes from it
    n_clients = int(cfg["num-clients"])
    model_kwargs = _model_kwargs(cfg, len(dm.base_names))
    torch.manual_seed(int(cfg["seed"]))
    template = FlowClassifier(**model_kwargs).state_dict()
    from flwr.common import ndarrays_to_parameters

    def fedavg_strategy(initial: list[np.ndarray], phase: str) -> FedAvg:
        return FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n_clients,
                      min_available_clients=n_clients, initial_parameters=ndarrays_to_parameters(initial),
                      on_fit_config_fn=lambda r: {"phase": phase, "round": r})

    # 1) FedAvg rounds of the encoder (weights averaged as in plain FedAvg)
    train = LegacyContext(context=context, config=ServerConfig(num_rounds=int(cfg["num-rounds"])),
                          strategy=fedavg_strategy(state_to_arrays(template), "train"))
    DefaultWorkflow()(grid, train)
    weights = _arrays(train)
    # 2) one SecAgg+ round of the class moments under the final encoder
    moments = LegacyContext(context=context, config=ServerConfig(num_rounds=1),
                            strategy=fedavg_strategy(weights, "moments"))
    secagg = SecAggPlusWorkflow(num_shares=n_clients, reconstruction_threshold=max(2, n_clients // 2 + 1),
                                clipping_range=float(cfg["clipping-range"]),
                                # clients scale by num_examples / max_weight before quantising: with
                                # num_examples = 1, max_weight = 1 keeps the full 2^22-level resolution
                                max_weight=1.0)
    DefaultWorkflow(fit_workflow=secagg)(grid, moments)
    mean_blocks = _arrays(moments)
    total = flatten_moments(*(torch.as_tensor(b * n_clients * s, dtype=torch.float64)
                              for b, s in zip(mean_blocks, _moment_scales(cfg))))
    state = arrays_to_state(weights, template)
    bank = build_prior_bank(total, dm.base_names, int(cfg["feature-dim"]), cfg["phrase-encoder"])
    result = FederationResult(state, model_kwargs, bank, total)
    _RESULTS[context.run_id] = result
    if cfg["output"]:
        torch.save(result, cfg["output"])


_RESULTS: dict[int, FederationResult] = {}


class _ThreadBackend:
    """A Flower simulation backend that runs each ClientApp call in the calling thread (no Ray)."""

    def __init__(self, backend_config) -> None:
        self.app_fn = None

    def build(self, app_fn) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return 1

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        pass

    def process_message(self, message, context):
        from flwr.clientapp.client_app import ClientAppException

        try:
            # a copy, as a transport would deliver: in-memory messages to several nodes can share one
            # content object, and secaggplus_mod consumes keys from it
            return self.app_fn()(message=copy.deepcopy(message), context=context), context
        except Exception as ex:  # reported to the ServerApp as an error reply, like Ray's actors
            raise ClientAppException(str(ex)) from ex


def run_flower_inprocess(server=None, client=None, num_supernodes: int = 3,
                         run_config: dict[str, Any] | None = None, timeout: float = 600.0) -> FederationResult:
    """Run the ServerApp and ClientApps in this process on Flower's in-memory SuperLink state.

    Uses Flower's own simulation loop (``flwr.simulation.run_simulation``) with its backend
    replaced by :class:`_ThreadBackend`, so no Ray is needed and the ClientApps, mods (SecAgg+)
    and workflows run unmodified.

    .. code-block:: python

        result = run_flower_inprocess(num_supernodes=3, run_config={"num-rounds": 1, "num-clients": 3})
    """
    from flwr.app import Context, RecordDict
    from flwr.app.user_config import UserConfig
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.simulation.run_simulation import _main_loop
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    server = server or server_app
    client = client or client_app
    cfg = _config(run_config or {})
    if int(cfg["num-clients"]) != num_supernodes:
        raise ValueError(f"run_flower_inprocess: run_config['num-clients']={cfg['num-clients']} must equal "
                         f"`num_supernodes`={num_supernodes} (one SuperNode per client partition)")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    run_id = int.from_bytes(os.urandom(7), "big")
    run = Run.create_empty(run_id=run_id)
    run.primary_task_id = int.from_bytes(os.urandom(7), "big")
    run.federation_id = NOOP_FEDERATION_ID
    run.override_config = UserConfig(cfg)  # fused with flower_app/pyproject.toml's defaults per node
    # as flwr.simulation.run_simulation does for its Python API
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    context = Context(run_id=run_id, node_id=0, node_config=UserConfig(), state=RecordDict(),
                      run_config=UserConfig(cfg))
    fake_ray = mock.MagicMock(RayBackend=_ThreadBackend)
    result: Queue = Queue()

    def target() -> None:
        try:
            with mock.patch.dict(sys.modules, {"flwr.server.superlink.fleet.vce.backend.raybackend": fake_ray}):
                _main_loop(num_supernodes, "inprocess", "{}", str(APP_DIR), True, False, run,
                           EventType.PYTHON_API_RUN_SIMULATION_LEAVE, client_app=client, server_app=server,
                           server_app_context=context)
            result.put(None)
        except BaseException as ex:  # noqa: BLE001 - re-raised in the caller
            result.put(ex)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        err = result.get(timeout=timeout)
    except Empty:
        raise TimeoutError(f"run_flower_inprocess: the Flower run did not finish in {timeout} s") from None
    if err is not None:
        raise err
    if run_id not in _RESULTS:
        raise RuntimeError("run_flower_inprocess: the ServerApp finished without a result (see the Flower log)")
    return _RESULTS.pop(run_id)
