"""The one benchmark harness: discovery, timing, the printed table and the JSON contract.

A benchmark is a module ``lit_lowrank/benchmarks/<name>.py`` with

.. code-block:: python

    def run(quick: bool, seed: int) -> BenchmarkResult:
        rows = [{"method": "mine", "ms_per_step": 3.1}, {"method": "baseline", "ms_per_step": 3.0}]
        return BenchmarkResult(rows, claims=[
            claim("step time within 3% of the baseline", measured=3.1 / 3.0 - 1, target=0.03, op="<="),
        ])

Claims are computed from the measured rows (never written by hand); the harness
adds ``benchmark``, ``quick``, ``device`` and ``seconds`` and writes the JSON of
DESIGN.md.
"""

from __future__ import annotations

import importlib
import json
import operator
import pkgutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
_PRIVATE = {"harness"}


def claim(text: str, measured: float, target: float, op: str = ">=") -> dict[str, Any]:
    """A claim row: ``holds`` is ``measured <op> target``, computed here."""
    if op not in _OPS:
        raise ValueError(f"`op`={op!r}, expected one of {sorted(_OPS)}.")
    measured = float(measured)
    return {"claim": text, "measured": measured, "target": float(target), "op": op,
            "holds": bool(_OPS[op](measured, target))}


@dataclass
class BenchmarkResult:
    """What a benchmark's ``run`` returns: rows (one dict per method/setting) and claims."""

    rows: list[dict[str, Any]]
    claims: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


def available_benchmarks() -> list[str]:
    """Names of the benchmark modules in ``lit_lowrank.benchmarks``."""
    import lit_lowrank.benchmarks as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")
                  and m.name not in _PRIVATE)


def run_benchmark(name: str, quick: bool = False, seed: int = 0, json_path: str | Path | None = None,
                  print_table: bool = True) -> dict[str, Any]:
    """Run benchmark ``name``, print its table, optionally write its JSON; return the JSON dict."""
    names = available_benchmarks()
    if name not in names:
        raise ValueError(f"Unknown benchmark {name!r}; available: {names}.")
    module = importlib.import_module(f"lit_lowrank.benchmarks.{name}")
    start = time.perf_counter()
    result: BenchmarkResult = module.run(quick=quick, seed=seed)
    seconds = time.perf_counter() - start
    payload = {
        "benchmark": name, "quick": quick, "seed": seed,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "seconds": round(seconds, 2), "rows": result.rows, "claims": result.claims,
    }
    if result.notes:
        payload["notes"] = result.notes
    if print_table:
        print_result(payload)
    if json_path is not None:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    return payload


def print_result(payload: dict[str, Any]) -> None:
    """Print the rows and claims as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows: Sequence[dict[str, Any]] = payload["rows"]
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    table = Table(title=f"{payload['benchmark']} ({'quick' if payload['quick'] else 'full'}, "
                        f"{payload['device']}, {payload['seconds']:.1f} s)")
    for col in cols:
        table.add_column(col)
    for row in rows:
        table.add_row(*(_fmt(row.get(c, "")) for c in cols))
    console.print(table)
    claims = Table(title="claims")
    for col in ("claim", "measured", "op", "target", "holds"):
        claims.add_column(col)
    for c in payload["claims"]:
        claims.add_row(c["claim"], _fmt(c["measured"]), c["op"], _fmt(c["target"]), "yes" if c["holds"] else "NO")
    console.print(claims)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
