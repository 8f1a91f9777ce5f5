"""Forward–backward (FB) representations with temporal abstraction: the math (arXiv 2603.20103).

FB (Touati & Ollivier 2021) models the successor measure of the policy ``π_z`` as
``M^{π_z}(s, a, ds') ≈ F(s, a, z)ᵀ B(s') ρ(ds')`` with ``ρ`` the data distribution. Temporal
abstraction of length ``k`` replaces the one-step transition operator by a macro operator; two are
kept, by name (:data:`ABSTRACTIONS`):

- ``"options"``: a fixed-length option takes its first action, then runs the behaviour policy
  ``π`` for ``k − 1`` more steps. Averaged over the first action this is ``P_πᵏ``, whose
  eigenvalues are exactly ``λᵏ``: a low-pass filter on the spectrum *when the spectrum is
  non-negative* (a lazy walk); on a nearly bipartite walk ``λ ≈ −1`` survives (``λ² ≈ 1``).
- ``"repeat"``: action repeat holds the chosen action ``k`` steps, ``Σ_a π(a|s) P_aᵏ``. This is
  not a power of ``P_π`` and its eigenvalues are not ``λᵏ``: held actions travel further, and its
  SR effective rank can *rise* with ``k`` (measured in ``lit-lowrank bench fb_temporal``).

The filtered spectrum lowers the effective rank of the successor measure the rank-``d``
FB bottleneck has to fit. This module holds everything that is plain math:

- the FB temporal-difference loss and the orthonormality regulariser (:func:`fb_loss`,
  :func:`orthonormality_loss`), the latent sampler (:func:`sample_z`) and zero-shot reward
  inference (:func:`zero_shot_z`);
- temporal abstraction (:func:`macro_discount`, :func:`macro_reward`,
  :func:`macro_transition`);
- tabular / discretised spectral tools: the policy transition operator
  (:func:`policy_transition`), exact successor representation and successor measure
  (:func:`successor_representation`, :func:`successor_measure`), the spectrum
  (:func:`transition_spectrum`), a discretised operator estimated from transitions
  (:func:`estimate_transition_operator`), the effective rank of the SR as a function of ``k``
  (:func:`sr_effective_rank`), the relative SR error (:func:`relative_sr_error`) and the
  value-error bound (:func:`value_error_bound`, :func:`rank_value_floor`).

Decisions (METHODS.md §1 leaves them open):

- **macro discount**: ``"power"`` (default) discounts a macro step of ``k`` primitive steps by
  ``γᵏ``, so every ``k`` solves the same task (same horizon in primitive steps) and bootstraps
  ``k`` times fewer times; ``"per_decision"`` discounts each macro step by ``γ`` (horizon
  counted in decisions). With action repeat on the (non-lazy) slip grid the effective rank falls
  per decision (10×10 slip grid, γ=0.99: 13.5 → 9.3 → 4.1 → 1.9 for k = 1, 2, 4, 8, the spec's reference
  numbers); with ``γᵏ`` the rank still falls from k=1 to k=8 (13.5 → 9.4) but first *rises* at
  ``k = 2`` (16.6): eigenvalues near −1 of the nearly periodic walk become ``λ² ≈ 1`` and the
  top eigenvalue ``1/(1 − γᵏ)`` shrinks. The benchmark reports both.
- **macro reward**: ``"sum"`` (default) of the primitive rewards inside the repeat, or
  ``"discounted"`` ``Σ_i γ^i r_i`` (with ``"power"`` this makes the macro value equal the
  primitive value of the repeated policy exactly).
- **effective rank**: the shared Roy–Vetterli entropy rank :func:`~lit_lowrank.ops.lowrank.effective_rank_of`
  (``srank`` is the shared :func:`~lit_lowrank.ops.lowrank.stable_rank_of`, also reported).

.. code-block:: python

    from lit_lowrank.ops.fb import fb_loss, orthonormality_loss, zero_shot_z

    loss, parts = fb_loss(F, B, target_M, discount)          # F (n, d), B (n, d), target_M (n, n)
    loss = loss + orthonormality_loss(B)
    z = zero_shot_z(B_next, reward)                          # (d,), ‖z‖ = √d
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from lit_lowrank.ops.lowrank import effective_rank_of, singular_values, stable_rank_of

__all__ = [
    "MACRO_DISCOUNTS", "MACRO_REWARDS", "fb_loss", "orthonormality_loss", "sample_z", "zero_shot_z",
    "macro_discount", "macro_reward", "macro_transition", "macro_action_operators", "policy_transition",
    "successor_representation", "successor_measure", "transition_spectrum", "estimate_transition_operator",
    "sr_effective_rank", "relative_sr_error", "value_error_bound", "rank_value_floor", "normalize_sphere",
    "goal_reaching_operators", "macro_task", "optimal_repeat_values", "repeat_value_gap", "sr_tail",
    "repeat_value_bound", "ABSTRACTIONS",
]

MacroDiscount = Literal["per_decision", "power"]
MacroReward = Literal["sum", "discounted"]
MACRO_DISCOUNTS: tuple[str, ...] = ("power", "per_decision")
MACRO_REWARDS: tuple[str, ...] = ("sum", "discounted")
Abstraction = Literal["options", "repeat"]
#: The two temporal abstractions: ``"options"`` (first action, then ``π``: ``P_πᵏ``) and ``"repeat"``
#: (the action held ``k`` steps: ``Σ_a π_a P_aᵏ``).
ABSTRACTIONS: tuple[str, ...] = ("options", "repeat")


def _off_diagonal_mean_sq(matrix: Tensor) -> Tensor:
    """``mean_{i≠j} X_ij²`` of a square matrix (0 for a 1×1 matrix)."""
    n = matrix.shape[-1]
    if n < 2:
        return matrix.new_zeros(())
    total = matrix.square().sum((-2, -1)) - torch.diagonal(matrix, dim1=-2, dim2=-1).square().sum(-1)
    return total / (n * (n - 1))


# ---------------------------------------------------------------------------- FB losses
def fb_loss(F: Tensor, B: Tensor, target_M: Tensor, discount: Tensor | float) -> tuple[Tensor, dict[str, Tensor]]:
    """The FB temporal-difference loss of one batch.

    ``M_ij = F_iᵀ B_j`` (``F`` at ``(s_i, a_i, z_i)``, ``B`` at ``s'_j``), ``D = M − γ_i M̄`` with
    ``γ_i = discount[i]`` (already multiplied by ``1 − done_i``) and
    ``L = ½·mean_{i≠j} D_ij² − mean_i D_ii``: the Bellman residual of the successor measure, whose
    diagonal term is the ``δ_{s'}`` part of ``M = P + γ P M`` under ``ρ``.

    Args:
        F: ``(n, d)`` forward embeddings (one F head).
        B: ``(n, d)`` backward embeddings of the next states.
        target_M: ``(n, n)`` target ``M̄_ij = F̄(s'_i, π_z(s'_i), z_i)ᵀ B̄(s'_j)`` (no gradient).
        discount: ``(n,)`` per-row discount ``γ_macro·(1 − done)`` or a float.

    Returns:
        ``(loss, {"diag": ..., "offdiag": ...})`` with ``loss = offdiag − diag``.

    .. code-block:: python

        loss, parts = fb_loss(F, B, (F_target @ B_target.T).detach(), discount)
    """
    if F.dim() != 2 or B.dim() != 2 or F.shape != B.shape:
        raise ValueError(f"`F` and `B` must both be (n, d), got {tuple(F.shape)} and {tuple(B.shape)}.")
    n = F.shape[0]
    if target_M.shape != (n, n):
        raise ValueError(f"`target_M` must be ({n}, {n}), got {tuple(target_M.shape)}.")
    discount = torch.as_tensor(discount, dtype=F.dtype, device=F.device)
    if discount.dim() == 0:
        discount = discount.expand(n)
    if discount.shape != (n,):
        raise ValueError(f"`discount` must be a float or ({n},), got {tuple(discount.shape)}.")
    diff = F @ B.T - discount[:, None] * target_M
    offdiag = 0.5 * _off_diagonal_mean_sq(diff)
    diag = torch.diagonal(diff).mean()
    return offdiag - diag, {"offdiag": offdiag, "diag": diag}


def orthonormality_loss(B: Tensor, exclude_diagonal: bool = True) -> Tensor:
    """``½·mean_{i≠j} (B_iᵀB_j)² − mean_i B_iᵀB_i``: pushes ``E_ρ[B Bᵀ]`` towards ``I``.

    With ``exclude_diagonal=False`` the first mean runs over all pairs, and the loss equals
    ``½‖Σ − I‖_F² − d/2`` with ``Σ = BᵀB/n``: minimal exactly when ``B`` is orthonormal under the
    empirical measure. The default drops the ``i = j`` pairs, the unbiased FB estimator.

    .. code-block:: python

        loss = orthonormality_loss(backward_net(next_obs))
    """
    if B.dim() != 2:
        raise ValueError(f"`B` must be (n, d), got {tuple(B.shape)}.")
    cov = B @ B.T
    off = _off_diagonal_mean_sq(cov) if exclude_diagonal else cov.square().mean()
    return 0.5 * off - torch.diagonal(cov).mean()


def normalize_sphere(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Rescale the last dimension to norm ``√d`` (the FB convention for ``z`` and ``B``)."""
    return math.sqrt(x.shape[-1]) * x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def sample_z(n: int, d: int, B_next: Tensor | None = None, mix_ratio: float = 0.5,
             generator: torch.Generator | None = None) -> Tensor:
    """``n`` latents ``√d·normalize(N(0, I))``, a ``mix_ratio`` share replaced by ``√d·normalize(B(s'_perm))``.

    .. code-block:: python

        z = sample_z(256, 50, B_next=backward_net(next_obs).detach())
    """
    if not 0.0 <= mix_ratio <= 1.0:
        raise ValueError(f"`mix_ratio`={mix_ratio}, expected in [0, 1].")
    device = B_next.device if B_next is not None else None
    z = normalize_sphere(torch.randn(n, d, generator=generator, device=device))
    if B_next is not None and mix_ratio > 0:
        mask = torch.rand(n, generator=generator, device=device) < mix_ratio
        perm = torch.randint(0, B_next.shape[0], (n,), generator=generator, device=device)
        z = torch.where(mask[:, None], normalize_sphere(B_next[perm].to(z.dtype)), z)
    return z


def zero_shot_z(B_next: Tensor, reward: Tensor, method: Literal["mean", "lstsq"] = "mean",
                normalize: bool = True) -> Tensor:
    """Task latent from reward samples: ``z_r ∝ E_ρ[r(s') B(s')]``.

    ``"mean"`` is FB's estimator (exact when ``B`` is orthonormal under ``ρ``); ``"lstsq"`` solves
    ``min_z ‖B z − r‖`` (exact for any full-column-rank ``B`` when ``r`` lies in its span).
    ``normalize`` rescales to norm ``√d`` (the sphere the policies were trained on).

    .. code-block:: python

        z = zero_shot_z(backward_net(next_obs), reward)      # Q(s, a) = F(s, a, z)ᵀ z
    """
    if B_next.dim() != 2 or reward.shape != (B_next.shape[0],):
        raise ValueError(f"`B_next` must be (n, d) and `reward` (n,), got {tuple(B_next.shape)} and "
                         f"{tuple(reward.shape)}.")
    if method == "mean":
        z = (reward.to(B_next.dtype)[:, None] * B_next).mean(0)
    elif method == "lstsq":
        z = torch.linalg.lstsq(B_next, reward.to(B_next.dtype)[:, None]).solution[:, 0]
    else:
        raise ValueError(f"`method`={method!r}, expected 'mean' or 'lstsq'.")
    return normalize_sphere(z) if normalize else z


# ---------------------------------------------------------------------------- temporal abstraction
def macro_discount(gamma: float | Tensor, steps: int | Tensor, mode: MacroDiscount = "power") -> Tensor:
    """Discount of one macro step that took ``steps`` primitive steps.

    ``"per_decision"``: ``γ`` (horizon counted in decisions); ``"power"``: ``γ^steps`` (horizon
    counted in primitive steps; a repeat cut short by a termination uses the steps it took).
    """
    if mode not in MACRO_DISCOUNTS:
        raise ValueError(f"`macro_discount`={mode!r}, expected one of {MACRO_DISCOUNTS}.")
    gamma = torch.as_tensor(gamma, dtype=torch.float32)
    steps = torch.as_tensor(steps, dtype=torch.float32)
    return gamma.expand_as(steps).clone() if mode == "per_decision" else gamma ** steps


def macro_reward(rewards: Tensor, gamma: float = 1.0, mode: MacroReward = "sum") -> Tensor:
    """Macro reward of the primitive rewards ``(..., k)`` collected inside one repeat."""
    if mode == "sum":
        return rewards.sum(-1)
    if mode == "discounted":
        powers = gamma ** torch.arange(rewards.shape[-1], dtype=rewards.dtype, device=rewards.device)
        return (rewards * powers).sum(-1)
    raise ValueError(f"`macro_reward`={mode!r}, expected one of {MACRO_REWARDS}.")


def policy_transition(P: Tensor, policy: Tensor | None = None) -> Tensor:
    """``P_π[s, s'] = Σ_a π(a|s) P[a, s, s']`` for ``P (A, S, S)`` and ``policy (S, A)`` (uniform if None)."""
    _check_tabular(P)
    if policy is None:
        return P.mean(0)
    if policy.shape != (P.shape[1], P.shape[0]):
        raise ValueError(f"`policy` must be (S, A) = {(P.shape[1], P.shape[0])}, got {tuple(policy.shape)}.")
    return torch.einsum("sa,ast->st", policy.to(P.dtype), P)


def _check_abstraction(abstraction: str) -> None:
    if abstraction not in ABSTRACTIONS:
        raise ValueError(f"`abstraction`={abstraction!r}, expected one of {ABSTRACTIONS} ('options': first action "
                         "then the policy, P_π^k; 'repeat': the action held k steps, Σ_a π_a P_a^k).")


def macro_transition(P: Tensor, k: int, policy: Tensor | None = None, abstraction: Abstraction = "repeat") -> Tensor:
    """Macro transition operator ``(S, S)`` of length-``k`` temporal abstraction under ``policy`` (uniform if None).

    ``"repeat"``: the macro policy picks ``a ~ π(·|s)`` and holds it ``k`` steps,
    ``P_k[s] = Σ_a π(a|s) (P_aᵏ)[s]`` (not a power of ``P_π``). ``"options"``: the first action
    ``a ~ π(·|s)``, then ``π`` for ``k − 1`` steps: ``P_k = P_πᵏ``, eigenvalues exactly ``λᵏ``. The
    per-first-action operators are :func:`macro_action_operators`.

    .. code-block:: python

        macro_transition(P, 4, abstraction="options")     # == matrix_power(P.mean(0), 4)
    """
    if k < 1:
        raise ValueError(f"`k`={k}, expected an integer >= 1.")
    _check_abstraction(abstraction)
    if abstraction == "options":
        return torch.linalg.matrix_power(policy_transition(P, policy), k)
    return policy_transition(macro_action_operators(P, k), policy)


def macro_action_operators(P: Tensor, k: int, abstraction: Abstraction = "repeat",
                           policy: Tensor | None = None) -> Tensor:
    """``(A, S, S)`` operators of each first action: ``P_aᵏ`` (``"repeat"``) or ``P_a P_π^(k−1)`` (``"options"``)."""
    _check_tabular(P)
    _check_abstraction(abstraction)
    if abstraction == "options":
        return P @ torch.linalg.matrix_power(policy_transition(P, policy), k - 1)
    return torch.linalg.matrix_power(P, k)


def _check_tabular(P: Tensor) -> None:
    if P.dim() != 3 or P.shape[1] != P.shape[2]:
        raise ValueError(f"`P` must be (A, S, S), got {tuple(P.shape)}.")


def successor_representation(P: Tensor, gamma: float) -> Tensor:
    """``(I − γP)⁻¹ = Σ_t γᵗ Pᵗ`` of a ``(S, S)`` operator (``γ < 1``)."""
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"`gamma`={gamma}, expected in [0, 1).")
    eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
    return torch.linalg.solve(eye - gamma * P, eye)


def successor_measure(P: Tensor, gamma: float, P_first: Tensor | None = None) -> Tensor:
    """FB's target ``P_first (I − γ P)⁻¹ = Σ_{t≥0} γᵗ P_first Pᵗ`` (visits from the *next* state on).

    ``P`` is the policy operator ``(S, S)``; ``P_first`` the first-step operator (``(S, S)`` or
    ``(A, S, S)`` for ``M(s, a, s')``; defaults to ``P``).
    """
    sr = successor_representation(P, gamma)
    first = P if P_first is None else P_first
    return first @ sr


def transition_spectrum(P: Tensor) -> Tensor:
    """Eigenvalues of ``P`` (complex), sorted by decreasing modulus."""
    eig = torch.linalg.eigvals(P.to(torch.float64) if P.dtype != torch.float64 else P)
    return eig[torch.argsort(eig.abs(), descending=True)]


def estimate_transition_operator(cells: Tensor, next_cells: Tensor, num_cells: int) -> Tensor:
    """Row-normalised transition counts of a discretised environment (unvisited rows stay in place).

    ``cells``/``next_cells`` are integer cell ids of the transitions' states (e.g. binned
    observations). Rows never visited get a self-loop so the operator stays stochastic.
    """
    if cells.shape != next_cells.shape:
        raise ValueError(f"`cells` {tuple(cells.shape)} and `next_cells` {tuple(next_cells.shape)} must match.")
    counts = torch.zeros(num_cells, num_cells, dtype=torch.float64)
    counts.index_put_((cells.long(), next_cells.long()), torch.ones(cells.numel(), dtype=torch.float64),
                      accumulate=True)
    empty = counts.sum(1) == 0
    counts[empty, empty.nonzero().flatten()] = 1.0
    return counts / counts.sum(1, keepdim=True)


def sr_effective_rank(P: Tensor, gamma: float, ks: tuple[int, ...] = (1, 2, 4, 8),
                      discount: MacroDiscount = "power", abstraction: Abstraction = "repeat",
                      policy: Tensor | None = None) -> dict[int, dict[str, float]]:
    """Effective (Roy–Vetterli) and stable rank of the macro SR ``P_k (I − γ_k P_k)⁻¹``, per ``k``.

    ``P`` is ``(A, S, S)`` (tabular actions; ``abstraction`` as in :func:`macro_transition`) or
    ``(S, S)`` (a policy / discretised operator; then ``abstraction`` is ignored and ``P_k = Pᵏ``).

    .. code-block:: python

        sr_effective_rank(env.transition_tensor(), 0.99, discount="per_decision")   # {1: {"erank": 13.5, ...}, ...}
    """
    out: dict[int, dict[str, float]] = {}
    for k in ks:
        Pk = torch.linalg.matrix_power(P, k) if P.dim() == 2 else macro_transition(P, k, policy, abstraction)
        g = float(macro_discount(gamma, k, discount))
        M = successor_measure(Pk, g)
        out[k] = {"erank": float(effective_rank_of(M)), "srank": float(stable_rank_of(M)), "gamma_macro": g}
    return out


def relative_sr_error(M_hat: Tensor, M_true: Tensor) -> Tensor:
    """``‖M̂ − M‖_F / ‖M‖_F`` (both in measure form, rows summing to ``1/(1−γ)`` for the truth)."""
    if M_hat.shape != M_true.shape:
        raise ValueError(f"`M_hat` {tuple(M_hat.shape)} and `M_true` {tuple(M_true.shape)} must match.")
    return (M_hat - M_true).norm() / M_true.norm().clamp_min(1e-12)


def value_error_bound(M_hat: Tensor, M_true: Tensor, reward: Tensor) -> dict[str, Tensor]:
    """Value error of the FB estimate ``V̂ = M̂ r`` against ``V = M r`` and its bound.

    ``‖V − V̂‖_∞ ≤ ‖M − M̂‖_{∞→∞}·‖r‖_∞`` (max absolute row sum), and in ℓ2
    ``‖V − V̂‖₂ ≤ ‖M − M̂‖₂·‖r‖₂``. ``M`` are ``(..., S)`` measures over next states
    (rows may be ``(s, a)`` pairs); ``reward`` is ``(S,)`` or ``(S, G)`` for ``G`` rewards at once.

    Returns:
        ``error_inf``, ``bound_inf``, ``error_l2``, ``bound_l2`` (per reward) and ``holds``
        (bool, every bound).
    """
    r = reward if reward.dim() == 2 else reward[:, None]
    diff = (M_true - M_hat).reshape(-1, M_true.shape[-1]).to(torch.float64)
    r = r.to(torch.float64)
    err = diff @ r
    error_inf = err.abs().amax(0)
    bound_inf = diff.abs().sum(1).amax() * r.abs().amax(0)
    error_l2 = err.norm(dim=0)
    bound_l2 = torch.linalg.matrix_norm(diff, ord=2) * r.norm(dim=0)
    tol = 1e-9 * (1 + bound_inf)
    holds = bool((error_inf <= bound_inf + tol).all() and (error_l2 <= bound_l2 * (1 + 1e-9) + 1e-12).all())
    return {"error_inf": error_inf, "bound_inf": bound_inf, "error_l2": error_l2, "bound_l2": bound_l2,
            "holds": torch.tensor(holds)}


def rank_value_floor(M: Tensor, d: int) -> Tensor:
    """``σ_{d+1}(M)/σ_1(M)``: the relative ℓ2 error no rank-``d`` FB can beat (Eckart–Young).

    The value error of any rank-``d`` model is at least this share of the top singular value for
    the worst unit reward; temporal abstraction shrinks it by filtering the spectrum.
    """
    s = singular_values(M.to(torch.float64))
    if d >= s.numel():
        return s.new_zeros(())
    return s[d] / s[0].clamp_min(1e-300)



# ---------------------------------------------------------------------------- the value bound under action repeat
def goal_reaching_operators(P: Tensor, goal: int) -> Tensor:
    """``(A, S, S)`` operators of the goal-reaching task: entering ``goal`` ends the episode.

    The goal's row is zeroed, so mass that entered the goal leaves at the next step; with the
    reward ``r = 1[s' = goal]`` on entering, ``(P_absⁱ r)(s)`` counts first entries at step ``i`` only.
    """
    _check_tabular(P)
    absorbing = P.clone()
    absorbing[:, goal, :] = 0.0
    return absorbing


def macro_task(P: Tensor, reward: Tensor, gamma: float, k: int) -> tuple[Tensor, Tensor, float]:
    """The primitive task seen through ``k``-step action repeat: ``(R_k (A, S), P_k (A, S, S), γᵏ)``.

    ``R_k[a, s] = Σ_{i<k} γ^i (P_a^{i+1} r)(s)``: the discounted reward of the states entered inside
    the repeat (the ``"discounted"`` macro reward), so a macro policy's value is its primitive value.
    ``reward`` ``(S,)`` is paid on entering a state; ``P`` may be sub-stochastic (terminations).
    """
    _check_tabular(P)
    if k < 1:
        raise ValueError(f"`k`={k}, expected an integer >= 1.")
    r = reward.to(P.dtype)
    R = torch.zeros(P.shape[0], P.shape[1], dtype=P.dtype)
    step = torch.eye(P.shape[1], dtype=P.dtype).expand(P.shape[0], -1, -1)
    for i in range(k):
        step = step @ P
        R = R + gamma ** i * (step @ r)
    return R, step, gamma ** k


def optimal_repeat_values(P: Tensor, reward: Tensor, gamma: float, k: int, tol: float = 1e-8,
                          max_iter: int = 20_000) -> tuple[Tensor, Tensor]:
    """Optimal ``(V (S,), greedy macro actions (S,))`` over policies that hold each action ``k`` steps.

    Value iteration on :func:`macro_task`; ``k = 1`` is the primitive optimum ``V*``.
    """
    R, Pk, gk = macro_task(P, reward, gamma, k)
    V = torch.zeros(P.shape[1], dtype=P.dtype)
    for _ in range(max_iter):
        new = (R + gk * (Pk @ V)).max(0).values
        done = float((new - V).abs().max()) < tol
        V = new
        if done:
            break
    Q = R + gk * (Pk @ V)
    return Q.max(0).values, Q.argmax(0)


def repeat_value_gap(P: Tensor, goal: int, gamma: float, k: int) -> float:
    """``ε_repeat(k)``: the share of the optimal goal-reaching value lost by acting with ``k``-step repeats.

    ``mean_s (V*(s) − V*_k(s)) / mean_s V*(s)`` over non-goal starts, with entering ``goal`` paying 1
    and ending the episode (also inside a repeat); 0 at ``k = 1``, and it grows with ``k`` — the
    price of the coarser policy class, the other side of the paper's trade-off.
    """
    if k == 1:
        return 0.0
    absorbing = goal_reaching_operators(P, goal)
    reward = torch.zeros(P.shape[1], dtype=P.dtype)
    reward[goal] = 1.0
    v_star, _ = optimal_repeat_values(absorbing, reward, gamma, 1)
    v_k, _ = optimal_repeat_values(absorbing, reward, gamma, k)
    starts = torch.arange(P.shape[1]) != goal
    return float((v_star - v_k)[starts].mean() / v_star[starts].mean().clamp_min(1e-300))


def sr_tail(P_macro: Tensor, gamma_macro: float, d: int) -> dict[str, float]:
    """The spectral tail of the macro SR ``M = P(I − γP)⁻¹`` at rank ``d``.

    ``sigma_tail`` = ``σ_{d+1}(M)``, the ℓ2 error of the best rank-``d`` FB for the worst unit
    reward (Eckart–Young). ``spectral_tail`` is the same number from the spectrum of ``P``: the
    ``(d+1)``-th largest ``|λ_i|/|1 − γλ_i|`` — equal to ``sigma_tail`` when ``P`` is normal
    (a reversible walk with uniform stationary measure, e.g. the uniform repeat policy on the
    slip grid), and the reason options help: ``P_πᵏ`` maps ``λ → λᵏ``, which shrinks it when ``λ ≥ 0``.
    """
    if P_macro.dim() != 2 or P_macro.shape[0] != P_macro.shape[1]:
        raise ValueError(f"`P_macro` must be (S, S), got {tuple(P_macro.shape)}.")
    S = P_macro.shape[0]
    if not 1 <= d < S:
        raise ValueError(f"`d`={d}, expected 1 <= d < {S}.")
    if not 0.0 <= gamma_macro < 1.0:
        raise ValueError(f"`gamma_macro`={gamma_macro}, expected in [0, 1).")
    P64 = P_macro.to(torch.float64)
    M = successor_measure(P64, gamma_macro)
    sigma = singular_values(M)
    lam = torch.linalg.eigvals(P64)
    gain = torch.sort((lam / (1.0 - gamma_macro * lam)).abs(), descending=True).values
    return {"sigma_tail": float(sigma[d]), "spectral_tail": float(gain[d]), "sigma_top": float(sigma[0])}


def repeat_value_bound(P: Tensor, gamma: float, k: int, d: int, reward: Tensor,
                       policy: Tensor | None = None, abstraction: Abstraction = "repeat") -> dict[str, float]:
    """The value-error bound of rank-``d`` FB under ``k``-step action repeat (arXiv 2603.20103).

    For the macro policy ``π`` (``policy`` ``(S, A)``, uniform when ``None``) with macro operator
    ``P̃`` (:func:`macro_transition`: ``Σ_a π(a|s) P_aᵏ`` for ``"repeat"``, ``P_πᵏ`` for ``"options"``),
    discount ``γᵏ`` and SR ``M_k = P̃(I − γᵏP̃)⁻¹``, the best rank-``d`` FB has

        ‖V_k − V̂_k‖₂ ≤ σ_{d+1}(M_k) · ‖r‖₂,   σ_{d+1}(M_k) = |λ_{d+1}|/|1 − γᵏλ_{d+1}|  (normal P̃),

    a function of ``k``, ``γ`` and the spectrum: for options the low-pass ``λ → λᵏ`` shrinks the tail while
    ``γ → γᵏ`` keeps the horizon. ``V_k = M_k r`` counts the reward at macro landing states, as
    FB's ``V̂ = M̂ r`` does. The price of the coarser policy class is the separate term
    :func:`repeat_value_gap`.

    Returns:
        ``bound``, ``sigma_tail``, ``spectral_tail`` (:func:`sr_tail`), ``truncation_error`` (the exact
        ``‖(M_k − [M_k]_d) r‖₂`` of the truncated SVD, ``≤ bound``) and ``value_norm`` ``‖V_k‖₂``.
    """
    _check_tabular(P)
    P_macro = macro_transition(P.to(torch.float64), k, policy, abstraction)
    gk = float(macro_discount(gamma, k))
    tail = sr_tail(P_macro, gk, d)
    r = reward.to(torch.float64)
    M = successor_measure(P_macro, gk)
    U, sig, Vh = torch.linalg.svd(M)
    M_d = U[:, :d] @ torch.diag(sig[:d]) @ Vh[:d]
    return {"bound": tail["sigma_tail"] * float(r.norm()), **tail,
            "truncation_error": float(((M - M_d) @ r).norm()), "value_norm": float((M @ r).norm())}
