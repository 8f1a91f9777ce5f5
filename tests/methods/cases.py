"""Contract cases: how the generic suite builds each method on a plain module.

Every implemented method of kind callback / mixin / adapter adds one entry to
:data:`CASES` (a zero-argument factory returning a :class:`ContractCase`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
from torch import nn


@dataclass
class ContractCase:
    """How to run one method in the contract suite.

    Attributes:
        name: the registry name.
        make_callbacks: fresh method callbacks (for a Trainer).
        make_module: a plain user LightningModule the method is applied to.
        make_data: a datamodule whose batches the module accepts.
        apply: the functional surgery form ``apply(model) -> model`` (structural methods).
        make_task_module: one of our task modules, for ``load_from_checkpoint``.
        stateful / structural / ddp: which contracts apply.
        make_sharded_callbacks: the callbacks of the FSDP2 run when they differ (a diagnostics callback that
            refuses FSDP left out, so the method itself is run sharded); ``None``: ``make_callbacks``.
    """

    name: str
    make_callbacks: Callable[[], list[pl.Callback]]
    make_module: Callable[[], pl.LightningModule]
    make_data: Callable[[], pl.LightningDataModule]
    apply: Callable[[nn.Module], nn.Module] | None = None
    make_task_module: Callable[[], pl.LightningModule] | None = None
    stateful: bool = False
    structural: bool = False
    ddp: bool = False
    configs: list[str] = field(default_factory=list)
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    make_sharded_callbacks: Callable[[], list[pl.Callback]] | None = None


def _digits():
    from lit_lowrank.datamodules import DigitsDataModule

    return DigitsDataModule(batch_size=32)


def reference_case() -> ContractCase:
    from lit_lowrank.tasks import ClassificationModule
    from tests.methods.plain import PlainUserClassifier
    from tests.methods.reference_method import ReferenceMethod, apply_gain

    return ContractCase(
        name="reference",
        make_callbacks=lambda: [ReferenceMethod()],
        make_module=PlainUserClassifier,
        make_data=_digits,
        apply=apply_gain,
        make_task_module=lambda: ClassificationModule("mlp", num_classes=10, in_chans=1,
                                                      backbone_kwargs={"in_features": 64, "hidden_sizes": [32]}),
        stateful=True, structural=True, ddp=True,
    )


def safecut_case() -> ContractCase:
    from lit_lowrank.callbacks import SafeCut
    from lit_lowrank.datamodules import ShiftedDigitsDataModule
    from lit_lowrank.models import DigitPrototypeClassifier
    from tests.methods.plain import PlainUserClassifier

    return ContractCase(
        name="safecut",
        make_callbacks=lambda: [SafeCut(DigitPrototypeClassifier(), k=5)],
        make_module=PlainUserClassifier,
        make_data=lambda: ShiftedDigitsDataModule(shift="rotate", batch_size=32),
        stateful=True,
    )


def specdrop_case() -> ContractCase:
    from lit_lowrank.mixins import apply_specdrop
    from lit_lowrank.tasks import ClassificationModule
    from tests.mixins.plain import PlainSpecDropClassifier

    return ContractCase(
        name="specdrop",
        make_callbacks=list,
        make_module=PlainSpecDropClassifier,  # applies apply_specdrop in __init__, sets the category in its step
        make_data=_digits,
        apply=lambda m: apply_specdrop(m, target=r"body\.1$", num_branches=3, merge="specdrop", in_features=64),
        make_task_module=lambda: ClassificationModule(
            "mlp", num_classes=10, in_chans=1, backbone_kwargs={"in_features": 64, "hidden_sizes": [32, 32]},
            branches={"target": r"backbone\.layers\.2$", "num_branches": 3, "missing_category": "uniform"}),
        structural=True, ddp=True,
    )


def sara_case() -> ContractCase:
    from lit_lowrank.callbacks import SARA
    from tests.callbacks.sara_plain import PlainUserDiffusion

    return ContractCase(
        name="sara",
        # validation at the last step runs SARA's sampling diagnostic (calibration + sampling) in fit
        make_callbacks=lambda: [SARA(mode="dp", budget=0.6, num_inference_steps=3, calibration_samples=2,
                                     eval_samples=2)],
        make_module=PlainUserDiffusion,
        make_data=_digits,
        trainer_kwargs={"limit_val_batches": 1, "val_check_interval": 3, "num_sanity_val_steps": 0},
    )


def stac_r_case() -> ContractCase:
    from lit_lowrank.callbacks import STACR, apply_stac_r
    from lit_lowrank.tasks import ClassificationModule
    from tests.methods.plain import PlainUserClassifier

    def apply(model):
        apply_stac_r(model, rank=8, residual_density=0.05)
        return model

    return ContractCase(
        name="stac_r",
        make_callbacks=lambda: [STACR(rank=8, residual_density=0.05, bridge_every=2)],
        make_module=PlainUserClassifier,
        make_data=_digits,
        apply=apply,
        make_task_module=lambda: ClassificationModule("mlp", num_classes=10, in_chans=1,
                                                      backbone_kwargs={"in_features": 64, "hidden_sizes": [32]}),
        stateful=True, structural=True, ddp=True,
    )


def sphquant_case() -> ContractCase:
    from lit_lowrank.quant import SPHQuantizer, quantize_sph
    from lit_lowrank.tasks import ClassificationModule
    from tests.methods.plain import PlainUserClassifier

    fmt = {"codebook_size": 16, "radius_bits": 3, "group_size": 32, "finetune_steps": 5}

    def apply(model):
        quantize_sph(model, **fmt)
        return model

    return ContractCase(
        name="sphquant",
        make_callbacks=lambda: [SPHQuantizer(**fmt, after_fit=True)],  # quantizes at on_fit_end
        make_module=PlainUserClassifier,
        make_data=_digits,
        apply=apply,
        make_task_module=lambda: ClassificationModule("mlp", num_classes=10, in_chans=1,
                                                      backbone_kwargs={"in_features": 64, "hidden_sizes": [32]}),
        structural=True,
    )


def _adapter_case(method: str) -> ContractCase:
    """An ``AdapterInjector`` variant on the plain classifier and the task module's MLP.

    One pattern for both modules: the plain module's ``body.1`` and the task module's first MLP layer. Rank 4
    (for SaMA: the parameter budget of a rank-4 LoRA, spent on the highest-rank relaxed-Kronecker shape).
    """
    from lit_lowrank.adapters import AdapterDiagnostics, AdapterInjector, inject_adapters
    from lit_lowrank.tasks import ClassificationModule
    from tests.methods.plain import PlainUserClassifier

    kwargs = {"method": method, "target_modules": r"(body\.1|backbone\.layers\.0)$", "rank": 4, "alpha": 8,
              "modules_to_save": r"head$"}
    return ContractCase(
        name=method,
        make_callbacks=lambda: [AdapterInjector(**kwargs), AdapterDiagnostics(every_n_steps=2)],
        make_module=PlainUserClassifier,
        make_data=_digits,
        apply=lambda m: inject_adapters(m, **kwargs),
        make_task_module=lambda: ClassificationModule("mlp", num_classes=10, in_chans=1,
                                                      backbone_kwargs={"in_features": 64, "hidden_sizes": [32]}),
        structural=True, ddp=True,
        # AdapterDiagnostics refuses FSDP (torch.func.jvp on DTensors; tests/methods/test_distributed.py)
        make_sharded_callbacks=lambda: [AdapterInjector(**kwargs)],
    )


def sds_lora_case() -> ContractCase:
    return _adapter_case("sds_lora")


def sama_case() -> ContractCase:
    return _adapter_case("sama")


def polar_vbll_case() -> ContractCase:
    from lit_lowrank.adapters.polar_vbll import PoLARVBLL, apply_polar_vbll
    from lit_lowrank.tasks import ClassificationModule
    from tests.methods.plain import PlainUserClassifier

    target = r"(body\.1|backbone\.layers\.0)$"  # the plain module's and the task module's first Linear
    return ContractCase(
        name="polar_vbll",
        make_callbacks=lambda: [PoLARVBLL(target_modules=target, rank=4,
                                          phases=[{"train": ["adapter"], "steps": 1}, {"train": ["head"], "steps": 1}])],
        make_module=PlainUserClassifier,
        make_data=_digits,
        apply=lambda m: apply_polar_vbll(m, num_train=100, target_modules=target, rank=4),
        make_task_module=lambda: ClassificationModule("mlp", num_classes=10, in_chans=1,
                                                      backbone_kwargs={"in_features": 64, "hidden_sizes": [32]}),
        structural=True,
    )


def moe_quant_case() -> ContractCase:
    from lit_lowrank.callbacks import MoEQuantQAT, RoutingReplay
    from lit_lowrank.datamodules.text import PackedTextDataModule
    from tests.callbacks.moe_plain import PlainUserMoELM

    # structural (experts swapped in setup) but the generic reload test feeds batch["x"]; the
    # CausalLMModule reload and idempotence are tested in tests/quant/test_moe.py
    return ContractCase(
        name="moe_quant",
        make_callbacks=lambda: [MoEQuantQAT(avg_rank=2, calibration_batches=1), RoutingReplay()],
        make_module=PlainUserMoELM,
        make_data=lambda: PackedTextDataModule(seq_len=32, batch_size=2, max_documents=8),
    )


def sd_lora_case() -> ContractCase:
    from lit_lowrank.adapters.sd_lora import SDLoRA
    from lit_lowrank.datamodules.fewshot import FewShotDigitsDataModule
    from tests.adapters.sd_lora_plain import PlainFewShotCLIP

    return ContractCase(
        name="sd_lora",
        make_callbacks=lambda: [SDLoRA(teacher_warmup_steps=2)],  # the teacher lives in the callback's state
        make_module=PlainFewShotCLIP,
        make_data=lambda: FewShotDigitsDataModule(shots=2, repeats=2, batch_size=5),
        stateful=True,
    )


#: method name -> case factory. The reference method is always present so the suite is
#: exercised before (and besides) the real methods.
CASES: dict[str, Callable[[], ContractCase]] = {
    "moe_quant": moe_quant_case,
    "reference": reference_case,
    "polar_vbll": polar_vbll_case,
    "safecut": safecut_case,
    "sama": sama_case,
    "sara": sara_case,
    "sd_lora": sd_lora_case,
    "sds_lora": sds_lora_case,
    "specdrop": specdrop_case,
    "sphquant": sphquant_case,
    "stac_r": stac_r_case,
}
