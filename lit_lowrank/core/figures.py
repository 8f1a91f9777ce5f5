"""Dashboards: log a matplotlib figure to every logger a trainer has, and the run's ``method`` entry.

- :func:`log_figure` — W&B (``WandbLogger.log_image``, an image panel), TensorBoard
  (``add_image``), and any logger with a ``log_dir`` (CSVLogger...): a PNG in
  ``<log_dir>/images/`` next to ``metrics.csv``. Rank zero only; closes the figure.
- :func:`figure_due` — the shared interval rule (every ``n`` epochs, never while sanity
  checking, only when a real logger is attached), so plots cost nothing in tests and
  ``fast_dev_run``.
- :func:`heatmap`, :func:`image_grid`, :func:`new_figure` — labelled plots every method reuses.
- :func:`~lit_lowrank.core.method_entry.method_config` (in ``method_entry.py``) — the run's ``method`` entry.
- Image keys never collide with scalar keys: a figure logged under a key a scalar already uses (``method/stac_r/ssp``
  is both STAC-R's SSP value and its SSP figure) is logged as ``<key>_figure``.

Matplotlib is imported only when a figure is drawn (the Agg backend: no display needed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from matplotlib.figure import Figure


def new_figure(width: float = 5.0, height: float = 4.0, ncols: int = 1, nrows: int = 1) -> tuple["Figure", Any]:
    """A ``(figure, axes)`` pair on the Agg backend (``plt`` state untouched: safe in threads and tests)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=True)
    return fig, axes


def figure_to_array(figure: "Figure") -> np.ndarray:
    """``(H, W, 3)`` uint8 RGB pixels of ``figure``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def has_real_logger(trainer: "pl.Trainer | None") -> bool:
    """A trainer with at least one logger that records something (not ``fast_dev_run``'s dummy)."""
    if trainer is None:
        return False
    return any(type(logger).__name__ != "DummyLogger" for logger in trainer.loggers)


def figure_due(trainer: "pl.Trainer | None", every_n_epochs: int | None) -> bool:
    """Whether a figure logged every ``every_n_epochs`` epochs is due now (0/None: never)."""
    if not every_n_epochs or trainer is None or getattr(trainer, "sanity_checking", False):
        return False
    return has_real_logger(trainer) and trainer.current_epoch % int(every_n_epochs) == 0


def _file_stem(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_")


def log_figure(trainer: "pl.Trainer | None", key: str, figure: "Figure", step: int | None = None,
               close: bool = True) -> list[str]:
    """Log ``figure`` under ``key`` to every logger of ``trainer``; returns what was written.

    W&B gets an image panel (``log_image``), TensorBoard an image (``add_image``), a logger
    with a ``log_dir`` (CSVLogger, or any other) a PNG ``<log_dir>/images/<key>_step<N>.png``.
    A ``key`` a scalar of the run already uses becomes ``<key>_figure``.
    Off rank zero, or without a trainer, it only closes the figure.

    .. code-block:: python

        fig, ax = new_figure()
        ax.plot(ranks)
        log_figure(trainer, "method/sara/rank_schedule", fig)
    """
    written: list[str] = []
    if trainer is None or getattr(trainer, "global_rank", 0) != 0:
        return written
    from lit_lowrank.core.logging import image_key

    key = image_key(trainer, key)  # never the key of a scalar (``method/stac_r/ssp`` -> ``..._figure``)
    step = int(trainer.global_step if step is None else step)
    pixels = figure_to_array(figure)
    for logger in trainer.loggers:
        name = type(logger).__name__
        if name == "DummyLogger":
            continue
        if name == "WandbLogger" or (hasattr(logger, "log_image") and name != "TensorBoardLogger"):
            logger.log_image(key=key, images=[pixels], step=step)
            written.append(f"{name}:{key}")
        elif hasattr(getattr(logger, "experiment", None), "add_image"):
            logger.experiment.add_image(key, pixels, step, dataformats="HWC")
            written.append(f"{name}:{key}")
        elif getattr(logger, "log_dir", None):
            folder = Path(logger.log_dir) / "images"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{_file_stem(key)}_step{step:06d}.png"
            figure.savefig(path)
            written.append(str(path))
    if close:
        figure.clear()
    return written


def heatmap(ax: Any, matrix: Any, row_labels: list[str], col_labels: list[str], *, xlabel: str = "",
            ylabel: str = "", title: str = "", fmt: str = "{:.2f}", cmap: str = "viridis",
            colorbar_label: str = "") -> None:
    """A labelled heatmap with the value written in every cell (``matrix``: ``(R, C)``)."""
    values = np.asarray(matrix, dtype=float)
    image = ax.imshow(values, cmap=cmap, aspect="auto")
    ax.set_xticks(range(values.shape[1]), labels=col_labels)
    ax.set_yticks(range(values.shape[0]), labels=row_labels)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    finite = values[np.isfinite(values)]
    middle = (finite.max() + finite.min()) / 2 if finite.size else 0.0
    if values.size <= 400:  # beyond ~20x20 the numbers no longer fit
        for (r, c), v in np.ndenumerate(values):
            ax.text(c, r, fmt.format(v), ha="center", va="center", fontsize=8,
                    color="black" if v > middle else "white")
    ax.figure.colorbar(image, ax=ax, label=colorbar_label)


def image_grid(images: Any, titles: list[str] | None = None, ncols: int = 8, title: str = "",
               cell: float = 1.2) -> "Figure":
    """A grid of images ``(N, C, H, W)`` or ``(N, H, W)`` (values rescaled to [0, 1] per image)."""
    arr = np.asarray(images.detach().cpu().float() if hasattr(images, "detach") else images, dtype=float)
    if arr.ndim == 4:
        arr = arr.transpose(0, 2, 3, 1)
        if arr.shape[-1] == 1:
            arr = arr[..., 0]
    n = arr.shape[0]
    ncols = max(1, min(ncols, n))
    nrows = int(np.ceil(n / ncols))
    fig, axes = new_figure(cell * ncols, cell * nrows + (0.4 if title else 0.0), ncols=ncols, nrows=nrows)
    axes = np.atleast_1d(axes).ravel()
    for i, ax in enumerate(axes):
        ax.axis("off")
        if i >= n:
            continue
        img = arr[i]
        lo, hi = float(img.min()), float(img.max())
        ax.imshow((img - lo) / (hi - lo + 1e-12), cmap="gray" if img.ndim == 2 else None)
        if titles is not None and i < len(titles):
            ax.set_title(titles[i], fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


# ``method_config`` moved to method_entry.py (the run's ``method`` entry); importable from here as before
from lit_lowrank.core.method_entry import method_config  # noqa: E402,F401
