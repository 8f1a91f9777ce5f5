"""Issue #40 finding 1: adapters injected into a LightningModule ship as a folder for the bare transformers model.

A user's module holds a transformers causal LM at ``self.model``; ``AdapterInjector`` adapts it (targets named from
the LightningModule, or with ``submodule="model"`` from the LM). ``save_adapters(module.model, folder)`` then loads
into a bare copy of the LM with ``load_adapters``, ``load_peft_model`` and ``PeftModel.from_pretrained`` with the
trained module's logits.
"""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lit_lowrank.adapters import AdapterInjector, load_adapters, load_peft_model, read_variant_info, save_adapters


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    return LlamaForCausalLM(config)


class UserLM(pl.LightningModule):
    """A user's own module: a transformers LM at ``self.model``, nothing from lit_lowrank."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.model = lm

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=0.05)


def _fit(injector: AdapterInjector, tmp_path) -> UserLM:
    base = _tiny_llama()
    module = UserLM(copy.deepcopy(base))
    torch.manual_seed(1)
    data = DataLoader(torch.randint(0, 64, (8, 12)), batch_size=4)
    trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=tmp_path,
                         callbacks=[injector])
    trainer.fit(module, data)
    return module.eval()


INPUT = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(("method", "submodule"), [("lora", None), ("lora", "model"), ("sds_lora", None),
                                                   ("sama", "model")])
def test_submodule_folder_loads_into_bare_model(method, submodule, tmp_path):
    from peft import PeftModel

    targets = r"self_attn\.(q|v)_proj$"
    module = _fit(AdapterInjector(method=method, target_modules=targets, rank=4, alpha=8, submodule=submodule),
                  tmp_path)
    with torch.no_grad():
        want = module.model(input_ids=INPUT).logits
        assert not torch.allclose(want, _tiny_llama().eval()(input_ids=INPUT).logits), "the adapters did not train"
    folder = save_adapters(module.model, tmp_path / "adapter")
    info = read_variant_info(folder)
    assert info["target_modules"] == [f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in ("q", "v")]

    with torch.no_grad():
        got = load_adapters(_tiny_llama(), folder).eval()(input_ids=INPUT).logits
        torch.testing.assert_close(got, want)
        got = load_peft_model(_tiny_llama(), folder).eval()(input_ids=INPUT).logits
        torch.testing.assert_close(got, want)
        if method in ("lora", "sds_lora"):  # LoRA weights: plain PEFT reads the folder too
            got = PeftModel.from_pretrained(_tiny_llama(), str(folder)).eval()(input_ids=INPUT).logits
            torch.testing.assert_close(got, want)


def test_submodule_injection_rebuilds_from_a_checkpoint(tmp_path):
    from lit_lowrank.core import rebuild_surgery, save_surgery

    module = _fit(AdapterInjector(method="lora", target_modules=["q_proj"], rank=2, submodule="model"), tmp_path)
    checkpoint = {"state_dict": module.state_dict()}
    save_surgery(module, checkpoint)
    fresh = UserLM(_tiny_llama())
    rebuild_surgery(fresh, checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"])
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval().model(input_ids=INPUT).logits, module.model(input_ids=INPUT).logits)


def test_bad_submodule_and_a_module_without_adapters_name_the_fix(tmp_path):
    from lit_lowrank.adapters import inject_adapters

    with pytest.raises(ValueError, match=r"`submodule`='backbone' is not a submodule of UserLM; expected one of \['model'\]"):
        inject_adapters(UserLM(_tiny_llama()), target_modules=["q_proj"], rank=2, submodule="backbone")
    with pytest.raises(ValueError, match=r"holds no adapter of that name.*submodule holding adapted layers"):
        save_adapters(_tiny_llama(), tmp_path / "none")
