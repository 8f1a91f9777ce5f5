"""The STAC-R callback on a plain user module: calibration, measured memory, controls, resume, errors."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_lowrank.callbacks import STACR, STACRLinear, apply_stac_r
from lit_lowrank.callbacks.stac_r import apply_checkpointing, galore_param_groups, total_memory_warning
from lit_lowrank.callbacks.stac_r_baselines import CheckpointedModule
from lit_lowrank.core import apply_loss_hooks
from lit_lowrank.ops.stac_r.saved_tensors import SavedTensorCounter, optimizer_state_bytes


class GeluUser(pl.LightningModule):
    """A user's module (not ours): GELU saves its *input*, so each Linear input is held by that Linear only."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.down(F.gelu(self.up(x))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        loss = apply_loss_hooks(self, batch, {"logits": None}, loss)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader(n: int = 256) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g) @ torch.randn(4, 32, generator=g) + 0.05 * torch.randn(n, 32, generator=g)
    return DataLoader(TensorDataset(x, torch.randint(0, 4, (n,), generator=g)), batch_size=64)


def _fit(callback: STACR, module: pl.LightningModule, steps: int = 3, **kwargs) -> pl.Trainer:
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, callbacks=[callback], **kwargs)
    trainer.fit(module, train_dataloaders=_loader())
    return trainer


def test_plain_module_fit_predicts_and_reduces_memory():
    torch.manual_seed(0)
    # step 0 calibrates, 1 and 2 measure the total peak (exact, compressed), 3 is diagnosed, 4 measured
    callback = STACR(rank=4, residual_density=0.02, bridge_every=3, measure_total=False)
    module = GeluUser()
    trainer = _fit(callback, module, steps=5)
    assert all(isinstance(getattr(module, n), STACRLinear) for n in ("up", "down", "head"))
    metrics = trainer.callback_metrics
    exact, measured = float(metrics["method/stac_r/exact_peak_saved_mib"]), float(metrics["method/stac_r/saved_mib"])
    assert measured < exact
    # the predictor saw every saved tensor: on this chain its prediction is the measurement
    assert callback.report["predicted_peak_bytes"] == callback.peak_saved_bytes
    assert 1 - measured / exact <= callback.report["ssp"] + 1e-12
    assert callback.report["increasing"] == []
    assert 0.9 < float(metrics["method/stac_r/grad_cosine_mean"]) <= 1.0
    assert "method/stac_r/total_reduction" not in metrics and callback.total == {}


class WideUser(GeluUser):
    """512-wide layers: with many rows per batch activations dominate, with two the optimizer step does."""

    def __init__(self) -> None:
        pl.LightningModule.__init__(self)
        self.up, self.down, self.head = nn.Linear(32, 512), nn.Linear(512, 512), nn.Linear(512, 4)

    def forward(self, x):
        return self.head(F.gelu(self.down(F.gelu(self.up(x)))))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)  # its state makes the optimizer step the floor


def _wide_loader(rows: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows * 4, 8, generator=g) @ torch.randn(8, 32, generator=g)
    return DataLoader(TensorDataset(x, torch.randint(0, 4, (rows * 4,), generator=g)), batch_size=rows)


def test_total_peak_is_measured_and_an_undelivered_saving_warns():
    # many rows: activations dominate and the measured total peak falls as predicted
    torch.manual_seed(0)
    callback = STACR(rank=8, residual_density=0.0, bridge_every=0)
    trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a delivered saving must not warn
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers|Memory block).*")
        trainer.fit(WideUser(), train_dataloaders=_wide_loader(2048))
    ref, measured = callback.total["reference"], callback.total["measured"]
    assert measured["peak"] < ref["peak"] and 0 < measured["reduction"] <= measured["predicted_reduction"] + 0.05
    metrics = trainer.callback_metrics
    assert float(metrics["method/stac_r/total_reduction"]) == pytest.approx(measured["reduction"])
    assert float(metrics["method/stac_r/ssp"]) >= measured["reduction"]
    # two rows: the optimizer step (parameters, gradients, AdamW state) sets the peak, nothing is delivered
    torch.manual_seed(0)
    callback = STACR(rank=8, residual_density=0.0, bridge_every=0)
    trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, callbacks=[callback])
    with pytest.warns(UserWarning, match="optimizer step"):
        trainer.fit(WideUser(), train_dataloaders=_wide_loader(2))
    measured = callback.total["measured"]
    assert measured["reduction"] <= 0  # nothing delivered: the optimizer step sets both peaks
    assert measured["optimizer_peak"] >= measured["activation_peak"]
    assert callback.total["reference"]["peak"] == callback.total["reference"]["optimizer_peak"]


def test_total_memory_warning_text():
    ref = {"activation_peak": 100 * 2**20, "optimizer_peak": 60 * 2**20, "peak": 100 * 2**20,
           "predicted_peak": 70 * 2**20}
    delivered = {"activation_peak": 72 * 2**20, "optimizer_peak": 60 * 2**20, "peak": 72 * 2**20}
    assert total_memory_warning(ref, delivered) is None
    floor = {"activation_peak": 95 * 2**20, "optimizer_peak": 99 * 2**20, "peak": 99 * 2**20}
    assert "optimizer step" in total_memory_warning(ref, floor)
    transient = {"activation_peak": 101 * 2**20, "optimizer_peak": 60 * 2**20, "peak": 101 * 2**20}
    assert "-1.0% reduction" in total_memory_warning(ref, transient)


def test_controls_track_freeze_or_refit_the_basis():
    torch.manual_seed(0)
    bases = {}
    for mode in ("tracked", "untracked", "svd", "random"):
        module = GeluUser()
        callback = STACR(rank=4, residual_density=0.0, basis=mode, bridge_every=0, measure_total=False)
        _fit(callback, module, steps=1)
        first = None if module.up.stac_r_basis is None else module.up.stac_r_basis.clone()
        trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[callback])
        trainer.fit(module, train_dataloaders=_loader())
        bases[mode] = (first, module.up.stac_r_basis)
    assert not torch.equal(*bases["tracked"])
    assert torch.equal(*bases["untracked"])  # frozen after step 0
    assert bases["svd"] == (None, None)  # a per-step basis is an activation, never state
    assert bases["random"] == (None, None)  # a per-step projection is regenerated from its seed, never state


def test_resume_keeps_the_bases(tmp_path):
    torch.manual_seed(0)
    callback = STACR(rank=4, residual_density=0.02, bridge_every=0, measure_total=False)
    trainer = _fit(callback, GeluUser(), steps=2)
    path = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(path)
    saved = {n: b.clone() for n, b in callback.state_dict()["bases"].items()}
    assert set(saved) == {"up", "down", "head"}

    seen = {}

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if not seen:
                seen.update({n: getattr(pl_module, n).stac_r_basis.clone() for n in saved})

    resumed_cb = STACR(rank=4, residual_density=0.02, bridge_every=0, measure_total=False)
    resumed = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[resumed_cb, Probe()])
    resumed.fit(GeluUser(), train_dataloaders=_loader(), ckpt_path=path)
    assert resumed_cb.calibrated  # no second calibration step after resume
    for name, basis in saved.items():
        torch.testing.assert_close(seen[name], basis, rtol=0, atol=0)


def test_memory_increasing_layers_are_named_and_can_be_skipped():
    class ReluUser(GeluUser):
        def forward(self, x):  # ReLU saves its output: `down`'s input stays held whatever STAC-R does
            return self.head(self.down(torch.relu(self.up(x))))

    torch.manual_seed(0)
    callback = STACR(rank=4, residual_density=0.02, skip_increasing=True, bridge_every=0, measure_total=False)
    module = ReluUser()
    with pytest.warns(UserWarning, match=r"\['down'\]"):
        _fit(callback, module)
    assert module.down.mode == "off" and module.up.mode == "compress"
    assert callback.state_dict()["skipped"] == ["down"]


def test_surgery_is_idempotent_and_keeps_state_dict_keys():
    module = GeluUser()
    keys = list(module.state_dict())
    first = apply_stac_r(module, rank=4)
    again = apply_stac_r(module, rank=4)
    assert first == again and list(module.state_dict()) == keys
    x = torch.randn(5, 32)
    module.eval()
    torch.testing.assert_close(module(x), GeluUser.forward(module, x))


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="rank"):
        apply_stac_r(GeluUser(), target=["head"], rank=33)  # rank = in_features (32) is the no-compression control
    with pytest.raises(ValueError, match="target"):
        apply_stac_r(GeluUser(), target="nothing")
    with pytest.raises(ValueError, match="basis"):
        apply_stac_r(GeluUser(), basis="gaussian")
    with pytest.raises(ValueError, match="residual_density"):
        STACR(residual_density=2.0)
    with pytest.raises(ValueError, match="coef_dtype"):
        STACR(coef_dtype="int4")


def test_generic_hook_path_codes_other_saved_tensors():
    torch.manual_seed(0)
    linear_only = STACR(rank=4, residual_density=0.02, bridge_every=0, measure_total=False)
    _fit(linear_only, GeluUser())
    torch.manual_seed(0)
    generic = STACR(rank=4, residual_density=0.02, bridge_every=0, saved_tensor_min_numel=1000, measure_total=False)
    _fit(generic, GeluUser())
    assert generic.peak_saved_bytes < linear_only.peak_saved_bytes  # GELU's saved input is coded too
    assert generic.state_dict()["hook_bases"]  # its tracked bases are callback state as well


def test_random_projection_control_matches_the_tracked_bytes_and_redraws():
    torch.manual_seed(0)
    x = torch.randn(128, 32, requires_grad=True)
    layers = {mode: STACRLinear(nn.Linear(32, 16), rank=4, residual_density=0.05, basis_mode=mode)
              for mode in ("tracked", "random")}
    held, grads = {}, {}
    for mode, layer in layers.items():
        with SavedTensorCounter() as counter:
            y = layer(x)
            held[mode] = counter.current_bytes
            y.square().sum().backward()
        grads[mode] = layer.weight.grad.clone()
        assert held[mode] == layer.code_nbytes(128)
    # tracked: 128x4 bf16 coefficients + 205 residual entries (int8 + int32 index) + a scale = 2053 bytes; the
    # random code spends those bytes on coefficients only: width (2053 - 4) // (128 * 2) = 8 -> 2052 bytes
    assert held["tracked"] == 128 * 4 * 2 + 205 * 5 + 4 == 2053
    assert layers["random"]._rank_for(128) == 8 and held["random"] == 128 * 8 * 2 + 4 == 2052
    layer = layers["random"]
    assert layer.stac_r_basis is None  # nothing persistent: a fresh projection each step
    layer.weight.grad = None
    layer(x).square().sum().backward()
    assert not torch.equal(layer.weight.grad, grads["random"])
    assert STACR(basis="random").surgery["basis"] == "random"


class Blocks(nn.Module):
    """Residual MLP blocks called with a keyword argument, like a transformer layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(4))
        for block in self.layers:
            block.forward = lambda h, scale, _b=block: nn.Sequential.forward(_b, h) * scale
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = x
        for block in self.layers:
            h = h + block(h, scale=0.5)
        return self.head(h)


def test_checkpointing_gives_exact_gradients_and_less_saved_memory():
    torch.manual_seed(0)
    plain = Blocks()
    ckpt = Blocks()
    ckpt.load_state_dict(plain.state_dict())
    assert apply_checkpointing(ckpt, r"layers\.\d+$") == [f"layers.{i}" for i in range(4)]
    apply_checkpointing(ckpt, r"layers\.\d+$")  # idempotent
    assert all(isinstance(block, CheckpointedModule) and isinstance(block.module, nn.Sequential)
               for block in ckpt.layers)
    assert list(ckpt.state_dict()) == list(plain.state_dict())  # the wrapper's level is not in the keys
    ckpt.load_state_dict(plain.state_dict())  # strict: the wrapper adds its level back on load
    x = torch.randn(256, 32, requires_grad=True)
    peaks = {}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        with SavedTensorCounter() as counter:
            model(x).square().mean().backward()
        peaks[name] = counter.peak_bytes
        assert counter.current_bytes == 0
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-7), n
    assert peaks["ckpt"] < peaks["plain"]
    # an input needing no grad runs plainly (reentrant checkpointing would lose the parameter gradients)
    ckpt.zero_grad()
    ckpt(torch.randn(8, 32)).sum().backward()
    assert ckpt.layers[0][0].weight.grad is not None
    # switched off, every block keeps its saved tensors again
    for block in ckpt.layers:
        block.stac_r_checkpoint = False
    with SavedTensorCounter() as counter:
        ckpt(x).square().mean().backward()
    assert counter.peak_bytes == peaks["plain"]


def test_galore_composition_runs_a_step():
    galore_torch = pytest.importorskip("galore_torch")
    torch.manual_seed(0)
    module = GeluUser()
    apply_stac_r(module, target=["up", "down"], rank=4, residual_density=0.02)
    groups = galore_param_groups(module, target=["up", "down"], rank=4, update_proj_gap=10)
    assert len(groups[1]["params"]) == 2 and groups[1]["rank"] == 4
    opt = galore_torch.GaLoreAdamW(groups, lr=1e-2, no_deprecation_warning=True)
    x, y = next(iter(_loader()))
    before = module.up.weight.detach().clone()
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert not torch.equal(before, module.up.weight) and losses[-1] < losses[0]
    assert opt.state[module.up.weight]["exp_avg"].numel() == 4 * 64  # projected moment, not the (64, 32) weight
    ref = GeluUser()
    adam = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    F.cross_entropy(ref(x), y).backward()
    adam.step()
    assert optimizer_state_bytes(opt) < optimizer_state_bytes(adam)
    with pytest.raises(ValueError, match="rank"):
        galore_param_groups(module, target=["up"], rank=0)
