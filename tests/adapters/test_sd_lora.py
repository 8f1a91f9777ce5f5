"""SD-LoRA in fit: the teacher trains and is distilled, and the exported inference model holds no teacher."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.adapters.sd_lora import SDLoRA
from lit_lowrank.datamodules.fewshot import FewShotDigitsDataModule, collect
from lit_lowrank.ops.macs import count_macs
from lit_lowrank.tasks.fewshot_clip import FewShotCLIPModule
from tests.adapters.sd_lora_plain import tiny_encoder

NAMES = ["five", "six", "seven", "eight", "nine"]


def _fit(callbacks, steps=3, seed=0):
    pl.seed_everything(seed, verbose=False)
    module = FewShotCLIPModule(encoder=tiny_encoder(), class_names=NAMES, template="a photo of the digit {}.")
    dm = FewShotDigitsDataModule(shots=2, seed=seed, repeats=1, batch_size=10)
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=callbacks, accelerator="cpu")
    trainer.fit(module, datamodule=dm)
    return module, dm, trainer


def test_teacher_trains_but_is_absent_from_the_exported_model(one_thread):
    callback = SDLoRA(teacher_warmup_steps=3, lambda_relation=1.0, lambda_ppa=1.0)
    module, dm, trainer = _fit([callback])
    teacher = callback.teacher
    assert teacher is not None and callback.warmed_up
    for key in ("relation_loss", "ppa_loss", "teacher_loss", "agreement_patch_text", "agreement_patch_patch"):
        assert torch.isfinite(trainer.callback_metrics[f"method/sd_lora/{key}"]), key
    teacher_params = {id(p) for p in teacher.parameters()}
    teacher_storage = {p.data_ptr() for p in teacher.parameters()}
    assert not teacher_params & {id(p) for p in module.parameters()}
    assert not any("teacher" in k for k in module.state_dict())

    baseline, _, _ = _fit([])  # CLIP-LoRA: same module, no callback
    classifier = module.export_inference_model(dm)
    reference = baseline.export_inference_model(dm)
    state = classifier.state_dict()
    assert list(state) == list(reference.state_dict())
    assert not any("teacher" in k for k in state)
    assert not teacher_storage & {t.data_ptr() for t in state.values()}
    assert not any("lora" in k for k in state)  # LoRA merged into the image tower

    calls = {"n": 0}
    hooks = [m.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1)) for m in teacher.modules()]
    x, y = collect(dm.test_dataloader())
    x = x[:64]
    with torch.no_grad():
        logits = classifier(x)
        expected = module.eval()(x)  # the unmerged module with its fitted cache gives the same logits
    for h in hooks:
        h.remove()
    assert calls["n"] == 0, "the teacher ran at inference"
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    # equal inference cost: the same Linear/conv MACs as the CLIP-LoRA export
    assert count_macs(classifier, x)[0] == count_macs(reference, x)[0]


def test_callback_state_round_trip(one_thread, tmp_path):
    callback = SDLoRA(teacher_warmup_steps=2)
    _fit([callback], steps=2)
    state = callback.state_dict()
    fresh = SDLoRA(teacher_warmup_steps=2)
    fresh.load_state_dict(state)  # before setup: kept pending, applied when the teacher is built
    assert fresh._pending is not None
    for a, b in zip(state["teacher"].values(), callback.teacher.state_dict().values()):
        assert torch.equal(a, b)


def test_callback_rejects_a_module_without_the_protocol(one_thread, tmp_path):
    from tests.methods.plain import PlainUserClassifier

    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         callbacks=[SDLoRA()], default_root_dir=tmp_path)
    with pytest.raises(TypeError, match="frozen_graph_inputs"):
        trainer.fit(PlainUserClassifier(), datamodule=FewShotDigitsDataModule(shots=1))


def test_parameter_errors():
    with pytest.raises(ValueError, match="lambda_ppa"):
        SDLoRA(lambda_ppa=-1)
    with pytest.raises(ValueError, match="teacher_inputs"):
        SDLoRA(teacher_inputs="student")
    with pytest.raises(ValueError, match="crops"):
        SDLoRA(crops=3)
