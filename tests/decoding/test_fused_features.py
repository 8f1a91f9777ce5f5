"""EAGLE-3's fused features: the same low/mid/high target states in training data, in the verifier and in the drafter."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.decoding import (
    EagleDrafter,
    HybridDrafter,
    NgramDrafter,
    SpecBlockDrafter,
    SpeculativeDecoder,
    TargetLM,
)
from lit_lowrank.decoding.distill_data import check_feature_layers, teacher_forced_outputs
from lit_lowrank.decoding.training import DrafterDistillModule
from lit_lowrank.models.spec_drafter import BlockDrafterNet
from tests.decoding.test_engine import tiny_target

LAYERS = (1, 2, 3)  # a 3-layer target: after layer 1, after layer 2, the final normed output


def _net(block_size: int, layers=LAYERS) -> BlockDrafterNet:
    torch.manual_seed(0)
    return BlockDrafterNet(32, 23, block_size=block_size, num_heads=4, context_window=4,
                           feature_layers=None if layers is None else list(layers)).double().eval()


def test_verifier_features_are_the_fused_states_and_end_with_the_last_hidden():
    model = tiny_target(layers=3)
    prompt = torch.randint(0, 23, (9,), generator=torch.Generator().manual_seed(0))
    plain_logits, last = TargetLM(model).start(prompt, all_logits=True)
    fused = TargetLM(model, feature_layers=LAYERS)
    logits, feats = fused.start(prompt, all_logits=True)
    out = model(input_ids=prompt[None], output_hidden_states=True)
    expected = torch.cat([out.hidden_states[1][0], out.hidden_states[2][0], last], -1)
    assert feats.shape == (9, 3 * 32)
    torch.testing.assert_close(feats, expected)
    torch.testing.assert_close(logits, plain_logits)
    torch.testing.assert_close(fused.logits(feats), plain_logits)  # the head reads the last H columns
    # training data: teacher forcing returns exactly what the verifier returns
    data_feats, argmax = teacher_forced_outputs(model, [prompt.tolist()], dtype=torch.float64, feature_layers=LAYERS)
    torch.testing.assert_close(data_feats[0], feats)
    assert torch.equal(argmax[0], plain_logits.argmax(-1))


def test_feature_layers_are_checked():
    model = tiny_target(layers=3)
    for bad in ([2, 1, 3], [1, 2], [0, 4], []):
        with pytest.raises(ValueError, match="feature_layers"):
            TargetLM(model, feature_layers=bad)
        with pytest.raises(ValueError, match="feature_layers"):
            check_feature_layers(bad, 3)
    assert TargetLM(model, feature_layers=[3]).feature_layers is None  # the last state alone: no fusion
    assert check_feature_layers([3], 3) is None


def test_drafter_fuses_target_features_and_reads_its_own_state_unfused():
    net = _net(block_size=3)
    assert net.feature_size == 96 and net.fuse is not None
    e = torch.randn(2, 5, 32, dtype=torch.float64)
    f = torch.randn(2, 5, 96, dtype=torch.float64)
    torch.testing.assert_close(net.input_states(e, f), net.fc(torch.cat([e, net.fuse(f)], -1)))
    g = torch.randn(2, 5, 32, dtype=torch.float64)  # a drafted node's own output state (training-time test)
    torch.testing.assert_close(net.input_states(e, g), net.fc(torch.cat([e, g], -1)))
    with pytest.raises(ValueError, match="width 64"):
        net.input_states(e, torch.randn(2, 5, 64, dtype=torch.float64))
    loss, parts = net.training_loss(e, f, torch.randint(0, 23, (2, 5)), expand_at=2)
    loss.backward()
    assert net.fuse.weight.grad.abs().sum() > 0
    # the feature regression targets the last hidden state: the last H columns of f
    with pytest.raises(ValueError, match=r"\(B, T, 96\)"):
        net.training_loss(e, f[..., :32], torch.randint(0, 23, (2, 5)))
    assert _net(1, layers=None).fuse is None and _net(1, layers=[3]).fuse is None


@pytest.mark.parametrize("block_size", [1, 3])
def test_decoding_with_a_fused_drafter_is_lossless(block_size):
    model = tiny_target(layers=3)
    net = _net(block_size)
    drafter = SpecBlockDrafter(net, blocks=2, expand=2, max_branch=3) if block_size > 1 else EagleDrafter(net, 3, 2)
    prompt = torch.randint(0, 23, (6,), generator=torch.Generator().manual_seed(1))
    ref = model.generate(prompt[None], max_new_tokens=20, do_sample=False, pad_token_id=0)[0]
    target = TargetLM(model)
    out, stats = SpeculativeDecoder(target, drafter, budget=8).generate(prompt, 20)
    assert torch.equal(out, ref) and stats.rounds > 0
    assert target.feature_layers == LAYERS  # the engine asked the verifier for what the drafter reads
    hybrid = HybridDrafter(drafter, NgramDrafter())
    assert hybrid.feature_layers == LAYERS
    out, _ = SpeculativeDecoder(target, hybrid, budget=8).generate(prompt, 20)
    assert torch.equal(out, ref)
    out, _ = SpeculativeDecoder(target, HybridDrafter(None, NgramDrafter()), budget=8).generate(prompt, 20)
    assert torch.equal(out, ref) and target.feature_layers is None  # prompt lookup reads no features


def test_module_computes_fused_features_on_the_fly():
    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64}
    module = DrafterDistillModule(model_config=cfg, vocab_size=23,
                                  drafter={"block_size": 2, "num_heads": 4, "feature_layers": list(LAYERS)})
    ids = torch.randint(0, 23, (2, 8))
    loss, parts = module._loss({"input_ids": ids, "labels": ids}, expand_at=1)
    assert torch.isfinite(loss) and parts["acc1"] >= 0
    medusa = DrafterDistillModule(model_config=cfg, vocab_size=23, architecture="medusa", drafter={"num_heads": 2})
    feats = torch.randn(2, 8, 96)  # a fused set: Medusa reads its last H columns
    loss, _ = medusa._loss({"input_ids": ids, "features": feats, "target_ids": ids}, expand_at=None)
    ref, _ = medusa.drafter.training_loss(feats[..., -32:], ids)
    torch.testing.assert_close(loss, ref)


@pytest.mark.slow  # the SmolLM2 tokenizer is read from its GGUF when no cache exists
def test_self_distillation_set_caches_answers_apart_from_features(tmp_path, monkeypatch):
    """Other feature layers reuse the target's answers; a second call decodes nothing."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_lowrank.decoding import distill_data
    from lit_lowrank.models.pretrained import load_smollm2_tokenizer

    tokenizer = load_smollm2_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)).eval()
    kw = dict(corpus="lee", split="val", prompts=2, max_new_tokens=3, cache_dir=tmp_path)
    fused = distill_data.self_distillation_set(model, tokenizer, feature_layers=[1, 2], **kw)
    assert [f.shape[-1] for f in fused["features"]] == [32, 32]
    calls = []
    real = distill_data.greedy_continuations
    monkeypatch.setattr(distill_data, "greedy_continuations", lambda *a, **k: calls.append(1) or real(*a, **k))
    last = distill_data.self_distillation_set(model, tokenizer, **kw)
    again = distill_data.self_distillation_set(model, tokenizer, feature_layers=[1, 2], **kw)
    assert not calls and last["continuations"] == fused["continuations"]
    assert [f.shape[-1] for f in last["features"]] == [16, 16]
    for a, b in zip(last["features"], fused["features"]):
        torch.testing.assert_close(a, b[:, 16:])  # the fused set ends with the last hidden state
    assert all(torch.equal(a, b) for a, b in zip(again["features"], fused["features"]))
    assert len(list(tmp_path.glob("answers-*.pt"))) == 1 and len(list(tmp_path.glob("features-*.pt"))) == 2


def test_unfused_features_are_refused_and_wrappers_pass_the_layers_on():
    """A fused drafter given last-hidden-state features (width H, which its own states also have) must not
    read them as drafted states: the request is refused; the bandit wrapper asks the verifier for its layers."""
    from lit_lowrank.decoding import BanditAdaptiveDrafter, DraftRequest

    net = _net(block_size=3)
    target = TargetLM(tiny_target(layers=3))
    tokens = torch.randint(0, 23, (6,))
    with pytest.raises(ValueError, match="width 32, the drafter reads 96"):
        SpecBlockDrafter(net).draft(DraftRequest(tokens, torch.randn(5, 32, dtype=torch.float64), 8, target))
    assert BanditAdaptiveDrafter(SpecBlockDrafter(net)).feature_layers == LAYERS
