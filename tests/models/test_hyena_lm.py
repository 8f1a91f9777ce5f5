"""The RubiConv Hyena LM: documents in a pack never see each other; it trains through
CausalLMModule and logs its diagnostics; the leaky ablation really differs."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.datamodules import PackedTextDataModule
from lit_lowrank.models.hyena_lm import HyenaLM
from lit_lowrank.tasks import CausalLMModule

CONFIG = {"model_type": "rubiconv_hyena", "hidden_size": 16, "num_layers": 2, "max_seq_len": 64, "filter_order": 16}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HyenaLM(vocab_size=258, hidden_size=16, num_layers=2, max_seq_len=64, filter_order=16).eval()


def test_packed_documents_equal_documents_alone(model):
    ids = torch.randint(0, 258, (2, 11))
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2], [3] * 11])
    with torch.no_grad():
        packed = model(ids, doc_ids=doc_ids).logits
        for lo, hi in [(0, 4), (4, 7), (7, 11)]:
            torch.testing.assert_close(packed[:1, lo:hi], model(ids[:1, lo:hi]).logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(packed[1:], model(ids[1:]).logits, atol=1e-5, rtol=1e-4)
        leaky = model(ids, doc_ids=doc_ids, respect_boundaries=False).logits
    assert (leaky[0, 4:] - packed[0, 4:]).abs().max() > 1e-3  # the ablation really leaks
    torch.testing.assert_close(leaky[:, :4], packed[:, :4])    # ... but only after the first boundary


def test_document_sources_agree(model):
    ids = torch.randint(0, 258, (1, 9))
    doc_ids = torch.tensor([[5, 5, 6, 6, 6, 6, 7, 7, 7]])
    position_ids = torch.tensor([[0, 1, 0, 1, 2, 3, 0, 1, 2]])
    with torch.no_grad():
        by_doc = model(ids, doc_ids=doc_ids).logits
        torch.testing.assert_close(model(ids, position_ids=position_ids).logits, by_doc)
        torch.testing.assert_close(model(ids, cu_seqlens=torch.tensor([0, 2, 6, 9])).logits, by_doc)
        torch.testing.assert_close(model(ids, cu_seqlens=[torch.tensor([0, 2, 6, 9])]).logits, by_doc)


def test_outputs_hidden_states_loss_and_diagnostics(model):
    ids = torch.randint(0, 258, (2, 12))
    out = model(ids, labels=ids, output_hidden_states=True)
    assert out.logits.shape == (2, 12, 258)
    assert len(out.hidden_states) == 3 and out.hidden_states[-1].shape == (2, 12, 16)
    assert out.loss is not None and torch.isfinite(out.loss)
    diag = model.method_diagnostics()["rubiconv"]
    assert diag["documents_per_row"] == 1.0 and diag["taps_used_fraction"] == 1.0 and diag["fft_buckets"] >= 1
    assert model.generate(ids[:, :3], max_new_tokens=4).shape == (2, 7)


def test_rows_longer_than_the_filter():
    torch.manual_seed(0)
    m = HyenaLM(hidden_size=8, num_layers=1, max_seq_len=16, filter_order=8).eval()
    ids = torch.randint(0, 258, (1, 40))
    with torch.no_grad():
        assert torch.isfinite(m(ids, doc_ids=torch.tensor([[0] * 30 + [1] * 10])).logits).all()


def test_invalid_config():
    with pytest.raises(ValueError, match="hidden_size"):
        HyenaLM(hidden_size=0)


def test_trains_through_causal_lm_module_and_logs_diagnostics(tmp_path):
    torch.manual_seed(0)
    data = PackedTextDataModule(corpus="lee", seq_len=64, batch_size=4, max_documents=12)
    module = CausalLMModule(model_config=CONFIG, vocab_size=258)
    assert isinstance(module.model, HyenaLM) and module.is_native
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = pl.Trainer(fast_dev_run=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 1
    changed = [n for n, p in module.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert any("filter" in n for n in changed) and any("short_weight" in n for n in changed)
    metrics = trainer.callback_metrics
    for name in ("fft_buckets", "documents_per_row", "taps_used_fraction", "fft_slots_per_token"):
        assert f"method/rubiconv/{name}" in metrics
    assert "val/ppl" in metrics


def test_module_respect_boundaries_switch_and_checkpoint(tmp_path):
    torch.manual_seed(0)
    module = CausalLMModule(model_config=CONFIG, vocab_size=258).eval()
    ids = torch.randint(0, 258, (1, 10))
    doc_ids = torch.tensor([[0] * 4 + [1] * 6])
    with torch.no_grad():
        packed = module(ids, doc_ids=doc_ids).logits
        torch.testing.assert_close(packed[:, 4:], module(ids[:, 4:]).logits, atol=1e-5, rtol=1e-4)
        module.respect_boundaries = False
        assert (module(ids, doc_ids=doc_ids).logits[:, 4:] - packed[:, 4:]).abs().max() > 1e-3
        module.respect_boundaries = True
    trainer = pl.Trainer(max_steps=0, logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "hyena.ckpt")
    reloaded = CausalLMModule.load_from_checkpoint(tmp_path / "hyena.ckpt").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids, doc_ids=doc_ids).logits, packed)
