"""A picture of every committed result, drawn from its JSON: each claim's interval against its target.

``docs/results/<name>.png`` shows, one strip per item, the premises, claims, competitors and
controls of ``docs/results/<name>.json``: the estimate, its 95% CI, the target (dashed) and the
verdict (colour). Each strip has its own x-axis, because each claim has its own quantity. A
benchmark module may also define ``figure(payload) -> matplotlib.figure.Figure`` for a picture
of its own rows (tokens/s per peer, a memory–fidelity frontier); it is written beside the first
as ``docs/results/<name>.detail.png``.

The PNGs carry the SHA-256 of the JSON they were drawn from (a PNG text chunk), so
``lit-lowrank bench --table --check`` knows a stale picture without drawing it again.

.. code-block:: python

    from lit_lowrank.benchmarks._figures import write_figures
    write_figures(Path("."), "castor", payload)   # docs/results/castor.png (+ .detail.png)
"""

from __future__ import annotations

import hashlib
import importlib
import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = {"holds": "#2a9d8f", "fails": "#e76f51", "inconclusive": "#8d99ae", "no_headroom": "#e9c46a"}
SECTIONS = (("premises", "premise"), ("claims", "claim"), ("competitors", "competitor"), ("controls", "control"))
KEY = "lit_lowrank_source"


def payload_digest(payload: dict[str, Any]) -> str:
    """SHA-256 of a result's JSON, canonical (sorted keys), 16 hex digits."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=float).encode()).hexdigest()[:16]


def _title(kind: str, c: dict[str, Any]) -> str:
    text = c.get("claim", "?")
    if kind == "competitor":
        text = f"{c.get('competitor')} in the method's place: {text}"
    verdict = c.get("verdict", "?") + (f" (CI alone: {c['measured_verdict']})" if c.get("measured_verdict") else "")
    target = c.get("target")
    goal = f"{c.get('op', '')} {target:.4g}" if isinstance(target, (int, float)) else ""
    line = f"[{kind}] {text}"
    return "\n".join(textwrap.wrap(line, 110)[:2]) + f"   —   {goal}: {verdict}"


def claims_figure(name: str, payload: dict[str, Any]) -> "Figure":
    """One strip per premise, claim, competitor and control: estimate, CI and target, coloured by verdict."""
    from matplotlib.figure import Figure

    items = [(kind, c) for key, kind in SECTIONS for c in payload.get(key, []) or []]
    fig = Figure(figsize=(9.0, 0.95 * max(1, len(items)) + 0.5), dpi=90, layout="constrained")
    if not items:
        ax = fig.subplots()
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"{name}: no claims", ha="center", va="center")
        return fig
    axes = fig.subplots(len(items), 1, squeeze=False)[:, 0]
    for ax, (kind, c) in zip(axes, items):
        colour = COLOURS.get(c.get("verdict", "inconclusive"), "#8d99ae")
        est, target, ci = c.get("estimate"), c.get("target"), c.get("ci")
        xs = [v for v in (est, target, *(ci or [])) if isinstance(v, (int, float))]
        if ci:
            ax.plot(ci, [0, 0], color=colour, linewidth=4, solid_capstyle="butt")
        if isinstance(est, (int, float)):
            ax.plot([est], [0], "o", color=colour, markersize=7)
        if isinstance(target, (int, float)):
            ax.axvline(target, color="black", linestyle="--", linewidth=0.8)
            if c.get("op") == "within":
                ax.axvline(-target, color="black", linestyle="--", linewidth=0.8)
                xs.append(-target)
        lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        pad = 0.08 * (hi - lo) or 0.05 * (abs(hi) or 1.0)
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(-1, 1)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=7, pad=1)
        ax.set_title(_title(kind, c), fontsize=7, loc="left", color="black", pad=2)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
    fig.suptitle(f"{name}: estimate (dot), 95% CI (bar) and target (dashed) per item; colour = verdict",
                 fontsize=9)
    return fig


def _detail_figure(name: str, payload: dict[str, Any]) -> "Figure | None":
    try:
        module = importlib.import_module(f"lit_lowrank.benchmarks.{name.split('.')[0]}")
    except ImportError:
        return None
    draw = getattr(module, "figure", None)
    return draw(payload) if callable(draw) else None


def _save(fig: "Figure", path: Path, digest: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", metadata={KEY: digest})


def figure_paths(root: Path, name: str) -> tuple[Path, Path]:
    """``docs/results/<name>.png`` and ``docs/results/<name>.detail.png``."""
    folder = root / "docs" / "results"
    return folder / f"{name}.png", folder / f"{name}.detail.png"


def recorded_digest(path: Path) -> str | None:
    """The JSON digest a PNG was drawn from (``None`` when absent or not ours)."""
    if not path.is_file():
        return None
    from PIL import Image

    with Image.open(path) as image:
        return image.text.get(KEY) if hasattr(image, "text") else None


def figures_current(root: Path, name: str, payload: dict[str, Any]) -> bool:
    """Whether ``docs/results/<name>.png`` was drawn from this payload (and its detail, where one exists)."""
    main, detail = figure_paths(root, name)
    digest = payload_digest(payload)
    if recorded_digest(main) != digest:
        return False
    return not detail.exists() or recorded_digest(detail) == digest


def write_figures(root: Path, name: str, payload: dict[str, Any]) -> list[Path]:
    """Draw and write the claims figure (and the benchmark's own detail figure, if it has one)."""
    main, detail = figure_paths(root, name)
    digest = payload_digest(payload)
    _save(claims_figure(name, payload), main, digest)
    written = [main]
    extra = _detail_figure(name, payload)
    if extra is not None:
        _save(extra, detail, digest)
        written.append(detail)
    elif detail.exists():
        detail.unlink()
    return written
