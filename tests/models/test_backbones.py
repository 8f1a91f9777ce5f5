"""The backbone registry: our builders, the timm fallback, errors, local pretrained weights."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

from lit_lowrank.models import BACKBONES, build_backbone

# A small input and the extra builder arguments for each of our backbones.
EXAMPLES = {
    "resnet20_cifar": ({}, torch.randn(2, 3, 8, 8)),
    "resnet32_cifar": ({}, torch.randn(2, 3, 8, 8)),
    "resnet56_cifar": ({}, torch.randn(2, 3, 8, 8)),
    "resnet110_cifar": ({}, torch.randn(2, 3, 8, 8)),
    "mlp": ({"in_features": 192}, torch.randn(2, 3, 8, 8)),
    "cnn_small": ({}, torch.randn(2, 3, 8, 8)),
    "token_bag": ({"vocab_size": 20}, torch.randint(0, 20, (2, 7))),
    "minilm": ({"num_layers": 1}, torch.randint(1, 1000, (2, 7))),  # the offline pretrained sentence encoder
    "mc_lm": ({"pretrained": None, "model_config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                                     "num_hidden_layers": 1, "num_attention_heads": 2,
                                                     "num_key_value_heads": 2, "vocab_size": 258}},
              torch.tensor([[5, 6, 7, -1, -1, -1, -1], [1, 2, 3, 4, 5, 6, 7]])),  # right-padded with -1
}


def test_every_backbone_has_an_example():
    assert set(EXAMPLES) == set(BACKBONES)


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_our_backbones_are_feature_extractors(name):
    kwargs, x = EXAMPLES[name]
    model = build_backbone(name, **kwargs)
    assert isinstance(model.num_features, int)
    assert model(x).shape == (2, model.num_features)


@pytest.mark.parametrize("name", ["resnet20_cifar", "cnn_small"])
def test_in_chans_reaches_image_backbones(name):
    assert build_backbone(name, in_chans=1)(torch.randn(2, 1, 8, 8)).shape[0] == 2


def test_timm_fallback_has_no_head():
    model = build_backbone("test_resnet", in_chans=1)
    assert model.num_features == 96
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 96)


def test_timm_kwargs_pass_through():
    model = build_backbone("test_resnet", drop_rate=0.5)
    assert model.drop_rate == 0.5


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="backbone='not_a_net'") as info:
        build_backbone("not_a_net")
    assert "resnet20_cifar" in str(info.value) and "timm.list_models('*resnet*')" in str(info.value)


def test_missing_pretrained_file(tmp_path):
    missing = str(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match="pretrained_path="):
        build_backbone("resnet20_cifar", pretrained_path=missing)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_ours_pretrained_round_trip(tmp_path, suffix):
    torch.manual_seed(0)
    source = build_backbone("resnet20_cifar", in_chans=1)
    source(torch.randn(8, 1, 8, 8))  # move the BN running stats away from their init
    path = str(tmp_path / f"weights{suffix}")
    if suffix == ".safetensors":
        save_file(source.state_dict(), path)
    else:
        torch.save({"state_dict": source.state_dict(), "epoch": 3}, path)  # checkpoint-style dict
    loaded = build_backbone("resnet20_cifar", in_chans=1, pretrained_path=path)
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(source.eval()(x), loaded.eval()(x))


def test_timm_pretrained_drops_classifier(tmp_path):
    torch.manual_seed(0)
    source = timm.create_model("test_resnet", num_classes=10).eval()
    path = str(tmp_path / "test_resnet.pth")
    torch.save(source.state_dict(), path)  # includes fc.weight / fc.bias
    loaded = build_backbone("test_resnet", pretrained_path=path).eval()
    x = torch.randn(2, 3, 32, 32)
    expected = source.forward_head(source.forward_features(x), pre_logits=True)
    assert torch.equal(loaded(x), expected)


def test_timm_pretrained_adapts_stem_channels(tmp_path):
    source = timm.create_model("test_resnet", num_classes=0)
    path = str(tmp_path / "rgb.safetensors")
    save_file(source.state_dict(), path)
    loaded = build_backbone("test_resnet", in_chans=1, pretrained_path=path)
    stem = source.pretrained_cfg["first_conv"] + ".weight"
    torch.testing.assert_close(loaded.state_dict()[stem], source.state_dict()[stem].sum(1, keepdim=True))
    assert loaded(torch.randn(2, 1, 32, 32)).shape == (2, 96)


def test_mismatched_weights_name_the_path(tmp_path):
    path = str(tmp_path / "other.safetensors")
    save_file(build_backbone("cnn_small").state_dict(), path)
    with pytest.raises(RuntimeError, match=r"pretrained_path=.*does not match"):
        build_backbone("resnet20_cifar", pretrained_path=path)
