"""CIFAR ResNet (He et al. 2016, Sec. 4.2): parameter counts, shapes, shortcuts, gradients."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.models.resnet_cifar import (
    BasicBlock,
    ResNetCifar,
    resnet20_cifar,
    resnet32_cifar,
    resnet56_cifar,
    resnet110_cifar,
)


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _expected_option_a(n: int, in_chans: int = 3) -> int:
    """Closed-form count with option A: stem + 3 stages of basic blocks (conv weights + BN affine)."""

    def block(c_in: int, c_out: int) -> int:
        return 9 * c_in * c_out + 9 * c_out * c_out + 4 * c_out

    stem = 9 * in_chans * 16 + 2 * 16
    stages = block(16, 16) * n + block(16, 32) + block(32, 32) * (n - 1) + block(32, 64) + block(64, 64) * (n - 1)
    return stem + stages


@pytest.mark.parametrize(
    ("builder", "n", "expected"),
    [
        (resnet20_cifar, 3, 269_072),  # the paper's 0.27M = this + a 64x10 head (650)
        (resnet32_cifar, 5, 463_504),
        (resnet56_cifar, 9, 852_368),
        (resnet110_cifar, 18, 1_727_312),  # the paper's 1.7M
    ],
)
def test_parameter_count_option_a(builder, n, expected):
    model = builder()
    assert _num_params(model) == expected == _expected_option_a(n)
    assert model.depth == 6 * n + 2
    assert model.num_features == 64


def test_option_b_adds_two_projections():
    # Option B: 1x1 conv + BN on the two downsampling blocks: (16*32 + 64) + (32*64 + 128).
    extra = 16 * 32 + 2 * 32 + 32 * 64 + 2 * 64
    assert _num_params(resnet20_cifar(shortcut="B")) == 269_072 + extra == 271_824
    assert _num_params(resnet110_cifar(shortcut="B")) == 1_727_312 + extra


def test_option_a_is_parameter_free_zero_pad_subsample():
    block = BasicBlock(16, 32, stride=2, shortcut="A")
    assert block.projection is None
    x = torch.randn(2, 16, 8, 8)
    out = block.shortcut(x)
    assert out.shape == (2, 32, 4, 4)
    torch.testing.assert_close(out[:, 8:24], x[:, :, ::2, ::2])
    assert out[:, :8].abs().sum() == 0 and out[:, 24:].abs().sum() == 0


@pytest.mark.parametrize("size", [8, 32])
@pytest.mark.parametrize("shortcut", ["A", "B"])
def test_output_shape(size, shortcut):
    model = resnet20_cifar(shortcut=shortcut)
    assert model(torch.randn(3, 3, size, size)).shape == (3, 64)


def test_in_chans_one_on_digits_size():
    model = resnet32_cifar(in_chans=1).eval()
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 64)


def test_resnet110_forward():
    assert resnet110_cifar()(torch.randn(2, 3, 32, 32)).shape == (2, 64)


@pytest.mark.parametrize("shortcut", ["A", "B"])
def test_gradient_reaches_every_parameter(shortcut):
    torch.manual_seed(0)
    model = resnet20_cifar(shortcut=shortcut)
    model(torch.randn(4, 3, 16, 16)).pow(2).sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_kaiming_init_scale():
    # fan_out Kaiming normal: std = sqrt(2 / (out_channels * 9)) for a 3x3 conv.
    torch.manual_seed(0)
    conv = resnet56_cifar().stages[2][1].conv1
    assert conv.weight.std().item() == pytest.approx((2 / (64 * 9)) ** 0.5, rel=0.05)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="shortcut='C'"):
        ResNetCifar(3, shortcut="C")
    with pytest.raises(ValueError, match="blocks_per_stage=0"):
        ResNetCifar(0)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        resnet20_cifar()(torch.randn(3, 32, 32))
