"""SpecBlock benchmark: lossless tree speculative decoding with SpecBlock (+ bandit) vs EAGLE-style and Medusa.

**Target.** Quick mode: a byte-level Llama (4 layers, width 128, 150 steps) trained on the Lee news
corpus at the start of the run (cached under ``$LIT_LOWRANK_CACHE/specblock-bench``, so a
re-run skips it); SmolLM2-135M on this 2-core CPU costs ~0.1 s per token, too slow to
generate training features and decode within the quick budget. Full mode: the offline
SmolLM2-135M-Instruct (frozen), Lee tokenised with its tokenizer, a 4096-id draft
vocabulary of the target's most frequent outputs.

**Drafters** (same network size: one decoder layer of the target's width, the target's
LM head rows frozen; same data, steps and optimiser), trained on the target's cached
last hidden states and argmax over the training documents
(:func:`~lit_lowrank.decoding.training.target_feature_cache`):

- ``eagle``: ``block_size=1``, no shift, no rank head, plain masked mean; drafted with
  :class:`~lit_lowrank.decoding.EagleDrafter` (dynamic top-k tree, one forward per depth);
- ``specblock``: ``block_size=4``, layer-wise shift, valid-prefix mask, rank head; drafted
  with :class:`~lit_lowrank.decoding.SpecBlockDrafter` (2 forwards per round);
- ``medusa``: Medusa-1 parallel heads (4 heads, residual SiLU block + an LM head initialised
  from the target's, trainable) on the same features, steps, batch and optimiser; one
  forward per round (:class:`~lit_lowrank.decoding.MedusaDrafter`);
- ``specblock_bandit``: a copy of the ``specblock`` net wrapped in
  :class:`~lit_lowrank.decoding.BanditAdaptiveDrafter` (epochs of 8 rounds, 1 AdamW step
  (lr 2e-3) on the last 32 decoded positions per update; the update time is inside its wall time);
  it restarts from the deployed weights at the start of every repeat;
- ablations: ``no_rank_head`` (same net, branching by draft probabilities), and in full
  mode ``no_shift`` and ``no_mask`` (retrained).

**Decoding.** Greedy, the same prompts for every method: a stream that shifts — the first
32 tokens of held-out Lee documents, then of text8 (Wikipedia) documents no drafter saw
(``tau_in_domain`` / ``tau_shifted``) — and the same verifier budget (draft nodes per
round); each prompt is decoded by every method in turn (A B C ..., interleaved, warm-up on
the first prompt) and wall times are medians over prompts and repeats. Rows: mean
acceptance length τ (tokens per target forward), drafter forwards per round, drafting
time per round relative to EAGLE-style, tokens/s ratio to plain decoding, whether the
output equals plain greedy decoding (all prompts), the bandit's arm counts.
"""

from __future__ import annotations

import copy
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from lit_lowrank.benchmarks._tiny_lm import load_cached, train_and_cache
from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.decoding import (
    EagleDrafter,
    MedusaDrafter,
    SpecBlockDrafter,
    SpeculativeDecoder,
    TargetLM,
    plain_decode,
)
from lit_lowrank.decoding.adaptive import BanditAdaptiveDrafter
from lit_lowrank.decoding.engine import DecodeStats, Drafter
from lit_lowrank.decoding.training import target_feature_cache
from lit_lowrank.models.spec_drafter import BlockDrafterNet, MedusaHeads

# quick: 32-token training windows (the SpecBlock training pass grows with T * (2K - 1) tokens and its
# attention with the square of that; 32 x 8 keeps one step at ~0.1 s CPU, so 300 steps fit), 2 in-domain then
# 4 shifted prompts
QUICK = dict(target_steps=150, windows=384, seq_len=32, drafter_steps=300, batch=8, prompts=2, shifted_prompts=4,
             prompt_len=32, max_new=64, budget=24, repeats=1)
FULL = dict(target_steps=400, windows=400, seq_len=128, drafter_steps=800, batch=8, prompts=6, shifted_prompts=6,
            prompt_len=32, max_new=96, budget=24, repeats=2)
TINY_TARGET = dict(model_type="llama", hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024)


def _cache_dir() -> Path:
    root = os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank"
    path = Path(root) / "specblock-bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _documents(tokenizer: str, corpus: str = "lee") -> tuple[list[list[int]], list[list[int]], int]:
    """(train documents, held-out documents, EOS id), tokenised, EOS-terminated."""
    from lit_lowrank.datamodules import PackedTextDataModule

    dm = PackedTextDataModule(corpus=corpus, tokenizer=tokenizer, seq_len=128, seed=0)
    dm.setup("fit")

    def split(ds) -> list[list[int]]:
        docs, toks = [], ds.tokens.tolist()
        ids = ds.doc_ids.tolist()
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or ids[i] != ids[start]:
                docs.append(toks[start:i])
                start = i
        return docs

    return split(dm.train_set), split(dm.val_set), dm.eos_token_id


def _windows(docs: list[list[int]], seq_len: int, n: int) -> torch.Tensor:
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.long)
    usable = min(n, stream.numel() // seq_len)
    return stream[: usable * seq_len].view(usable, seq_len)


def _tiny_target(train_docs: list[list[int]], steps: int, seed: int) -> torch.nn.Module:
    """The quick-mode target: a byte-level Llama trained on Lee (cached)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(TINY_TARGET)
    config = AutoConfig.for_model(kwargs.pop("model_type"), vocab_size=258, **kwargs)
    path = _cache_dir() / f"tiny-target-{steps}-{seed}.pt"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if load_cached(model, path):
        return model
    return train_and_cache(model, _windows(train_docs, 128, 10**9), steps, lr=5e-3, seed=seed, path=path)


def _fit_on_cache(net: torch.nn.Module, data: dict[str, torch.Tensor], steps: int, batch: int, seed: int,
                  loss_of: Any) -> tuple[Any, dict[str, float]]:
    """The one recipe every drafter trains with on the cached target features: AdamW over the trainable
    parameters, one-cycle lr, clipped gradients, random rows; ``loss_of(idx) -> (loss, parts)``."""
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=2e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    n = data["input_ids"].shape[0]
    start, parts = time.perf_counter(), {}
    net.train()
    for _ in range(steps):
        loss, parts = loss_of(torch.randint(0, n, (batch,), generator=g))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
    info = {k: float(v) for k, v in parts.items()}
    info["train_seconds"] = time.perf_counter() - start
    return net.eval(), info


def _train_drafter(target: torch.nn.Module, data: dict[str, torch.Tensor], steps: int, batch: int, seed: int,
                   draft_vocab: torch.Tensor | None, **net_kwargs: Any) -> tuple[BlockDrafterNet, dict[str, float]]:
    cfg = target.config
    torch.manual_seed(seed)
    net = BlockDrafterNet(cfg.hidden_size, cfg.vocab_size, num_layers=1, num_heads=cfg.num_attention_heads,
                          draft_vocab_size=None if draft_vocab is None else draft_vocab.numel(), **net_kwargs)
    if draft_vocab is not None:
        net.set_draft_vocab(draft_vocab)
    net.init_head_from(target.get_output_embeddings().weight)
    net.head.requires_grad_(False)  # the target's head, frozen (EAGLE)
    embed = target.get_input_embeddings()

    def loss_of(idx: torch.Tensor):
        with torch.no_grad():
            emb = embed(data["input_ids"][idx])
        return net.training_loss(emb, data["features"][idx].float(), data["target_ids"][idx])

    return _fit_on_cache(net, data, steps, batch, seed, loss_of)


def _train_medusa(target: torch.nn.Module, data: dict[str, torch.Tensor], steps: int, batch: int, seed: int,
                  depth: int) -> tuple[MedusaHeads, dict[str, float]]:
    """Medusa-1 heads on the same cached features, steps, batch and optimiser as the feature drafters."""
    cfg = target.config
    torch.manual_seed(seed)
    heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, num_heads=depth)
    heads.init_head_from(target.get_output_embeddings().weight)
    return _fit_on_cache(heads, data, steps, batch, seed,
                         lambda idx: heads.training_loss(data["features"][idx].float(), data["target_ids"][idx]))


def _decode_all(target: TargetLM, methods: dict[str, Drafter | None], prompts: list[torch.Tensor], max_new: int,
                budget: int, eos: int | None, repeats: int) -> dict[str, Any]:
    """Every prompt by every method in turn; per method: times, stats, outputs, per-prompt τ (first repeat).

    Round 0 warms up on the first prompt only; an adaptive drafter restarts from its deployed
    weights at the start of every repeat (each repeat is the same stream from the start).
    """
    out: dict[str, Any] = {m: {"times": [], "stats": DecodeStats(), "outputs": [], "taus": [], "rep_seconds": 0.0}
                           for m in methods}
    for rep in range(repeats + 1):  # round 0 is the warm-up
        for name in methods:
            out[name]["rep_seconds"] = 0.0  # decode seconds of this repeat (the last one is kept)
        for drafter in methods.values():
            if isinstance(drafter, BanditAdaptiveDrafter):
                drafter.restart()
        for prompt in prompts if rep else prompts[:1]:
            for name, drafter in methods.items():
                start = time.perf_counter()
                if drafter is None:
                    tokens, stats = plain_decode(target, prompt, max_new, eos)
                else:
                    tokens, stats = SpeculativeDecoder(target, drafter, budget).generate(prompt, max_new, eos)
                elapsed = time.perf_counter() - start
                out[name]["rep_seconds"] += elapsed
                if rep == 0:
                    continue
                out[name]["times"].append(elapsed / max(stats.new_tokens, 1))
                out[name]["stats"] = out[name]["stats"].merge(stats)
                if rep == 1:
                    out[name]["outputs"].append(tokens)
                    out[name]["taus"].append(stats.mean_acceptance_length)
    return out


def run(quick: bool, seed: int) -> BenchmarkResult:
    cfg = QUICK if quick else FULL
    torch.set_num_threads(1)  # a shared 2-core machine: one thread per op spins less
    random.seed(seed)  # training_loss draws the block-2 start with `random`
    t0 = time.perf_counter()
    if quick:
        train_docs, val_docs, eos = _documents("byte")
        shifted_docs = _documents("byte", "text8")[1]
        target_model = _tiny_target(train_docs, cfg["target_steps"], seed)
        draft_vocab = None
    else:
        from lit_lowrank.models.pretrained import load_smollm2

        train_docs, val_docs, eos = _documents("smollm2")
        shifted_docs = _documents("smollm2", "text8")[1]
        target_model, _ = load_smollm2()
        draft_vocab = None
    target_seconds = time.perf_counter() - t0
    windows = _windows(train_docs, cfg["seq_len"], cfg["windows"])
    data = target_feature_cache(target_model, windows, _cache_dir())
    if not quick:  # the target's most frequent outputs (EAGLE-3's reduced draft vocabulary)
        counts = torch.bincount(data["target_ids"].flatten().clamp(min=0), minlength=target_model.config.vocab_size)
        draft_vocab = counts.argsort(descending=True)[:4096]
    feature_seconds = time.perf_counter() - t0 - target_seconds
    variants = {
        "eagle": dict(block_size=1, layer_shift=False, rank_head=False, valid_prefix=False),
        "specblock": dict(block_size=4, layer_shift=True, rank_head=True, valid_prefix=True),
    }
    if not quick:
        variants["specblock_no_shift"] = dict(block_size=4, layer_shift=False, rank_head=True, valid_prefix=True)
        variants["specblock_no_mask"] = dict(block_size=4, layer_shift=True, rank_head=True, valid_prefix=False)
    nets, train_info = {}, {}
    for name, kw in variants.items():
        nets[name], train_info[name] = _train_drafter(target_model, data, cfg["drafter_steps"], cfg["batch"], seed,
                                                      draft_vocab, **kw)
    medusa, train_info["medusa"] = _train_medusa(target_model, data, cfg["drafter_steps"], cfg["batch"], seed,
                                                 depth=4)
    methods: dict[str, Drafter | None] = {
        "plain": None,
        "medusa": MedusaDrafter(medusa, topk=4),
        "eagle": EagleDrafter(nets["eagle"], depth=6, topk=4),
        "specblock": SpecBlockDrafter(nets["specblock"], blocks=2, expand=4),
        # its own copy of the SpecBlock net: the updates must not leak into the other rows
        "specblock_bandit": BanditAdaptiveDrafter(SpecBlockDrafter(copy.deepcopy(nets["specblock"]), blocks=2,
                                                                   expand=4), interval=8, window=32, steps=1,
                                                 lr=2e-3),
        "specblock_no_rank_head": SpecBlockDrafter(nets["specblock"], blocks=2, expand=4, use_rank_head=False),
    }
    for name in ("specblock_no_shift", "specblock_no_mask"):
        if name in nets:
            methods[name] = SpecBlockDrafter(nets[name], blocks=2, expand=4)
    # the prompt stream shifts: held-out Lee news first, then Wikipedia (text8) the drafters never saw
    def take(docs: list[list[int]], n: int) -> list[torch.Tensor]:
        return [torch.tensor(d[: cfg["prompt_len"]]) for d in docs if len(d) > cfg["prompt_len"] + 8][:n]

    prompts = take(val_docs, cfg["prompts"]) + take(shifted_docs, cfg["shifted_prompts"])
    n_in = min(cfg["prompts"], len(prompts))
    target = TargetLM(target_model)
    t1 = time.perf_counter()
    res = _decode_all(target, methods, prompts, cfg["max_new"], cfg["budget"], eos, cfg["repeats"])
    decode_seconds = time.perf_counter() - t1

    plain_time = statistics.median(res["plain"]["times"])
    eagle_draft = res["eagle"]["stats"].draft_seconds / max(res["eagle"]["stats"].rounds, 1)
    rows = []
    for name, r in res.items():
        st: DecodeStats = r["stats"]
        same = all(torch.equal(a, b) for a, b in zip(r["outputs"], res["plain"]["outputs"]))
        row = {"method": name, "tau": round(st.mean_acceptance_length, 3),
               "drafter_forwards_per_round": round(st.forwards_per_round, 2),
               "draft_nodes_per_round": round(st.draft_nodes / max(st.rounds, 1), 1),
               "draft_cost_vs_eagle": round(st.draft_seconds / max(st.rounds, 1) / eagle_draft, 3)
               if name != "plain" else 0.0,
               "draft_share": round(st.draft_share, 3),
               "speedup_vs_plain": round(plain_time / statistics.median(r["times"]), 3),
               "ms_per_token": round(1000 * statistics.median(r["times"]), 2),
               "greedy_identical": same}
        row["tau_in_domain"] = round(statistics.mean(r["taus"][:n_in]), 3) if n_in else 0.0
        row["tau_shifted"] = round(statistics.mean(r["taus"][n_in:]), 3) if len(r["taus"]) > n_in else 0.0
        if name in train_info:
            row["train_acc1"] = round(train_info[name]["acc1"], 3)
        if isinstance(methods[name], BanditAdaptiveDrafter):
            row["arms"] = methods[name].arm_counts()
            # update time over the whole last repeat's decode time (the update cost the bandit weighed)
            row["update_share"] = round(methods[name].update_seconds / max(r["rep_seconds"], 1e-9), 3)
        rows.append(row)
    by = {r["method"]: r for r in rows}
    sb, eg = by["specblock"], by["eagle"]
    claims = [
        legacy_claim("SpecBlock speedup over plain decoding exceeds EAGLE-style's (ratio - 1)",
              sb["speedup_vs_plain"] / eg["speedup_vs_plain"] - 1, 0.0, ">"),
        legacy_claim("SpecBlock drafting cost per round <= 55% of EAGLE-style's", sb["draft_cost_vs_eagle"], 0.55, "<="),
        legacy_claim("every method's greedy output equals plain greedy decoding (fraction of methods)",
              sum(r["greedy_identical"] for r in rows) / len(rows), 1.0, ">="),
        legacy_claim("the rank head raises tau over probability branching (tau ratio - 1)",
              sb["tau"] / by["specblock_no_rank_head"]["tau"] - 1, 0.0, ">"),
        legacy_claim("the bandit adds a speedup on the shifting stream (bandit / SpecBlock speedup - 1)",
              by["specblock_bandit"]["speedup_vs_plain"] / sb["speedup_vs_plain"] - 1, 0.0, ">"),
    ]
    notes = {"target": "tiny byte-level Llama (4x128, 150 steps) trained on Lee" if quick else "SmolLM2-135M-Instruct",
             "target_seconds": round(target_seconds, 1), "feature_seconds": round(feature_seconds, 1),
             "decode_seconds": round(decode_seconds, 1), "budget": cfg["budget"], "prompts": len(prompts),
             "prompt_stream": f"{n_in} Lee (in-domain) then {len(prompts) - n_in} text8 (shifted)",
             "max_new_tokens": cfg["max_new"],
             "drafter_train": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in train_info.items()}}
    return BenchmarkResult(rows, claims, notes)
