"""The one benchmark harness: discovery, claims over paired units, controls, the JSON contract.

A benchmark is a module ``lit_lowrank/benchmarks/<name>.py`` with

.. code-block:: python

    from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, paired

    def run(quick: bool, seed: int) -> BenchmarkResult:
        rows = [{"method": m, "seed": s, "acc": ...} for m in ("mine", "base", "null") for s in range(5)]
        mine, base, seeds = paired(rows, "acc", {"method": "mine"}, {"method": "base"})
        null, _, _ = paired(rows, "acc", {"method": "null"}, {"method": "base"})
        return BenchmarkResult(
            rows,
            claims=[claim("mine above base", paper="+2.1 points over base", quantity="acc(mine) - acc(base)",
                          values=mine, baseline=base, units=seeds, target=0.0, op=">")],
            controls=[claim("a null model above base", paper="(control)", quantity="acc(null) - acc(base)",
                            values=null, baseline=base, units=seeds, target=0.0, op=">")],
        )

Claims are computed from the measured rows over paired units with a 95% CI and a
verdict (:mod:`lit_lowrank.benchmarks._claims`). Controls are the same claims computed
where they must not hold; a benchmark with no control, or with a control that holds, is
written with ``valid: false``. Premises (``premises=``) are the measured conditions a
claim's mechanism needs here: a claim whose ``requires`` did not hold reads
``no_headroom``. Competitors (``competitors=``) are the claim's quantity with the cheapest
alternative in the method's place; a claim lists those that pass it too (``matched_by``).
The harness adds ``benchmark``, ``quick``, ``device``, ``seconds``, ``date``, ``machine``
and ``provenance`` (commit and code hashes of every source the run imported,
:mod:`lit_lowrank.benchmarks._provenance`) and writes the JSON of DESIGN.md;
``lit-lowrank bench --table`` turns the committed JSON under ``docs/results/`` into the
README's and the cards' tables, ``lit-lowrank bench --stale`` lists those whose code changed.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import pkgutil
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_lowrank.benchmarks._claims import (
    claim,
    competitor,
    paired,
    per_unit,
    premise,
    resolve,
    statistic_claim,
    verdict_of,
)

__all__ = ["BenchmarkResult", "available_benchmarks", "claim", "competitor", "paired", "per_unit", "premise",
           "print_result", "resolve", "run_benchmark", "statistic_claim", "validity", "verdict_of"]

_PRIVATE = {"harness"}
_REQUIRED = ("claim", "paper", "quantity", "n", "estimate", "ci", "target", "op", "verdict", "holds")


@dataclass
class BenchmarkResult:
    """What a benchmark's ``run`` returns.

    Attributes:
        rows: one dict per (method, setting, unit): the raw measurements claims are computed from.
        claims: the paper's headline statements at the benchmark's scale (:func:`claim`).
        controls: the same claims where they must not hold (a null, a shuffle, a random drafter).
        notes: free-form settings (steps, seeds, threads) and the measured causes of failing claims.
        summary: optional aggregated rows (means per method) shown in the cards instead of ``rows``.
        premises: the measured conditions claims ``require`` (:func:`premise`); a claim whose premise
            did not hold reads ``no_headroom``.
        competitors: the claims' quantities with the cheapest alternative in the method's place
            (:func:`competitor`).
    """

    rows: list[dict[str, Any]]
    claims: list[dict[str, Any]] = field(default_factory=list)
    controls: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    summary: list[dict[str, Any]] | None = None
    premises: list[dict[str, Any]] = field(default_factory=list)
    competitors: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a section with ``n`` intra-op threads, restored after (small-op sections run faster on one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def validity(claims: Sequence[dict[str, Any]], controls: Sequence[dict[str, Any]],
             premises: Sequence[dict[str, Any]] = (), competitors: Sequence[dict[str, Any]] = ()) -> list[str]:
    """Why a benchmark's claims could not fail (empty: valid)."""
    reasons = []
    for c in [*claims, *controls, *premises, *competitors]:
        missing = [k for k in _REQUIRED if k not in c]
        if missing:
            reasons.append(f"claim {c.get('claim', '?')!r} lacks {missing} (not computed by `claim`)")
    if not controls:
        reasons.append("no control: nothing shows that a claim can fail")
    for c in controls:
        if c.get("verdict") == "holds":
            reasons.append(f"control holds: {c.get('claim')!r}")
    return reasons


def available_benchmarks() -> list[str]:
    """Names of the benchmark modules in ``lit_lowrank.benchmarks``."""
    import lit_lowrank.benchmarks as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")
                  and m.name not in _PRIVATE)


def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.machine(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return info


def run_benchmark(name: str, quick: bool = False, seed: int = 0, json_path: str | Path | None = None,
                  print_table: bool = True) -> dict[str, Any]:
    """Run benchmark ``name``, print its table, optionally write its JSON; return the JSON dict."""
    names = available_benchmarks()
    if name not in names:
        raise ValueError(f"Unknown benchmark {name!r}; available: {names}.")
    module = importlib.import_module(f"lit_lowrank.benchmarks.{name}")
    from lit_lowrank.benchmarks._progress import reporting
    from lit_lowrank.benchmarks._provenance import WORKER_SOURCES, provenance

    WORKER_SOURCES.clear()
    started = time.time()
    start = time.perf_counter()
    with reporting(f"{name} ({'quick' if quick else 'full'})"):
        result: BenchmarkResult = module.run(quick=quick, seed=seed)
    seconds = time.perf_counter() - start
    claims = resolve(result.claims, result.premises, result.competitors)
    reasons = validity(claims, result.controls, result.premises, result.competitors)
    machine = _machine()
    payload: dict[str, Any] = {
        "benchmark": name, "quick": quick, "seed": seed, "device": "cuda" if "gpu" in machine else "cpu",
        "seconds": round(seconds, 2), "date": datetime.date.today().isoformat(), "machine": machine,
        "provenance": provenance(started=started), "valid": not reasons, "rows": result.rows, "claims": claims,
        "controls": result.controls, "premises": result.premises, "competitors": result.competitors,
    }
    if reasons:
        payload["invalid_reasons"] = reasons
    if result.summary is not None:
        payload["summary"] = result.summary
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
    """Print the rows (or summary), claims and controls as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows: Sequence[dict[str, Any]] = payload.get("summary") or payload["rows"]
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
    sections = (("premises (what the mechanism needs here)", payload.get("premises", [])),
                ("claims", payload["claims"]), ("competitors (in the method's place)", payload.get("competitors", [])),
                ("controls (must not hold)", payload.get("controls", [])))
    for title, items in sections:
        if not items and title.startswith(("premises", "competitors")):
            continue
        t = Table(title=title)
        for col in ("claim", "n", "estimate", "95% CI", "op", "target", "verdict"):
            t.add_column(col)
        for c in items:
            ci = c.get("ci")
            verdict = c.get("verdict", "?")
            if c.get("measured_verdict"):
                verdict += f" (measured: {c['measured_verdict']})"
            if c.get("matched_by"):
                verdict += f"; also: {', '.join(c['matched_by'])}"
            t.add_row(c.get("claim", "?"), str(c.get("n", "")), _fmt(c.get("estimate", c.get("measured", ""))),
                      "—" if not ci else f"[{_fmt(ci[0])}, {_fmt(ci[1])}]", c.get("op", ""),
                      _fmt(c.get("target", "")), verdict)
        console.print(t)
    if not payload.get("valid", True):
        console.print("[bold red]invalid:[/] " + "; ".join(payload.get("invalid_reasons", [])))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
