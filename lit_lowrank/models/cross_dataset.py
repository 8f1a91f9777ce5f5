"""A second model for source-free adaptation that fails differently: a classifier of the
same classes trained on *another dataset*.

SafeCut (and DIFO-style one-way distillation) pair the adapted source model with a
model whose errors differ — in the paper a vision–language zero-shot classifier,
broadly pre-trained, better than the source model on some target classes and worse
on others. The embedded stand-in: ``cnn_small`` trained on the 5,000 real MNIST
digits rendered as 8x8 images (:func:`~lit_lowrank.datamodules.domain_shift.mnist_as_digits8`),
used on (shifted) scikit-learn digits. It never sees a scikit-learn digit or a shift
type of the target, so its strengths come from its own data (other writers, more
slant variation), not from the target's corruption.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _cache_root() -> Path:
    return Path(os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank")


class CrossDatasetDigitClassifier(nn.Module):
    """``cnn_small`` + linear head trained on MNIST-as-8x8 digits, for inputs standardised like
    :class:`~lit_lowrank.datamodules.DigitsDataModule` (``(x - mean) / std`` of its training split).

    Args:
        seed: seeds the initialisation and the batch order, and names the
            ``DigitsDataModule(seed=seed)`` whose standardisation the inputs use
            (unless ``input_mean`` / ``input_std`` are given).
        epochs: training epochs (AdamW, lr 3e-3, batch 64).
        input_mean, input_std: the standardisation of the inputs it will receive.
        cache: reuse / store the trained weights under
            ``$LIT_LOWRANK_CACHE/safecut/`` (default ``~/.cache/lit_lowrank``), keyed
            by every setting above; written atomically.

    .. code-block:: python

        second = CrossDatasetDigitClassifier(seed=0)           # ~5 s on 1 CPU core, then cached
        SafeCut(second_model=second)
    """

    def __init__(self, seed: int = 0, epochs: int = 4, input_mean: float | None = None,
                 input_std: float | None = None, cache: bool = True) -> None:
        super().__init__()
        from lit_lowrank.models import build_backbone

        if epochs < 1:
            raise ValueError(f"`epochs`={epochs!r}, expected an integer >= 1.")
        if input_mean is None or input_std is None:
            from lit_lowrank.datamodules import DigitsDataModule

            clean = DigitsDataModule(seed=seed)
            clean.setup("fit")
            input_mean, input_std = clean.mean, clean.std
        self.input_mean, self.input_std = float(input_mean), float(input_std)
        self.backbone = build_backbone("cnn_small", in_chans=1)
        self.head = nn.Linear(self.backbone.num_features, 10)
        self.num_features = self.backbone.num_features
        key = f"mnist5k_digits8_cnn_small_e{epochs}_s{seed}_m{self.input_mean:.5f}_sd{self.input_std:.5f}.pt"
        path = _cache_root() / "safecut" / key
        if cache and path.exists():
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        else:
            self._train(seed, epochs)
            if cache:
                path.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
                    torch.save(self.state_dict(), tmp.name)
                os.replace(tmp.name, path)
        self.eval()

    def _train(self, seed: int, epochs: int) -> None:
        from lit_lowrank.datamodules.domain_shift import mnist_as_digits8

        x, y = mnist_as_digits8()
        x = (x - self.input_mean) / self.input_std
        with torch.random.fork_rng(devices=[]):  # the caller's RNG state is left as it was
            torch.manual_seed(seed)
            for module in (self.backbone, self.head):
                for sub in module.modules():
                    if hasattr(sub, "reset_parameters"):
                        sub.reset_parameters()
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
            order = torch.Generator().manual_seed(seed)
            self.train()
            for _ in range(epochs):
                for index in torch.randperm(len(y), generator=order).split(64):
                    loss = F.cross_entropy(self(x[index]), y[index])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()

    def forward_features(self, x: Tensor) -> Tensor:
        """Backbone features ``(B, 128)``."""
        return self.backbone(x)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, 10)`` for standardised 8x8 digits ``(B, 1, 8, 8)``."""
        return self.head(self.backbone(x))
