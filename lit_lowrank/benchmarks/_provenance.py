"""Results that cannot go stale: the commit and the code a benchmark run imported, and the check.

A run records ``provenance``: the git commit it ran at (``dirty`` when sources differed from
it), and ``sources``, a hash of every ``lit_lowrank`` source file imported by the run (in
its own process and in the workers of :func:`lit_lowrank.benchmarks._workers.map_jobs`).
The hash is of the file's *code*: its syntax tree with docstrings dropped, so a comment or
docstring edit does not make a result stale, while any change to what runs does.

:func:`stale_results` compares a committed ``docs/results/*.json`` with today's files;
``lit-lowrank bench --stale`` prints it (fast: no torch import).

.. code-block:: python

    from lit_lowrank.benchmarks._provenance import stale_results
    for name, reason, files in stale_results(Path(".")):
        print(name, reason, files)
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]
# Presentation only: they print and tabulate results, never change one.
_PRESENTATION = {"lit_lowrank/cli.py", "lit_lowrank/benchmarks/_tables.py", "lit_lowrank/benchmarks/_provenance.py",
                 "lit_lowrank/benchmarks/_progress.py", "lit_lowrank/benchmarks/_figures.py"}

#: Source files imported by worker processes (filled by ``_workers``), merged into the run's record.
WORKER_SOURCES: set[str] = set()


def code_hash(path: Path) -> str:
    """SHA-256 (first 16 hex digits) of a Python file's code: its AST without docstrings."""
    text = path.read_text()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return hashlib.sha256(text.encode()).hexdigest()[:16]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()[:16]


def _relative(file: str | None) -> str | None:
    if not file:
        return None
    path = Path(file).resolve()
    try:
        rel = path.relative_to(PACKAGE.parent)
    except ValueError:
        return None
    if rel.parts[0] != "lit_lowrank" or path.suffix != ".py":
        return None
    return rel.as_posix()


def imported_sources(modules: Iterable[Any] | None = None) -> set[str]:
    """Repository-relative paths of the ``lit_lowrank`` source files among ``modules`` (default: imported)."""
    mods = list(sys.modules.values()) if modules is None else list(modules)
    out = set()
    for mod in mods:
        rel = _relative(getattr(mod, "__file__", None))
        if rel is not None and rel not in _PRESENTATION:
            out.add(rel)
    return out


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


#: The hash recorded for a source file edited while the run was going: it never matches, so the result reads stale.
CHANGED_DURING_RUN = "changed-during-run"


def provenance(extra_sources: Iterable[str] = (), started: float | None = None) -> dict[str, Any]:
    """``{"commit", "dirty", "sources": {path: code hash}}`` for the sources imported so far.

    ``started`` (a ``time.time()``): a file modified after it may not be the code that ran, so
    it is recorded as :data:`CHANGED_DURING_RUN` instead of its hash.
    """
    paths = sorted(imported_sources() | set(extra_sources) | WORKER_SOURCES)
    sources = {}
    for p in paths:
        path = PACKAGE.parent / p
        changed = started is not None and path.stat().st_mtime > started
        sources[p] = CHANGED_DURING_RUN if changed else code_hash(path)
    commit = _git("rev-parse", "HEAD")
    dirty = None
    if commit is not None:
        changed = _git("status", "--porcelain", "--", *paths) if paths else ""
        dirty = bool(changed)
    return {"commit": commit, "dirty": dirty, "sources": sources}


def changed_sources(recorded: dict[str, str], root: Path) -> list[str]:
    """The recorded source files whose code differs today (or that no longer exist)."""
    out = []
    for rel, digest in sorted(recorded.items()):
        path = root / rel
        if not path.is_file() or code_hash(path) != digest:
            out.append(rel)
    return out


def stale_results(root: Path, names: Iterable[str] | None = None) -> list[tuple[str, str, list[str]]]:
    """``(result name, reason, files)`` for every committed result whose code changed since it ran.

    ``reason`` is ``"no provenance"`` for a result written before runs recorded their sources,
    ``"code changed"`` otherwise (``files``: the changed ones). ``names`` restricts the check.
    """
    out = []
    wanted = None if names is None else set(names)
    for path in sorted((root / "docs" / "results").glob("*.json")):
        name = path.stem
        if wanted is not None and name not in wanted:
            continue
        prov = json.loads(path.read_text()).get("provenance")
        if not prov or not prov.get("sources"):
            out.append((name, "no provenance", []))
            continue
        changed = changed_sources(prov["sources"], root)
        if changed:
            out.append((name, "code changed", changed))
    return out


def benchmark_owned(name: str, files: Iterable[str]) -> list[str]:
    """Of ``files``, the benchmark's own code (``benchmarks/<name>.py``, or every file of the package
    ``benchmarks/<name>/``) and the shared private helpers (``benchmarks/_*.py``) it used."""
    base = name.split(".")[0]
    own = f"lit_lowrank/benchmarks/{base}.py"
    package = f"lit_lowrank/benchmarks/{base}/"
    return [f for f in files if f == own or f.startswith(package) or (f.startswith("lit_lowrank/benchmarks/_")
                                                                      and f not in _PRESENTATION)]
