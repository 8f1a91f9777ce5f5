"""Small backbones for the embedded datasets: an MLP, a three-block CNN and a token-bag encoder.

Each is a feature extractor (no classification head) with a ``num_features``
attribute, sized to train in seconds on two CPU cores:

- :class:`MLP` flattens its input (8x8 digits, tabular rows, 28x28 MNIST) and applies
  ``Linear -> ReLU`` layers; ``num_features`` is the last hidden size.
- :class:`SmallCNN` stacks ``Conv3x3 -> BN -> ReLU`` blocks with a 2x2 max-pool between
  them and ends in global average pooling, so 8x8 and 28x28 images both work.
- :class:`TokenBagEncoder` is a deep averaging network (Iyyer et al., ACL 2015): the mean
  of the token embeddings, ignoring padding, followed by ``Linear -> ReLU`` layers. It
  reads ``(B, T)`` token ids, e.g. tokenized tweets or reviews.

.. code-block:: python

    from lit_lowrank.models import build_backbone

    mlp = build_backbone("mlp", in_features=64, hidden_sizes=(128, 64))     # (B, 1, 8, 8) -> (B, 64)
    cnn = build_backbone("cnn_small", in_chans=1)                           # (B, 1, 28, 28) -> (B, 128)
    bag = build_backbone("token_bag", vocab_size=30522, pad_token_id=0)     # (B, T) long -> (B, 128)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class MLP(nn.Module):
    """Flatten, then ``Linear -> ReLU (-> Dropout)`` for each hidden size.

    Args:
        in_features: size of the flattened input (``C * H * W`` for images).
        hidden_sizes: widths of the hidden layers; the last is ``num_features``.
        dropout: dropout probability after each activation (0 disables it).

    Shapes:
        ``x: (B, *)`` with ``prod(*) == in_features`` -> ``(B, hidden_sizes[-1])``.

    .. code-block:: python

        net = MLP(in_features=64, hidden_sizes=(128, 64))
        features = net(torch.randn(16, 1, 8, 8))   # (16, 64)
    """

    def __init__(self, in_features: int, hidden_sizes: Sequence[int] = (256, 128), dropout: float = 0.0) -> None:
        super().__init__()
        if not hidden_sizes:
            raise ValueError(f"hidden_sizes={hidden_sizes!r}: expected at least one hidden size.")
        self.in_features = in_features
        self.num_features = int(hidden_sizes[-1])
        layers: list[nn.Module] = []
        width = in_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(x, 1)
        if x.shape[1] != self.in_features:
            raise ValueError(
                f"MLP(in_features={self.in_features}) got an input with {x.shape[1]} features per sample "
                f"after flattening; set in_features={x.shape[1]}."
            )
        return self.layers(x)


class SmallCNN(nn.Module):
    """``Conv3x3 -> BN -> ReLU`` blocks, a 2x2 max-pool between blocks, global average pooling.

    Args:
        in_chans: input image channels.
        channels: output channels of each block; the last is ``num_features``.

    Shapes:
        ``x: (B, in_chans, H, W)`` -> ``(B, channels[-1])``; with three blocks an 8x8 input
        is pooled 8 -> 4 -> 2 and a 28x28 one 28 -> 14 -> 7 before the global pool.

    .. code-block:: python

        net = SmallCNN(in_chans=1, channels=(32, 64, 128))
        features = net(torch.randn(16, 1, 28, 28))   # (16, 128)
    """

    def __init__(self, in_chans: int = 3, channels: Sequence[int] = (32, 64, 128)) -> None:
        super().__init__()
        if not channels:
            raise ValueError(f"channels={channels!r}: expected at least one block width.")
        self.num_features = int(channels[-1])
        layers: list[nn.Module] = []
        width = in_chans
        for index, out_channels in enumerate(channels):
            if index > 0:
                # ceil_mode keeps odd sizes (7 -> 4) from dropping a row and column.
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
            layers += [
                nn.Conv2d(width, out_channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(inplace=True),
            ]
            width = out_channels
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"SmallCNN expects x of shape (B, C, H, W); got shape {tuple(x.shape)}.")
        return torch.flatten(self.pool(self.features(x)), 1)


class TokenBagEncoder(nn.Module):
    """Mean of token embeddings over non-padding positions, then ``Linear -> ReLU`` layers.

    ``nn.EmbeddingBag(mode="mean", padding_idx=...)`` excludes padding tokens from the
    mean, so appending or inserting padding never changes the output; a row of only
    padding encodes to the MLP applied to a zero vector.

    Args:
        vocab_size: number of token ids.
        dim: embedding width, also the hidden width and ``num_features``.
        pad_token_id: the id that marks padding.
        num_layers: ``Linear -> ReLU`` layers after pooling (0 returns the pooled mean).

    Shapes:
        ``x: (B, T)`` integer token ids -> ``(B, dim)``.

    .. code-block:: python

        net = TokenBagEncoder(vocab_size=1000, dim=64, pad_token_id=0)
        features = net(torch.tensor([[5, 9, 0, 0], [7, 0, 0, 0]]))   # (2, 64)
    """

    def __init__(self, vocab_size: int, dim: int = 128, pad_token_id: int = 0, num_layers: int = 1) -> None:
        super().__init__()
        if not 0 <= pad_token_id < vocab_size:
            raise ValueError(f"pad_token_id={pad_token_id!r}: expected an id in [0, vocab_size={vocab_size}).")
        self.vocab_size = vocab_size
        self.pad_token_id = pad_token_id
        self.num_features = dim
        self.embedding = nn.EmbeddingBag(vocab_size, dim, mode="mean", padding_idx=pad_token_id)
        layers: list[nn.Module] = []
        for _ in range(num_layers):
            layers += [nn.Linear(dim, dim), nn.ReLU(inplace=True)]
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(
                f"TokenBagEncoder expects token ids x of shape (B, T) and dtype long; "
                f"got shape {tuple(x.shape)} and dtype {x.dtype}."
            )
        return self.mlp(self.embedding(x.long()))


def mlp(in_features: int, hidden_sizes: Sequence[int] = (256, 128), dropout: float = 0.0) -> MLP:
    """Builder for :class:`MLP` (registered as ``"mlp"``).

    .. code-block:: python

        net = mlp(in_features=64)   # digits 8x8 -> (B, 128)
    """
    return MLP(in_features, hidden_sizes=hidden_sizes, dropout=dropout)


def cnn_small(in_chans: int = 3, channels: Sequence[int] = (32, 64, 128)) -> SmallCNN:
    """Builder for :class:`SmallCNN` (registered as ``"cnn_small"``).

    .. code-block:: python

        net = cnn_small(in_chans=1)   # digits or MNIST -> (B, 128)
    """
    return SmallCNN(in_chans=in_chans, channels=channels)


def token_bag(vocab_size: int, dim: int = 128, pad_token_id: int = 0, num_layers: int = 1) -> TokenBagEncoder:
    """Builder for :class:`TokenBagEncoder` (registered as ``"token_bag"``).

    .. code-block:: python

        net = token_bag(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id)
    """
    return TokenBagEncoder(vocab_size, dim=dim, pad_token_id=pad_token_id, num_layers=num_layers)
