"""Homodyne quadrature statistics of one- and two-mode states in a truncated Fock basis.

Convention (METHODS.md §4): ``x = (a + a†)/√2``, so the vacuum has quadrature variance
½. Measuring the rotated quadrature ``x_θ`` of a state with Fock amplitudes ``c_n`` gives

    p(x | θ) = |Σ_n c_n e^{-inθ} ψ_n(x)|²

with the Hermite functions ``ψ_n``; two modes: ``A(x₁, x₂ | θ₁, θ₂) = Ψ(x₁, θ₁)ᵀ C Ψ(x₂, θ₂)``
and ``p = |A|²`` for the coefficient matrix ``C`` (``N₁ × N₂``). Mixed states
(iterative MLE) use ``p = Φᵀ ρ Φ*`` with ``Φ = Ψ₁ ⊗ Ψ₂`` (row-major joint index
``n₁ N₂ + n₂``). A coherent state ``|α⟩`` has mean ``√2 |α| cos(θ − arg α)``.

Everything here is pure torch (no Lightning): states, densities on grids and at points,
and sampling of simulated homodyne records with detector inefficiency, additive noise
and local-oscillator phase drift.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

_LOG_PI_QUARTER = -0.25 * math.log(math.pi)
_RESCALE_AT = 1e150  # rescale the recurrence before float64 overflows (~1e308)


def hermite_functions(x: Tensor, cutoff: int) -> Tensor:
    """Normalised Hermite functions ``ψ_0..ψ_{cutoff-1}`` at ``x`` by the stable recurrence.

    ``ψ₀ = π^(−¼) e^(−x²/2)``, ``ψ₁ = √2 x ψ₀``,
    ``ψ_{n+1} = √(2/(n+1)) x ψ_n − √(n/(n+1)) ψ_{n−1}``. The Gaussian factor is applied
    at the end through a per-point log scale, so large ``|x|`` with a large cutoff (where
    ``e^(−x²/2)`` alone underflows but ``ψ_n`` does not) stays accurate: any cutoff works.
    Computed in float64, returned in ``x``'s floating dtype.

    Args:
        x: quadrature values, any shape ``(...)``.
        cutoff: number of functions ``N >= 1``.

    Returns:
        ``(..., N)`` real tensor.

    .. code-block:: python

        psi = hermite_functions(torch.linspace(-6, 6, 200), cutoff=12)  # (200, 12)
    """
    if cutoff < 1:
        raise ValueError(f"`cutoff`={cutoff}, expected an integer >= 1.")
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    xd = x.to(torch.float64)
    log_scale = torch.zeros_like(xd)  # log of the factor divided out so far
    envelope = torch.exp(-0.5 * xd * xd)  # e^{log_scale - x²/2}, recomputed only after a rescale
    prev = torch.zeros_like(xd)
    cur = torch.full_like(xd, math.exp(_LOG_PI_QUARTER))
    out = [cur * envelope]
    for n in range(cutoff - 1):
        nxt = math.sqrt(2.0 / (n + 1)) * xd * cur - math.sqrt(n / (n + 1)) * prev
        prev, cur = cur, nxt
        if n % 16 == 15:  # |ψ̃| grows at most ~(2|x|)^n: checking every 16 steps cannot overflow below |x| ~ 1e8
            big = cur.abs() > _RESCALE_AT
            if bool(big.any()):
                factor = torch.where(big, cur.abs(), torch.ones_like(cur))
                prev, cur = prev / factor, cur / factor
                log_scale = log_scale + torch.log(factor)
                envelope = torch.exp(log_scale - 0.5 * xd * xd)
        out.append(cur * envelope)
    return torch.stack(out, dim=-1).to(dtype)


def quadrature_basis(x: Tensor, theta: Tensor | float, cutoff: int) -> Tensor:
    """``Ψ_n(x, θ) = e^{−inθ} ψ_n(x)``: the rotated-quadrature amplitudes of Fock states.

    Args:
        x: quadratures ``(...)``.
        theta: local-oscillator phases broadcastable to ``x``.
        cutoff: Fock cutoff ``N``.

    Returns:
        ``(..., N)`` complex tensor (complex128 for float64 ``x``, else complex64).
    """
    psi = hermite_functions(x, cutoff)
    theta = torch.as_tensor(theta, dtype=psi.dtype, device=psi.device)
    n = torch.arange(cutoff, dtype=psi.dtype, device=psi.device)
    phase = torch.polar(torch.ones_like(psi), -theta.unsqueeze(-1) * n)
    return psi * phase


def _check_modes(theta: Tensor, num_modes: int, name: str = "theta") -> None:
    if theta.shape[-1] != num_modes:
        raise ValueError(f"`{name}` has last dimension {theta.shape[-1]}, expected the number of modes {num_modes}.")


def pure_state_amplitude_grid(coefficients: Tensor, theta: Tensor, grid: Tensor) -> Tensor:
    """Amplitudes of a pure state on a quadrature grid, for each phase setting.

    Args:
        coefficients: ``(N,)`` (one mode) or ``(N₁, N₂)`` (two modes) complex Fock amplitudes.
        theta: ``(S, M)`` phase settings, ``M`` = number of modes.
        grid: ``(G,)`` quadrature grid (the same for every mode).

    Returns:
        ``(S, G)`` (one mode) or ``(S, G, G)`` (two modes, ``[s, i, j]`` at ``(x_i, x_j)``).
    """
    num_modes = coefficients.dim()
    if num_modes not in (1, 2):
        raise ValueError(f"`coefficients` must be (N,) or (N1, N2), got shape {tuple(coefficients.shape)}.")
    _check_modes(theta, num_modes)
    grid = grid.to(coefficients.real.dtype)
    bases = [quadrature_basis(grid.expand(theta.shape[0], -1), theta[:, m : m + 1], coefficients.shape[m])
             for m in range(num_modes)]  # each (S, G, N_m)
    if num_modes == 1:
        return bases[0] @ coefficients
    return torch.einsum("sin,nm,sjm->sij", bases[0], coefficients, bases[1])


def pure_state_density_grid(coefficients: Tensor, theta: Tensor, grid: Tensor) -> Tensor:
    """``p = |A|²`` of :func:`pure_state_amplitude_grid` (a density in each quadrature)."""
    amp = pure_state_amplitude_grid(coefficients, theta, grid)
    return amp.real.square() + amp.imag.square()


def pure_state_density_points(coefficients: Tensor, theta: Tensor, x: Tensor) -> Tensor:
    """Density of a pure state at measured points.

    Args:
        coefficients: ``(N,)`` or ``(N₁, N₂)`` complex Fock amplitudes.
        theta: ``(..., M)`` phases per point.
        x: ``(..., M)`` quadratures per point.

    Returns:
        ``(...)`` densities.
    """
    num_modes = coefficients.dim()
    _check_modes(theta, num_modes)
    _check_modes(x, num_modes, "x")
    x = x.to(coefficients.real.dtype)
    bases = [quadrature_basis(x[..., m], theta[..., m], coefficients.shape[m]) for m in range(num_modes)]
    if num_modes == 1:
        amp = bases[0] @ coefficients
    else:
        amp = ((bases[0] @ coefficients) * bases[1]).sum(-1)
    return amp.real.square() + amp.imag.square()


def joint_basis(x: Tensor, theta: Tensor, cutoffs: Sequence[int]) -> Tensor:
    """``Φ = Ψ(x₁, θ₁) ⊗ Ψ(x₂, θ₂)`` (row-major), so that ``p = Φᵀ ρ Φ*``.

    Args:
        x, theta: ``(..., M)``.
        cutoffs: per-mode cutoffs ``(N₁[, N₂])``.

    Returns:
        ``(..., N₁ N₂)`` complex.
    """
    _check_modes(theta, len(cutoffs))
    _check_modes(x, len(cutoffs), "x")
    phi = quadrature_basis(x[..., 0], theta[..., 0], cutoffs[0])
    for m in range(1, len(cutoffs)):
        other = quadrature_basis(x[..., m], theta[..., m], cutoffs[m])
        phi = (phi.unsqueeze(-1) * other.unsqueeze(-2)).flatten(-2)
    return phi


def mixed_state_density_points(rho: Tensor, theta: Tensor, x: Tensor, cutoffs: Sequence[int]) -> Tensor:
    """``p = Φᵀ ρ Φ*`` at points for a density matrix ``rho`` ``(D, D)``, ``D = ∏ N_m``."""
    phi = joint_basis(x, theta, cutoffs).to(rho.dtype)
    return torch.einsum("...i,ij,...j->...", phi, rho, phi.conj()).real


# ----------------------------------------------------------------------------- states

def coherent_state(alpha: complex, cutoff: int, dtype: torch.dtype = torch.complex128) -> Tensor:
    """Fock amplitudes of ``|α⟩``: ``e^{−|α|²/2} αⁿ/√n!`` (by recurrence, no factorial overflow)."""
    c = torch.zeros(cutoff, dtype=torch.complex128)
    c[0] = math.exp(-abs(alpha) ** 2 / 2)
    for n in range(1, cutoff):
        c[n] = c[n - 1] * alpha / math.sqrt(n)
    return c.to(dtype)


def cat_state(alpha: complex, cutoff: int, parity: int = 1, dtype: torch.dtype = torch.complex128) -> Tensor:
    """``|α⟩ + parity·|−α⟩``, normalised in the truncated space."""
    if parity not in (1, -1):
        raise ValueError(f"`parity`={parity}, expected +1 (even cat) or -1 (odd cat).")
    c = coherent_state(alpha, cutoff) + parity * coherent_state(-alpha, cutoff)
    return (c / torch.linalg.vector_norm(c)).to(dtype)


def squeezed_vacuum(r: float, cutoff: int, dtype: torch.dtype = torch.complex128) -> Tensor:
    """``S(r)|0⟩`` squeezed along ``x`` (``Var x = e^{−2r}/2``), normalised in the truncated space."""
    c = torch.zeros(cutoff, dtype=torch.complex128)
    c[0] = 1.0 / math.sqrt(math.cosh(r))
    for n in range(2, cutoff, 2):
        c[n] = c[n - 2] * (-math.tanh(r)) * math.sqrt((n - 1) / n)
    return (c / torch.linalg.vector_norm(c)).to(dtype)


def two_mode_cat_state(alpha: complex, cutoff: int, parity: int = 1, dtype: torch.dtype = torch.complex128) -> Tensor:
    """``|α, α⟩ + parity·|−α, −α⟩`` as an ``(N, N)`` coefficient matrix, normalised."""
    a, b = coherent_state(alpha, cutoff), coherent_state(-alpha, cutoff)
    c = torch.outer(a, a) + parity * torch.outer(b, b)
    return (c / torch.linalg.vector_norm(c)).to(dtype)


def fidelity_pure(target: Tensor, state: Tensor) -> Tensor:
    """``|⟨target|state⟩|²`` over the Fock indices both hold (truncation beyond either cutoff
    counts as zero amplitude). Both normalised inside; shapes ``(N,)`` or ``(N₁, N₂)``."""
    if target.dim() != state.dim():
        raise ValueError(f"`target` has {target.dim()} modes but `state` has {state.dim()}.")
    t, s = target / torch.linalg.vector_norm(target), state / torch.linalg.vector_norm(state)
    common = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, s.shape))
    overlap = (t[common].conj() * s[common].to(t.dtype)).sum()
    return overlap.abs().square()


def fidelity_to_pure(target: Tensor, rho: Tensor) -> Tensor:
    """``⟨target|ρ|target⟩`` for a mixed ``rho`` ``(D, D)`` and a pure target truncated to match."""
    cutoffs = _cutoffs_of(rho, target.dim())
    t = target[tuple(slice(0, n) for n in cutoffs)]
    pad = [0 for _ in range(2 * t.dim())]
    for m, n in enumerate(reversed(cutoffs)):
        pad[2 * m + 1] = n - t.shape[t.dim() - 1 - m]
    t = torch.nn.functional.pad(t, pad).reshape(-1).to(rho.dtype)
    t = t / torch.linalg.vector_norm(target)
    return (t.conj() @ rho @ t).real / torch.diagonal(rho).real.sum()


def _cutoffs_of(rho: Tensor, num_modes: int) -> tuple[int, ...]:
    d = rho.shape[0]
    n = round(d ** (1.0 / num_modes))
    if n ** num_modes != d:
        raise ValueError(f"`rho` of size {d} is not a square of a per-mode cutoff for {num_modes} modes.")
    return (n,) * num_modes


def purity(rho: Tensor) -> Tensor:
    """``tr ρ²`` (``rho`` normalised inside)."""
    rho = rho / torch.diagonal(rho).real.sum()
    return (rho * rho.transpose(-1, -2)).sum().real


def reduced_density_matrix(coefficients: Tensor, keep: int = 0) -> Tensor:
    """``ρ`` of mode ``keep`` of a pure one- or two-mode state (``(N,)`` or ``(N₁, N₂)``)."""
    c = coefficients / torch.linalg.vector_norm(coefficients)
    if c.dim() == 1:
        return torch.outer(c, c.conj())
    return c @ c.conj().T if keep == 0 else c.T @ c.conj()


# ---------------------------------------------------------------------------- sampling

def phase_settings(phases: Sequence[float], num_modes: int) -> Tensor:
    """All combinations of the per-mode LO ``phases``: ``(P^M, M)`` float64."""
    p = torch.tensor(list(phases), dtype=torch.float64)
    if num_modes == 1:
        return p[:, None]
    return torch.cartesian_prod(*([p] * num_modes)).reshape(-1, num_modes)


def sample_homodyne(
    coefficients: Tensor,
    theta: Tensor,
    shots_per_setting: int,
    *,
    efficiency: float = 1.0,
    additive_noise: float = 0.0,
    phase_drift: float = 0.0,
    drift_blocks: int = 8,
    quadrature_limit: float = 8.0,
    grid_size: int = 400,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Simulated homodyne records of a pure state: ``(S, shots_per_setting, M)`` float64.

    Exact draws from ``p(x | θ)`` by inverse-CDF sampling on a fine grid (uniform jitter
    within a cell), then the detector model: efficiency ``η`` mixes in vacuum noise,
    ``x ← √η x + √((1−η)/2) ξ``; additive electronic noise ``x ← x + σ ξ``. Phase drift is
    a slow random walk of the LO phases: the shots of each setting are split into
    ``drift_blocks`` consecutive blocks, block ``b`` measured at ``θ + Σ_{b'≤b} δ ξ_{b'}``
    while the record keeps the nominal ``θ`` (the experimenter does not know the drift).

    Args:
        coefficients: ``(N,)`` or ``(N₁, N₂)`` Fock amplitudes (normalised inside).
        theta: ``(S, M)`` nominal phase settings.
        shots_per_setting: records per setting.
        efficiency: detector efficiency ``η`` in ``(0, 1]``.
        additive_noise: std ``σ`` of additive Gaussian noise.
        phase_drift: std ``δ`` (radians) of each random-walk step.
        drift_blocks: number of blocks per setting for the drift.
        quadrature_limit: sampling grid ``[−L, L]`` per mode (must hold the state).
        grid_size: sampling grid points per mode.
        generator: torch RNG for reproducibility.

    .. code-block:: python

        state = two_mode_cat_state(1.5, cutoff=16)
        x = sample_homodyne(state, phase_settings([0, math.pi / 3], 2), 1000, efficiency=0.9)
    """
    if not 0.0 < efficiency <= 1.0:
        raise ValueError(f"`efficiency`={efficiency}, expected a value in (0, 1].")
    if additive_noise < 0 or phase_drift < 0:
        raise ValueError(f"`additive_noise`={additive_noise} and `phase_drift`={phase_drift} must be >= 0.")
    if shots_per_setting < 1:
        raise ValueError(f"`shots_per_setting`={shots_per_setting}, expected >= 1.")
    coefficients = coefficients.to(torch.complex128)
    coefficients = coefficients / torch.linalg.vector_norm(coefficients)
    num_modes = coefficients.dim()
    theta = theta.to(torch.float64)
    _check_modes(theta, num_modes)
    num_settings = theta.shape[0]
    grid = torch.linspace(-quadrature_limit, quadrature_limit, grid_size, dtype=torch.float64)
    step = float(grid[1] - grid[0])
    blocks = max(1, min(drift_blocks, shots_per_setting)) if phase_drift > 0 else 1
    sizes = [len(chunk) for chunk in torch.arange(shots_per_setting).tensor_split(blocks)]
    walk = torch.zeros(num_settings, blocks, num_modes, dtype=torch.float64)
    if phase_drift > 0:
        walk = torch.cumsum(phase_drift * torch.randn(num_settings, blocks, num_modes, generator=generator,
                                                      dtype=torch.float64), dim=1)
    out = torch.empty(num_settings, shots_per_setting, num_modes, dtype=torch.float64)
    start = 0
    for b, size in enumerate(sizes):
        dens = pure_state_density_grid(coefficients, theta + walk[:, b], grid).reshape(num_settings, -1)
        dens = dens.clamp_min(0)
        idx = torch.multinomial(dens, size, replacement=True, generator=generator)  # (S, size)
        if num_modes == 1:
            cells = idx[..., None]
        else:
            cells = torch.stack([idx // grid_size, idx % grid_size], dim=-1)
        jitter = (torch.rand(num_settings, size, num_modes, generator=generator, dtype=torch.float64) - 0.5) * step
        out[:, start : start + size] = grid[cells] + jitter
        start += size
    if efficiency < 1.0:
        vac = torch.randn(out.shape, generator=generator, dtype=torch.float64)
        out = math.sqrt(efficiency) * out + math.sqrt((1.0 - efficiency) / 2.0) * vac
    if additive_noise > 0:
        out = out + additive_noise * torch.randn(out.shape, generator=generator, dtype=torch.float64)
    return out
