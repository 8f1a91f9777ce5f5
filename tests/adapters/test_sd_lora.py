"""SD-LoRA in fit: the teacher trains and is distilled, and the exported inference model holds no teacher."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.adapters.sd_lora import SDLoRA, target_entropy
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


def _module_and_batch(seed=0):
    torch.manual_seed(seed)
    module = FewShotCLIPModule(encoder=tiny_encoder(), class_names=NAMES, template="a photo of the digit {}.")
    dm = FewShotDigitsDataModule(shots=2, seed=seed, repeats=1, batch_size=10, max_shift=0)
    dm.setup("fit")
    return module.train(), next(iter(dm.support_dataloader()))


def _sd_lora_gradients(teacher_inputs, lambda_teacher=1.0, lambda_logit=0.0):
    """LoRA gradients of the SD-LoRA terms alone (CE excluded), only the teacher's cross-entropy switched on
    (and, with ``lambda_logit``, the distillation of its logits into the deployed path)."""
    module, batch = _module_and_batch()
    callback = SDLoRA(lambda_teacher=lambda_teacher, lambda_relation=0.0, lambda_ppa=0.0, lambda_logit=lambda_logit,
                      teacher_inputs=teacher_inputs)
    callback.setup(None, module, "fit")
    callback.warmed_up = True
    outputs = module.step(batch)
    extra = callback.on_loss(None, module, batch, outputs, torch.zeros(()))
    extra.backward()
    lora = {n: p.grad for n, p in module.named_parameters() if "lora_" in n}
    teacher = [p.grad for p in callback.teacher.parameters()]
    return lora, teacher


def test_teacher_gradients_reach_the_shared_lora_only_from_the_adapted_towers(one_thread):
    lora, teacher = _sd_lora_gradients("adapted")
    # lora_B starts at zero, so the first gradient shows on B (dL/dB = g · (A x)ᵀ), in both towers
    image_b = [g for n, g in lora.items() if "vision_model" in n and "lora_B" in n]
    text_b = [g for n, g in lora.items() if "text_model" in n and "lora_B" in n]
    assert image_b and text_b
    assert all(g is not None for g in image_b + text_b)
    assert sum(float(g.abs().sum()) for g in image_b) > 0 and sum(float(g.abs().sum()) for g in text_b) > 0
    assert any(g is not None and float(g.abs().sum()) > 0 for g in teacher)  # the same loss trains the teacher
    lora_frozen, teacher_frozen = _sd_lora_gradients("frozen")
    assert all(g is None or float(g.abs().sum()) == 0 for g in lora_frozen.values())
    assert any(g is not None and float(g.abs().sum()) > 0 for g in teacher_frozen)


def test_the_teachers_logits_are_distilled_into_the_deployed_path(one_thread):
    """With only the logit KD on and a teacher that reads frozen towers (no implicit path), the LoRA of the
    image tower and of the text side still gets gradients: through the student's s·f·Wcᵀ logits."""
    lora, teacher = _sd_lora_gradients("frozen", lambda_teacher=0.0, lambda_logit=1.0)
    image_b = [g for n, g in lora.items() if "vision_model" in n and "lora_B" in n]
    assert image_b and sum(float(g.abs().sum()) for g in image_b if g is not None) > 0
    assert all(g is None or float(g.abs().sum()) == 0 for g in teacher)  # the KD target is detached
    off, _ = _sd_lora_gradients("frozen", lambda_teacher=0.0, lambda_logit=0.0)
    assert all(g is None or float(g.abs().sum()) == 0 for g in off.values())


def test_one_logit_scale_and_a_soft_ppa_target(one_thread):
    """The teacher returns cosines; its CE applies exp(logit_scale) once; PPA's target stays soft."""
    module, batch = _module_and_batch()
    callback = SDLoRA(teacher_warmup_steps=0)
    callback.setup(None, module, "fit")
    outputs = module.step(batch)
    teacher = callback._teacher_forward(callback._step_inputs(module, batch["x"], outputs))
    cos = teacher["cosines"]
    assert cos.abs().max() <= 1 + 1e-5
    torch.testing.assert_close(callback.teacher.logits(cos), callback.teacher.logit_scale.exp() * cos)
    # entropy of softmax(cos / tau): bounded by log C, and far from the one-hot collapse of a double scale
    # (exp(2.7) * cos / 0.1 gave ~1e-4 nats on the embedded task)
    h = float(target_entropy(cos, tau=0.1))
    assert 0.05 < h <= math.log(len(NAMES)) + 1e-6
    doubled = float(target_entropy(callback.teacher.logits(callback.teacher.logits(cos)), tau=0.1))
    assert doubled < h
    # a confident teacher keeps a soft target: cosines 0.9 vs 0.5 at tau = 0.1 are logits 9 vs 5
    confident = torch.tensor([[0.9, 0.5, 0.5, 0.5, 0.5]])
    top = math.exp(4) / (math.exp(4) + 4)
    rest = (1 - top) / 4
    expected = -(top * math.log(top) + 4 * rest * math.log(rest))  # 0.344 nats
    assert float(target_entropy(confident, 0.1)) == pytest.approx(expected, rel=1e-5)


def test_fit_logs_a_ppa_target_entropy_in_range(one_thread):
    callback = SDLoRA(teacher_warmup_steps=5, lambda_relation=0.1, lambda_ppa=0.5)
    _, _, trainer = _fit([callback], steps=3)
    h = float(trainer.callback_metrics["method/sd_lora/ppa_target_entropy"])
    assert 0.05 < h <= math.log(len(NAMES)) + 1e-6


def test_parameter_errors():
    with pytest.raises(ValueError, match="lambda_ppa"):
        SDLoRA(lambda_ppa=-1)
    with pytest.raises(ValueError, match="teacher_inputs"):
        SDLoRA(teacher_inputs="student")
    with pytest.raises(ValueError, match="crops"):
        SDLoRA(crops=3)
    with pytest.raises(ValueError, match="graph_structure"):
        SDLoRA(graph_structure="random")
    with pytest.raises(ValueError, match="lambda_teacher"):
        SDLoRA(lambda_teacher=-0.5)


def test_from_clip_on_a_tiny_random_clip_model_runs_sd_lora(one_thread, tmp_path):
    """DualEncoder.from_clip on a transformers CLIPModel: CLIP's features, LoRA on q/k/v of both towers,
    an SD-LoRA fit and a teacher-free export."""
    import torch.nn.functional as F

    from lit_lowrank.models.dual_encoder import DualEncoder
    from tests.models.tiny_clip import CharTokenizer, tiny_clip

    clip = tiny_clip(channels=1)
    encoder = DualEncoder.from_clip(clip, CharTokenizer(), image_mean=(0.5,), image_std=(0.5,))
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        glob, patches = encoder.encode_image(x)
        small = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
        expected = clip.visual_projection(clip.vision_model(pixel_values=(small - 0.5) / 0.5).pooler_output)
        tokens = encoder.tokenize(["a photo of the digit five."])
        text = clip.text_projection(clip.text_model(**tokens).pooler_output)
        assert torch.allclose(glob, F.normalize(expected, dim=-1), atol=1e-5)
        assert torch.allclose(encoder.encode_text(**tokens), F.normalize(text, dim=-1), atol=1e-5)
    assert patches.shape == (3, 16, 16)
    pl.seed_everything(0, verbose=False)
    module = FewShotCLIPModule(encoder=encoder, class_names=NAMES, template="a photo of the digit {}.")
    lora_layers = {n.rsplit(".lora_", 1)[0] for n, _ in module.named_parameters() if ".lora_A" in n}
    assert any("vision_model" in n and n.endswith("q_proj") for n in lora_layers)
    assert any("text_model" in n and n.endswith("v_proj") for n in lora_layers)
    callback = SDLoRA(teacher_warmup_steps=2)
    dm = FewShotDigitsDataModule(shots=2, seed=0, repeats=1, batch_size=10)
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=[callback], accelerator="cpu",
                         default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    assert torch.isfinite(trainer.callback_metrics["method/sd_lora/logit_kd_loss"])
    classifier = module.export_inference_model(dm)
    assert classifier(x).shape == (3, len(NAMES))
    assert not any("teacher" in k for k in classifier.state_dict())
