"""A small MLP autoencoder: CAMEL's Appraiser for MNIST-like images."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


class MLPAutoencoder(nn.Module):
    """Flatten → MLP encoder → ``latent_dim`` bottleneck → MLP decoder → reshape.

    SiLU activations keep the reconstruction loss smooth, which CAMEL's second-order
    inner loop differentiates twice.

    Args:
        image_shape: ``(C, H, W)`` of the inputs.
        hidden_sizes: encoder widths (the decoder mirrors them).
        latent_dim: bottleneck width; small enough that unfamiliar images reconstruct badly.

    .. code-block:: python

        ae = MLPAutoencoder((1, 8, 8), hidden_sizes=(64,), latent_dim=8)
        recon = ae(torch.rand(4, 1, 8, 8))   # (4, 1, 8, 8)
    """

    def __init__(self, image_shape: Sequence[int] = (1, 8, 8), hidden_sizes: Sequence[int] = (64,),
                 latent_dim: int = 8) -> None:
        super().__init__()
        if len(image_shape) != 3 or min(image_shape) < 1:
            raise ValueError(f"`image_shape`={tuple(image_shape)}, expected (C, H, W) with positive sizes.")
        if latent_dim < 1:
            raise ValueError(f"`latent_dim`={latent_dim}, expected >= 1.")
        self.image_shape = tuple(int(s) for s in image_shape)
        features = self.image_shape[0] * self.image_shape[1] * self.image_shape[2]
        widths = [features, *hidden_sizes, latent_dim]
        enc: list[nn.Module] = []
        dec: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            enc += [nn.Linear(a, b)] + ([nn.SiLU()] if i < len(widths) - 2 else [])
        rev = widths[::-1]
        for i, (a, b) in enumerate(zip(rev, rev[1:])):
            dec += [nn.Linear(a, b)] + ([nn.SiLU()] if i < len(rev) - 2 else [])
        self.encoder = nn.Sequential(*enc)
        self.decoder = nn.Sequential(*dec)

    def forward(self, x: Tensor) -> Tensor:
        """Reconstruction of ``x`` ``(B, C, H, W)``, same shape."""
        if tuple(x.shape[1:]) != self.image_shape:
            raise ValueError(f"MLPAutoencoder expects (B, *{self.image_shape}); got {tuple(x.shape)}.")
        return self.decoder(self.encoder(x.flatten(1))).view(x.shape)
