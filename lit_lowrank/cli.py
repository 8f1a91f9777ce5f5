"""``lit-lowrank``: LightningCLI (fit/validate/test/predict) plus ``bench`` and ``methods``.

.. code-block:: bash

    lit-lowrank fit --config configs/quickstart.yaml
    lit-lowrank fit --config configs/quickstart.yaml --trainer.logger lightning.pytorch.loggers.WandbLogger
    lit-lowrank bench overhead --quick --json out.json
    lit-lowrank methods
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

EXTRA_COMMANDS = """extra commands:
  bench NAME [--quick] [--json PATH] [--seed N] [--strict] [--quiet]   run a method's benchmark (`bench --list`)
  bench --table [--check]                          README/card tables from docs/results/*.json
  bench --stale [NAME ...]                         committed results whose code changed since they ran
  methods [--markdown]                             print the method registry as a table
"""

_LIGHTNING_NAMES = ("LitLowRankCLI", "LitLowRankSaveConfig")


def __getattr__(name: str) -> Any:
    # the LightningCLI classes live in cli_lightning: `methods` and `bench` never import Lightning
    if name in _LIGHTNING_NAMES:
        from lit_lowrank import cli_lightning

        return getattr(cli_lightning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _bench(argv: list[str]) -> int:
    from lit_lowrank.benchmarks.harness import available_benchmarks, run_benchmark

    parser = argparse.ArgumentParser(prog="lit-lowrank bench", description="Run a method's benchmark.")
    parser.add_argument("name", nargs="*", help="benchmark name (lit_lowrank/benchmarks/<name>.py); with --stale, "
                        "result names (default: all)")
    parser.add_argument("--quick", action="store_true", help="the small version: < 3 minutes on 2 CPU cores")
    parser.add_argument("--json", metavar="PATH", help="write the contract JSON (rows, claims, controls) here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the available benchmarks")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when the run is invalid (no control, or a control holds)")
    parser.add_argument("--table", action="store_true",
                        help="regenerate the README's and the cards' tables from docs/results/*.json")
    parser.add_argument("--check", action="store_true", help="with --table: only report the files that differ")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress display (for CI logs); the same as LIT_LOWRANK_QUIET=1")
    parser.add_argument("--stale", action="store_true",
                        help="list committed docs/results/*.json whose code changed since they ran (exit 1 if any)")
    parser.add_argument("--root", metavar="PATH",
                        help="with --table/--stale: the checkout (default: found from the cwd)")
    ns = parser.parse_args(argv)
    if ns.stale:
        from pathlib import Path

        from lit_lowrank.benchmarks._provenance import stale_results
        from lit_lowrank.benchmarks._tables import repo_root

        stale = stale_results(repo_root(Path(ns.root) if ns.root else None), ns.name or None)
        for name, reason, files in stale:
            print(f"{name}: {reason}" + (f" ({', '.join(files)})" if files else ""))
        return 1 if stale else 0
    if ns.table:
        from pathlib import Path

        from lit_lowrank.benchmarks._tables import repo_root, sync_tables

        changed = sync_tables(repo_root(Path(ns.root) if ns.root else None), check=ns.check)
        verb = "differ from docs/results" if ns.check else "rewritten"
        print("\n".join(f"{f}: {verb}" for f in changed) or "tables up to date")
        return 1 if (ns.check and changed) else 0
    if ns.list or not ns.name:
        print("\n".join(available_benchmarks()))
        return 0 if ns.list else 2
    if len(ns.name) > 1:
        parser.error(f"one benchmark at a time, got {ns.name}")
    if ns.quiet:
        import os

        os.environ["LIT_LOWRANK_QUIET"] = "1"
    result = run_benchmark(ns.name[0], quick=ns.quick, seed=ns.seed, json_path=ns.json)
    return 1 if ns.strict and not result["valid"] else 0


def _methods(argv: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    from lit_lowrank.core.registry import methods_markdown, methods_table

    if argv == ["--markdown"]:
        print(methods_markdown())
        return 0
    if argv:
        print("usage: lit-lowrank methods [--markdown]", file=sys.stderr)
        return 2
    rows = methods_table()
    table = Table(title="lit_lowrank methods")
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*row.values())
    Console().print(table)
    return 0


def main(argv: list[str] | None = None) -> int | None:
    """Entry point of the ``lit-lowrank`` console script."""
    from_sys = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    # Lightning 2.6 on torch 2.14 warns about a pytree API it still uses; not actionable here.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    # torch_geometric scripts two NamedTuples with torch.jit.script at import (deprecated in torch 2.10+): not
    # actionable by a user, and printed by every command. bitsandbytes' missing-kernel message is dropped at its
    # source by lit_lowrank.core.quiet (one message, not the whole logger).
    warnings.filterwarnings("ignore", message=r".*`torch\.jit\.script` is deprecated.*", category=FutureWarning)
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    if argv and argv[0] == "methods":
        return _methods(argv[1:])
    from lit_lowrank.cli_lightning import LitLowRankCLI

    # args=None when the arguments are sys.argv's: LightningCLI warns when given both
    LitLowRankCLI(args=None if from_sys else argv)
    return None


if __name__ == "__main__":
    sys.exit(main())
