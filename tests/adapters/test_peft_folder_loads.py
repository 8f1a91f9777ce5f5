"""Issue #29 finding 5: plain ``PeftModel.from_pretrained`` on a SaMA / PoLAR folder fails loudly (it would build
LoRA layers and return the base model's outputs); ``load_peft_model`` loads the variant; SDS-LoRA folders, whose
weights are LoRA's, stay loadable as plain LoRA."""

from __future__ import annotations

import copy

import peft
import pytest
import torch
from torch import nn

from lit_lowrank.adapters import inject_adapters, load_peft_model, peft_config_for, save_adapters, write_variant_info


def _base() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))


def _trained(method: str) -> nn.Module:
    model = inject_adapters(_base(), method=method, target_modules=["0"], rank=2)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


X = torch.randn(5, 12, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("method", ["sama", "polar"])
def test_plain_peft_refuses_a_variant_folder_and_load_peft_model_loads_it(method, tmp_path):
    model = _trained(method)
    save_adapters(model, tmp_path)
    with pytest.raises(ValueError, match=rf"lit_lowrank:{method} is a {method} adapter, not LoRA.*load_peft_model"):
        peft.PeftModel.from_pretrained(_base(), str(tmp_path))
    loaded = load_peft_model(_base(), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(X), model(X))
        assert not torch.allclose(loaded(X), _base()(X))


def test_peft_config_for_path_is_marked_too(tmp_path):
    """The documented PEFT-wrapper path: peft_config_for + get_peft_model + save_pretrained + write_variant_info."""
    peft_model = peft.get_peft_model(_base(), peft_config_for("polar", ["0"], rank=2))
    with torch.no_grad():
        peft_model.base_model.model[0].lora_theta["default"].fill_(0.5)
    peft_model.save_pretrained(str(tmp_path))
    write_variant_info(tmp_path, "polar")
    with pytest.raises(ValueError, match="load_peft_model"):
        peft.PeftModel.from_pretrained(_base(), str(tmp_path))
    loaded = load_peft_model(_base(), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(X), peft_model(X))


def test_sds_lora_folder_still_loads_as_plain_lora(tmp_path):
    model = _trained("sds_lora")
    save_adapters(model, tmp_path)
    plain = peft.PeftModel.from_pretrained(_base(), str(tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(plain(X), copy.deepcopy(model)(X))
