"""FB math (lit_lowrank.ops.fb): losses against hand computation, zero-shot z, exact SR and its spectrum."""

from __future__ import annotations

import math

import pytest
import torch

from lit_lowrank.datamodules.rl_envs import SlipGridWorld
from lit_lowrank.ops.fb import (
    estimate_transition_operator,
    fb_loss,
    goal_reaching_operators,
    macro_discount,
    macro_reward,
    macro_task,
    macro_transition,
    optimal_repeat_values,
    orthonormality_loss,
    rank_value_floor,
    relative_sr_error,
    repeat_value_bound,
    repeat_value_gap,
    sample_z,
    sr_effective_rank,
    sr_tail,
    successor_measure,
    successor_representation,
    transition_spectrum,
    value_error_bound,
    zero_shot_z,
)


def test_fb_loss_matches_hand_computation():
    F = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    B = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    target = torch.tensor([[1.0, 0.0], [2.0, 1.0]])
    discount = torch.tensor([0.5, 0.0])                       # second row: a termination
    # M = F Bᵀ = [[1, 2], [2, 0]];  D = M − γ_i M̄ = [[0.5, 2], [2, 0]]
    # offdiag = ½·(2² + 2²)/2 = 2;  diag = (0.5 + 0)/2 = 0.25;  loss = 1.75
    loss, parts = fb_loss(F, B, target, discount)
    assert parts["offdiag"].item() == pytest.approx(2.0)
    assert parts["diag"].item() == pytest.approx(0.25)
    assert loss.item() == pytest.approx(1.75)
    # a scalar discount broadcasts
    loss_scalar, _ = fb_loss(F, B, target, 0.5)
    # D = [[0.5, 2], [1, -0.5]] -> offdiag ½(4 + 1)/2 = 1.25, diag 0 -> 1.25
    assert loss_scalar.item() == pytest.approx(1.25)


def test_fb_loss_rejects_bad_shapes():
    with pytest.raises(ValueError, match="target_M"):
        fb_loss(torch.ones(3, 2), torch.ones(3, 2), torch.ones(2, 2), 0.9)
    with pytest.raises(ValueError, match="discount"):
        fb_loss(torch.ones(3, 2), torch.ones(3, 2), torch.ones(3, 3), torch.ones(2))


def test_fb_loss_fixed_point_is_the_successor_measure():
    """F, B the exact factorisation of M = P(I − γP)⁻¹ (tabular, uniform ρ): the population gradient vanishes."""
    torch.manual_seed(0)
    S, gamma = 6, 0.8
    P = torch.softmax(torch.randn(S, S, dtype=torch.float64), -1)
    M = successor_measure(P, gamma)                           # measure over s'; density = M·S for uniform ρ
    F = (M * S).clone().requires_grad_(True)                  # F(s) = row of the density, B(s') = e_{s'}
    B = torch.eye(S, dtype=torch.float64)
    # population FB loss over (s, s') pairs: expand every (s, s') transition with its probability
    target = (P @ (M * S)).detach()                           # E_{s1~P(s)}[M(s1, ·)] density
    diff = F @ B.T - gamma * target
    pop = 0.5 * (diff.square() * (1.0 / S)).sum(1).mean() - (P * diff).sum(1).mean()
    pop.backward()
    assert F.grad.abs().max() < 1e-10


def test_orthonormality_minimised_by_orthonormal_b():
    torch.manual_seed(0)
    n, d = 64, 4
    Q, _ = torch.linalg.qr(torch.randn(n, d, dtype=torch.float64))
    B_orth = Q * math.sqrt(n)                                 # BᵀB / n = I: orthonormal under the empirical ρ
    best = orthonormality_loss(B_orth, exclude_diagonal=False)
    assert best.item() == pytest.approx(-d / 2)               # ½‖Σ − I‖² − d/2 at Σ = I
    for scale in (0.5, 0.9, 1.1, 2.0):
        assert orthonormality_loss(B_orth * scale, exclude_diagonal=False) > best
    for _ in range(5):
        other = B_orth + 0.3 * torch.randn_like(B_orth)
        assert orthonormality_loss(other, exclude_diagonal=False) > best
    # gradient descent from a random B reaches an orthonormal one
    B = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([B], lr=2.0)
    for _ in range(100):
        opt.zero_grad()
        orthonormality_loss(B, exclude_diagonal=False).backward()
        opt.step()
    torch.testing.assert_close(B.detach().T @ B.detach() / n, torch.eye(d, dtype=torch.float64), atol=1e-4, rtol=0)


def test_orthonormality_hand_computed():
    B = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    C = B @ B.T                                               # [[1,1,0],[1,2,2],[0,2,4]]
    expected = 0.5 * (1 + 0 + 1 + 4 + 0 + 4) / 6 - (1 + 2 + 4) / 3
    assert orthonormality_loss(B).item() == pytest.approx(expected)
    assert C.shape == (3, 3)


def test_zero_shot_z_recovers_a_reward_in_b_span():
    torch.manual_seed(0)
    n, d = 200, 5
    Q, _ = torch.linalg.qr(torch.randn(n, d, dtype=torch.float64))
    B = Q * math.sqrt(n)                                      # orthonormal under the sample measure
    w = torch.randn(d, dtype=torch.float64)
    r = B @ w                                                 # a reward in B's span
    z = zero_shot_z(B, r, normalize=False)
    torch.testing.assert_close(z, w)                          # E[r B] = E[B Bᵀ] w = w
    z_n = zero_shot_z(B, r)
    assert z_n.norm().item() == pytest.approx(math.sqrt(d))
    torch.testing.assert_close(z_n / z_n.norm(), w / w.norm())
    # a non-orthonormal B: the mean estimator is biased, least squares is exact
    B2 = torch.randn(n, d, dtype=torch.float64) @ torch.randn(d, d, dtype=torch.float64)
    r2 = B2 @ w
    torch.testing.assert_close(zero_shot_z(B2, r2, method="lstsq", normalize=False), w)
    assert not torch.allclose(zero_shot_z(B2, r2, normalize=False), w, atol=1e-2)


def test_sample_z_on_sphere_and_mixed():
    g = torch.Generator().manual_seed(0)
    B = torch.randn(50, 8)
    z = sample_z(1000, 8, B_next=B, mix_ratio=0.5, generator=g)
    torch.testing.assert_close(z.norm(dim=1), torch.full((1000,), math.sqrt(8)))
    from_b = (z[:, None, :] - math.sqrt(8) * torch.nn.functional.normalize(B, dim=1)[None]).abs().amax(-1).amin(1)
    share = (from_b < 1e-5).float().mean().item()
    assert 0.4 < share < 0.6


def _two_state_chain(p: float) -> torch.Tensor:
    return torch.tensor([[1 - p, p], [p, 1 - p]], dtype=torch.float64)


def test_exact_sr_and_spectrum_on_a_tiny_mdp():
    p, gamma = 0.3, 0.9
    P = _two_state_chain(p)                                   # eigenvalues 1 and 1 − 2p = 0.4
    spectrum = transition_spectrum(P)
    torch.testing.assert_close(spectrum.real, torch.tensor([1.0, 0.4], dtype=torch.float64))
    sr = successor_representation(P, gamma)
    # closed form: (I − γP)⁻¹ = Π/(1 − γ) + (I − Π)/(1 − γλ) with Π = ½·11ᵀ, λ = 0.4
    Pi = torch.full((2, 2), 0.5, dtype=torch.float64)
    expected = Pi / (1 - gamma) + (torch.eye(2, dtype=torch.float64) - Pi) / (1 - gamma * 0.4)
    torch.testing.assert_close(sr, expected)
    # series check and the FB target P(I − γP)⁻¹
    series = sum(gamma ** t * torch.linalg.matrix_power(P, t) for t in range(400))
    torch.testing.assert_close(sr, series)
    torch.testing.assert_close(successor_measure(P, gamma), P @ series)
    torch.testing.assert_close(successor_measure(P, gamma).sum(1), torch.full((2,), 1 / (1 - gamma),
                                                                             dtype=torch.float64))
    # macro operator of k primitive steps: eigenvalues λᵏ (low-pass)
    Pk = macro_transition(P[None], 3)
    torch.testing.assert_close(transition_spectrum(Pk).real, torch.tensor([1.0, 0.4 ** 3], dtype=torch.float64))


def test_action_repeat_operator_and_erank_falls_with_k():
    from lit_lowrank.datamodules.rl_envs import SlipGridWorld

    P = SlipGridWorld(size=10, slip=0.2).transition_tensor()
    torch.testing.assert_close(P.sum(-1), torch.ones(4, 100, dtype=torch.float64))
    ranks = sr_effective_rank(P, 0.99, ks=(1, 2, 4, 8), discount="per_decision")
    values = [ranks[k]["erank"] for k in (1, 2, 4, 8)]
    assert values[0] == pytest.approx(13.5, abs=0.1)          # METHODS.md §1's reference value
    assert all(a > b for a, b in zip(values, values[1:]))
    power = sr_effective_rank(P, 0.99, ks=(1, 8), discount="power")
    assert power[8]["gamma_macro"] == pytest.approx(0.99 ** 8)
    assert power[8]["erank"] < power[1]["erank"]


def test_macro_discount_and_reward():
    assert macro_discount(0.9, 3, "power").item() == pytest.approx(0.729)
    assert macro_discount(0.9, 3, "per_decision").item() == pytest.approx(0.9)
    torch.testing.assert_close(macro_discount(0.5, torch.tensor([1, 2]), "power"), torch.tensor([0.5, 0.25]))
    r = torch.tensor([1.0, 2.0, 4.0])
    assert macro_reward(r).item() == 7.0
    assert macro_reward(r, 0.5, "discounted").item() == pytest.approx(1 + 1 + 1)
    with pytest.raises(ValueError, match="macro_discount"):
        macro_discount(0.9, 1, "bogus")


def test_estimated_operator_matches_the_exact_one():
    torch.manual_seed(0)
    P = _two_state_chain(0.3)
    s = torch.randint(0, 2, (40000,))
    nxt = torch.multinomial(P[s], 1).squeeze(1)
    est = estimate_transition_operator(s, nxt, 3)             # cell 2 never visited: self-loop
    torch.testing.assert_close(est[:2, :2], P, atol=0.02, rtol=0)
    assert est[2, 2] == 1.0


def test_value_error_bound_and_rank_floor():
    torch.manual_seed(0)
    M = successor_measure(torch.softmax(torch.randn(8, 8, dtype=torch.float64), -1), 0.9)
    M_hat = M + 0.05 * torch.randn_like(M)
    r = torch.rand(8, 3, dtype=torch.float64)
    out = value_error_bound(M_hat, M, r)
    assert bool(out["holds"])
    assert (out["error_inf"] <= out["bound_inf"]).all() and (out["error_l2"] <= out["bound_l2"]).all()
    # the bound is tight for a sign-matched reward on the worst row
    diff = M - M_hat
    row = diff.abs().sum(1).argmax()
    r_worst = diff[row].sign()
    tight = value_error_bound(M_hat, M, r_worst)
    assert tight["error_inf"].item() == pytest.approx(tight["bound_inf"].item())
    assert relative_sr_error(M, M).item() == 0.0
    # Eckart–Young: the best rank-d approximation's ℓ2 error is σ_{d+1}
    s = torch.linalg.svdvals(M)
    assert rank_value_floor(M, 3).item() == pytest.approx((s[3] / s[0]).item())
    assert rank_value_floor(M, 8).item() == 0.0


def test_repeat_value_bound_is_eckart_young_and_the_spectrum():
    P = SlipGridWorld(size=6, slip=0.2).transition_tensor()
    r = torch.zeros(36, dtype=torch.float64)
    r[7] = 1.0
    for k in (1, 2, 4):
        out = repeat_value_bound(P, 0.95, k, 8, r)
        # the best rank-d FB (truncated SVD of the macro SR) satisfies the bound: true by construction
        assert out["truncation_error"] <= out["bound"] * (1 + 1e-9)
        assert out["bound"] == pytest.approx(out["sigma_tail"] * float(r.norm()))
    # k = 1: the uniform policy's operator is symmetric, so σ_(d+1) is the spectral |λ|/|1 − γλ|
    one = repeat_value_bound(P, 0.95, 1, 8, r)
    assert one["spectral_tail"] == pytest.approx(one["sigma_tail"], rel=1e-8)
    # the low-pass: the tail shrinks with k (γᵏ per macro step)
    tails = [repeat_value_bound(P, 0.95, k, 8, r)["sigma_tail"] for k in (1, 2, 4, 8)]
    assert tails[-1] < tails[0]
    worst = sr_tail(macro_transition(P, 1), 0.95, 8)
    assert worst["sigma_tail"] <= worst["sigma_top"]
    with pytest.raises(ValueError, match="d"):
        sr_tail(macro_transition(P, 1), 0.95, 36)


def test_macro_task_and_the_price_of_repeating():
    P = SlipGridWorld(size=5, slip=0.1).transition_tensor()
    r = torch.zeros(25, dtype=torch.float64)
    r[12] = 1.0
    R1, P1, g1 = macro_task(P, r, 0.9, 1)
    torch.testing.assert_close(R1, P @ r) and torch.testing.assert_close(P1, P)
    assert g1 == pytest.approx(0.9)
    R2, P2, g2 = macro_task(P, r, 0.9, 2)
    torch.testing.assert_close(R2, P @ r + 0.9 * (P @ P @ r))
    assert g2 == pytest.approx(0.81)
    # k = 1 value iteration is the primitive optimum (Bellman equation holds)
    v, a = optimal_repeat_values(P, r, 0.9, 1)
    torch.testing.assert_close(v, (P @ (r + 0.9 * v)).max(0).values, atol=1e-6, rtol=0)
    # goal-reaching: the goal row is absorbing-without-reward; repeats can only lose value
    absorbing = goal_reaching_operators(P, 12)
    assert float(absorbing[:, 12].abs().sum()) == 0.0 and torch.equal(absorbing[:, 3], P[:, 3])
    gaps = [repeat_value_gap(P, 12, 0.9, k) for k in (1, 2, 4)]
    assert gaps[0] == 0.0 and all(g >= -1e-9 for g in gaps) and gaps[2] > 0


def test_options_are_powers_of_the_policy_operator_and_repeat_is_not():
    from lit_lowrank.ops.fb import macro_action_operators

    P = SlipGridWorld(size=5, slip=0.2, stay=0.5).transition_tensor()
    P_pi = P.mean(0)
    options = macro_transition(P, 3, abstraction="options")
    torch.testing.assert_close(options, torch.linalg.matrix_power(P_pi, 3))
    # eigenvalues exactly λ³ (P_π of the uniform walk on the grid is symmetric: real spectrum)
    lam = torch.linalg.eigvalsh((P_pi + P_pi.T) / 2)
    torch.testing.assert_close(torch.sort(torch.linalg.eigvalsh((options + options.T) / 2)).values,
                               torch.sort(lam ** 3).values)
    # per first action: P_a P_π², whose mean over actions is P_π³
    per_action = macro_action_operators(P, 3, "options")
    torch.testing.assert_close(per_action[2], P[2] @ P_pi @ P_pi)
    torch.testing.assert_close(per_action.mean(0), options)
    # action repeat Σ_a π_a P_a³ is a different operator (held actions travel further)
    repeat = macro_transition(P, 3, abstraction="repeat")
    torch.testing.assert_close(repeat, torch.linalg.matrix_power(P, 3).mean(0))
    assert float((repeat - options).abs().max()) > 1e-2
    with pytest.raises(ValueError, match="abstraction.*'options'.*'repeat'"):
        macro_transition(P, 2, abstraction="primitive")


def test_lazy_grid_has_a_nonnegative_spectrum_and_options_lower_the_sr_rank():
    classic = SlipGridWorld(size=10, slip=0.2).transition_tensor()
    lazy = SlipGridWorld(size=10, slip=0.2, stay=0.5).transition_tensor()
    torch.testing.assert_close(lazy.sum(-1), torch.ones(4, 100, dtype=torch.float64))
    torch.testing.assert_close(lazy, 0.5 * classic + 0.5 * torch.eye(100, dtype=torch.float64))
    assert float(transition_spectrum(classic.mean(0)).real.min()) < -0.9     # nearly bipartite
    assert float(transition_spectrum(lazy.mean(0)).real.min()) >= -1e-9
    ranks = sr_effective_rank(lazy, 0.99, ks=(1, 2, 4, 8), abstraction="options")
    values = [ranks[k]["erank"] for k in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(values, values[1:]))
    # on the classic grid λ ≈ −0.95 survives as λ² ≈ 0.9 and the options rank first rises
    classic_ranks = sr_effective_rank(classic, 0.99, ks=(1, 2), abstraction="options")
    assert classic_ranks[2]["erank"] > classic_ranks[1]["erank"]


def test_lazy_grid_stays_put_with_probability_stay():
    import numpy as np

    env = SlipGridWorld(size=5, slip=0.0, stay=0.3)
    rng = np.random.default_rng(0)
    start = np.full(20000, 12)                                              # the centre
    moved = env.step_batch(start, np.full(20000, 3), rng)
    assert (moved == 12).mean() == pytest.approx(0.3, abs=0.015)
    assert (moved == 13).mean() == pytest.approx(0.7, abs=0.015)
    with pytest.raises(ValueError, match="stay"):
        SlipGridWorld(stay=1.0)
