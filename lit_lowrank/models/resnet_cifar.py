"""The CIFAR-layout ResNet of He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), Sec. 4.2.

timm and torchvision ship only the ImageNet layout (7x7 stem, max-pool, 4 stages of
64-512 channels). The CIFAR layout is smaller and is what CIFAR papers mean by
"ResNet-20/32/56/110":

- a 3x3 stem convolution to 16 channels, no max-pool;
- three stages of ``n`` basic blocks (two 3x3 convolutions each) with 16, 32 and 64
  channels; the first block of stages 2 and 3 halves the resolution (stride 2);
- global average pooling. Depth = 6n + 2 (the +2 counts the stem and the classifier
  that the paper's count includes; this module is a feature extractor and stops at the
  pooled 64-dimensional feature, the task module adds the linear head).

Where a block changes shape, the shortcut is either

- option A (the paper's CIFAR choice, default): parameter-free, subsample the input by
  taking every second pixel and zero-pad the new channels; or
- option B: a 1x1 convolution with stride 2 followed by batch norm.

Convolutions use Kaiming-normal initialisation (He et al. 2015, the paper's ref. [13]).
The paper trains ResNet-110 with a learning-rate warm-up (0.01 for ~400 iterations,
then 0.1); that belongs in the training config, not here.

.. code-block:: python

    from lit_lowrank.models import resnet20_cifar

    net = resnet20_cifar()                           # 269,072 parameters (0.27M with a 10-way head)
    features = net(torch.randn(8, 3, 32, 32))        # (8, 64)
    logits = nn.Linear(net.num_features, 10)(features)
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ShortcutOption = Literal["A", "B"]
STAGE_CHANNELS: tuple[int, int, int] = (16, 32, 64)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers and a shortcut: ``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))``.

    Args:
        in_channels: channels of the input.
        out_channels: channels of the output.
        stride: 2 in the first block of a downsampling stage, else 1.
        shortcut: ``"A"`` (zero-pad + subsample, no parameters) or ``"B"`` (1x1 conv + BN)
            for blocks whose input and output shapes differ; identity otherwise.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, shortcut: ShortcutOption = "A") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.stride = stride
        self.pad_channels = out_channels - in_channels
        # Option B's projection is the only shortcut with parameters; option A and the
        # identity are computed in `shortcut` below.
        self.projection: nn.Module | None = None
        if shortcut == "B" and (stride != 1 or in_channels != out_channels):
            self.projection = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def shortcut(self, x: Tensor) -> Tensor:
        """The residual path: identity, option A (subsample + zero channels) or option B (projection)."""
        if self.projection is not None:
            return self.projection(x)
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.pad_channels > 0:
            # Split the new zero channels evenly on both sides, as in the reference
            # implementations, so the old channels sit in the middle.
            half = self.pad_channels // 2
            x = F.pad(x, (0, 0, 0, 0, half, self.pad_channels - half))
        return x

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetCifar(nn.Module):
    """CIFAR ResNet feature extractor of depth ``6 * blocks_per_stage + 2``.

    Args:
        blocks_per_stage: ``n`` in the paper (3 -> ResNet-20, 5 -> 32, 9 -> 56, 18 -> 110).
        in_chans: input image channels (3 for CIFAR, 1 for digits/MNIST).
        shortcut: ``"A"`` (paper default for CIFAR, parameter-free) or ``"B"`` (1x1 conv).

    Attributes:
        num_features: size of the output feature vector (64).

    Shapes:
        ``x: (B, in_chans, H, W)`` with any ``H, W >= 1`` (8x8 digits and 32x32 CIFAR both
        work; two stride-2 stages divide the resolution by 4) -> ``(B, 64)``.

    .. code-block:: python

        net = ResNetCifar(blocks_per_stage=18)          # ResNet-110, 1,727,312 parameters
        features = net(torch.randn(2, 3, 32, 32))       # (2, 64)
    """

    def __init__(self, blocks_per_stage: int, in_chans: int = 3, shortcut: ShortcutOption = "A") -> None:
        super().__init__()
        if blocks_per_stage < 1:
            raise ValueError(f"blocks_per_stage={blocks_per_stage!r}: expected an integer >= 1 (depth = 6n + 2).")
        if shortcut not in ("A", "B"):
            raise ValueError(f"shortcut={shortcut!r}: expected 'A' (zero-pad, parameter-free) or 'B' (1x1 conv).")
        self.blocks_per_stage = blocks_per_stage
        self.num_features = STAGE_CHANNELS[-1]

        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, STAGE_CHANNELS[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(STAGE_CHANNELS[0]),
            nn.ReLU(inplace=True),
        )
        stages = []
        in_channels = STAGE_CHANNELS[0]
        for index, channels in enumerate(STAGE_CHANNELS):
            first_stride = 1 if index == 0 else 2
            blocks = [BasicBlock(in_channels, channels, first_stride, shortcut)]
            blocks += [BasicBlock(channels, channels, 1, shortcut) for _ in range(blocks_per_stage - 1)]
            stages.append(nn.Sequential(*blocks))
            in_channels = channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)

        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    @property
    def depth(self) -> int:
        """Layer count as the paper counts it (including the classifier this module omits)."""
        return 6 * self.blocks_per_stage + 2

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"ResNetCifar expects x of shape (B, C, H, W); got shape {tuple(x.shape)}.")
        x = self.stages(self.stem(x))
        return torch.flatten(self.pool(x), 1)


def resnet20_cifar(in_chans: int = 3, shortcut: ShortcutOption = "A") -> ResNetCifar:
    """ResNet-20 (n=3): 269,072 parameters with option A (the paper's 0.27M includes the 10-way head).

    .. code-block:: python

        net = resnet20_cifar(in_chans=1)   # for 8x8 digits
    """
    return ResNetCifar(3, in_chans=in_chans, shortcut=shortcut)


def resnet32_cifar(in_chans: int = 3, shortcut: ShortcutOption = "A") -> ResNetCifar:
    """ResNet-32 (n=5): 463,504 parameters with option A.

    .. code-block:: python

        net = resnet32_cifar()
    """
    return ResNetCifar(5, in_chans=in_chans, shortcut=shortcut)


def resnet56_cifar(in_chans: int = 3, shortcut: ShortcutOption = "A") -> ResNetCifar:
    """ResNet-56 (n=9): 852,368 parameters with option A.

    .. code-block:: python

        net = resnet56_cifar()
    """
    return ResNetCifar(9, in_chans=in_chans, shortcut=shortcut)


def resnet110_cifar(in_chans: int = 3, shortcut: ShortcutOption = "A") -> ResNetCifar:
    """ResNet-110 (n=18): 1,727,312 parameters with option A (the paper's 1.7M).

    .. code-block:: python

        net = resnet110_cifar()
    """
    return ResNetCifar(18, in_chans=in_chans, shortcut=shortcut)
