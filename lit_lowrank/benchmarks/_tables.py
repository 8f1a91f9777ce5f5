"""Results as data: the README's and the cards' benchmark tables, generated from ``docs/results/*.json``.

``docs/results/<name>.json`` is the JSON of the last quick run (``<name>.full.json`` of a
full run, where one was made). Markdown files carry generated blocks between markers:

- ``README.md``: ``<!-- benchmarks-table:start -->`` ... ``<!-- benchmarks-table:end -->``,
  one row per benchmark;
- any ``docs/**/*.md``: ``<!-- results:NAME:start -->`` ... ``<!-- results:NAME:end -->``,
  the claims, controls and rows of benchmark ``NAME``.

Every result also gets its picture, ``docs/results/<name>.png`` (:mod:`._figures`), linked from
its card's block. ``lit-lowrank bench --table`` rewrites the blocks and redraws stale figures;
``--table --check`` only reports which differ (a test runs it, so numbers and pictures in the
docs cannot drift from what ran).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

README_START, README_END = "<!-- benchmarks-table:start -->", "<!-- benchmarks-table:end -->"
_BLOCK = re.compile(r"<!-- results:(?P<name>[\w.]+):start -->\n.*?<!-- results:(?P=name):end -->", re.S)
MAX_ROWS = 40


def repo_root(start: Path | None = None) -> Path:
    """The checkout holding ``docs/results`` (the cwd, or the package's parent)."""
    candidates = [start] if start is not None else [Path.cwd(), Path(__file__).resolve().parents[2]]
    for c in candidates:
        if c is not None and (c / "docs" / "results").is_dir():
            return c
    raise FileNotFoundError(f"no docs/results folder under {[str(c) for c in candidates]}: run from the "
                            "lit_lowrank checkout or pass `--root`.")


def load_results(root: Path) -> dict[str, dict[str, Any]]:
    """``{name: payload}`` for every ``docs/results/<name>.json`` (``name`` keeps a ``.full`` suffix)."""
    out = {}
    for path in sorted((root / "docs" / "results").glob("*.json")):
        out[path.stem] = json.loads(path.read_text())
    return out


def fmt(value: Any) -> str:
    """Four significant digits for floats, ``—`` for missing values."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _ci(c: dict[str, Any]) -> str:
    ci = c.get("ci")
    return "—" if not ci else f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def _verdict(c: dict[str, Any]) -> str:
    text = f"**{c.get('verdict', '?')}**"
    if c.get("premises_failed"):
        text += f" (CI alone: {c.get('measured_verdict')}; premise not held: {', '.join(c['premises_failed'])})"
    elif c.get("requires"):
        text += f" (premise held: {', '.join(c['requires'])})"
    for comp in c.get("competitors", []):
        text += f"; vs {fmt(comp['competitor'])}: {comp['verdict']}"
    return text


def _claims_table(items: Sequence[dict[str, Any]], paper_col: str = "paper") -> list[str]:
    lines = [f"| claim | {paper_col} | quantity | n | estimate | 95% CI | target | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for c in items:
        label = fmt(c.get("claim"))
        if c.get("name"):
            label += f" (`{c['name']}`)"
        if c.get("competitor"):
            label += f" — {fmt(c['competitor'])} for `{c.get('for')}`"
        lines.append(f"| {label} | {fmt(c.get('paper'))} | {fmt(c.get('quantity'))} | "
                     f"{fmt(c.get('n'))} {fmt(c.get('unit', ''))} | {fmt(c.get('estimate'))} | {_ci(c)} | "
                     f"{c.get('op', '')} {fmt(c.get('target'))} | {_verdict(c)} |")
    return lines


def _rows_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows[:MAX_ROWS]:
        lines.append("| " + " | ".join(fmt(row.get(c, "")) for c in cols) + " |")
    if len(rows) > MAX_ROWS:
        lines.append(f"\n*{len(rows) - MAX_ROWS} more rows in the JSON.*")
    return lines


def _run_line(name: str, p: dict[str, Any]) -> str:
    machine = p.get("machine") or {}
    where = f"{machine.get('cpus', '?')} CPUs" if p.get("device") == "cpu" else machine.get("gpu", p.get("device"))
    prov = p.get("provenance") or {}
    commit = prov.get("commit")
    at = (f"measured at `{commit[:10]}`{' with uncommitted changes' if prov.get('dirty') else ''} "
          f"({len(prov.get('sources', {}))} source files hashed)" if commit else "no provenance recorded")
    return (f"*Generated from `docs/results/{name}.json` by `lit-lowrank bench --table`: "
            f"{'quick' if p.get('quick') else 'full'} run of {p.get('date', '?')}, {where}, "
            f"{fmt(p.get('seconds'))} s, seed {p.get('seed', 0)}, {at}. Do not edit by hand.*")


def card_block(name: str, payload: dict[str, Any], figures: Sequence[str] = ()) -> str:
    """The generated markdown of one benchmark run: claims, controls, validity, rows (and its figures' links)."""
    lines = [_run_line(name, payload), ""]
    lines += [f"![{name}: {'claims' if i == 0 else 'rows'}]({f})" for i, f in enumerate(figures)]
    if figures:
        lines.append("")
    if not payload.get("valid", False):
        reasons = payload.get("invalid_reasons") or ["not run under the claims protocol"]
        lines += [f"**Invalid run**: {'; '.join(fmt(r) for r in reasons)}.", ""]
    if payload.get("premises"):
        lines += ["**Premises** (what the mechanism needs in this regime; a claim requiring one that did not hold "
                  "reads `no_headroom`)", ""] + _claims_table(payload["premises"], "needs") + [""]
    lines += ["**Claims**", ""] + _claims_table(payload.get("claims", []))
    if payload.get("competitors"):
        lines += ["", "**Competitors** (the claim's quantity with the cheapest alternative in the method's place)",
                  ""] + _claims_table(payload["competitors"])
    lines += ["", "**Controls** (the same quantity where the claim must not hold)", ""]
    lines += _claims_table(payload.get("controls", []))
    rows = payload.get("summary") or payload.get("rows", [])
    lines += ["", "**Summary**" if payload.get("summary") else "**Rows**", ""] + _rows_table(rows)
    return "\n".join(lines)


def readme_table(results: dict[str, dict[str, Any]], root: Path | None = None) -> str:
    """One README row per benchmark (the quick run), verdict counts and each claim's verdict."""
    lines = ["| benchmark | claims (quick run) | holds / fails / inconclusive / no headroom | premises held | "
             "controls | valid | seconds |", "|---|---|---|---|---|---|---|"]
    for name, p in results.items():
        if name.endswith(".full"):
            continue
        claims, controls, premises = p.get("claims", []), p.get("controls", []), p.get("premises", [])
        counts = [sum(c.get("verdict") == v for c in claims) for v in ("holds", "fails", "inconclusive", "no_headroom")]
        held = f"{sum(c.get('verdict') == 'holds' for c in premises)} / {len(premises)}" if premises else "none"
        text = "<br>".join(f"{c.get('verdict', '?')}: {fmt(c.get('claim'))} ({fmt(c.get('estimate'))}, CI "
                           f"{_ci(c)})" for c in claims)
        ctl = "<br>".join(f"{c.get('verdict', '?')}: {fmt(c.get('claim'))}" for c in controls) or "none"
        # a method's card, else a tooling benchmark's own page, else the page that shows its results block
        # (a method's second benchmark: polar_vbll_mc on the polar_vbll card), else the shared benchmarks page
        candidates = [f"docs/methods/{name}.md", f"docs/benchmarks/{name}.md"]
        if root is not None:
            marker = f"<!-- results:{name}:start -->"
            candidates += sorted(str(p.relative_to(root)) for p in (root / "docs").rglob("*.md")
                                 if marker in p.read_text())
        card = next((c for c in candidates if root is None or (root / c).exists()), "docs/benchmarks.md")
        label = f"[`{name}`]({card})"
        lines.append(f"| {label} | {text} | {' / '.join(map(str, counts))} | {held} | {ctl} | "
                     f"{fmt(bool(p.get('valid')))} | {fmt(p.get('seconds'))} |")
    return "\n".join(lines)


def _replace_blocks(text: str, results: dict[str, dict[str, Any]], where: Path, root: Path) -> str:
    from lit_lowrank.benchmarks._figures import figure_paths

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in results:
            raise FileNotFoundError(f"{where}: a results block names {name!r} but docs/results/{name}.json "
                                    "does not exist.")
        pngs = [p for i, p in enumerate(figure_paths(root, name)) if i == 0 or p.exists()]
        links = [os.path.relpath(p, where.parent).replace(os.sep, "/") for p in pngs]
        block = card_block(name, results[name], links)
        return f"<!-- results:{name}:start -->\n{block}\n<!-- results:{name}:end -->"

    return _BLOCK.sub(sub, text)


def sync_figures(root: Path, results: dict[str, dict[str, Any]], check: bool = False) -> list[str]:
    """Draw (or, with ``check``, only list) the figures not drawn from today's ``docs/results`` JSON."""
    from lit_lowrank.benchmarks._figures import figure_paths, figures_current, write_figures

    changed = []
    for name, payload in results.items():
        if not figures_current(root, name, payload):
            changed.append(str(figure_paths(root, name)[0].relative_to(root)))
            if not check:
                write_figures(root, name, payload)
    return changed


def sync_tables(root: Path, check: bool = False) -> list[str]:
    """Rewrite (or, with ``check``, only compare) every generated block and figure; return what differs."""
    results = load_results(root)
    changed = sync_figures(root, results, check)
    readme = root / "README.md"
    files = [readme, *sorted((root / "docs").rglob("*.md"))]
    for path in files:
        text = path.read_text()
        new = _replace_blocks(text, results, path, root)
        if path == readme:
            if README_START not in new or README_END not in new:
                raise ValueError(f"{path} lacks the {README_START} / {README_END} markers.")
            head, rest = new.split(README_START, 1)
            _, tail = rest.split(README_END, 1)
            new = f"{head}{README_START}\n{readme_table(results, root)}\n{README_END}{tail}"
        if new != text:
            changed.append(str(path.relative_to(root)))
            if not check:
                path.write_text(new)
    return changed


def referenced_blocks(root: Path) -> set[str]:
    """Names of the results blocks the docs carry."""
    names = set()
    for path in sorted((root / "docs").rglob("*.md")):
        names |= {m.group("name") for m in _BLOCK.finditer(path.read_text())}
    return names
