"""Issue #29 finding 3: PoLAR trained without its landing step warns, naming PoLARLanding / apply_landing_."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_lowrank.adapters import AdapterInjector, PoLARLanding, PoLARLandingWarning, apply_landing_, inject_adapters
from lit_lowrank.adapters.polar_landing import polar_diagnostics


def _model() -> nn.Module:
    torch.manual_seed(0)
    return inject_adapters(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), method="polar",
                           target_modules=["0"], rank=4)


def _train(model: nn.Module, steps: int, landing: bool, accumulate: int = 1) -> None:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(accumulate):
            x, y = torch.randn(16, 8, generator=gen), torch.randint(0, 3, (16,), generator=gen)
            F.cross_entropy(model(x), y).backward()
        if landing:
            apply_landing_(model, 1.0)
        opt.step()
        opt.zero_grad()


def test_training_without_landing_warns_once():
    model = _model()
    with pytest.warns(PoLARLandingWarning, match=r"PoLARLanding\(lam=...\).*apply_landing_") as rec:
        _train(model, 40, landing=False)
    assert sum(issubclass(w.category, PoLARLandingWarning) for w in rec) == 1
    assert polar_diagnostics(model)["orthogonality_error_x_max"] > 0.1  # what the warning is about


@pytest.mark.parametrize("accumulate", [1, 3])
def test_training_with_landing_or_after_a_load_is_silent(accumulate):
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoLARLandingWarning)
        _train(model, 10, landing=True, accumulate=accumulate)
        model.load_state_dict(_model().state_dict())  # one change without landing: a load, not a step
        _train(model, 10, landing=True, accumulate=accumulate)
        with torch.no_grad():
            model.eval()
            model(torch.randn(2, 8))


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=5e-2)


def _fit(callbacks) -> None:
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=gen), torch.randint(0, 3, (64,), generator=gen))
    trainer = pl.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    trainer.fit(_Tiny(), torch.utils.data.DataLoader(data, batch_size=8))


def test_lightning_without_the_landing_callback_warns_and_with_it_does_not():
    with pytest.warns(PoLARLandingWarning):
        _fit([AdapterInjector(method="polar", target_modules=["net.0"], rank=4)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoLARLandingWarning)
        _fit([AdapterInjector(method="polar", target_modules=["net.0"], rank=4), PoLARLanding()])
