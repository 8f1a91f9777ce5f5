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

    It trains on 4,500 of the 5,000 digits and checks its accuracy on the other 500 (in the
    same input units): below ``min_val_acc`` it raises instead of returning a model at chance.
    ``val_acc`` keeps the measured value.

    Args:
        seed: seeds the initialisation and the batch order, and names the
            ``DigitsDataModule(seed=seed)`` whose standardisation the inputs use
            (unless ``input_mean`` / ``input_std`` are given).
        epochs: training epochs (AdamW, lr 3e-3, batch 64).
        input_mean, input_std: the standardisation of the inputs it will receive, **in units of
            pixel intensity in [0, 1]** (the model sees ``(pixels - input_mean) / input_std``;
            ``DigitsDataModule.mean`` / ``.std`` are in these units; scikit-learn's raw 0–16
            counts or 0–255 are not): ``input_mean`` in [0, 1], ``input_std`` in (0, 1].
        min_val_acc: the held-out accuracy below which training is an error (chance is 0.1).
        cache: reuse / store the trained weights under
            ``$LIT_LOWRANK_CACHE/safecut/`` (default ``~/.cache/lit_lowrank``), keyed
            by every setting above; written atomically.

    .. code-block:: python

        second = CrossDatasetDigitClassifier(seed=0)           # ~5 s on 1 CPU core, then cached
        SafeCut(second_model=second)
    """

    def __init__(self, seed: int = 0, epochs: int = 4, input_mean: float | None = None,
                 input_std: float | None = None, min_val_acc: float = 0.5, cache: bool = True) -> None:
        super().__init__()
        from lit_lowrank.models import build_backbone

        if epochs < 1:
            raise ValueError(f"`epochs`={epochs!r}, expected an integer >= 1.")
        if input_mean is None or input_std is None:
            from lit_lowrank.datamodules import DigitsDataModule

            clean = DigitsDataModule(seed=seed)
            clean.setup("fit")
            input_mean, input_std = clean.mean, clean.std
        if not (0.0 <= float(input_mean) <= 1.0 and 0.0 < float(input_std) <= 1.0):
            raise ValueError(f"`input_mean`={input_mean!r}, `input_std`={input_std!r}: expected the standardisation in "
                             "units of pixel intensity in [0, 1] (mean in [0, 1], std in (0, 1]), e.g. "
                             "DigitsDataModule(seed=...).mean / .std after setup().")
        self.input_mean, self.input_std = float(input_mean), float(input_std)
        self.backbone = build_backbone("cnn_small", in_chans=1)
        self.head = nn.Linear(self.backbone.num_features, 10)
        self.num_features = self.backbone.num_features
        key = f"mnist5k_digits8_cnn_small_e{epochs}_s{seed}_m{self.input_mean:.5f}_sd{self.input_std:.5f}_v2.pt"
        path = _cache_root() / "safecut" / key
        cached = cache and path.exists()
        if cached:
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        else:
            self._train(seed, epochs)
        self.val_acc = self._validate(seed)
        if self.val_acc < min_val_acc:
            raise RuntimeError(
                f"CrossDatasetDigitClassifier(seed={seed}, epochs={epochs}, input_mean={self.input_mean}, "
                f"input_std={self.input_std}): held-out accuracy {self.val_acc:.3f} < min_val_acc={min_val_acc} "
                "(chance 0.1). Its training failed: check that input_mean/input_std are in pixel units in [0, 1] "
                "and epochs >= 1.")
        if cache and not cached:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
                torch.save(self.state_dict(), tmp.name)
            os.replace(tmp.name, path)
        self.eval()

    def _split(self, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(x_train, y_train, x_val, y_val): 500 held-out digits of the 5,000, standardised as the inputs."""
        from lit_lowrank.datamodules.domain_shift import mnist_as_digits8

        x, y = mnist_as_digits8()
        x = (x - self.input_mean) / self.input_std
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(10_000 + seed))
        return x[order[500:]], y[order[500:]], x[order[:500]], y[order[:500]]

    @torch.no_grad()
    def _validate(self, seed: int) -> float:
        _, _, x, y = self._split(seed)
        was_training = self.training
        self.eval()
        acc = float((self(x).argmax(-1) == y).float().mean())
        self.train(was_training)
        return acc

    def _train(self, seed: int, epochs: int) -> None:
        x, y, _, _ = self._split(seed)
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
