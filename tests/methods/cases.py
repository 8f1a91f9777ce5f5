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


#: method name -> case factory. The reference method is always present so the suite is
#: exercised before (and besides) the real methods.
CASES: dict[str, Callable[[], ContractCase]] = {
    "reference": reference_case,
    "safecut": safecut_case,
    "sara": sara_case,
    "specdrop": specdrop_case,
    "sphquant": sphquant_case,
    "stac_r": stac_r_case,
}
