"""PoLAR-VBLL (adapters/polar_vbll.py): the alternating schedule, the ELBO hook, the task-module metrics."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.adapters.polar_vbll import AlternatingSchedule, PoLARVBLL, apply_polar_vbll, find_vbll_head
from lit_lowrank.datamodules import DigitsDataModule
from lit_lowrank.ops.vbll import VBLLHead
from lit_lowrank.tasks import ClassificationModule

pytest.importorskip("vbll")
TARGET = r"backbone\.layers\.(0|2)$"


def _module() -> ClassificationModule:
    torch.manual_seed(0)
    return ClassificationModule("mlp", num_classes=10, in_chans=1,
                                backbone_kwargs={"in_features": 64, "hidden_sizes": [32, 32]})


def _trainer(tmp_path, callbacks, max_steps):
    return pl.Trainer(max_steps=max_steps, callbacks=callbacks, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, accelerator="cpu", devices=1)


class _StepRecorder(pl.Callback):
    """Which parameters moved in each optimizer step, and which were trainable."""

    def __init__(self):
        self.moved: list[set[str]] = []
        self.trainable: list[set[str]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._before = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.trainable.append({n for n, p in pl_module.named_parameters() if p.requires_grad})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.moved.append({n for n, p in pl_module.named_parameters() if not torch.equal(p, self._before[n])})


def test_alternating_schedule_freezes_exactly_the_intended_groups(tmp_path, one_thread):
    module = _module()
    method = PoLARVBLL(target_modules=TARGET, rank=4,
                       phases=[{"train": ["adapter"], "steps": 2}, {"train": ["head"], "steps": 3}])
    recorder = _StepRecorder()  # after the method: records the requires_grad it set
    _trainer(tmp_path, [method, recorder], max_steps=7).fit(module, datamodule=DigitsDataModule(batch_size=32))
    names = [n for n, _ in module.named_parameters()]
    adapter = {n for n in names if ".lora_X." in n or ".lora_Y." in n or ".lora_theta." in n}
    head = {n for n in names if n.startswith("head.layer.") and n != "head.layer.noise_mean"}  # noise_mean: fixed
    assert len(adapter) == 6 and len(head) == 3  # X, Θ, Y on two layers; W mean, W log-diag, noise log-diag
    expected = [adapter, adapter, head, head, head, adapter, adapter]  # cycle of 2 + 3 steps
    assert recorder.trainable == expected
    for step, (moved, want) in enumerate(zip(recorder.moved, expected)):
        assert moved == want, f"step {step}: moved {sorted(moved ^ want)} unexpectedly"
    # after fit every managed parameter is trainable again; base weights and biases stay frozen
    assert {n for n, p in module.named_parameters() if p.requires_grad} == adapter | head
    assert not module.backbone.layers[0].base_layer.weight.requires_grad


def test_phase_at_and_validation():
    schedule = AlternatingSchedule([{"train": ["adapter"], "steps": 2}, {"train": ["head"], "steps": 1}])
    assert [schedule.phase_at(s) for s in range(7)] == [0, 0, 1, 0, 0, 1, 0]
    with pytest.raises(ValueError, match="steps"):
        AlternatingSchedule([{"train": ["adapter"], "steps": 0}])
    with pytest.raises(ValueError, match="train"):
        AlternatingSchedule([{"train": ["backbone"], "steps": 1}])


def test_loss_hook_returns_the_negative_elbo(tmp_path, one_thread):
    seen = {}

    class Probe(PoLARVBLL):
        def on_loss(self, trainer, pl_module, batch, outputs, loss):
            new = super().on_loss(trainer, pl_module, batch, outputs, loss)
            seen["loss"] = new.detach()
            seen["elbo"] = find_vbll_head(pl_module).elbo_loss(outputs["features"], batch["y"]).detach()
            seen["ce"] = outputs["loss"].detach()
            return new

    module = _module()
    _trainer(tmp_path, [Probe(target_modules=TARGET, rank=4, num_train=1079)], max_steps=1).fit(
        module, datamodule=DigitsDataModule(batch_size=32))
    torch.testing.assert_close(seen["loss"], seen["elbo"])
    assert not torch.allclose(seen["loss"], seen["ce"])
    head = find_vbll_head(module)
    assert head.num_train == 1079 and head.layer.regularization_weight == pytest.approx(1 / 1079)


def test_apply_is_idempotent_and_starts_from_the_linear_head():
    module = _module()
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        before = module(x).softmax(-1)
    apply_polar_vbll(module, num_train=50, target_modules=TARGET, rank=4)
    head = module.head
    apply_polar_vbll(module, num_train=50, target_modules=TARGET, rank=4)
    assert module.head is head and isinstance(head, VBLLHead)
    with torch.no_grad():  # ΔW = 0 at init and the posterior mean is the old head
        torch.testing.assert_close(head.predictive(module.backbone(x), "mean"), before)
    with pytest.raises(ValueError, match="head"):
        apply_polar_vbll(torch.nn.Sequential(torch.nn.Linear(3, 3)), num_train=5, head="head", adapter=None)


def test_classification_module_logs_calibration_and_ood_auroc(tmp_path, one_thread):
    class WithOOD(DigitsDataModule):
        def val_dataloader(self):
            loader = super().val_dataloader()
            gen = torch.Generator().manual_seed(0)
            noise = [{"x": torch.randn(1, 8, 8, generator=gen) * 3, "y": 0} for _ in range(64)]
            return [loader, torch.utils.data.DataLoader(noise, batch_size=32)]

    module = _module()
    trainer = pl.Trainer(max_steps=2, callbacks=[PoLARVBLL(target_modules=TARGET, rank=4)], default_root_dir=tmp_path,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=2, accelerator="cpu", devices=1)
    data = WithOOD(batch_size=32)
    trainer.fit(module, datamodule=data)
    metrics = trainer.validate(module, datamodule=data, verbose=False)[0]
    metrics = {k: torch.as_tensor(v) for k, v in {**metrics, **trainer.callback_metrics}.items()}
    for key in ("val/ece/dataloader_idx_0", "val/nll/dataloader_idx_0", "val/brier/dataloader_idx_0",
                "val/ood_auroc"):
        assert key in metrics and torch.isfinite(metrics[key]), key
    assert 0.0 <= float(metrics["val/ood_auroc"]) <= 1.0


def test_mle_warm_start_trains_the_posterior_mean_and_adapters_first(tmp_path, one_thread):
    module = _module()
    seen = []

    class Probe(PoLARVBLL):
        def on_loss(self, trainer, pl_module, batch, outputs, loss):
            new = super().on_loss(trainer, pl_module, batch, outputs, loss)
            mean, _ = self._head.logit_moments(outputs["features"])
            seen.append((float(new), float(torch.nn.functional.cross_entropy(mean, batch["y"]))))
            return new

    method = Probe(target_modules=TARGET, rank=4, warmup_steps=2,
                   phases=[{"train": ["adapter"], "steps": 1}, {"train": ["head"], "steps": 1}])
    recorder = _StepRecorder()
    _trainer(tmp_path, [method, recorder], max_steps=4).fit(module, datamodule=DigitsDataModule(batch_size=32))
    names = [n for n, _ in module.named_parameters()]
    adapter = {n for n in names if ".lora_X." in n or ".lora_Y." in n or ".lora_theta." in n}
    head = {n for n in names if n.startswith("head.layer.") and n != "head.layer.noise_mean"}
    # warm start: everything managed trains on the mean logits' cross-entropy; then the phases, from phase 0
    assert recorder.trainable == [adapter | head, adapter | head, adapter, head]
    assert "head.layer.W_mean" in recorder.moved[0] and adapter <= recorder.moved[0]
    assert [round(a, 5) for a, _ in seen[:2]] == [round(b, 5) for _, b in seen[:2]]  # the loss is that CE
    assert seen[2][0] != pytest.approx(seen[2][1])  # then the negative ELBO
    with pytest.raises(ValueError, match="warmup_steps"):
        PoLARVBLL(target_modules=TARGET, warmup_steps=-1)


def test_elbo_covariance_init_starts_q_w_at_the_elbo_optimum_once(tmp_path, one_thread):
    """``covariance_init="elbo"``: on the first ELBO step (after the warm start) the hook sets the covariance to
    :meth:`VBLLHead.fit_covariance_` of that batch's features, then leaves it to the optimizer."""
    module = _module()
    changes = []

    class Probe(PoLARVBLL):
        def on_loss(self, trainer, pl_module, batch, outputs, loss):
            before = self._head.layer.W_logdiag.detach().clone()
            reference = copy.deepcopy(self._head).fit_covariance_(outputs["features"].detach())
            new = super().on_loss(trainer, pl_module, batch, outputs, loss)
            after = self._head.layer.W_logdiag.detach()
            changes.append((not torch.equal(before, after), torch.allclose(after, reference.layer.W_logdiag)))
            return new

    method = Probe(target_modules=TARGET, rank=4, warmup_steps=2, phases=[], covariance_init="elbo")
    _trainer(tmp_path, [method], max_steps=4).fit(module, datamodule=DigitsDataModule(batch_size=32))
    assert [c for c, _ in changes] == [False, False, True, False]
    assert changes[2][1]
    with pytest.raises(ValueError, match="covariance_init"):
        PoLARVBLL(target_modules=TARGET, covariance_init="laplace")
    with pytest.raises(ValueError, match="diagonal"):
        PoLARVBLL(target_modules=TARGET, covariance_init="elbo", head_kwargs={"parameterization": "dense"})


def test_a_checkpoint_evaluates_without_a_datamodule_and_fit_rescales_the_kl(tmp_path, one_thread):
    """`trainer.predict(fresh_module, dataloaders=..., ckpt_path=...)` (no datamodule, so no training-set size: the
    SmolLM2 run's evaluation path) builds the VBLL head, loads the checkpoint and predicts what the trained module
    predicts; a later fit with a datamodule scales the KL by that datamodule's N, not the placeholder."""
    dm = DigitsDataModule(batch_size=32)
    module = _module()
    trainer = _trainer(tmp_path, [PoLARVBLL(target_modules=TARGET, rank=4)], max_steps=3)
    trainer.fit(module, datamodule=dm)
    ckpt = tmp_path / "polar_vbll.ckpt"
    trainer.save_checkpoint(ckpt)
    loader = dm.test_dataloader()
    module.eval()
    with torch.no_grad():
        expected = torch.cat([module(batch["x"]).softmax(-1) for batch in loader])

    fresh = _module()
    evaluator = pl.Trainer(callbacks=[PoLARVBLL(target_modules=TARGET, rank=4)], default_root_dir=tmp_path,
                           logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                           devices=1)
    got = torch.cat(evaluator.predict(fresh, dataloaders=loader, ckpt_path=ckpt))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(find_vbll_head(fresh).layer.W_mean, find_vbll_head(module).layer.W_mean)

    _trainer(tmp_path, [PoLARVBLL(target_modules=TARGET, rank=4)], max_steps=1).fit(fresh, datamodule=dm)
    n = len(dm.train_dataloader().dataset)
    head = find_vbll_head(fresh)
    assert head.num_train == n and head.layer.regularization_weight == pytest.approx(1 / n)
