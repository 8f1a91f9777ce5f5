"""CAMEL ops: DDIM parity and determinism, inner-loop gradients (finite differences), reward sign."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_lowrank.ops.camel import adapt_appraiser, basin_distance, camel_reward, ddim_sample, reconstruction_loss


def _tiny_diffusion():
    from lit_lowrank.tasks.diffusion import DiffusionModule

    torch.manual_seed(0)
    unet = {"sample_size": 8, "in_channels": 1, "out_channels": 1, "layers_per_block": 1,
            "block_out_channels": (8, 16), "down_block_types": ("DownBlock2D", "DownBlock2D"),
            "up_block_types": ("UpBlock2D", "UpBlock2D"), "norm_num_groups": 4}
    return DiffusionModule(unet_config=unet, num_classes=3).eval()


def test_ddim_sample_matches_diffusers_ddim_and_is_deterministic():
    from diffusers import DDIMScheduler

    module = _tiny_diffusion()
    noise = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2, 0])
    reference = module.sample(4, class_labels=labels, num_inference_steps=6, noise=noise)
    scheduler = DDIMScheduler.from_config(module.noise_scheduler.config)
    scheduler.set_timesteps(6)

    def denoise(x, t):
        return module(x, torch.full((x.shape[0],), t, dtype=torch.long), labels)

    with torch.no_grad():
        ours = ddim_sample(denoise, noise, scheduler.timesteps.tolist(), scheduler.alphas_cumprod,
                           float(scheduler.final_alpha_cumprod))
        again = ddim_sample(denoise, noise.clone(), scheduler.timesteps.tolist(), scheduler.alphas_cumprod,
                            float(scheduler.final_alpha_cumprod))
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-4)
    assert torch.equal(ours, again)
    assert not torch.allclose(ours[0], ours[3])  # same label, different seeds: different samples


def test_ddim_sample_rejects_bad_timesteps():
    with pytest.raises(ValueError, match="strictly decreasing"):
        ddim_sample(lambda x, t: x, torch.zeros(1, 1), [1, 5], torch.ones(10))
    with pytest.raises(ValueError, match="prediction_type"):
        ddim_sample(lambda x, t: x, torch.zeros(1, 1), [5, 1], torch.ones(10), prediction_type="x")


class _TinyAE(nn.Module):
    def __init__(self, d: int = 4, k: int = 2) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(d, k), nn.Linear(k, d)

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x)))


def _chain(z, ae, params, noise_train, noise_heldout, first_order, steps=2):
    """z -> DDIM samples of a toy conditional denoiser -> CAMEL reward."""
    ac = torch.linspace(0.99, 0.1, 10, dtype=torch.float64)

    def denoise(x, t):
        return torch.tanh(0.5 * x + z * (t / 10.0))

    x_train = ddim_sample(denoise, noise_train, [9, 5, 1], ac)
    x_heldout = ddim_sample(denoise, noise_heldout, [9, 5, 1], ac)
    return camel_reward(ae, params, x_train, x_heldout, steps=steps, lr=0.3, first_order=first_order)["reward"]


def test_reward_gradient_through_inner_loop_and_sampler_matches_finite_differences():
    torch.manual_seed(0)
    ae = _TinyAE().double()
    params = {k: v.detach() for k, v in ae.named_parameters()}
    gen = torch.Generator().manual_seed(3)
    noise_train = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    noise_heldout = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    z = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: _chain(v, ae, params, noise_train, noise_heldout, False), (z,),
                                    eps=1e-6, atol=1e-6)


def test_second_order_differentiates_through_the_training_samples_first_order_does_not():
    torch.manual_seed(0)
    ae = _TinyAE().double()
    params = {k: v.detach() for k, v in ae.named_parameters()}
    x_train = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    x_heldout = torch.randn(6, 4, dtype=torch.float64)
    for first_order in (False, True):
        out = camel_reward(ae, params, x_train, x_heldout, steps=3, lr=0.3, first_order=first_order)
        if first_order:  # the only path from x_train to R went through detached inner gradients
            assert not out["reward"].requires_grad
        else:
            (g,) = torch.autograd.grad(out["reward"], x_train)
            assert g.abs().max() > 1e-4
    # finite difference along a random direction of L_K w.r.t. the training samples (second order)
    direction = torch.randn_like(x_train)

    def lk(x):
        return camel_reward(ae, params, x, x_heldout, steps=3, lr=0.3)["lk"]

    (g,) = torch.autograd.grad(lk(x_train), x_train)
    h = 1e-6
    fd = (lk(x_train.detach() + h * direction) - lk(x_train.detach() - h * direction)) / (2 * h)
    torch.testing.assert_close((g * direction).sum(), fd, atol=1e-7, rtol=1e-5)


def test_adapt_appraiser_does_sgd_and_checks_arguments():
    ae = _TinyAE()
    params = {k: v.detach() for k, v in ae.named_parameters()}
    x = torch.randn(8, 4)
    one = adapt_appraiser(ae, params, x, steps=1, lr=0.1)
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    g = torch.autograd.grad(reconstruction_loss(ae, p, x), list(p.values()))
    for (k, v), gk in zip(params.items(), g):
        torch.testing.assert_close(one[k], v - 0.1 * gk)
    with pytest.raises(ValueError, match="steps"):
        adapt_appraiser(ae, params, x, steps=-1, lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        adapt_appraiser(ae, params, x, steps=1, lr=0.0)


def test_reward_sign_on_constructed_familiar_learnable_and_unlearnable_sets():
    """φ₀ knows a 2-d subspace. A consistent novel pattern is unfamiliar AND learnable (R > 0,
    largest); familiar samples are already reconstructed (R ≈ 0); i.i.d. noise is unfamiliar but
    what K steps learn on one draw does not transfer to held-out draws (R below the learnable set's)."""
    torch.manual_seed(0)
    d = 16
    basis = torch.linalg.qr(torch.randn(d, d))[0]
    familiar_basis, novel = basis[:, :2], basis[:, 5]
    ae = nn.Sequential(nn.Linear(d, 2), nn.Linear(2, d))
    opt = torch.optim.Adam(ae.parameters(), lr=0.02)
    for _ in range(400):
        x = torch.randn(64, 2) @ familiar_basis.T
        loss = (ae(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = {k: v.detach() for k, v in ae.named_parameters()}
    gen = torch.Generator().manual_seed(1)

    def sets(kind):
        if kind == "familiar":
            return [torch.randn(16, 2, generator=gen) @ familiar_basis.T for _ in range(2)]
        if kind == "learnable":
            return [2.0 * novel + 0.05 * torch.randn(16, d, generator=gen) for _ in range(2)]
        return [torch.randn(16, d, generator=gen) * (2.0 / d ** 0.5) for _ in range(2)]

    r = {kind: camel_reward(ae, params, *sets(kind), steps=5, lr=0.5) for kind in ("familiar", "learnable", "noise")}
    assert r["learnable"]["reward"] > 0.05
    assert r["learnable"]["l0"] > 10 * r["familiar"]["l0"]          # unfamiliar ...
    assert r["learnable"]["lk"] < 0.5 * r["learnable"]["l0"]         # ... yet learnable
    assert abs(r["familiar"]["reward"]) < 0.1 * r["learnable"]["reward"]
    assert r["noise"]["reward"] < 0.5 * r["learnable"]["reward"]


def test_basin_distance():
    bank = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    samples = torch.tensor([[0.0, 1.0], [3.0, 4.0], [6.0, 8.0]])
    torch.testing.assert_close(basin_distance(samples, bank), torch.tensor([1.0, 0.0, 5.0]))
    with pytest.raises(ValueError, match="trailing shape"):
        basin_distance(samples, torch.zeros(2, 3))


def test_recognition_hinge_is_zero_once_recognised_with_margin():
    from lit_lowrank.ops.camel import recognition_hinge

    logits = torch.tensor([[3.0, 0.0, 1.0], [0.0, 2.0, 1.5], [1.0, 1.0, 0.0]])
    hinge = recognition_hinge(logits, torch.tensor([0, 1, 2]), margin=1.0)
    # margins logit_c - max_other: 2.0, 0.5, -1.0 -> hinge max(0, 1 - margin)
    torch.testing.assert_close(hinge, torch.tensor([0.0, 0.5, 2.0]))
    torch.testing.assert_close(recognition_hinge(logits, 0, margin=0.0), torch.tensor([0.0, 2.0, 0.0]))
    logits.requires_grad_(True)
    recognition_hinge(logits, 1, margin=1.0).sum().backward()
    assert logits.grad[1].tolist() == [0.0, -1.0, 1.0]  # pushes the own logit up, the best rival down
    with pytest.raises(ValueError, match="margin"):
        recognition_hinge(logits, 0, margin=-1.0)


def test_sample_diversity_is_the_mean_pairwise_distance_and_zero_when_collapsed():
    from lit_lowrank.ops.camel import sample_diversity

    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 4.0]])
    assert sample_diversity(x).item() == pytest.approx((5.0 + 4.0 + 3.0) / 3)
    assert sample_diversity(torch.ones(5, 1, 2, 2)).item() == 0.0
    with pytest.raises(ValueError, match="N >= 2"):
        sample_diversity(torch.ones(1, 4))
