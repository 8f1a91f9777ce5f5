"""Drafter files: the shipped safetensors format round-trips; pickled drafter files are refused."""

from __future__ import annotations

import os

import pytest
import torch

from lit_lowrank.core.safe_load import UnsafeFileError
from lit_lowrank.decoding.shipped import SHIPPED, load_drafter_file, read_metadata, save_drafter, shipped_path
from lit_lowrank.models.spec_drafter import BlockDrafterNet, MedusaHeads
from tests.decoding.test_engine import tiny_target

MARK = "lit_lowrank_drafter_pwned"


def _pwn() -> None:
    os.environ[MARK] = "1"


class Payload:
    def __reduce__(self):
        return (_pwn, ())


def _net(model) -> BlockDrafterNet:
    torch.manual_seed(0)
    net = BlockDrafterNet(32, 23, block_size=2, num_heads=4, draft_vocab_size=6)
    net.set_draft_vocab(torch.tensor([3, 1, 4, 5, 9, 2]))
    net.init_head_from(model.lm_head.weight.float())
    return net


def test_save_and_load_a_drafter_with_the_targets_head(tmp_path):
    model = tiny_target().float()
    net = _net(model)
    path = tmp_path / "d.safetensors"
    save_drafter(net, path, key="abc", info={"acc1": 0.5}, target_head=model.lm_head.weight)
    meta = read_metadata(path)
    assert meta["key"] == "abc" and meta["head"] == "target" and meta["info"] == {"acc1": 0.5}
    loaded, _ = load_drafter_file(path, model)
    for k, v in net.state_dict().items():
        tol = 0 if k == "head.weight" or not v.is_floating_point() else 1e-3  # float16 storage; the head exact
        torch.testing.assert_close(loaded.state_dict()[k], v, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="pass the target `model`"):
        load_drafter_file(path)
    with torch.no_grad():
        net.head.weight.add_(1.0)  # a trained head is stored
    save_drafter(net, path, key="abc", info={}, target_head=model.lm_head.weight)
    assert read_metadata(path)["head"] == "stored"
    torch.testing.assert_close(load_drafter_file(path)[0].head.weight, net.head.weight, atol=1e-3, rtol=1e-3)


def test_shipped_files_are_named_and_unknown_names_refused():
    assert all(shipped_path(n).name == f"{n}-smollm2.safetensors" for n in SHIPPED)
    with pytest.raises(ValueError, match="No shipped drafter 'medusa'"):
        shipped_path("medusa")


def test_medusa_load_refuses_a_pickled_payload(tmp_path):
    heads = MedusaHeads(32, 23, num_heads=2)
    good = tmp_path / "heads.pt"
    heads.save(good)
    assert torch.equal(MedusaHeads.load(good).heads[0].weight, heads.heads[0].weight)
    bad = tmp_path / "crafted.pt"
    torch.save({"config": heads.config, "state_dict": heads.state_dict(), "x": Payload()}, bad)
    with pytest.raises(UnsafeFileError, match="not unpickled"):
        MedusaHeads.load(bad)
    assert MARK not in os.environ


def test_benchmark_drafter_cache_refuses_a_pickled_payload(tmp_path, monkeypatch):
    from lit_lowrank.benchmarks.specblock import drafters

    monkeypatch.setenv("LIT_LOWRANK_CACHE", str(tmp_path))
    path = tmp_path / "specblock-drafters" / f"medusa-{drafters.settings_key('medusa')}.pt"
    path.parent.mkdir(parents=True)
    heads = MedusaHeads(32, 23, num_heads=2)
    torch.save({"config": heads.config, "state_dict": heads.state_dict(), "info": {"x": Payload()}}, path)
    with pytest.raises(UnsafeFileError, match="not unpickled"):
        drafters.trained_drafter("medusa")
    assert MARK not in os.environ


@pytest.mark.slow
def test_shipped_drafters_are_current_and_decode_smollm2_losslessly():
    """The committed drafters match today's training settings (the benchmark and users load them instead of
    training); on SmolLM2, speculative decoding with them returns greedy `generate`'s tokens, and the reloaded
    file reproduces the τ measured when it was written."""
    from lit_lowrank.benchmarks.specblock.drafters import TAU_CHECK, settings_key, shipped_tau
    from lit_lowrank.decoding import EagleDrafter, SpecBlockDrafter, speculative_generate
    from lit_lowrank.decoding.distill_data import chat_prompt_ids, instruction_prompts
    from lit_lowrank.decoding.shipped import load_drafter
    from lit_lowrank.models.pretrained import load_smollm2

    for name in SHIPPED:
        assert shipped_path(name).is_file(), f"{shipped_path(name)} is not committed"
        assert read_metadata(shipped_path(name))["key"] == settings_key(name), f"{name}: re-run ship_drafter"
    model, tokenizer = load_smollm2()
    prompt = torch.tensor(chat_prompt_ids(tokenizer, instruction_prompts("lee", "test", 1))[0]).unsqueeze(0)
    n = TAU_CHECK["max_new_tokens"]
    greedy = model.generate(prompt, max_new_tokens=n, do_sample=False)
    drafters = {"specblock": lambda net: SpecBlockDrafter(net, **TAU_CHECK["specblock"]),
                "eagle": lambda net: EagleDrafter(net, **TAU_CHECK["eagle"])}
    for name, make in drafters.items():
        net = load_drafter(name, model)
        out, stats = speculative_generate(model, prompt, max_new_tokens=n, drafter=make(net), do_sample=False,
                                          return_stats=True)
        assert torch.equal(out, greedy), name
        assert stats.mean_acceptance_length > 1.0, (name, stats)  # some drafts were accepted
        stored = read_metadata(shipped_path(name))["info"]["tau_check"]
        assert shipped_tau(name, net, model, tokenizer) == pytest.approx(stored, abs=1e-6), name
