"""The adapter injector: inject_adapters, AdapterInjector, save/load through PEFT, errors, diagnostics."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn

from lit_lowrank.adapters import (
    AdapterDiagnostics,
    AdapterInjector,
    adapter_layers,
    available_variants,
    inject_adapters,
    load_adapters,
    load_peft_model,
    merge_adapters,
    register_variant,
    save_adapters,
    unregister_variant,
)
from lit_lowrank.core import surgery_records


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _perturb_trainable(model: nn.Module, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


class GainLoraLinear(LoraLinear):
    """A custom test variant with a method kwarg: ΔW = gain · s·B A."""

    def __init__(self, base_layer, adapter_name, config=None, r=8, lora_alpha=8, lora_dropout=0.0, gain=1.0, **kw):
        self.gain = gain
        super().__init__(base_layer, adapter_name, config=config, r=r, lora_alpha=lora_alpha, **kw)

    def get_delta_weight(self, adapter):
        return self.gain * super().get_delta_weight(adapter)

    def forward(self, x, *args, **kwargs):
        if self.disable_adapters or self.merged:
            return super().forward(x, *args, **kwargs)
        out = self.base_layer(x)
        for name in self.active_adapters:
            out = out + self.gain * self.scaling[name] * self.lora_B[name](self.lora_A[name](x))
        return out


@pytest.fixture
def gain_variant():
    register_variant("test_gain", GainLoraLinear)
    yield "test_gain"
    unregister_variant("test_gain")


METHODS = ["lora", "dora", "lokr", "sds_lora"]


@pytest.mark.parametrize("method", METHODS)
def test_output_unchanged_and_only_adapters_trainable(method):
    model, x = _mlp(), torch.randn(5, 12)
    y0 = model(x).detach()
    inject_adapters(model, method=method, target_modules=r"^[02]$", rank=4)
    torch.testing.assert_close(model(x), y0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(("lora_" in n or "lokr_" in n) and not n.startswith("4.") for n in trainable), trainable
    assert len(list(adapter_layers(model))) == 2


def test_train_bias_and_modules_to_save():
    model = inject_adapters(_mlp(), method="lora", target_modules=["0"], rank=2, train_bias=True,
                            modules_to_save=["4"])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"0.base_layer.bias", "4.weight", "4.bias"} <= trainable
    assert "0.base_layer.weight" not in trainable and "2.weight" not in trainable


@pytest.mark.parametrize("method", ["lora", "sds_lora"])
def test_merge_equals_unmerged_forward(method):
    model, x = inject_adapters(_mlp(), method=method, target_modules=["0", "2"], rank=4), torch.randn(6, 12)
    _perturb_trainable(model)
    with torch.no_grad():
        y = model(x)
        merged = merge_adapters(model)
        assert not list(adapter_layers(merged)) and isinstance(merged[0], nn.Linear)
        torch.testing.assert_close(merged(x), y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["sds_lora", "test_gain", "lokr"])
def test_save_load_round_trip_through_peft(method, gain_variant, tmp_path):
    kwargs = {"gain": 3.0} if method == "test_gain" else {}
    model, x = _mlp(), torch.randn(4, 12)
    inject_adapters(model, method=method, target_modules=["0", "2"], rank=3, modules_to_save=["4"], **kwargs)
    _perturb_trainable(model)
    with torch.no_grad():
        y = model(x)
    assert (y - _mlp()(x)).abs().max() > 1e-3  # the adapters moved the output
    save_adapters(model, tmp_path / "adapter")

    fresh = load_adapters(_mlp(), tmp_path / "adapter")
    assert type(fresh[0]) is type(model[0])
    if method == "test_gain":
        assert fresh[0].gain == 3.0  # the method kwarg survived
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), y)

    peft_model = load_peft_model(_mlp(), tmp_path / "adapter")  # PEFT's own from_pretrained, variant re-registered
    assert type(peft_model.base_model.model[0]) is type(model[0])
    with torch.no_grad():
        torch.testing.assert_close(peft_model(x), y)
        torch.testing.assert_close(peft_model.merge_and_unload()(x), y, atol=1e-5, rtol=1e-5)


def test_target_matching_nothing_raises():
    with pytest.raises(ValueError, match=r"`target_modules`='q_proj'.*among: '0', '2', '4'"):
        inject_adapters(_mlp(), method="lora", target_modules="q_proj", rank=2)
    with pytest.raises(ValueError, match="required"):
        inject_adapters(_mlp(), method="lora", target_modules=[], rank=2)


def test_rank_larger_than_layer_raises():
    with pytest.raises(ValueError, match=r"`rank`=13 is larger than layer '0' .* min\(in, out\) = 12"):
        inject_adapters(_mlp(), method="sds_lora", target_modules=["0"], rank=13)
    conv = nn.Sequential(nn.Conv2d(2, 4, 3))
    with pytest.raises(ValueError, match="= 4"):
        inject_adapters(conv, method="lora", target_modules=["0"], rank=5)


def test_unknown_method_raises():
    with pytest.raises(ValueError, match=r"`method`='nope'.*'lora'.*'sds_lora'"):
        inject_adapters(_mlp(), method="nope", target_modules=["0"], rank=2)
    assert "sds_lora" in available_variants()
    with pytest.raises(ValueError, match="built-in"):
        register_variant("lora", GainLoraLinear)
    with pytest.raises(TypeError, match="LoraLayer"):
        register_variant("plain", nn.Linear)


def test_injection_is_idempotent():
    model = inject_adapters(_mlp(), method="sds_lora", target_modules=["0"], rank=2)
    _perturb_trainable(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inject_adapters(model, method="sds_lora", target_modules=["0"], rank=2)
    after = model.state_dict()
    assert list(before) == list(after) and all(torch.equal(before[k], after[k]) for k in before)
    assert isinstance(model[0].base_layer, nn.Linear)  # not wrapped twice
    assert len(surgery_records(model)) == 1
    with pytest.raises(ValueError, match="already carries adapters"):
        inject_adapters(model, method="lora", target_modules=["0"], rank=2, adapter_name="other")


def test_transformers_model():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=16)).eval()
    ids = torch.randint(0, 50, (2, 7))
    y0 = model(input_ids=ids).last_hidden_state.detach()
    inject_adapters(model, method="sds_lora", target_modules=r"attention\.self\.(query|value)$", rank=4)
    assert len(list(adapter_layers(model))) == 4
    out = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(out, y0)
    out.sum().backward()
    assert model.encoder.layer[0].attention.self.query.lora_B["default"].weight.grad is not None


def test_timm_model():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False, num_classes=3, img_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    y0 = model(x).detach()
    inject_adapters(model, method="sds_lora", target_modules=r"blocks\.\d+\.attn\.qkv$", rank=4,
                    modules_to_save=["head"])
    torch.testing.assert_close(model(x), y0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("qkv.lora_A" in n for n in trainable) and "head.weight" in trainable


class _Plain(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


def _loader():
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 12, generator=gen), torch.randint(0, 3, (64,), generator=gen))
    return torch.utils.data.DataLoader(data, batch_size=16)


def test_callback_on_plain_module_with_diagnostics(tmp_path):
    module = _Plain()
    frozen_before = module.net[2].weight.detach().clone()
    injector = AdapterInjector(method="sds_lora", target_modules=r"net\.[02]$", rank=3, alpha=6,
                               modules_to_save=[r"net.4"])
    diag = AdapterDiagnostics(every_n_steps=2)
    trainer = pl.Trainer(max_steps=4, callbacks=[injector, diag], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=_loader())
    assert isinstance(module.net[0], LoraLinear) and torch.equal(module.net[2].base_layer.weight, frozen_before)
    injector.setup(trainer, module, "fit")  # a second setup does not wrap again
    assert isinstance(module.net[0].base_layer, nn.Linear)
    metrics = trainer.callback_metrics
    for key in ("delta_erank", "grad_erank", "update_cosine", "update_cosine_global", "delta_stable_rank"):
        assert f"method/sds_lora/{key}" in metrics, key
    assert 0 < diag.last["delta_erank"] <= 3 + 1e-4  # ΔW of a rank-3 adapter
    assert -1.0 <= diag.last["update_cosine"] <= 1.0 and diag.last["update_cosine"] > 0  # SGD descends
