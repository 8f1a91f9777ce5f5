"""Scale-out runs for the contract suite: every case under 2-process CPU (gloo) DDP and FSDP2.

One worker process per rank runs *every* case in turn (the interpreter and Lightning are imported once per rank,
not once per case): ``python -m tests.methods.distributed --strategy fsdp2 --out DIR`` with ``RANK`` /
``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_*`` set, so Lightning sees an externally launched cluster.
:func:`launch` starts both ranks. Each case writes ``DIR/<case>.pt`` from rank 0: the trained weights gathered
in full, the ``method/...`` metrics logged, and the error (its type and message) when the fit refused.

Both ranks see the same batches in the same order (``use_distributed_sampler=False``, one seed), so averaging the
two identical gradients is the single-process gradient: a method that acts the same under the strategy ends with
the single-process run's weights (within float tolerance), which :func:`run_case` computes with ``strategy="single"``.

FSDP2 is Lightning's ``ModelParallelStrategy`` (``FSDPStrategy`` requires CUDA) with ``fully_shard`` applied to the
user's module in ``configure_model``, after the callbacks' ``setup`` surgery, as a user's module does it.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

STRATEGIES = ("single", "ddp", "fsdp2")


def _shard(module: Any) -> None:
    """A user's ``configure_model`` for FSDP2: shard each child holding parameters, then the whole module.

    FSDP2 gathers a module's shards in a hook on its ``forward``; Lightning calls ``training_step``, which calls
    the children, so the children are the units (as Lightning's FSDP2 examples shard each block).
    """
    from torch.distributed.fsdp import fully_shard

    mesh = module.device_mesh
    mesh = mesh["data_parallel"] if mesh.ndim > 1 else mesh
    for child in module.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(module, mesh=mesh)


def _strategy(name: str) -> Any:
    if name == "single":
        return {"strategy": "auto", "devices": 1}
    if name == "ddp":
        return {"strategy": "ddp", "devices": 2}
    from lightning.pytorch.strategies import ModelParallelStrategy

    return {"strategy": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), "devices": 2}


def _full_state(module: Any) -> dict[str, Any]:
    """The module's weights in full on every rank (FSDP2 holds DTensor shards: gathered)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for key, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        out[key] = value.detach().cpu().clone() if hasattr(value, "detach") else value
    return out


def run_case(name: str, strategy: str, root: Path, max_steps: int = 3,
             sharded_callbacks: bool | None = None) -> dict[str, Any]:
    """Fit case ``name`` under ``strategy`` (``single``, ``ddp`` or ``fsdp2``); the outcome as plain data.

    ``sharded_callbacks`` (default: for ``fsdp2``) uses the case's ``make_sharded_callbacks`` when it has them.
    """
    import lightning.pytorch as pl
    import torch

    from tests.methods.cases import CASES

    case = CASES[name]()
    pl.seed_everything(0, verbose=False)
    module = case.make_module()
    if strategy == "fsdp2":
        module.configure_model = lambda: _shard(module)  # the user's configure_model
    trainer_kwargs = {**dict(max_steps=max_steps, default_root_dir=root / name / strategy, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             limit_val_batches=0, accelerator="cpu", use_distributed_sampler=False),
                      **case.trainer_kwargs, **_strategy(strategy)}
    sharded = strategy == "fsdp2" if sharded_callbacks is None else sharded_callbacks
    make = case.make_sharded_callbacks if sharded and case.make_sharded_callbacks else case.make_callbacks
    trainer = pl.Trainer(callbacks=make(), **trainer_kwargs)
    outcome: dict[str, Any] = {"case": name, "strategy": strategy, "error": None}
    data = case.make_data()
    if strategy == "single":
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()  # what DDP / ModelParallel's setup_distributed does: the same RNG state at the callbacks' setup
    try:
        trainer.fit(module, datamodule=data)
    except Exception as err:  # a refusal (or a crash) is the outcome the test reads
        outcome["error"] = f"{type(err).__name__}: {err}"
        outcome["traceback"] = traceback.format_exc()
        outcome["steps_done"] = trainer.global_step
        return outcome
    outcome["state"] = _full_state(module)
    outcome["metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()
                          if k.startswith("method/") and torch.is_tensor(v) and v.numel() == 1}
    outcome["global_step"] = trainer.global_step
    return outcome


def _worker(strategy: str, out: Path, cases: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    for name in cases:
        if strategy == "single":  # the references of both strategies (FSDP2 may run other callbacks)
            for sharded in (False, True):
                outcome = run_case(name, strategy, out, sharded_callbacks=sharded)
                torch.save(outcome, out / f"{name}{'.sharded' if sharded else ''}.pt")
            continue
        outcome = run_case(name, strategy, out)
        if rank == 0:
            torch.save(outcome, out / f"{name}.pt")
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # a refusal on one rank must not leave the other in a collective
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(strategy: str, out: Path, cases: list[str], timeout: float = 900.0) -> str:
    """Run :func:`_worker` on 2 CPU ranks (``single``: one process, no process group); returns the ranks' output
    (raises when a rank fails or hangs). The single-process reference runs the same way, in a fresh interpreter
    with the same environment, so the two differ only by the strategy."""
    out.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo), "PYTHONHASHSEED": "0"}
    ranks = 1 if strategy == "single" else 2
    if ranks > 1:
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "NODE_RANK": "0"})
    procs = []
    logs = []
    for rank in range(ranks):
        log = open(out / f"rank{rank}.log", "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.methods.distributed", "--strategy", strategy, "--out", str(out),
             "--cases", ",".join(cases)],
            cwd=repo, env={**env, **({"RANK": str(rank), "LOCAL_RANK": str(rank)} if ranks > 1 else {})},
            stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        codes = ["timeout"] * 2
    text = ""
    for rank, log in enumerate(logs):
        log.seek(0)
        text += f"--- rank {rank}\n{log.read()[-6000:]}"
        log.close()
    if codes != [0] * ranks:
        raise RuntimeError(f"{strategy} workers exited with {codes}:\n{text}")
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=STRATEGIES, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", required=True)
    ns = parser.parse_args()
    _worker(ns.strategy, ns.out, ns.cases.split(","))
