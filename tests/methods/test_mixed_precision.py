"""Mixed precision over the method registry: a 2-step fit under ``bf16-mixed`` and fp16 autocast.

Every fit-time method (each :data:`~tests.methods.cases.CASES` entry, plus the adapter variants
``AdapterInjector`` builds in) trains two steps on the CPU with ``precision="bf16-mixed"``.

fp16: Lightning maps ``Trainer(accelerator="cpu", precision="16-mixed")`` to ``bf16-mixed``
(``accelerator_connector.py``: "AMP with fp16 is not supported on CPU"), so the fp16 fit is run
through the precision plugin itself — ``MixedPrecision("16-mixed", "cpu")`` with a CPU
``GradScaler`` — which is exactly what ``16-mixed`` does on a GPU (fp16 autocast + loss scaling).
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from lit_lowrank.adapters.variants import BUILTIN_METHODS, available_variants
from tests.methods.cases import CASES, ContractCase, _adapter_case

REGISTRY_CASES = sorted(CASES)
#: adapter variants without a registry entry of their own (``lora``, ``polar``, ...) run through the injector
EXTRA_ADAPTERS = sorted((set(BUILTIN_METHODS) | set(available_variants())) - set(CASES))


def _fit(case: ContractCase, tmp_path: Path, **precision) -> pl.Trainer:
    module = case.make_module()
    kwargs = dict(max_steps=2, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                  accelerator="cpu", devices=1, **precision)
    kwargs.update({k: v for k, v in case.trainer_kwargs.items() if k not in kwargs or k == "limit_val_batches"})
    probe = _Probe()
    trainer = pl.Trainer(callbacks=[*case.make_callbacks(), probe], **kwargs)
    trainer.fit(module, datamodule=case.make_data())
    assert trainer.global_step == 2
    loss = trainer.callback_metrics.get("train/loss")
    assert loss is not None and math.isfinite(float(loss))
    assert all(torch.isfinite(p).all() for p in probe.after.values())
    assert probe.moved(), "no trainable weight moved in two mixed-precision steps"
    return trainer


class _Probe(pl.Callback):
    """Snapshots the trainable parameters once surgery is done (at train start) to see that a step moved one."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.before = {n: p.detach().clone() for n, p in pl_module.named_parameters() if p.requires_grad}

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # before on_fit_end, where a post-training method (SPHQuant) replaces the trained layers
        self.after = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def moved(self) -> bool:
        return any(n in self.before and not torch.equal(self.before[n], p) for n, p in self.after.items())


def _case(name: str) -> ContractCase:
    return CASES[name]() if name in CASES else _adapter_case(name)


@pytest.mark.parametrize("name", REGISTRY_CASES + EXTRA_ADAPTERS)
def test_bf16_mixed_fit(name, tmp_path):
    trainer = _fit(_case(name), tmp_path, precision="bf16-mixed")
    assert trainer.precision == "bf16-mixed"


@pytest.mark.parametrize("name", REGISTRY_CASES + EXTRA_ADAPTERS)
def test_fp16_mixed_fit(name, tmp_path):
    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    trainer = _fit(_case(name), tmp_path, plugins=[plugin])
    assert trainer.precision == "16-mixed"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_custom_functions_match_autograd_under_autocast(dtype):
    """The two custom autograd Functions give autograd's gradients (in the inputs' dtypes) under autocast."""
    from lit_lowrank.ops.sds_lora import sds_lora_delta
    from lit_lowrank.ops.stac_r.compress import init_basis, stac_r_linear

    torch.manual_seed(0)
    x = torch.randn(4, 6, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    basis = init_basis(x.detach().reshape(-1, 16), 16)  # full rank, exact mode: the reference is plain F.linear
    with torch.autocast("cpu", dtype=dtype):
        y = stac_r_linear(x, w, b, basis, density=0.0, exact=True)
        y_ref = torch.nn.functional.linear(x, w, b)
    assert y.dtype == y_ref.dtype == dtype
    grads = torch.autograd.grad(y.float().square().sum(), (x, w, b))
    refs = torch.autograd.grad(y_ref.float().square().sum(), (x, w, b))
    for g, r in zip(grads, refs):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-2 * float(r.abs().max()))

    a = torch.randn(3, 16, requires_grad=True)
    bb = torch.randn(8, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        h = sds_lora_delta(x, a, bb, scaling=0.5)
    assert h.dtype == dtype
    gx, ga, gb = torch.autograd.grad(h.float().sum(), (x, a, bb))
    assert gx.dtype == ga.dtype == gb.dtype == torch.float32
    with torch.autocast("cpu", dtype=dtype):  # ∂x is exact: the same as plain autograd through the product
        ref_x, = torch.autograd.grad((0.5 * (x @ a.t()) @ bb.t()).float().sum(), (x,))
    torch.testing.assert_close(gx, ref_x, rtol=2e-2, atol=2e-2 * float(ref_x.abs().max()))
