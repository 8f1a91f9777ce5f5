"""SafeCut and SHOT callbacks: gating on a plain module, second-model adaptation,
state round trip, refusal of multi-process strategies."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.callbacks import SHOT, SafeCut
from lit_lowrank.datamodules import ShiftedDigitsDataModule
from lit_lowrank.models import DigitPrototypeClassifier
from lit_lowrank.tasks import ClassificationModule


def _trainer(tmp_path, callbacks, steps=3):
    return pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=1, accelerator="cpu", devices=1,
                      default_root_dir=tmp_path, callbacks=callbacks)


def _target_module():
    return ClassificationModule("cnn_small", num_classes=10, in_chans=1, supervised=False)


def test_target_mode_never_reads_labels(tmp_path):
    """supervised=False: training runs on batches without 'y'; the task loss is zero."""
    module = _target_module().train()
    outputs = module.step({"x": torch.randn(8, 1, 8, 8)})
    assert float(outputs["loss"].detach()) == 0.0

    class NoLabels(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return {"x": torch.randn(1, 8, 8)}

    head = {k: v.clone() for k, v in module.head.state_dict().items()}
    body = {k: v.clone() for k, v in module.backbone.state_dict().items()}
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[SHOT()])
    trainer.fit(module, torch.utils.data.DataLoader(NoLabels(), batch_size=8))
    # SHOT as published: the hypothesis (head) is frozen, the feature extractor adapts
    assert all(torch.equal(v, module.head.state_dict()[k]) for k, v in head.items())
    assert any(not torch.equal(v, module.backbone.state_dict()[k]) for k, v in body.items() if v.is_floating_point())
    assert "method/shot/im_loss" in trainer.callback_metrics


def test_shot_adapts_the_head_when_asked_and_names_a_missing_head(tmp_path):
    module = _target_module()
    SHOT(freeze_head=None).setup(None, module, "fit")
    assert all(p.requires_grad for p in module.parameters())
    with pytest.raises(ValueError, match="'classifier'"):
        SHOT(freeze_head="classifier").setup(None, module, "fit")


def test_safecut_adapts_both_models_and_logs(tmp_path):
    second = DigitPrototypeClassifier()
    before = second.projection.weight.detach().clone()
    cb = SafeCut(second, k=5)
    module = _target_module()
    trainer = _trainer(tmp_path, [cb])
    data = ShiftedDigitsDataModule(batch_size=64)
    trainer.fit(module, datamodule=data)
    assert not torch.equal(second.projection.weight, before), "the second model did not adapt"
    # every key the card documents is logged (the target batches carry labels for evaluation)
    assert {f"method/safecut/{k}" for k in ("gate_to_first", "gate_to_second", "gate_none", "z_global_first",
                                            "z_global_second", "corrections", "miscorrections")
            } <= set(trainer.callback_metrics)
    trainer.validate(module, datamodule=data, verbose=False)
    batch = next(iter(data.val_dataloader()))
    with torch.no_grad():
        expected = (second(batch["x"]).argmax(-1) == batch["y"]).float().mean()
    assert float(trainer.callback_metrics["method/safecut/second_acc"]) == pytest.approx(float(expected), abs=1e-6)
    assert sum(cb.counts[k] for k in ("to_first", "to_second", "none")) > 0
    assert cb.z_separation() == cb.z_separation()  # finite once labelled batches were seen


def test_one_way_freezes_the_second_model(tmp_path):
    second = DigitPrototypeClassifier()
    before = {k: v.clone() for k, v in second.state_dict().items()}
    _trainer(tmp_path, [SafeCut(second, k=5, mode="one_way")]).fit(
        _target_module(), datamodule=ShiftedDigitsDataModule(batch_size=64))
    assert all(torch.equal(before[k], v) for k, v in second.state_dict().items())


def test_cross_term_follows_the_gate():
    """With a perfectly reliable second model and a random first one, the loss includes
    cross-entropy towards the second model's labels (and nothing the other way)."""
    torch.manual_seed(0)
    n, c = 60, 3
    y = torch.arange(c).repeat_interleave(n // c)
    feats = torch.nn.functional.one_hot(y, c).float() * 5 + 0.1 * torch.randn(n, c)

    class Oracle(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.one_hot(x.long(), c).float() * 10

        def forward_features(self, x):
            return feats

    first_logits = torch.randn(n, c, requires_grad=True)
    cb = SafeCut(Oracle(), k=5, beta=0.0, im_weight=0.0, adapt_second=False, graph_features="second")
    loss = cb.on_loss(None, torch.nn.Module(), {"x": y}, {"logits": first_logits, "features": torch.randn(n, 4)},
                      torch.zeros(()))
    (grad,) = torch.autograd.grad(loss, first_logits)
    # the gradient pushes every taught sample towards the oracle's label
    taught = grad.abs().sum(1) > 0
    assert taught.float().mean() > 0.5
    assert torch.all(grad[taught].argmin(1) == y[taught])


def test_state_dict_round_trip_restores_the_second_model():
    a = SafeCut(DigitPrototypeClassifier(), k=5)
    a.second_optimizer = torch.optim.AdamW(a.second_model.parameters(), lr=1e-3)
    with torch.no_grad():
        a.second_model.prototypes.add_(1.0)
    a.counts["corrections"] = 7
    b = SafeCut(DigitPrototypeClassifier(), k=5)
    b.load_state_dict(a.state_dict())
    assert b.counts["corrections"] == 7
    assert torch.equal(b.second_model.prototypes, a.second_model.prototypes)
    assert b._pending_optimizer_state is not None


def test_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="`mode`='both'"):
        SafeCut(DigitPrototypeClassifier(), mode="both")
    cb = SafeCut(DigitPrototypeClassifier())
    with pytest.raises(ValueError, match=r"outputs \['logits', 'features'\]"):
        cb.on_loss(None, None, {"x": torch.zeros(2, 1, 8, 8)}, {"logits": torch.zeros(2, 10)}, torch.zeros(()))
    with pytest.raises(ValueError, match="input_key"):
        cb.on_loss(None, None, {"image": torch.zeros(2, 1, 8, 8)},
                   {"logits": torch.zeros(2, 10), "features": torch.zeros(2, 4)}, torch.zeros(()))
    with pytest.raises(ValueError, match="do not match"):
        cb.on_loss(None, None, {"x": torch.zeros(4, 1, 8, 8)},
                   {"logits": torch.zeros(4, 5), "features": torch.zeros(4, 4)}, torch.zeros(()))


def test_multi_process_strategy_is_refused(tmp_path):
    class FakeTrainer:
        world_size = 2
        strategy = object()

    with pytest.raises(RuntimeError, match="world_size=2"):
        SafeCut(DigitPrototypeClassifier()).setup(FakeTrainer(), _target_module(), "fit")


def test_graph_choices_and_frozen_needs_an_encoder():
    torch.manual_seed(0)
    n, c = 60, 3
    y = torch.arange(c).repeat_interleave(n // c)
    feats = torch.nn.functional.one_hot(y, c).float() * 5 + 0.1 * torch.randn(n, c)
    with pytest.raises(ValueError, match="graph_encoder"):
        SafeCut(DigitPrototypeClassifier(), graph_features="frozen")
    with pytest.raises(ValueError, match="graph_features"):
        SafeCut(DigitPrototypeClassifier(), graph_features="pixels")
    noise = torch.randint(0, c, (n,))
    # b's labels are noise and its features random: every graph that sees a's geometry ranks a's
    # clustered labelling as the more reliable ("second" alone, a random graph, sees neither)
    results = {}
    for choice in ("own", "both", "first", "frozen"):
        cb = SafeCut(DigitPrototypeClassifier(), k=5, graph_features=choice, graph_encoder=torch.nn.Flatten())
        z_a, z_b = cb.reliability({"x": feats}, feats, torch.randn(n, 4), y, noise, c)
        results[choice] = (float(z_a.z.mean()), float(z_b.z.mean()))
    for choice, (za, zb) in results.items():
        assert za < zb - 1.0, choice  # the clustered labelling is the more reliable one on every graph


def _clustered_oracle(wrong_every: int):
    """Three clusters of 20 near-one-hot features, an oracle second model on them (logits and
    ``forward_features``), and labels made wrong on every ``wrong_every``-th sample."""
    torch.manual_seed(0)
    n, c = 60, 3
    y = torch.arange(c).repeat_interleave(n // c)
    feats = torch.nn.functional.one_hot(y, c).float() * 5 + 0.1 * torch.randn(n, c)

    class Oracle(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.one_hot(y, c).float() * 10

        def forward_features(self, x):
            return feats

    wrong = y.clone()
    wrong[::wrong_every] = (wrong[::wrong_every] + 1) % c
    return y, feats, Oracle(), wrong


def test_net_correction_counts_both_directions():
    """An oracle second model and a first model that is wrong on half the samples: every taught
    label into the first model fixes it; the net correction is +1."""
    y, feats, oracle, wrong = _clustered_oracle(wrong_every=2)
    n, c = 60, 3
    first_logits = torch.nn.functional.one_hot(wrong, c).float() * 10
    cb = SafeCut(oracle, k=5, beta=0.0, im_weight=0.0, adapt_second=False, graph_features="second")
    cb.on_loss(None, torch.nn.Module(), {"x": y, "y": y}, {"logits": first_logits, "features": torch.randn(n, 4)},
               torch.zeros(()))
    assert cb.counts["corrections"] > 0 and cb.counts["miscorrections"] == 0
    assert cb.counts["corrections_to_second"] == 0 and cb.counts["miscorrections_to_second"] == 0
    assert cb.net_correction() == 1.0 and cb.net_correction("first") == 1.0
    assert cb.net_correction("second") != cb.net_correction("second")  # NaN: nothing taught to the second
    with pytest.raises(ValueError, match="`into`"):
        cb.net_correction("third")
    assert SafeCut(oracle).net_correction() != SafeCut(oracle).net_correction()  # NaN before any label


def test_a_second_model_without_forward_features_is_refused_unless_the_graph_is_frozen(tmp_path):
    """No silent softmax graph: without forward_features SafeCut refuses, naming the model, unless the
    frozen-encoder graph is asked for explicitly."""
    logits_only = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    with pytest.raises(TypeError, match="Sequential.*forward_features"):
        SafeCut(logits_only)
    before = logits_only[1].weight.detach().clone()
    cb = SafeCut(logits_only, k=5, graph_features="frozen", graph_encoder=torch.nn.Flatten())
    _trainer(tmp_path, [cb], steps=2).fit(_target_module(), datamodule=ShiftedDigitsDataModule(batch_size=64))
    assert not torch.equal(logits_only[1].weight, before)


class _TwoPart(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16))
        self.prompt = torch.nn.Linear(16, 10)

    def forward_features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.prompt(self.body(x))


def _fit_second(tmp_path, second, **kwargs):
    before = {k: v.clone() for k, v in second.state_dict().items()}
    _trainer(tmp_path, [SafeCut(second, k=5, **kwargs)], steps=2).fit(
        _target_module(), datamodule=ShiftedDigitsDataModule(batch_size=64))
    return {k for k, v in second.state_dict().items() if not torch.equal(before[k], v)}


def test_only_parameters_the_user_left_trainable_adapt(tmp_path):
    second = _TwoPart()
    second.body.requires_grad_(False)  # the user froze the encoder
    assert _fit_second(tmp_path, second) == {"prompt.weight", "prompt.bias"}
    assert not any(p.requires_grad for p in second.body.parameters())  # never unfrozen
    assert all(p.grad is None for p in second.parameters())


def test_the_trainable_filter_selects_among_trainable_parameters(tmp_path):
    assert _fit_second(tmp_path, _TwoPart(), trainable=r"^prompt\.weight$") == {"prompt.weight"}
    with pytest.raises(ValueError, match="no parameter of the second model"):
        _fit_second(tmp_path, _TwoPart(), trainable="lora_")
    frozen = _TwoPart().requires_grad_(False)
    with pytest.raises(ValueError, match="adapt_second=False"):
        _fit_second(tmp_path, frozen)
    assert _fit_second(tmp_path, frozen, adapt_second=False) == set()


def test_safecut_freezes_the_hypothesis_head_like_shot(tmp_path):
    module = _target_module()
    head = {k: v.clone() for k, v in module.head.state_dict().items()}
    _trainer(tmp_path, [SafeCut(DigitPrototypeClassifier(), k=5)], steps=2).fit(
        module, datamodule=ShiftedDigitsDataModule(batch_size=64))
    assert all(torch.equal(v, module.head.state_dict()[k]) for k, v in head.items())


def test_a_zero_shot_clip_second_model_adapts_only_its_class_embeddings(tmp_path):
    """A tiny random transformers CLIPModel as SafeCut's zero-shot second model, end to end."""
    from lit_lowrank.models import ZeroShotCLIP
    from tests.models.tiny_clip import CharTokenizer, tiny_clip

    data = ShiftedDigitsDataModule(batch_size=64)
    data.setup("fit")
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    second = ZeroShotCLIP(tiny_clip(), names, templates=("a photo of the digit {}.",), tokenizer=CharTokenizer(),
                          input_mean=data.mean, input_std=data.std)
    changed = _fit_second(tmp_path, second)
    assert changed == {"class_embeddings"}


def test_z_separation_reads_right_and_wrong_labels():
    """An oracle second model on a clustered graph, a first model wrong on a third of the samples:
    wrong labels have the higher local z."""
    y, feats, oracle, wrong = _clustered_oracle(wrong_every=3)
    c = 3
    cb = SafeCut(oracle, k=5, beta=0.0, im_weight=0.0, adapt_second=False, graph_features="second")
    assert cb.z_separation() != cb.z_separation()  # NaN before labels
    cb.on_loss(None, torch.nn.Module(), {"x": y, "y": y},
               {"logits": torch.nn.functional.one_hot(wrong, c).float() * 10, "features": feats}, torch.zeros(()))
    assert cb.z_separation() > 1.0
