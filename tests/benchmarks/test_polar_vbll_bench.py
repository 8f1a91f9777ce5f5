"""The PoLAR-VBLL benchmark's posterior ablation: the weight posterior collapsed, the logit noise kept."""

from __future__ import annotations

import torch
from torch import nn

from lit_lowrank.adapters.polar_vbll import apply_polar_vbll, find_vbll_head
from lit_lowrank.benchmarks.polar_vbll import without_epistemic
from lit_lowrank.ops.vbll import probit_softmax


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def test_without_epistemic_keeps_only_the_noise_and_restores_the_posterior():
    torch.manual_seed(0)
    net = _Net()
    apply_polar_vbll(net, num_train=10, adapter=None, head_kwargs={"predictive": "probit"})
    head = find_vbll_head(net).eval()
    with torch.no_grad():
        head.layer.W_logdiag.fill_(1.0)  # a wide weight posterior: it moves the predictive
    net.eval()
    x = torch.randn(5, 6)
    posterior = head.layer.W_logdiag.detach().clone()
    full = net(x).softmax(-1)
    ablated = without_epistemic(net)(x)
    assert torch.equal(head.layer.W_logdiag, posterior)  # restored after the call
    with torch.no_grad():
        feats = net.backbone(x)
        mean, var = head.logit_moments(feats)
        epistemic = head.weight_variance(feats)
    # the ablated predictive is the probit with the weight variance removed and the logit noise kept
    assert torch.allclose(ablated, probit_softmax(mean, var - epistemic), atol=1e-5)
    assert (var - epistemic).min() > 0
    assert not torch.allclose(full, ablated, atol=1e-3)  # the wide posterior did matter
