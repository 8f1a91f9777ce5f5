"""SpecBlock drafter: training layout == inference drafting, checkpoint reload, Lightning module, loss masks."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lit_lowrank.decoding import (
    DraftRequest,
    EagleDrafter,
    SpecBlockDrafter,
    SpeculativeDecoder,
    TargetLM,
    plain_decode,
)
from lit_lowrank.decoding.reference_drafters import OracleDrafter, RandomDrafter
from lit_lowrank.decoding.training import DrafterDistillModule, target_feature_cache
from lit_lowrank.models.spec_drafter import BlockDrafterNet, block_training_layout
from tests.decoding.test_engine import tiny_target

REPO = Path(__file__).resolve().parents[2]
TINY = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256}


def _net(**kw) -> BlockDrafterNet:
    torch.manual_seed(0)
    net = BlockDrafterNet(32, 23, num_heads=4, context_window=3, **kw).double()
    with torch.no_grad():
        for layer in net.layers:
            if layer.shift is not None:
                layer.shift.weight.normal_(0, 0.2)  # a non-zero shift, so the test sees it
    return net.eval()


def test_training_layout_matches_inference_block_and_expansion():
    """The block outputs the drafter is trained on are the ones SpecBlockDrafter computes at inference."""
    k, window, s = 3, 3, 9
    net = _net(block_size=k)
    h = torch.randn(1, s, 32, dtype=torch.float64)
    lay = block_training_layout(s, k, window, expand_at=2)
    n = lay["positions"].numel()
    full = torch.zeros(1, n, 32, dtype=torch.float64)
    full[:, :s] = h
    full[:, lay["block1"][:, 1:]] = net.placeholders.expand(1, s, -1, -1)
    start_tok = torch.randn(s, 32, dtype=torch.float64)
    full[:, lay["block2"][:, 0]] = start_tok
    full[:, lay["block2"][:, 1:]] = net.placeholders.expand(1, s, -1, -1)
    g_train, _ = net.run(full, lay["positions"], lay["mask"], None, lay["shift_src"])
    # inference, start t = 6: context [3..6] then the K - 1 placeholders, causal, shifted
    t = 6
    ctx = h[0, t - window: t + 1]
    x = torch.cat([ctx, net.placeholders])
    m = x.shape[0]
    shift = torch.full((m,), -1)
    shift[ctx.shape[0]:] = torch.arange(ctx.shape[0] - 1, m - 1)
    pos = torch.cat([torch.arange(t - window, t + 1), t + torch.arange(1, k)])
    g_inf, kv = net.run(x[None], pos, torch.ones(m, m, dtype=torch.bool).tril(), None, shift)
    torch.testing.assert_close(g_inf[0, ctx.shape[0] - 1:], g_train[0, lay["block1"][t]])
    # block 2 from block position 2 (j* = 2): attends to the context, block-1 position 2 and itself
    x2 = torch.cat([start_tok[t: t + 1], net.placeholders])
    mask2 = torch.zeros(k, m + k, dtype=torch.bool)
    mask2[:, : ctx.shape[0] + 1] = True
    mask2[:, m:] = torch.ones(k, k, dtype=torch.bool).tril()
    pos2 = t + 2 + torch.arange(k)
    g2, _ = net.run(x2[None], pos2, mask2, kv, torch.tensor([-1, 0, 1]))
    torch.testing.assert_close(g2[0], g_train[0, lay["block2"][t]])


def test_drafter_checkpoint_reload(tmp_path):
    net = _net(block_size=2, draft_vocab_size=7)
    net.set_draft_vocab(torch.tensor([3, 1, 4, 15, 9, 2, 6]))
    path = tmp_path / "drafter.pt"
    net.save(path)
    again = BlockDrafterNet.load(path).double().eval()
    target = TargetLM(tiny_target())
    request = DraftRequest(torch.tensor([1, 2, 3, 4, 5]), torch.randn(4, 32, dtype=torch.float64), 8, target)
    a = SpecBlockDrafter(net, blocks=2, expand=2, max_branch=4).draft(request)
    b = SpecBlockDrafter(again, blocks=2, expand=2, max_branch=4).draft(request)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    assert set(a.tokens.tolist()) <= {3, 1, 4, 15, 9, 2, 6}


def test_valid_prefix_mask_and_shift_in_training_loss():
    torch.manual_seed(0)
    b, t = 2, 10
    emb, feats, y = torch.randn(b, t, 32), torch.randn(b, t, 32), torch.randint(0, 23, (b, t))
    masked = BlockDrafterNet(32, 23, block_size=3, num_heads=4)
    loss, parts = masked.training_loss(emb, feats, y, expand_at=None)
    assert parts["valid_fraction"] < 0.6  # an untrained drafter is mostly wrong: later positions masked out
    plain = BlockDrafterNet(32, 23, block_size=3, num_heads=4, valid_prefix=False)
    loss, _ = plain.training_loss(emb, feats, y, expand_at=3)
    loss.backward()
    assert plain.layers[0].shift.weight.grad.abs().sum() > 0  # the shift is trained (zero-initialised)
    assert plain.placeholders.grad.abs().sum() > 0


def test_lightning_module_fits_and_checkpoint_holds_the_drafter_only(tmp_path):
    module = DrafterDistillModule(model_config=TINY, vocab_size=23, drafter={"block_size": 3, "num_heads": 4})
    torch.manual_seed(0)
    ids = torch.randint(0, 23, (8, 12))
    data = [{"input_ids": ids[i: i + 2], "labels": ids[i: i + 2], "doc_ids": torch.zeros(2, 12, dtype=torch.long)}
            for i in range(0, 8, 2)]
    trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path,
                         limit_val_batches=1)
    before = {k: v.clone() for k, v in module.drafter.state_dict().items()}
    loader = DataLoader(data, batch_size=None)  # each item is already a batch
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    assert any(not torch.equal(before[k], v) for k, v in module.drafter.state_dict().items())
    assert not module.target.training
    path = tmp_path / "drafter.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["state_dict"]
    assert saved and all(k.startswith("drafter.") for k in saved)
    reloaded = DrafterDistillModule.load_from_checkpoint(path)
    for k, v in module.drafter.state_dict().items():
        assert torch.equal(reloaded.drafter.state_dict()[k], v), k


def test_target_feature_cache_round_trip(tmp_path):
    model = tiny_target().float()
    windows = torch.randint(0, 23, (3, 8))
    first = target_feature_cache(model, windows, tmp_path, batch_size=2)
    assert first["features"].shape == (3, 8, 32) and first["target_ids"].shape == (3, 8)
    assert len(list(tmp_path.glob("features-*.pt"))) == 1
    with torch.no_grad():
        torch.testing.assert_close(first["target_ids"], model(windows).logits.argmax(-1))
    second = target_feature_cache(model, windows, tmp_path)
    assert torch.equal(first["features"], second["features"])


def _fresh_tree(net: BlockDrafterNet, request: DraftRequest, **kw):
    drafter = SpecBlockDrafter(net, **kw) if net.block_size > 1 else EagleDrafter(net, depth=3, topk=2)
    return drafter.draft(request)


@pytest.mark.parametrize("block_size", [1, 3])
def test_drafter_kv_cache_equals_recomputation(block_size):
    """Across rounds the cached drafter drafts what a drafter rebuilt from scratch each round drafts
    (one layer: a context entry's key/value depends only on its own input)."""
    net = _net(block_size=block_size)
    target = TargetLM(tiny_target())
    kw = dict(blocks=2, expand=2, max_branch=3)
    cached = SpecBlockDrafter(net, **kw) if block_size > 1 else EagleDrafter(net, depth=3, topk=2)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 23, (40,), generator=g)
    feats = torch.randn(40, 32, generator=g, dtype=torch.float64)
    n = 5
    for step in (1, 3, 2, 1, 4, 2, 1):  # rounds committing a few tokens each (as after verification)
        request = DraftRequest(tokens[:n], feats[: n - 1], 8, target)
        a, b = cached.draft(request), _fresh_tree(net, request, **kw)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents), n
        n += step
    assert cached.context.length <= net.context_window + 4  # the window before the newest items, and them


def test_reference_drafters_bound_the_engine():
    model = tiny_target(seed=1)
    target = TargetLM(model)
    prompt = torch.tensor([3, 1, 4])
    ref, _ = plain_decode(target, prompt, max_new_tokens=20)
    out, stats = SpeculativeDecoder(target, OracleDrafter(ref, length=4), budget=4).generate(prompt, 20)
    assert torch.equal(out, ref)
    assert stats.accepted[:-1] == [4] * (len(stats.accepted) - 1)  # every full round is accepted
    out, stats = SpeculativeDecoder(target, RandomDrafter(23, length=4), budget=4).generate(prompt, 20)
    assert torch.equal(out, ref)
    assert stats.mean_acceptance_length < 1.5  # random guesses over 23 tokens are (almost) all rejected
    with pytest.raises(ValueError, match="length"):
        OracleDrafter(ref, length=0)


def test_drafter_configs_equal_the_benchmark_settings():
    """configs/language_model/real/<name>_smollm2.yaml is what the specblock benchmark trains."""
    import yaml

    from lit_lowrank.benchmarks.specblock.drafters import DATA, DRAFTERS, OPTIM, SEED, STEPS

    for name, module in DRAFTERS.items():
        cfg = yaml.safe_load((REPO / "configs" / "language_model" / "real" / f"{name}_smollm2.yaml").read_text())
        args = cfg["model"]["init_args"]
        assert cfg["seed_everything"] == SEED and cfg["trainer"]["max_steps"] == STEPS[name]
        assert cfg["data"]["init_args"] == DATA and args["pretrained_path"] == DATA["target"]
        for key in ("architecture", "draft_vocab", "drafter"):
            assert args[key] == module[key], (name, key)
        assert args["optimizer"]["init_args"] == {"lr": OPTIM["lr"], "weight_decay": OPTIM["weight_decay"]}
        sched = args["lr_scheduler"]["init_args"]
        assert sched == {"max_lr": OPTIM["lr"], "total_steps": STEPS[name], "pct_start": OPTIM["pct_start"]}
        assert cfg["trainer"]["gradient_clip_val"] == 1.0


def test_top_n_draft_vocabulary_comes_from_the_datamodule(tmp_path):
    class Counts(pl.LightningDataModule):
        def target_token_counts(self):
            return torch.tensor([0, 5, 1, 9, 0, 7] + [0] * 17)

        def train_dataloader(self):
            ids = torch.randint(0, 23, (4, 10))
            return DataLoader([{"input_ids": ids, "labels": ids}], batch_size=None)

    module = DrafterDistillModule(model_config=TINY, vocab_size=23, drafter={"block_size": 2, "num_heads": 4},
                                  draft_vocab="top:3")
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path)
    trainer.fit(module, datamodule=Counts())
    assert module.drafter.draft_vocab.tolist() == [3, 5, 1]
    torch.testing.assert_close(module.drafter.head.weight, module.target.lm_head.weight[[3, 5, 1]])
    medusa = DrafterDistillModule(model_config=TINY, vocab_size=23, architecture="medusa",
                                  drafter={"num_heads": 2}, draft_vocab=5)
    assert all(h.weight.requires_grad for h in medusa.drafter.heads)  # Medusa trains its heads
    with pytest.raises(ValueError, match="top:N"):
        DrafterDistillModule(model_config=TINY, vocab_size=23, draft_vocab="top:99")


def test_prompt_tokens_extend_a_frozen_target_head_vocabulary():
    """With the target's own rows as the head, the prompt's ids join a reduced draft vocabulary (lossless)."""
    model = tiny_target()
    target = TargetLM(model)
    torch.manual_seed(0)
    net = BlockDrafterNet(32, 23, block_size=2, num_heads=4, draft_vocab_size=5).double().eval()
    net.set_draft_vocab(torch.tensor([0, 1, 2, 3, 4]))
    net.init_head_from(model.lm_head.weight)
    prompt = torch.tensor([9, 17, 21, 9, 2])
    ref, _ = plain_decode(target, prompt, max_new_tokens=12)
    for drafter in (SpecBlockDrafter(net, blocks=2, expand=2, max_branch=3), EagleDrafter(net, depth=2, topk=2)):
        out, _ = SpeculativeDecoder(target, drafter, budget=6).generate(prompt, max_new_tokens=12)
        assert torch.equal(out, ref)
        assert drafter.vocab.ids.tolist()[:5] == [0, 1, 2, 3, 4] and {9, 17, 21} <= set(drafter.vocab.ids.tolist())
    with torch.no_grad():
        net.head.weight.add_(0.1)  # a trained head: its rows are no longer the target's -> no extension
    drafter = SpecBlockDrafter(net, blocks=2, expand=2, max_branch=3)
    SpeculativeDecoder(target, drafter, budget=6).generate(prompt, max_new_tokens=4)
    assert drafter.vocab.ids.tolist() == [0, 1, 2, 3, 4]
