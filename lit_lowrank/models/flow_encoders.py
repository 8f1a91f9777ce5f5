"""Flow encoders for federated low-shot intrusion detection: an MLP and a small ResNet1D.

Both map ``(B, 78)`` standardised flow features to ``(B, feature_dim)`` embeddings (the space in
which class moments are summed and the NIW prior is applied). ResNet1D reads the feature vector
as a one-channel sequence (as flow-IDS ResNet1D baselines do).

.. code-block:: python

    from lit_lowrank.models.flow_encoders import build_flow_encoder

    enc = build_flow_encoder("resnet1d", in_features=78, feature_dim=32)
    z = enc(torch.randn(4, 78))     # (4, 32)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FlowMLP(nn.Module):
    """``in_features → hidden → hidden → feature_dim`` with LayerNorm + GELU.

    .. code-block:: python

        FlowMLP(78, feature_dim=32)(torch.randn(2, 78)).shape   # (2, 32)
    """

    def __init__(self, in_features: int = 78, feature_dim: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.LayerNorm(hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.GELU(),
            nn.Linear(hidden, feature_dim),
        )
        self.feature_dim = feature_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class _Block1D(nn.Module):
    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv1d(channels, out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm1d(out)
        self.conv2 = nn.Conv1d(out, out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm1d(out)
        self.skip = (nn.Sequential(nn.Conv1d(channels, out, 1, stride=stride, bias=False), nn.BatchNorm1d(out))
                     if stride != 1 else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.skip(x))


class ResNet1D(nn.Module):
    """Conv stem + residual blocks (channels doubling with stride 2) + global average pool.

    .. code-block:: python

        ResNet1D(78, feature_dim=32, channels=16, blocks=2)(torch.randn(2, 78)).shape   # (2, 32)
    """

    def __init__(self, in_features: int = 78, feature_dim: int = 32, channels: int = 16, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(1, channels, 5, padding=2, bias=False), nn.BatchNorm1d(channels),
                                  nn.ReLU())
        layers, c = [], channels
        for i in range(blocks):
            stride = 1 if i == 0 else 2
            layers.append(_Block1D(c, stride))
            c *= stride
        self.blocks = nn.Sequential(*layers)
        self.proj = nn.Linear(c, feature_dim)
        self.feature_dim = feature_dim

    def forward(self, x: Tensor) -> Tensor:
        h = self.blocks(self.stem(x.unsqueeze(1)))
        return self.proj(h.mean(-1))


FLOW_ENCODERS = {"mlp": FlowMLP, "resnet1d": ResNet1D}


def build_flow_encoder(name: str, in_features: int = 78, feature_dim: int = 32, **kwargs) -> nn.Module:
    """``"mlp"`` or ``"resnet1d"`` by name.

    .. code-block:: python

        enc = build_flow_encoder("mlp", feature_dim=16, hidden=64)
    """
    if name not in FLOW_ENCODERS:
        raise ValueError(f"build_flow_encoder: `name`={name!r}, expected one of {sorted(FLOW_ENCODERS)}")
    return FLOW_ENCODERS[name](in_features=in_features, feature_dim=feature_dim, **kwargs)
