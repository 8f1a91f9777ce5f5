"""fed_lowshot math: NIW MAP against the conjugate update, secure-sum masks, partitions, episodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import invwishart

from lit_lowrank.ops.dirichlet_partition import dirichlet_partition, partition_statistics
from lit_lowrank.ops.fed_lowshot.episodes import (
    gaussian_classify,
    macro_f1,
    mean_ci,
    prototype_classify,
    sample_episode,
)
from lit_lowrank.ops.fed_lowshot.niw import class_moments, moments_to_gaussian, niw_map
from lit_lowrank.ops.fed_lowshot.prior_bank import PriorBank, gated_prior, global_prior, retrieve_prior, similarity_gate
from lit_lowrank.ops.fed_lowshot.secure_sum import (
    decode_fixed_point,
    dh_keypair,
    encode_fixed_point,
    mask_vector,
    shared_seed,
    sum_masked,
)


def _spd(d: int, gen: torch.Generator) -> torch.Tensor:
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    return a @ a.T / d + 0.5 * torch.eye(d, dtype=torch.float64)


def _sequential_niw(x: torch.Tensor, mu0, kappa, nu0, psi0):
    """The NIW conjugate update applied one observation at a time (an independent derivation)."""
    mu, k, nu, psi = mu0.clone(), kappa, nu0, psi0.clone()
    for xi in x:
        diff = (xi - mu)[:, None]
        psi = psi + (k / (k + 1)) * diff @ diff.T
        mu = (k * mu + xi) / (k + 1)
        k, nu = k + 1, nu + 1
    return mu, k, nu, psi


@pytest.mark.parametrize("n", [1, 5])
def test_niw_map_matches_conjugate_update_and_is_the_mode(n):
    gen = torch.Generator().manual_seed(n)
    d, kappa = 4, 2.0
    nu0 = d + 4.0
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * 2 + 1
    mu0, sigma0 = torch.randn(d, generator=gen, dtype=torch.float64), _spd(d, gen)
    mu_hat, sigma_hat = niw_map(x, mu0, sigma0, kappa=kappa, nu0=nu0)
    mu_n, _, nu_n, psi_n = _sequential_niw(x, mu0, kappa, nu0, (nu0 - d - 1) * sigma0)
    torch.testing.assert_close(mu_hat, mu_n)
    torch.testing.assert_close(sigma_hat, psi_n / (nu_n + d + 1))
    # Σ̂ is the mode of the IW(Ψₙ, νₙ) marginal: every nearby SPD matrix has a lower density
    best = invwishart(df=nu_n, scale=psi_n.numpy()).logpdf(sigma_hat.numpy())
    rng = np.random.default_rng(0)
    for _ in range(20):
        e = rng.normal(size=(d, d)) * 0.02
        assert invwishart(df=nu_n, scale=psi_n.numpy()).logpdf(sigma_hat.numpy() + e @ e.T) < best
        assert invwishart(df=nu_n, scale=psi_n.numpy()).logpdf(sigma_hat.numpy() * 0.97) < best


def test_niw_map_limits_and_errors():
    gen = torch.Generator().manual_seed(0)
    d = 3
    x = torch.randn(4000, d, generator=gen, dtype=torch.float64) @ torch.tensor([[2.0, 0, 0], [0.5, 1, 0], [0, 0, .3]],
                                                                               dtype=torch.float64)
    mu, sigma = niw_map(x, torch.full((d,), 1.0, dtype=torch.float64), torch.eye(d, dtype=torch.float64) * 9,
                        kappa=1.0, nu0=d + 2.0)
    # with many shots the data win over the prior
    torch.testing.assert_close(mu, x.mean(0), atol=0.02, rtol=0)
    torch.testing.assert_close(sigma, torch.cov(x.T), atol=0.05, rtol=0.05)
    one = x[:1]
    mu1, _ = niw_map(one, torch.zeros(d, dtype=torch.float64), torch.eye(d, dtype=torch.float64), kappa=1.0)
    torch.testing.assert_close(mu1, one[0] / 2)  # n = κ = 1: halfway to the prior
    with pytest.raises(ValueError, match="nu0"):
        niw_map(one, torch.zeros(d), torch.eye(d), nu0=d + 1.0)
    with pytest.raises(ValueError, match="kappa"):
        niw_map(one, torch.zeros(d), torch.eye(d), kappa=0.0)


def test_class_moments_give_the_class_gaussians():
    gen = torch.Generator().manual_seed(1)
    z, y = torch.randn(300, 5, generator=gen), torch.randint(0, 3, (300,), generator=gen)
    counts, sums, second = class_moments(z, y, 3)
    means, covs = moments_to_gaussian(counts, sums, second, ridge=0.0)
    for c in range(3):
        zc = z[y == c].double()
        assert counts[c] == len(zc)
        torch.testing.assert_close(means[c], zc.mean(0))
        torch.testing.assert_close(covs[c], torch.cov(zc.T, correction=0))
    # moments are additive over clients: the sum of two halves' moments is the whole
    a, b = class_moments(z[:120], y[:120], 3), class_moments(z[120:], y[120:], 3)
    for part_a, part_b, whole in zip(a, b, (counts, sums, second)):
        torch.testing.assert_close(part_a + part_b, whole)


def test_secure_sum_masks_cancel_and_hide():
    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=257) * 10 ** rng.integers(0, 4) for _ in range(5)]
    keys = {i: dh_keypair(seed=i) for i in range(5)}
    assert shared_seed(keys[0][0], keys[3][1]) == shared_seed(keys[3][0], keys[0][1])
    masked = []
    for i, x in enumerate(vectors):
        seeds = {j: shared_seed(keys[i][0], keys[j][1]) for j in keys if j != i}
        masked.append(mask_vector(encode_fixed_point(x), i, seeds))
    total = decode_fixed_point(sum_masked(masked))
    np.testing.assert_allclose(total, np.sum(vectors, axis=0), atol=5 * 2.0**-20)
    for x, m in zip(vectors, masked):
        # what the server sees of one client is unrelated to its value: decoding it is garbage ...
        assert np.abs(decode_fixed_point(m) - x).min() > 1e3
        # ... and its bits are uniform (each bit ~ Bernoulli(1/2) over 257 entries, 64 bits)
        bits = np.unpackbits(m.view(np.uint8))
        assert abs(bits.mean() - 0.5) < 0.02
    # without one client's vector the masks do not cancel: partial sums reveal nothing
    partial = decode_fixed_point(sum_masked(masked[:4]))
    assert np.abs(partial - np.sum(vectors[:4], axis=0)).min() > 1e3


def test_secure_sum_zero_input_is_masked_and_fixed_point_errors():
    keys = {i: dh_keypair(seed=10 + i) for i in range(2)}
    m0 = mask_vector(encode_fixed_point(np.zeros(64)), 0, {1: shared_seed(keys[0][0], keys[1][1])})
    assert np.count_nonzero(m0) == 64
    with pytest.raises(ValueError, match="finite"):
        encode_fixed_point(np.array([np.inf]))
    with pytest.raises(ValueError, match="itself"):
        mask_vector(encode_fixed_point(np.zeros(2)), 0, {0: b"x" * 32})


def test_dirichlet_partition_statistics():
    labels = np.repeat(np.arange(10), 200)
    skewed = dirichlet_partition(labels, num_clients=8, alpha=0.1, seed=0)
    mild = dirichlet_partition(labels, num_clients=8, alpha=100.0, seed=0)
    for parts in (skewed, mild):
        flat = np.concatenate(parts)
        assert len(flat) == len(labels) and len(np.unique(flat)) == len(labels)  # a partition
        assert min(len(p) for p in parts) >= 10
    s, m = partition_statistics(labels, skewed), partition_statistics(labels, mild)
    assert s["histogram"].sum() == m["histogram"].sum() == len(labels)
    np.testing.assert_array_equal(s["histogram"].sum(0), np.full(10, 200))
    assert m["mean_tv"] < 0.1 < 0.4 < s["mean_tv"]
    assert s["mean_classes"] < m["mean_classes"] == 10
    again = dirichlet_partition(labels, num_clients=8, alpha=0.1, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(skewed, again))
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(labels, 4, alpha=0.0)


def test_prior_retrieval_and_global_prior():
    keys = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 0, 1.0]]), dim=1)
    means = torch.tensor([[1.0, 0], [3.0, 0], [0, 5.0]])
    covs = torch.stack([torch.eye(2), 2 * torch.eye(2), 3 * torch.eye(2)])
    bank = PriorBank(keys, means, covs, torch.tensor([10.0, 10.0, 20.0]), ["a", "b", "c"])
    mu0, sigma0, w, idx = retrieve_prior(bank, torch.tensor([0.0, 0.0, 2.0]), k=1)
    assert idx.tolist() == [2] and torch.allclose(mu0, means[2].double())
    mu0, sigma0, w, idx = retrieve_prior(bank, torch.tensor([1.0, 0.05, 0.0]), k=2, temperature=1e-3)
    assert sorted(idx.tolist()) == [0, 1] and torch.isclose(w.sum(), torch.tensor(1.0, dtype=torch.float64))
    g_mu, g_sigma = global_prior(bank)
    torch.testing.assert_close(g_mu, torch.tensor([1.0, 2.5], dtype=torch.float64))
    torch.testing.assert_close(g_sigma, 2.25 * torch.eye(2, dtype=torch.float64))


def test_similarity_gate_blends_retrieved_and_global_priors():
    keys = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 0, 1.0]]), dim=1)
    means = torch.tensor([[1.0, 0], [3.0, 0], [0, 5.0]])
    covs = torch.stack([torch.eye(2), 2 * torch.eye(2), 3 * torch.eye(2)])
    bank = PriorBank(keys, means, covs, torch.tensor([10.0, 10.0, 20.0]), ["a", "b", "c"])
    query = torch.tensor([0.0, 0.6, 0.8])                        # top cosine 0.8 (entry c)
    mu_r, sigma_r = retrieve_prior(bank, query, k=1)[:2]
    mu_g, sigma_g = global_prior(bank)
    mu, sigma, w = gated_prior(bank, query, k=1, threshold=-1.0)  # gate open: the retrieval
    assert w > 0.999 and torch.allclose(mu, mu_r, atol=1e-3)
    mu, sigma, w = gated_prior(bank, query, k=1, threshold=2.0)   # gate shut: the global prior
    assert w < 1e-3 and torch.allclose(mu, mu_g, atol=1e-2) and torch.allclose(sigma, sigma_g, atol=1e-2)
    mu, sigma, w = gated_prior(bank, query, k=1, threshold=0.8)   # at the threshold: the midpoint
    assert w == pytest.approx(0.5)
    torch.testing.assert_close(mu, 0.5 * (mu_r + mu_g))
    torch.testing.assert_close(sigma, 0.5 * (sigma_r + sigma_g))
    gates = [similarity_gate(s, 0.5) for s in (0.2, 0.45, 0.5, 0.55, 0.9)]
    assert gates == sorted(gates) and gates[0] < 0.01 and gates[-1] > 0.99
    assert similarity_gate(-50.0, 0.5, width=1e-3) == 0.0      # no overflow far from the threshold
    with pytest.raises(ValueError, match="width"):
        similarity_gate(0.5, 0.5, width=0.0)


def test_evaluate_episodes_settings_per_method_and_gate_off_equals_ungated():
    from lit_lowrank.federated.server import evaluate_episodes

    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 3, generator=gen) * 3
    z = torch.cat([centres[c] + torch.randn(30, 3, generator=gen) for c in range(4)])
    y = torch.arange(4).repeat_interleave(30)
    keys = torch.nn.functional.normalize(torch.randn(5, 8, generator=gen), dim=1)
    bank = PriorBank(keys, torch.randn(5, 3, generator=gen), torch.eye(3).repeat(5, 1, 1), torch.full((5,), 50.0),
                     list("abcde"))
    novel_keys = torch.nn.functional.normalize(torch.randn(4, 8, generator=gen), dim=1)
    run = dict(ways=3, shots=(1,), episodes=4, queries=5, seed=0)
    ungated = evaluate_episodes(z, y, list("wxyz"), bank, novel_keys, ("prior_bank",), gate_threshold=None, **run)
    open_gate = evaluate_episodes(z, y, list("wxyz"), bank, novel_keys, ("prior_bank",),
                                  settings={"prior_bank": {"gate_threshold": -10.0}}, **run)
    assert ungated == open_gate                                   # a wide-open gate is the plain retrieval
    shut = evaluate_episodes(z, y, list("wxyz"), bank, novel_keys, ("prior_bank", "global_prior"),
                             settings={"prior_bank": {"gate_threshold": 10.0}}, **run)
    assert shut[("prior_bank", 1)] == shut[("global_prior", 1)]   # a shut gate is the global prior
    with pytest.raises(ValueError, match="settings"):
        evaluate_episodes(z, y, list("wxyz"), bank, novel_keys, ("prior_bank",), settings={"prior_bank": {"kapa": 1}},
                          **run)
    with pytest.raises(ValueError, match="classifier"):
        evaluate_episodes(z, y, list("wxyz"), bank, novel_keys, ("prior_bank",), classifier="svm", **run)


def test_episode_sampling_classifiers_and_f1():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(6), 30)
    s, sy, q, qy, chosen = sample_episode(y, np.arange(6), ways=5, shots=2, queries=7, rng=rng)
    assert len(s) == 10 and len(q) == 35 and not set(s) & set(q)
    assert all(y[i] == chosen[j] for i, j in zip(q, qy))
    p, t = rng.integers(0, 5, 100), rng.integers(0, 5, 100)
    assert macro_f1(p, t, 5) == pytest.approx(f1_score(t, p, average="macro"))
    gen = torch.Generator().manual_seed(0)
    means = torch.tensor([[0.0, 0.0], [6.0, 0.0]])
    covs = torch.stack([torch.diag(torch.tensor([4.0, 0.1])), torch.diag(torch.tensor([0.1, 4.0]))])
    qx = torch.cat([means[c] + torch.randn(200, 2, generator=gen) @ covs[c].sqrt() for c in range(2)])
    qy2 = torch.arange(2).repeat_interleave(200)
    assert (gaussian_classify(qx, means, covs) == qy2).float().mean() > 0.95
    assert (prototype_classify(qx, means, torch.arange(2), 2) == qy2).float().mean() > 0.8
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(1.96 / np.sqrt(3))
