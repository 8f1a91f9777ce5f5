"""HomodyneDataModule: simulated or recorded homodyne measurement records, full batch.

One batch per epoch (tomography fits all records at once):

- ``theta``: ``(S, M)`` float32 nominal local-oscillator phases of the ``S`` settings;
- ``x``: ``(S, n, M)`` float32 quadratures (padded to the largest setting);
- ``mask``: ``(S, n)`` bool, valid records;
- ``true_state`` (simulated data only): ``(N,)`` / ``(N₁, N₂)`` complex64 Fock amplitudes
  at ``sim_cutoff``, for fidelity.

Embedded default: seeded simulation (:func:`~lit_lowrank.ops.homodyne.sample_homodyne`)
of ``coherent``, ``cat``, ``squeezed`` (one mode) or ``two_mode_cat`` /
``two_mode_coherent`` (two modes) with detector efficiency, additive noise and phase drift.
Real data: ``path`` to a text (``.csv``/``.txt``, comma or whitespace separated) or
``.npy`` file of rows ``(θ, x)`` (one mode) or ``(θ₁, θ₂, x₁, x₂)`` (two modes); rows
are grouped by their (rounded) phase setting.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_lowrank.ops.homodyne import (
    cat_state,
    coherent_state,
    phase_settings,
    sample_homodyne,
    squeezed_vacuum,
    two_mode_cat_state,
)

STATES = ("coherent", "cat", "squeezed", "two_mode_cat", "two_mode_coherent")


def make_state(state: str, cutoff: int, alpha: float = 1.5, squeezing: float = 0.5) -> torch.Tensor:
    """Fock amplitudes of a named state (``(N,)`` or ``(N, N)``, complex128)."""
    if state == "coherent":
        c = coherent_state(alpha, cutoff)
        return c / torch.linalg.vector_norm(c)
    if state == "cat":
        return cat_state(alpha, cutoff)
    if state == "squeezed":
        return squeezed_vacuum(squeezing, cutoff)
    if state == "two_mode_cat":
        return two_mode_cat_state(alpha, cutoff)
    if state == "two_mode_coherent":
        c = coherent_state(alpha, cutoff)
        c = torch.outer(c, c)
        return c / torch.linalg.vector_norm(c)
    raise ValueError(f"`state`={state!r}, expected one of {STATES}.")


def group_records(rows: np.ndarray) -> dict[str, torch.Tensor]:
    """Rows ``(θ_1..θ_M, x_1..x_M)`` → the padded batch dict (settings sorted)."""
    if rows.ndim != 2 or rows.shape[1] not in (2, 4):
        raise ValueError(f"homodyne records: expected rows of (theta, x) or (theta1, theta2, x1, x2), "
                         f"got an array of shape {rows.shape}.")
    num_modes = rows.shape[1] // 2
    phases = np.round(rows[:, :num_modes], 6)
    settings, inverse = np.unique(phases, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse, minlength=len(settings))
    x = np.zeros((len(settings), counts.max(), num_modes), dtype=np.float32)
    mask = np.zeros((len(settings), counts.max()), dtype=bool)
    for s in range(len(settings)):
        sel = rows[inverse == s, num_modes:]
        x[s, : len(sel)] = sel
        mask[s, : len(sel)] = True
    return {"theta": torch.from_numpy(settings.astype(np.float32)), "x": torch.from_numpy(x),
            "mask": torch.from_numpy(mask)}


def load_records(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a local file of homodyne rows (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"HomodyneDataModule: `path`={str(path)!r} does not exist; expected a .csv/.txt/.npy "
                                "file of rows (theta, x) or (theta1, theta2, x1, x2).")
    if path.suffix == ".npy":
        rows = np.load(path)
    else:
        text = path.read_text().replace(",", " ")
        rows = np.loadtxt(text.splitlines(), ndmin=2)
    return group_records(np.asarray(rows, dtype=np.float64))


class _OneBatch(Dataset):
    def __init__(self, batch: dict[str, Any]) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return 1

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return self.batch


class HomodyneDataModule(pl.LightningDataModule):
    """Homodyne records for quantum state tomography (one full batch).

    Args:
        state: a simulated state, one of :data:`STATES`.
        alpha: coherent amplitude of ``coherent`` / ``cat`` / two-mode states.
        squeezing: ``r`` of ``squeezed``.
        num_phases: LO phases per mode, ``kπ/num_phases``; two modes use every pair.
        shots: total records, split evenly over the settings.
        efficiency: detector efficiency ``η``.
        additive_noise: std of additive Gaussian noise.
        phase_drift: std (rad) of the LO phase random-walk step (``drift_blocks`` steps).
        drift_blocks: blocks of shots per setting sharing one drifted phase.
        sim_cutoff: Fock cutoff of the simulated state.
        quadrature_limit: sampling grid ``[−L, L]``.
        path: a local records file (real data); the simulation arguments are then unused.
        seed: simulation seed.

    .. code-block:: python

        dm = HomodyneDataModule("two_mode_cat", alpha=1.5, shots=10_000, efficiency=0.8)
        L.Trainer(max_epochs=300).fit(TomographyModule(num_modes=2, cutoff=8), datamodule=dm)
    """

    def __init__(
        self,
        state: str = "two_mode_cat",
        alpha: float = 1.5,
        squeezing: float = 0.5,
        num_phases: int = 4,
        shots: int = 10_000,
        efficiency: float = 1.0,
        additive_noise: float = 0.0,
        phase_drift: float = 0.0,
        drift_blocks: int = 8,
        sim_cutoff: int = 16,
        quadrature_limit: float = 8.0,
        path: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if path is None and state not in STATES:
            raise ValueError(f"`state`={state!r}, expected one of {STATES}.")
        if num_phases < 1:
            raise ValueError(f"`num_phases`={num_phases}, expected >= 1.")
        self.save_hyperparameters()
        self.batch: dict[str, Any] | None = None

    @property
    def num_modes(self) -> int:
        return 2 if self.hparams.state.startswith("two_mode") else 1

    def simulate(self) -> dict[str, Any]:
        """The simulated batch (seeded; same call, same records)."""
        hp = self.hparams
        true_state = make_state(hp.state, hp.sim_cutoff, hp.alpha, hp.squeezing)
        theta = phase_settings([k * math.pi / hp.num_phases for k in range(hp.num_phases)], self.num_modes)
        per_setting = max(1, hp.shots // theta.shape[0])
        gen = torch.Generator().manual_seed(hp.seed)
        x = sample_homodyne(true_state, theta, per_setting, efficiency=hp.efficiency,
                            additive_noise=hp.additive_noise, phase_drift=hp.phase_drift,
                            drift_blocks=hp.drift_blocks, quadrature_limit=hp.quadrature_limit, generator=gen)
        return {"theta": theta.float(), "x": x.float(), "mask": torch.ones(x.shape[:2], dtype=torch.bool),
                "true_state": true_state.to(torch.complex64)}

    def setup(self, stage: str | None = None) -> None:
        if self.batch is None:
            self.batch = load_records(self.hparams.path) if self.hparams.path else self.simulate()

    def _loader(self) -> DataLoader:
        self.setup()
        return DataLoader(_OneBatch(self.batch), batch_size=None, shuffle=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()
