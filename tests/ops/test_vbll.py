"""VBLL head (ops/vbll.py): the ELBO against a hand-computed case, predictive behaviour."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lit_lowrank.ops.vbll import VBLLHead, probit_softmax

pytest.importorskip("vbll")


def _small_head() -> VBLLHead:
    head = VBLLHead(2, 2, num_train=4, bias=False, parameterization="diagonal", prior_scale=1.0)
    with torch.no_grad():
        head.layer.W_mean.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
        head.layer.W_logdiag.copy_(torch.tensor([[0.5, 0.1], [0.2, 0.3]]).log())  # weight std
        head.layer.noise_logdiag.copy_(torch.tensor([0.4, 0.6]).log())  # logit-noise std
    return head


def test_elbo_matches_hand_computed_case():
    head = _small_head()
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    # logits: mean M x = (1, -2); variance sum_j s_cj^2 x_j^2 + noise^2
    var0 = 0.5**2 * 1 + 0.1**2 * 4 + 0.4**2  # 0.45
    var1 = 0.2**2 * 1 + 0.3**2 * 4 + 0.6**2  # 0.76
    jensen = 1.0 - math.log(math.exp(1.0 + var0 / 2) + math.exp(-2.0 + var1 / 2))
    # prior variance prior_scale * 2 / d = 1: KL = 1/2 [|M|^2 + tr S - logdet S] (constants dropped as in vbll)
    stds = [0.5, 0.1, 0.2, 0.3]
    kl = 0.5 * ((1.0 + 1.0) + sum(s * s for s in stds) - sum(math.log(s * s) for s in stds))
    # Wishart on the noise precision: dof' = (dof + C + 1) / 2 = 2
    logdet_prec = -2 * (math.log(0.4) + math.log(0.6))
    trace_prec = 1 / 0.4**2 + 1 / 0.6**2
    wishart = 2.0 * logdet_prec - 0.5 * 1.0 * trace_prec
    expected = -(jensen + (1 / 4) * (wishart - kl))
    assert head.elbo_loss(x, y).item() == pytest.approx(expected, rel=1e-5)
    mean, var = head.logit_moments(x)
    torch.testing.assert_close(mean, torch.tensor([[1.0, -2.0]]))
    torch.testing.assert_close(var, torch.tensor([[var0, var1]]))


def test_kl_scale_scales_the_regulariser():
    head = _small_head()
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([0])
    data_only = VBLLHead(2, 2, num_train=4, kl_scale=0.0, bias=False)
    data_only.load_state_dict(head.state_dict())
    half = VBLLHead(2, 2, num_train=4, kl_scale=0.5, bias=False)
    half.load_state_dict(head.state_dict())
    full, none, mid = (h.elbo_loss(x, y).item() for h in (head, data_only, half))
    assert mid == pytest.approx((full + none) / 2, rel=1e-6)


def _fit_head(n: int, seed: int = 0, steps: int = 80) -> tuple[VBLLHead, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, 4, generator=gen) + 1.5 * (2 * y[:, None].float() - 1) * torch.tensor([1.0, 0, 0, 0])
    torch.manual_seed(seed)
    head = VBLLHead(4, 2, num_train=n)
    opt = torch.optim.Adam(head.parameters(), lr=5e-2)
    for _ in range(steps):
        opt.zero_grad()
        head.elbo_loss(x, y).backward()
        opt.step()
    test = torch.randn(256, 4, generator=torch.Generator().manual_seed(99))
    return head, test


def test_predictive_variance_shrinks_with_data(one_thread):
    variances = []
    for n in (16, 256, 4096):  # KL weight 1/n: the posterior contracts as n grows
        head, test = _fit_head(n)
        with torch.no_grad():
            variances.append(head.weight_variance(test).mean().item())
    assert variances[0] > 2 * variances[1] > 4 * variances[2], variances


def test_predictives_agree_and_are_normalised(one_thread):
    head, test = _fit_head(64)
    head.num_samples = 2000  # MC error well below the probit approximation's
    head.eval()
    with torch.no_grad():
        mc = head.predictive(test, "mc")
        probit = head.predictive(test, "probit")
        mean = head.predictive(test, "mean")
        again = head.predictive(test, "mc")
        out = head(test)
    for p in (mc, probit, mean):
        torch.testing.assert_close(p.sum(-1), torch.ones(256))
    torch.testing.assert_close(mc, again)  # seeded MC in eval mode: reproducible
    assert (mc - probit).abs().max() < 0.08
    torch.testing.assert_close(out.exp(), mc)
    # the Bayesian predictive is less confident than the mean-logit point prediction
    assert mc.max(-1).values.mean() < mean.max(-1).values.mean()


def test_probit_softmax_zero_variance_is_softmax():
    mean = torch.randn(5, 3)
    torch.testing.assert_close(probit_softmax(mean, torch.zeros(5, 3)), mean.softmax(-1))
    flat = probit_softmax(mean, torch.full((5, 3), 1e6))
    assert (flat - 1 / 3).abs().max() < 0.05


def test_init_from_linear_gives_the_linear_point_prediction():
    torch.manual_seed(0)
    linear = nn.Linear(6, 3)
    head = VBLLHead(6, 3, num_train=10).init_from_linear(linear)
    x = torch.randn(8, 6)
    torch.testing.assert_close(head.predictive(x, "mean"), linear(x).softmax(-1))


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="predictive"):
        VBLLHead(4, 2, num_train=3, predictive="laplace")
    with pytest.raises(ValueError, match="num_classes"):
        VBLLHead(4, 1, num_train=3)
    head = VBLLHead(4, 2, num_train=3)
    with pytest.raises(ValueError, match=r"\(B, 4\)"):
        head(torch.randn(2, 5))


@pytest.mark.parametrize(("kl_scale", "prior_scale", "feature_scale"), [(1.0, 1.0, 1.0), (1.0, 10.0, 3.0),
                                                                      (0.1, 1.0, 0.3)])
def test_fit_covariance_is_the_elbo_optimum_for_the_mean(kl_scale, prior_scale, feature_scale):
    """The closed form zeroes the ELBO's gradient in every covariance parameter, and no nearby covariance beats it
    (the negative ELBO is convex in the weight variances and noise precisions), while the mean is left as it was."""
    torch.manual_seed(0)
    head = VBLLHead(5, 3, num_train=40, kl_scale=kl_scale, prior_scale=prior_scale).double()
    x, y = feature_scale * torch.randn(40, 5, dtype=torch.float64), torch.randint(0, 3, (40,))
    mean = head.layer.W_mean.detach().clone()
    head.fit_covariance_(x)
    torch.testing.assert_close(head.layer.W_mean.detach(), mean)
    loss = head.elbo_loss(x, y)
    grads = torch.autograd.grad(loss, [head.layer.W_logdiag, head.layer.noise_logdiag])
    assert max(g.abs().max().item() for g in grads) < 1e-8
    with torch.no_grad():
        for _ in range(5):
            saved = (head.layer.W_logdiag.clone(), head.layer.noise_logdiag.clone())
            head.layer.W_logdiag.add_(0.05 * torch.randn_like(saved[0]))
            head.layer.noise_logdiag.add_(0.05 * torch.randn_like(saved[1]))
            assert head.elbo_loss(x, y) > loss
            head.layer.W_logdiag.copy_(saved[0])
            head.layer.noise_logdiag.copy_(saved[1])


def test_fit_covariance_tempering_narrows_the_posterior():
    """A smaller kl_scale (a colder posterior) gives every weight a smaller optimal variance."""
    torch.manual_seed(1)
    x = torch.randn(64, 4)
    widths = []
    for kl_scale in (1.0, 0.1):
        torch.manual_seed(2)
        head = VBLLHead(4, 3, num_train=64, kl_scale=kl_scale).fit_covariance_(x)
        widths.append(head.layer.W_logdiag.detach())
    assert (widths[1] < widths[0]).all()


def test_fit_covariance_refuses_what_it_cannot_solve():
    with pytest.raises(ValueError, match="kl_scale"):
        VBLLHead(4, 2, num_train=3, kl_scale=0.0).fit_covariance_(torch.randn(3, 4))
    with pytest.raises(ValueError, match="diagonal"):
        VBLLHead(4, 2, num_train=3, parameterization="dense").fit_covariance_(torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"\(B, 4\)"):
        VBLLHead(4, 2, num_train=3).fit_covariance_(torch.randn(3, 5))
    with pytest.raises(ValueError, match="no rows"):
        VBLLHead(4, 2, num_train=3).fit_covariance_(torch.randn(0, 4))


def test_fit_covariance_warns_when_it_stops_before_the_fixed_point():
    torch.manual_seed(0)
    head = VBLLHead(4, 3, num_train=20)
    with pytest.warns(RuntimeWarning, match="max_iter"):
        head.fit_covariance_(torch.randn(20, 4), max_iter=1)
