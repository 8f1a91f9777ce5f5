"""CausalLMModule: packed documents never see each other; loss, perplexity, generation."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from lit_lowrank.datamodules import PackedTextDataModule
from lit_lowrank.tasks import CausalLMModule, block_causal_attention_mask

TINY = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return CausalLMModule(model_config=TINY, vocab_size=258).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_documents_equal_separate_forwards(attn):
    """With boundaries respected, each document's logits equal a forward of it alone."""
    torch.manual_seed(0)
    m = CausalLMModule(model_config=TINY, vocab_size=258, attn_implementation=attn).eval()
    ids = torch.randint(0, 258, (1, 11))
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]])
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3]])
    with torch.no_grad():
        packed = m(ids, pos, doc_ids).logits
        for lo, hi in [(0, 4), (4, 7), (7, 11)]:
            alone = m(ids[:, lo:hi]).logits
            torch.testing.assert_close(packed[:, lo:hi], alone, atol=1e-5, rtol=1e-4)
        m.respect_boundaries = False
        leaky = m(ids, pos, doc_ids).logits
    assert (leaky[:, 4:7] - packed[:, 4:7]).abs().max() > 1e-3  # the ablation really differs


def test_block_mask_values():
    mask = block_causal_attention_mask(torch.tensor([[0, 0, 1]]), torch.float32)
    allowed = mask[0, 0] == 0
    assert allowed.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        block_causal_attention_mask(torch.zeros(3), torch.float32)


def test_loss_ignores_masked_labels_and_ppl_is_exp_loss(model, tmp_path):
    data = PackedTextDataModule(corpus="lee", seq_len=64, batch_size=8, max_documents=40)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    out = model.step(batch)
    keep = batch["labels"] != -100
    ref = torch.nn.functional.cross_entropy(out["logits"][keep], batch["labels"][keep])
    torch.testing.assert_close(out["loss"], ref)
    assert out["hidden_states"].shape == (*batch["input_ids"].shape, TINY["hidden_size"])
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, limit_val_batches=3)
    trainer.validate(model, datamodule=data, verbose=False)
    metrics = trainer.callback_metrics
    assert math.isclose(float(metrics["val/ppl"]), math.exp(float(metrics["val/loss"])), rel_tol=1e-3)


def test_generate_is_greedy_and_deterministic(model):
    prompt = torch.tensor([[72, 101, 108, 108, 111]])
    a = model.generate(prompt, max_new_tokens=6)
    b = model.generate(prompt, max_new_tokens=6)
    assert a.shape == (1, 11) and torch.equal(a, b) and torch.equal(a[:, :5], prompt)


def test_training_reduces_loss(tmp_path):
    pl.seed_everything(0)
    data = PackedTextDataModule(corpus="lee", seq_len=64, batch_size=8, max_documents=60)
    m = CausalLMModule(model_config=TINY, vocab_size=258, optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3))
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    before = float(m.step(batch)["loss"])
    pl.Trainer(max_steps=40, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path).fit(m, datamodule=data)
    assert float(m.step(batch)["loss"]) < before - 1.0


def test_bad_config_and_missing_path(tmp_path):
    with pytest.raises(ValueError, match="model_type"):
        CausalLMModule(model_config={"hidden_size": 8})
    with pytest.raises(ValueError, match="'not_a_model'"):
        CausalLMModule(model_config={"model_type": "not_a_model"})
    with pytest.raises(FileNotFoundError, match="pretrained_path"):
        CausalLMModule(pretrained_path=str(tmp_path / "missing"))
