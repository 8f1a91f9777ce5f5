"""DiffusionModule: training targets, step hooks, deterministic DDIM, conditioning."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_lowrank.tasks import DiffusionModule

SMALL = {"sample_size": 8, "in_channels": 1, "out_channels": 1, "layers_per_block": 1,
         "block_out_channels": (8, 16), "down_block_types": ("DownBlock2D", "DownBlock2D"),
         "up_block_types": ("UpBlock2D", "UpBlock2D"), "norm_num_groups": 4}


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(4, 1, 8, 8, generator=g), "y": torch.tensor([0, 1, 2, 3])}


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
def test_loss_is_mse_to_the_parameterisation_target(prediction_type, batch):
    torch.manual_seed(0)
    model = DiffusionModule(unet_config=SMALL, prediction_type=prediction_type)
    g = torch.Generator().manual_seed(1)
    out = model.step(batch, generator=g)
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(batch["x"].shape, generator=g)
    t = torch.randint(0, 1000, (4,), generator=g)
    assert torch.equal(out["timesteps"], t)
    target = {"epsilon": noise, "sample": batch["x"],
              "v_prediction": model.noise_scheduler.get_velocity(batch["x"], noise, t)}[prediction_type]
    torch.testing.assert_close(out["loss"], torch.nn.functional.mse_loss(out["prediction"], target))


def test_step_hooks_see_every_step_and_the_current_timestep():
    model = DiffusionModule(unet_config=SMALL).eval()
    calls, seen_in_forward = [], []
    handle = model.register_step_hook(lambda m, i, t, x: calls.append((i, t, tuple(x.shape))))
    pre = model.model.conv_in.register_forward_pre_hook(lambda mod, args: seen_in_forward.append(model.current_timestep))
    model.sample(2, num_inference_steps=5, generator=torch.Generator().manual_seed(0))
    assert [c[0] for c in calls] == list(range(5))
    timesteps = [c[1] for c in calls]
    assert timesteps == sorted(timesteps, reverse=True) and seen_in_forward == timesteps
    assert model.current_timestep is None
    handle.remove(), pre.remove()
    model.sample(1, num_inference_steps=2)
    assert len(calls) == 5


def test_ddim_is_deterministic_given_noise():
    model = DiffusionModule(unet_config=SMALL).eval()
    noise = torch.randn(3, 1, 8, 8)
    a = model.sample(3, num_inference_steps=4, noise=noise)
    b = model.sample(3, num_inference_steps=4, noise=noise)
    assert a.shape == (3, 1, 8, 8) and torch.equal(a, b)
    with pytest.raises(ValueError, match="`noise` has shape"):
        model.sample(2, noise=noise)


def test_class_conditional_needs_labels(batch):
    model = DiffusionModule(unet_config=SMALL, num_classes=4)
    model.step(batch)  # labels from batch["y"]
    with pytest.raises(ValueError, match="class_labels"):
        model.sample(2, num_inference_steps=2)
    x = model.sample(2, class_labels=torch.tensor([0, 3]), num_inference_steps=2)
    assert x.shape == (2, 1, 8, 8)


def test_bad_inputs_are_named(batch):
    with pytest.raises(ValueError, match="prediction_type"):
        DiffusionModule(unet_config=SMALL, prediction_type="x0")
    model = DiffusionModule(unet_config=SMALL)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        model.step({"x": torch.randn(4, 64)})
    with pytest.raises(ValueError, match="sampler"):
        model.sample(1, sampler="euler")


def test_custom_model_needs_sample_shape():
    class Denoiser(nn.Module):
        def forward(self, x, t, class_labels=None):
            return x * 0

    model = DiffusionModule(model=Denoiser())
    with pytest.raises(ValueError, match="sample_shape"):
        model.sample(1, num_inference_steps=2)
