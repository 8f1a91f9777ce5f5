"""The composition matrix (issue #29): methods that stack train, checkpoint, resume and reload with identical
outputs; pairs that cannot stack refuse with a clear error. The rows are :data:`lit_lowrank.core.composition.
COMPOSITIONS` (the README's table is generated from the same rows, see tests/test_readme.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_lowrank.adapters import AdapterInjector, PoLARLanding, inject_adapters
from lit_lowrank.callbacks.stac_r import STACR, STACRLinear, apply_stac_r
from lit_lowrank.core import apply_loss_hooks, rebuild_surgery, save_surgery
from lit_lowrank.core.composition import ADAPTER_VARIANTS, COMPOSITIONS, Composition
from lit_lowrank.mixins.specdrop import SpecDropBranches, apply_specdrop, specdrop_category

SAME, OTHER = "net.2", "net.0"  # the shared Linear (32 -> 32) and another one (16 -> 32)


class Net(pl.LightningModule):
    """A user's own module: apply_loss_hooks, the SpecDrop category context, and the two surgery lines."""

    def __init__(self, specdrop_target: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        if specdrop_target is not None:  # a mixin: part of the module, recorded in hparams
            apply_specdrop(self, target=[specdrop_target], num_branches=2)

    def forward(self, x: torch.Tensor, category: torch.Tensor | None = None) -> torch.Tensor:
        with specdrop_category(self, category):
            return self.net(x)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self(batch["x"], batch["category"])
        return apply_loss_hooks(self, batch, {"logits": logits}, F.cross_entropy(logits, batch["y"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=2e-2)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        save_surgery(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rebuild_surgery(self, checkpoint)


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"x": torch.randn(16, 16, generator=gen), "y": torch.randint(0, 4, (16,), generator=gen),
            "category": torch.randint(0, 2, (16,), generator=gen)}


class _OneBatch(torch.utils.data.Dataset):
    """The same batch every step: a resumed run sees exactly the data the uninterrupted one saw."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return _batch()


def _loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(_OneBatch(), batch_size=None)


def _callbacks(method: str, layer: str) -> list[pl.Callback]:
    if method == "stac_r":
        # measure_total off: the total-peak measurement runs one exact reference step, and a run resumed between it
        # and the measured step takes that exact step again (by design), so it would differ from the run it resumes
        return [STACR(rank=4, target=[layer], bridge_every=0, measure_total=False)]
    if method in ADAPTER_VARIANTS:
        landing = [PoLARLanding(log_every_n_steps=0)] if method == "polar" else []
        return [AdapterInjector(method=method, target_modules=[layer], rank=2), *landing]
    return []  # specdrop lives in the module


def _run(row: Composition, tmp: Path, steps: int, ckpt: Path | None = None) -> tuple[Net, pl.Trainer]:
    pl.seed_everything(0, verbose=False)
    # "other": the first method on OTHER, the second on SAME; "same": both on SAME
    first_layer, second_layer = (SAME, SAME) if row.layer == "same" else (OTHER, SAME)
    module = Net(specdrop_target=first_layer if row.first == "specdrop" else None)
    callbacks = [*_callbacks(row.first, first_layer), *_callbacks(row.second, second_layer)]
    trainer = pl.Trainer(max_steps=steps, default_root_dir=tmp, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         accelerator="cpu", devices=1, callbacks=callbacks)
    trainer.fit(module, _loader(), ckpt_path=ckpt)
    return module, trainer


@torch.no_grad()
def _outputs(module: Net) -> torch.Tensor:
    module.eval()
    batch = _batch()
    return module(batch["x"], batch["category"])


STACKS = [c for c in COMPOSITIONS if c.stacks]
REFUSED = [c for c in COMPOSITIONS if not c.stacks]


def _id(c: Composition) -> str:
    return f"{c.first}+{c.second}-{c.layer}"


@pytest.mark.parametrize("row", STACKS, ids=_id)
def test_pair_trains_resumes_and_reloads_identically(row, tmp_path):
    continuous, _ = _run(row, tmp_path / "a", steps=4)
    half, trainer = _run(row, tmp_path / "b", steps=2)
    path = tmp_path / "half.ckpt"
    trainer.save_checkpoint(path)
    # reload: the checkpoint alone rebuilds both methods' structure and weights
    reloaded = Net.load_from_checkpoint(path, map_location="cpu")
    torch.testing.assert_close(_outputs(reloaded), _outputs(half), rtol=0, atol=0)
    assert [type(m) for m in reloaded.modules()] == [type(m) for m in half.modules()]
    # resume: fit(ckpt_path=...) with the callbacks in place equals the uninterrupted run
    resumed, trainer = _run(row, tmp_path / "c", steps=4, ckpt=path)
    assert trainer.global_step == 4
    torch.testing.assert_close(_outputs(resumed), _outputs(continuous), rtol=0, atol=0)
    # both methods are really there
    kinds = {type(m) for m in resumed.modules()}
    for method in (row.first, row.second):
        if method == "stac_r":
            assert STACRLinear in kinds
        elif method == "specdrop":
            assert SpecDropBranches in kinds
        else:
            assert any(getattr(m, "lit_lowrank_adapter_method", None) == method for m in resumed.modules())
    assert not torch.equal(_outputs(resumed), _outputs(Net(resumed.hparams.specdrop_target))), "nothing trained"


APPLY: dict[str, Callable[[nn.Module, str], Any]] = {
    "stac_r": lambda m, layer: apply_stac_r(m, target=[layer], rank=4),
    "lora": lambda m, layer: inject_adapters(m, method="lora", target_modules=[layer], rank=2),
    "specdrop": lambda m, layer: apply_specdrop(m, target=[layer], num_branches=2),
}


@pytest.mark.parametrize("row", REFUSED, ids=_id)
def test_pair_that_cannot_stack_refuses_clearly(row):
    model = Net().net
    APPLY[row.first](model, "2")
    with pytest.raises(ValueError, match=r"'2' is a \w+ made by '\w+'.*(cannot stack|cannot branch)"):
        APPLY[row.second](model, "2")


def test_stac_r_error_suggests_the_adapter_layer_not_its_hidden_base():
    """Issue #29: the error once suggested `.base_layer`, the very name the search then excluded."""
    model = inject_adapters(Net().net, method="lora", target_modules=["2"], rank=2)
    with pytest.raises(ValueError, match=r"among: '0', '2', '4'\.") as err:
        apply_stac_r(model, target=["2.base_layer"], rank=4)
    assert "base_layer" not in str(err.value).split("among:")[1]
    layers = apply_stac_r(model, target=["2"], rank=4)
    assert isinstance(model[2].base_layer, STACRLinear) and layers["2"] is model[2].base_layer
