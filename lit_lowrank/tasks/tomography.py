"""TomographyModule: neural-network quantum state tomography from homodyne records.

An overparameterised MLP (:class:`~lit_lowrank.models.fock_wavefunction.FockWavefunction`)
gives the pure state ``ψ`` in a truncated Fock basis (rank-1 factored gradient descent,
``ρ = ψψ†``); the loss compares measured and predicted quadrature distributions:

- ``"msw1"`` (the method): max-sliced Wasserstein-1 — for every phase setting the
  2-D quadrature distribution is projected on the direction ``u_φ``, ``W1 = ∫|F_model − F_data|``,
  and ``φ`` is *optimised* over the continuous half circle (dense search of ``num_angles``
  angles + golden-section refinement, :func:`~lit_lowrank.ops.sliced_wasserstein.max_sliced_w1_on_grid`);
  the per-setting max-sliced distances are reduced over settings by ``setting_reduction``
  (``"max"``, the default — the spec's max over settings and directions — or ``"mean"``, the
  ablation). One mode has one direction (the W1 of the marginal);
- ``"sw1"``: the mean over the ``num_angles`` slices (the "sliced" ablation);
- ``"nll"``: the negative log-likelihood of the records (the NN + NLL baseline).

The **known detector channel** is part of the forward model: with ``efficiency`` η < 1 or
``additive_noise`` σ > 0 a recorded quadrature is ``√η y + N(0, (1−η)/2 + σ²)`` of the ideal ``y``
(the loss-corrected POVM of :mod:`~lit_lowrank.ops.imle` uses the same kernel,
:func:`~lit_lowrank.ops.imle.detector_kernel`), so the model density on the grid is blurred per
mode before it meets the records, and the network fits the state *before* the detector (with the
channel, ``"nll"`` is the binned likelihood of the records on the same grid). ``init_state`` starts
the network at a given state (e.g. standard iMLE's leading eigenvector): a parity-breaking start —
the even and odd cats have the same marginal bumps and differ only in damped fringes.

Batches come from :class:`~lit_lowrank.datamodules.homodyne.HomodyneDataModule`.
Logged: ``<split>/loss``, ``<split>/fidelity`` (when the batch holds ``true_state``),
``<split>/reduced_purity`` (``tr ρ₁²`` of mode 1, < 1 for an entangled two-mode state),
``method/nn_qst/max_slice_w1`` and ``method/nn_qst/mean_slice_w1`` (max and mean over settings
of the per-setting max-sliced W1; W1 losses only); optionally a Wigner plot of mode 1
(``wigner_every_n_epochs``; needs qutip and matplotlib).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.models.fock_wavefunction import FockWavefunction
from lit_lowrank.ops.homodyne import fidelity_pure, purity, quadrature_basis, reduced_density_matrix
from lit_lowrank.ops.imle import detector_kernel
from lit_lowrank.ops.sliced_wasserstein import (
    max_sliced_w1_on_grid,
    projected_cdf,
    slice_directions,
    sliced_w1_on_grid,
    w1_between_cdfs,
)
from lit_lowrank.tasks.base import TaskModule

LOSSES = ("msw1", "sw1", "nll")
SETTING_REDUCTIONS = ("mean", "max")
SELECTIONS = ("loss", "nll")
METHOD = "nn_qst"


class TomographyModule(TaskModule):
    """Fit a neural-network wavefunction to homodyne records.

    Args:
        num_modes: 1 or 2.
        cutoff: Fock cutoff per mode.
        loss: ``"msw1"`` (max-sliced W1), ``"sw1"`` (mean-sliced W1) or ``"nll"``.
        hidden_size, num_layers: the MLP.
        num_angles: angles of the dense direction search for two modes (``φ_k = kπ/K``; also the
            slices of ``"sw1"``); one mode has one direction.
        refine_steps: golden-section steps refining the best angle of each setting (0: dense search only).
        setting_reduction: how the per-setting max-sliced W1 are combined: ``"max"`` (the worst
            setting, the spec) or ``"mean"`` (every setting gets gradient; the ablation).
        grid_size: model-density grid points per mode on ``[−L, L]``.
        quadrature_limit: ``L``.
        num_t_bins: bins of the projected CDFs on ``[−L√M, L√M]``.
        nll_floor: density floor inside the log (records where the model has no mass).
        wigner_every_n_epochs: log a Wigner plot of mode 1 every n validation epochs (0: off).
        efficiency, additive_noise: the known detector channel in the forward model (η = 1, σ = 0: none).
        init_state: ``(N[, N])`` amplitudes the network starts at (``None``: a random start); see
            :class:`~lit_lowrank.models.fock_wavefunction.FockWavefunction`.

    .. code-block:: python

        model = TomographyModule(num_modes=2, cutoff=8, loss="msw1",
                                 optimizer=lambda p: torch.optim.Adam(p, lr=3e-3))
        L.Trainer(max_epochs=300).fit(model, datamodule=HomodyneDataModule("two_mode_cat"))
        psi = model()  # (8, 8) complex amplitudes
    """

    def __init__(
        self,
        num_modes: int = 2,
        cutoff: int = 8,
        loss: str = "msw1",
        hidden_size: int = 128,
        num_layers: int = 2,
        num_angles: int = 32,
        refine_steps: int = 8,
        setting_reduction: str = "max",
        grid_size: int = 64,
        quadrature_limit: float = 7.0,
        num_t_bins: int = 160,
        nll_floor: float = 1e-8,
        wigner_every_n_epochs: int = 0,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "epoch",
        efficiency: float = 1.0,
        additive_noise: float = 0.0,
        init_state: Tensor | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        if num_modes not in (1, 2):
            raise ValueError(f"`num_modes`={num_modes}, expected 1 or 2.")
        if loss not in LOSSES:
            raise ValueError(f"`loss`={loss!r}, expected one of {LOSSES}.")
        if setting_reduction not in SETTING_REDUCTIONS:
            raise ValueError(f"`setting_reduction`={setting_reduction!r}, expected one of {SETTING_REDUCTIONS}.")
        if num_angles < 3:
            raise ValueError(f"`num_angles`={num_angles}, expected >= 3.")
        if not 0.0 < efficiency <= 1.0 or additive_noise < 0:
            raise ValueError(f"`efficiency`={efficiency} (expected in (0, 1]) and `additive_noise`={additive_noise} "
                             "(expected >= 0) describe the detector.")
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler", "init_state"])
        self.num_modes, self.cutoff, self.loss_name = num_modes, cutoff, loss
        self.wavefunction = FockWavefunction((cutoff,) * num_modes, hidden_size, num_layers, init_state=init_state)
        grid = torch.linspace(-quadrature_limit, quadrature_limit, grid_size)
        self.register_buffer("grid", grid, persistent=False)
        self.detector = efficiency < 1.0 or additive_noise > 0.0
        if self.detector:  # K[i, j] = P(record in the cell of grid point i | ideal quadrature at grid point j)
            step = 2 * quadrature_limit / (grid_size - 1)
            edges = torch.cat([grid[:1] - step / 2, 0.5 * (grid[1:] + grid[:-1]), grid[-1:] + step / 2]).double()
            edges[0], edges[-1] = -math.inf, math.inf  # records beyond the grid are snapped to its ends
            kernel = detector_kernel(edges, grid.double(), efficiency, additive_noise).float()
            self.register_buffer("detector_kernel", kernel, persistent=False)
        mesh = torch.meshgrid(*([grid] * num_modes), indexing="ij")
        self.register_buffer("grid_points", torch.stack(mesh, -1).reshape(-1, num_modes), persistent=False)
        self.register_buffer("directions", slice_directions(1, 1, torch.float32), persistent=False)
        t_max = quadrature_limit * math.sqrt(num_modes)
        self.register_buffer("t_edges", torch.linspace(-t_max, t_max, num_t_bins + 1), persistent=False)
        self.bin_width = 2 * t_max / num_t_bins
        self._cache: dict[str, Any] = {}

    def forward(self) -> Tensor:
        """The state's Fock amplitudes ``(N[, N])`` complex, unit norm."""
        return self.wavefunction()

    # ------------------------------------------------------------------ densities
    def _cached(self, name: str, key: Any, make: Any) -> Any:
        if self._cache.get(name, (None,))[0] != key:
            self._cache[name] = (key, make())
        return self._cache[name][1]

    @staticmethod
    def _key(t: Tensor) -> tuple:
        return (tuple(t.shape), t.device.type, float(t.double().sum()), float(t.double().square().sum()))

    def _check_batch(self, batch: dict[str, Any]) -> None:
        theta, x = batch["theta"], batch["x"]
        if theta.dim() != 2 or theta.shape[1] != self.num_modes or x.shape[-1] != self.num_modes:
            raise ValueError(f"TomographyModule(num_modes={self.num_modes}) got `theta` {tuple(theta.shape)} and "
                             f"`x` {tuple(x.shape)}; expected (S, {self.num_modes}) and (S, n, {self.num_modes}).")

    def grid_density(self, psi: Tensor, theta: Tensor) -> Tensor:
        """Model density ``(S, G^M)`` on the grid for each setting (differentiable in ``psi``)."""
        bases = self._cached("grid_basis", self._key(theta), lambda: [
            quadrature_basis(self.grid.expand(theta.shape[0], -1), theta[:, m : m + 1], self.cutoff)
            for m in range(self.num_modes)])
        if self.num_modes == 1:
            amp = bases[0] @ psi
        else:
            amp = torch.einsum("sin,nm,sjm->sij", bases[0], psi, bases[1])
        density = amp.real.square() + amp.imag.square()
        if self.detector:  # the known channel, per mode: what the detector records of the ideal density
            k = self.detector_kernel
            density = density @ k.T if self.num_modes == 1 else torch.einsum("bi,sij,cj->sbc", k, density, k)
        return density.reshape(theta.shape[0], -1)

    def data_weights(self, batch: dict[str, Any]) -> Tensor:
        """Record counts on the model's grid points ``(S, G^M)`` (records snapped to the grid; cached)."""
        x, mask = batch["x"], batch.get("mask")

        def make() -> Tensor:
            grid = self.grid
            step = (grid[-1] - grid[0]) / (grid.numel() - 1)
            index = torch.round((x.to(grid.dtype) - grid[0]) / step).clamp(0, grid.numel() - 1).long()
            flat = index[..., 0]
            for m in range(1, self.num_modes):
                flat = flat * grid.numel() + index[..., m]
            weights = torch.ones(x.shape[:2], device=x.device) if mask is None else mask.float()
            counts = torch.zeros(x.shape[0], grid.numel() ** self.num_modes, device=x.device)
            return counts.scatter_add(1, flat, weights.to(counts.dtype))

        return self._cached("data_weights", self._key(x), make)

    def snap_to_grid(self, x: Tensor) -> Tensor:
        """Records moved to their nearest model-grid point (clamped to ``[−L, L]``).

        The model density lives on grid points, so its projected CDF is a staircase; against
        raw records that alone costs ``W1 ≈ h/4`` per axis slice (``h`` the grid step, 0.056
        at the defaults) — a floor the max over slices then chases instead of the state.
        Quantising the records on the same grid removes it (both sides see the same
        quantisation; the loss stays a consistent estimator as ``h → 0``).
        """
        grid = self.grid
        step = (grid[-1] - grid[0]) / (grid.numel() - 1)
        index = torch.round((x.to(grid.dtype) - grid[0]) / step).clamp(0, grid.numel() - 1).long()
        return grid[index]

    def slice_distances(self, psi: Tensor, batch: dict[str, Any], loss: str = "msw1") -> Tensor:
        """Per-setting distance ``(S,)``: the max-sliced W1 (``loss="msw1"``, max over the continuous
        direction) or the sliced W1 (``"sw1"``, mean over ``num_angles`` directions); one mode: the W1
        of the marginal."""
        density = self.grid_density(psi, batch["theta"])
        data = self.data_weights(batch)
        if self.num_modes == 1:
            model_cdf = projected_cdf(self.grid_points, density, self.directions, self.t_edges)
            data_cdf = projected_cdf(self.grid_points, data, self.directions, self.t_edges)
            return w1_between_cdfs(model_cdf, data_cdf, self.bin_width, reduction="none")[:, 0]
        if loss == "sw1":
            return sliced_w1_on_grid(self.grid_points, density, data, self.t_edges, self.hparams.num_angles)
        values, angles = max_sliced_w1_on_grid(self.grid_points, density, data, self.t_edges,
                                               self.hparams.num_angles, self.hparams.refine_steps)
        self.last_angles = angles
        return values

    def sliced_loss(self, psi: Tensor, batch: dict[str, Any]) -> Tensor:
        """The W1 objective of ``loss`` (``"msw1"`` or ``"sw1"``) reduced over settings."""
        name = "sw1" if self.loss_name == "sw1" else "msw1"
        values = self.slice_distances(psi, batch, name)
        return values.max() if self.hparams.setting_reduction == "max" and name == "msw1" else values.mean()

    def nll(self, psi: Tensor, batch: dict[str, Any]) -> Tensor:
        """Mean negative log-likelihood of the (masked) records (binned on the grid with a detector channel)."""
        theta, x, mask = batch["theta"], batch["x"], batch.get("mask")
        if self.detector:
            density = self.grid_density(psi, theta)
            area = float(self.grid[1] - self.grid[0]) ** self.num_modes  # cell mass -> density: the same scale
            cell = density / density.sum(-1, keepdim=True).clamp_min(1e-30) / area  # as the point likelihood
            counts = self.data_weights(batch)
            return -(counts * torch.log(cell + self.hparams.nll_floor)).sum() / counts.sum().clamp_min(1)

        def make() -> list[Tensor]:
            return [quadrature_basis(x[..., m], theta[:, None, m].expand(x.shape[:2]), self.cutoff)
                    for m in range(self.num_modes)]

        bases = self._cached("point_basis", self._key(x), make)
        amp = bases[0] @ psi if self.num_modes == 1 else ((bases[0] @ psi) * bases[1]).sum(-1)
        logp = torch.log(amp.real.square() + amp.imag.square() + self.hparams.nll_floor)
        if mask is None:
            return -logp.mean()
        return -(logp * mask).sum() / mask.sum().clamp_min(1)

    # ---------------------------------------------------------------------- steps
    def step(self, batch: dict[str, Any]) -> dict[str, Any]:
        self._check_batch(batch)
        psi = self()
        if self.loss_name == "nll":
            return {"loss": self.nll(psi, batch), "state": psi, "slice_w1": None, "category": None}
        name = "sw1" if self.loss_name == "sw1" else "msw1"
        slices = self.slice_distances(psi, batch, name)
        reduce_max = self.hparams.setting_reduction == "max" and name == "msw1"
        loss = slices.max() if reduce_max else slices.mean()
        return {"loss": loss, "state": psi, "slice_w1": slices.detach(), "category": None}

    def criterion(self, batch: dict[str, Any], select: str = "loss") -> float:
        """A data-only score of the current state (lower is better): its own loss or the records' NLL."""
        if select not in SELECTIONS:
            raise ValueError(f"`select`={select!r}, expected one of {SELECTIONS}.")
        with torch.no_grad():
            return float(self.step(batch)["loss"] if select == "loss" else self.nll(self(), batch))

    def _metrics(self, outputs: dict[str, Any], batch: dict[str, Any]) -> dict[str, Tensor]:
        psi = outputs["state"].detach()
        values: dict[str, Tensor] = {"reduced_purity": purity(reduced_density_matrix(psi, 0))}
        if batch.get("true_state") is not None:
            values["fidelity"] = fidelity_pure(batch["true_state"], psi)
        return values

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        outputs = self.step(batch)
        loss = apply_loss_hooks(self, batch, outputs, outputs["loss"])
        self.log_split("train", {"loss": loss, **self._metrics(outputs, batch)}, batch_size=1)
        if outputs["slice_w1"] is not None:
            log_method(self, METHOD, "max_slice_w1", outputs["slice_w1"].max())
            log_method(self, METHOD, "mean_slice_w1", outputs["slice_w1"].mean())
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        outputs = self.step(batch)
        self.log_split("val", {"loss": outputs["loss"], **self._metrics(outputs, batch)}, batch_size=1)
        every = self.hparams.wigner_every_n_epochs
        if every and self.current_epoch % every == 0:
            self.log_wigner(outputs["state"].detach())

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        outputs = self.step(batch)
        self.log_split("test", {"loss": outputs["loss"], **self._metrics(outputs, batch)}, batch_size=1)

    def log_wigner(self, psi: Tensor) -> None:
        """Log the Wigner function of mode 1 as an image to every logger (core/figures.py: W&B
        ``log_image``, TensorBoard ``add_image``, else a PNG in the log dir). Needs qutip."""
        try:
            import qutip
        except ImportError:  # optional: the fit does not depend on the plot
            return
        from lit_lowrank.core.figures import figure_due, log_figure, new_figure

        if not figure_due(self._trainer, 1):
            return
        rho = reduced_density_matrix(psi.cpu().to(torch.complex128), 0).numpy()
        xvec = torch.linspace(-self.hparams.quadrature_limit, self.hparams.quadrature_limit, 121).numpy()
        w = qutip.wigner(qutip.Qobj(rho), xvec, xvec)  # qutip's default g=sqrt(2) matches x=(a+a†)/√2
        fig, ax = new_figure(4.6, 4.0)
        bound = float(abs(w).max()) or 1.0
        image = ax.contourf(xvec, xvec, w, 60, cmap="RdBu_r", vmin=-bound, vmax=bound)
        fig.colorbar(image, ax=ax, label="W(x, p)")
        ax.set(xlabel="x", ylabel="p", title=f"Wigner, mode 1, epoch {self.current_epoch}")
        log_figure(self.trainer, "val/wigner", fig)



def fit_with_restarts(
    batch: dict[str, Any],
    restarts: int = 1,
    steps: int = 200,
    lr: float = 1e-2,
    seed: int = 0,
    select: str = "loss",
    **module_kwargs: Any,
) -> tuple[TomographyModule, list[float]]:
    """Fit ``restarts`` independently initialised modules; keep the best by a data-only criterion.

    Each restart seeds torch with ``seed + r`` and runs ``steps`` full-batch Adam steps
    (cosine learning rate). Selection uses only data, evaluated once more after the last
    step — never the fidelity, since the true state is unknown to the fitter. ``select="loss"``
    (the default) ranks restarts by each fit's *own* objective (MSW1 for the method, NLL for
    the NLL baseline); ``select="nll"`` ranks every fit by the records' likelihood (the NLL
    baseline's criterion: using it for an MSW1 fit borrows the baseline's estimator).

    Args:
        batch: a full batch from :class:`~lit_lowrank.datamodules.homodyne.HomodyneDataModule`.
        restarts: number of independent fits (≥ 1).
        steps: Adam steps per fit.
        lr: initial learning rate.
        seed: seed of the first restart.
        select: ``"loss"`` (the fit's own objective) or ``"nll"`` (records' likelihood).
        **module_kwargs: passed to :class:`TomographyModule` (``num_modes``, ``cutoff``, ``loss``, ...).

    Returns:
        The selected module (eval mode) and the selection criterion of every restart, in order.

    .. code-block:: python

        module, losses = fit_with_restarts(dm.batch, restarts=3, steps=200, num_modes=2, cutoff=8, loss="msw1")
        psi = module()
    """
    if restarts < 1:
        raise ValueError(f"`restarts`={restarts}, expected an integer >= 1.")
    if select not in SELECTIONS:
        raise ValueError(f"`select`={select!r}, expected one of {SELECTIONS}.")
    best: TomographyModule | None = None
    losses: list[float] = []
    for r in range(restarts):
        torch.manual_seed(seed + r)
        module = TomographyModule(**module_kwargs)
        opt = torch.optim.Adam(module.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        for _ in range(steps):
            opt.zero_grad()
            module.step(batch)["loss"].backward()
            opt.step()
            sched.step()
        module.eval()
        losses.append(module.criterion(batch, select))
        if best is None or losses[-1] < min(losses[:-1]):
            best = module
    assert best is not None
    return best, losses
