"""Start-up cost of the ``lit-lowrank`` command line (issue #29): ``methods`` and ``bench --list``
never import Lightning; ``--help`` costs about one ``import lightning``.

Every unit is one interleaved round that runs, as fresh ``python`` processes, back to back:
``lit-lowrank methods``, ``lit-lowrank bench --list``, ``lit-lowrank --help``,
``python -c "import lightning"``, and the two controls. Each process is measured by its
CPU time (user + sys, from ``wait4``'s rusage) — on a shared, loaded machine wall time
measures the neighbours, CPU time the command; on the idle 2-core machine they agree to
within the threads' overlap. Wall time is kept in the rows beside it.

Claims: ``methods`` < 2 s and ``bench --list`` < 2 s (per round, t-interval); ``--help`` /
``import lightning`` <= 1.1 (paired per round, geometric mean).
Controls: the CLI as it was before #29 (every component package imported before
``--help``: PyG, PEFT, diffusers...) must fail the 1.1x claim, and ``methods`` after an
``import lightning`` must fail the 2 s claim — the measurement sees the import costs the
claims are about.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, premise

_ROOT = str(Path(__file__).resolve().parents[2])
# the CLI before #29: LitLowRankCLI imported every component package before parsing
_EAGER = ("import importlib, pkgutil, lit_lowrank; "
          "[importlib.import_module(f'lit_lowrank.{p}.{m.name}') "
          "for p in ('callbacks', 'tasks', 'datamodules', 'quant', 'adapters') "
          "for m in pkgutil.iter_modules(importlib.import_module(f'lit_lowrank.{p}').__path__) "
          "if not m.name.startswith('_') and m.name not in ('rl_envs',)]; "
          "from lit_lowrank.cli import main; main(['--help'])")

COMMANDS: dict[str, list[str]] = {
    "lit-lowrank methods": ["-m", "lit_lowrank.cli", "methods"],
    "lit-lowrank bench --list": ["-m", "lit_lowrank.cli", "bench", "--list"],
    "lit-lowrank --help": ["-m", "lit_lowrank.cli", "--help"],
    "import lightning": ["-c", "import lightning"],
    "control: --help with eager imports (before #29)": ["-c", _EAGER],
    "control: methods after import lightning": [
        "-c", "import lightning; from lit_lowrank.cli import main; main(['methods'])"],
}


def measure(args: list[str]) -> tuple[float, float]:
    """(CPU seconds user+sys, wall seconds) of ``python <args>`` run to completion."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=_ROOT, env=env)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"`python {' '.join(args)[:80]}` exited {proc.returncode}: {err.decode()[-400:]}")
    return usage.ru_utime + usage.ru_stime, wall


def run(quick: bool, seed: int) -> BenchmarkResult:
    repeats = 5 if quick else 15
    measure(COMMANDS["import lightning"][:])  # warm the page cache once
    rows = []
    cpu: dict[str, list[float]] = {k: [] for k in COMMANDS}
    for r in range(repeats):
        order = list(COMMANDS)
        if (r + seed) % 2:  # alternate the order so no command always runs first in a round
            order.reverse()
        for name in order:
            seconds, wall = measure(COMMANDS[name])
            cpu[name].append(seconds)
            rows.append({"command": name, "round": r, "cpu_s": seconds, "wall_s": wall})
    rounds = list(range(repeats))
    summary = []
    for name in COMMANDS:
        mine = [row for row in rows if row["command"] == name]
        summary.append({"command": name,
                        "median_cpu_s": sorted(x["cpu_s"] for x in mine)[len(mine) // 2],
                        "median_wall_s": sorted(x["wall_s"] for x in mine)[len(mine) // 2],
                        "cpu_ratio_to_import_lightning": sorted(
                            a / b for a, b in zip(cpu[name], cpu["import lightning"]))[len(mine) // 2]})
    paper = "issue #29: `lit-lowrank methods` < 2 s; `lit-lowrank --help` within 1.1x of `import lightning`"
    q_time = "CPU seconds (user+sys) of the process, per round"
    q_ratio = "CPU time(lit-lowrank --help) / CPU time(python -c 'import lightning'), geometric mean over rounds"

    def under_2s(text: str, name: str, short: str | None = None) -> dict:
        return claim(text, paper=paper, quantity=q_time, values=cpu[name], target=2.0, op="<", unit="round",
                     units=rounds, name=short, requires="lightning_is_heavy" if short else None)

    def within_11(text: str, name: str, short: str | None = None) -> dict:
        return claim(text, paper=paper, quantity=q_ratio, values=cpu[name], baseline=cpu["import lightning"],
                     compare="ratio", target=1.1, op="<=", unit="round", units=rounds, name=short,
                     requires="eager_is_heavy" if short else None)

    premises = [
        premise("lightning_is_heavy", "`import lightning` costs more than 2 s of CPU here",
                needs="importing Lightning costs > 2 s, so `< 2 s` shows it was not imported",
                quantity=q_time, values=cpu["import lightning"], target=2.0, op=">", unit="round", units=rounds),
        premise("eager_is_heavy", "the CLI with eager imports (before #29) costs more than 1.1x `import lightning`",
                needs="the component packages cost > 10% over Lightning, so 1.1x shows they stay lazy",
                quantity=q_ratio.replace("lit-lowrank --help", "eager-import --help"),
                values=cpu["control: --help with eager imports (before #29)"], baseline=cpu["import lightning"],
                compare="ratio", target=1.1, op=">", unit="round", units=rounds),
    ]
    claims = [under_2s("`lit-lowrank methods` < 2 s", "lit-lowrank methods", "methods"),
              under_2s("`lit-lowrank bench --list` < 2 s", "lit-lowrank bench --list", "bench_list"),
              within_11("`lit-lowrank --help` <= 1.1x `import lightning`", "lit-lowrank --help", "help")]
    controls = [within_11("the eager-import CLI (before #29) passes the same 1.1x test",
                          "control: --help with eager imports (before #29)"),
                under_2s("`methods` after `import lightning` passes the same 2 s test",
                         "control: methods after import lightning")]
    return BenchmarkResult(rows, claims, controls, summary=summary, premises=premises,
                           notes={"repeats": repeats, "measure": "CPU time (user+sys) per process via wait4; "
                                  "wall time in the rows (inflated on a loaded machine)",
                                  "cpus": os.cpu_count(), "python": sys.executable})
