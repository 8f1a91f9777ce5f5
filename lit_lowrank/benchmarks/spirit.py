"""SPIRIT benchmark: speed-driven online layer-skip self-speculation on SmolLM2-135M-Instruct (CPU, no training),
against transformers ``generate`` and the training-free layer-skip baselines, on a stream that shifts domain.

**Target.** SmolLM2-135M-Instruct (fp32, 30 layers: 56 skippable sublayers), greedy, 2 intra-op threads.
Every self-drafter drafts chains (``draft_length=6``, SWIFT's confidence stop at 0.5) over the 8,192-id
draft vocabulary ``0..8191`` (BPE ids in merge order: FR-Spec's frequent-token head; the full 49k head is
a fifth of the model and would be paid at every draft token).

**Stream.** Instruction prompts in the chat template (:func:`~lit_lowrank.decoding.distill_data.
instruction_prompts`): Lee-news ``test`` documents, then text8-Wikipedia ``test`` documents (the domain
switch). Every prompt runs every method in a rotated order; the drafters keep their state along the
stream (online adaptation), and their search work (matchness forwards) happens inside their decode
calls, so it is in the wall time they report.

**Baselines** (the same skip-ratio grid as SPIRIT, tuned offline on validation): for each ratio of
the grid a Draft&Verify-style Bayesian search (GP + expected improvement,
:class:`~lit_lowrank.decoding.OfflineBayesDrafter`) finds the pattern with the best matchness on the
target's greedy answers to ``val`` Lee prompts; the ratio whose pattern decodes fastest on a ``val``
prompt is then used by ``offline_bayes`` (that pattern), ``agreement_only`` (SWIFT-style online
matchness search at that ratio) and ``fixed_ratio`` (a random pattern at that ratio; full mode only: no
claim reads it, and quick mode's 3 minutes do not hold a fourth drafter). SPIRIT gets
no validation data: it searches the ratio online, on the test stream. Control ``random``: a
:class:`~lit_lowrank.decoding.reference_drafters.RandomDrafter` 4-token chain.

**Ceiling** (``ceiling@r``, per ratio of ``ceiling_grid``, on the first ``ceiling_prompts`` prompts of
each domain): an always-right layer-skip drafter at ratio ``r`` — every round runs a
``DRAFT_LENGTH``-token chain of the skipped model (the offline pattern where ``r`` is on the grid, a
random one elsewhere; no early stop) for its cost, then proposes the true greedy continuation
(:class:`~lit_lowrank.decoding.reference_drafters.OracleDrafter` with ``cost=``). No drafter that
skips that many sublayers decodes faster on this machine; ``notes["ceiling"]`` sets the per-token
acceptance it would need to break even (:func:`~lit_lowrank.ops.spirit.break_even_acceptance`) beside
the matchness measured at that ratio.

**Premises** (``ceiling_<r>``, paired over the ceiling prompts): the always-right drafter at ratio ``r``
beats generate. The speed claims require the one nearest the skip ratio the tuned baselines chose on
validation: where even an always-right drafter is not faster, a "fails" would say nothing about SPIRIT.

**Measure.** Decode tokens/s after the first output token, per prompt; claims are per-prompt paired
ratios (geometric mean, t interval over prompts).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from lit_lowrank.benchmarks._decoding_peers import decode_rate, engine_decode, first_divergence, hf_generate
from lit_lowrank.benchmarks.harness import BenchmarkResult, claim, competitor, paired, premise
from lit_lowrank.ops.spirit import break_even_acceptance

QUICK = dict(prompts_per_domain=3, max_new=48, fixed_ratio=False, window=64, grid=(0.05, 0.1, 0.2),
             calib_prompts=2, calib_new=32, bo_budget=8, bo_init=4, val_new=32, control_new=16,
             ceiling_new=29, ceiling_prompts=2, ceiling_grid=(0.05, 0.2, 0.5))
FULL = dict(prompts_per_domain=16, max_new=96, fixed_ratio=True, window=64, grid=(0.05, 0.1, 0.15, 0.2, 0.3),
            calib_prompts=4, calib_new=48, bo_budget=16, bo_init=6, val_new=48, control_new=32,
            ceiling_new=50, ceiling_prompts=4, ceiling_grid=(0.05, 0.1, 0.2, 0.3, 0.5, 0.7))
DRAFT_VOCAB = 8192
DRAFT_LENGTH = 6  # every self-drafter's chain (LayerSkipDrafter's default, SWIFT-style); the ceiling's too
PAPER = ("SPIRIT consistently outperforms strong training-free baselines and achieves up to 1.74x speedup while "
         "preserving the target model's output distribution")


def run(quick: bool, seed: int) -> BenchmarkResult:
    cfg = QUICK if quick else FULL
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return _run(cfg, seed)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: dict[str, Any], seed: int) -> BenchmarkResult:
    from lit_lowrank.decoding import (
        AgreementSearchDrafter,
        LayerSkipDrafter,
        OfflineBayesDrafter,
        SpiritDrafter,
        TargetLM,
        calibrate_length_profile,
        plain_decode,
    )
    from lit_lowrank.decoding.distill_data import chat_prompt_ids, instruction_prompts
    from lit_lowrank.decoding.reference_drafters import OracleDrafter, RandomDrafter
    from lit_lowrank.decoding.spirit import sequence_matchness
    from lit_lowrank.models.pretrained import load_smollm2
    from lit_lowrank.ops.spirit import random_pattern

    t_start = time.perf_counter()
    model, tokenizer = load_smollm2()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    target = TargetLM(model)
    layers = int(model.config.num_hidden_layers)
    eos, pad = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)

    def prompts(corpus: str, split: str, n: int) -> list[torch.Tensor]:
        return [torch.tensor(p) for p in chat_prompt_ids(tokenizer, instruction_prompts(corpus, split, n))]

    n = cfg["prompts_per_domain"]
    stream = prompts("lee", "test", n) + prompts("text8", "test", n)
    domains = ["lee"] * n + ["text8"] * n
    val = prompts("lee", "val", cfg["calib_prompts"] + 1)
    calib, val_prompt = val[:-1], val[-1]
    common = dict(draft_vocab=DRAFT_VOCAB, draft_length=DRAFT_LENGTH)

    # warm-up (every code path once), then the plain-decoding speed profile vs context length
    hf_generate(model, val_prompt, 8, eos, pad)
    engine_decode(target, LayerSkipDrafter(random_pattern(layers, 0.3, torch.Generator().manual_seed(seed)),
                                           **common), val_prompt, 8, eos)
    profile = calibrate_length_profile(target, lengths=(64, 128, 192, 256), repeats=3)

    # offline tuning for the fixed-ratio baselines: per ratio a Bayesian pattern search on val answers,
    # then the ratio whose pattern decodes fastest on a val prompt
    t0 = time.perf_counter()
    seqs = [plain_decode(target, p, cfg["calib_new"], eos)[0] for p in calib]
    starts = [p.numel() for p in calib]
    offline: dict[float, Any] = {}
    val_rates: dict[str, float] = {}
    for r in cfg["grid"]:
        od = OfflineBayesDrafter(layers, ratio=r, budget=cfg["bo_budget"], n_init=cfg["bo_init"],
                                 window_tokens=cfg["window"], profile=profile, seed=seed, **common)
        od.calibrate_on(target, seqs, starts)
        offline[r] = od
        val_rates[str(r)] = round(decode_rate(engine_decode(target, od, val_prompt, cfg["val_new"], eos)), 3)
    ratio = float(max(val_rates, key=val_rates.get))
    tuning_seconds = time.perf_counter() - t0

    g = torch.Generator().manual_seed(seed)
    window = dict(window_tokens=cfg["window"], profile=profile, seed=seed, **common)
    best = offline[ratio]
    best.history.clear()
    drafters: dict[str, Any] = {
        "agreement_only": AgreementSearchDrafter(layers, ratio=ratio, **window),
        "offline_bayes": best,
        "spirit": SpiritDrafter(layers, grid=tuple(cfg["grid"]), **window),
    }
    if cfg["fixed_ratio"]:
        drafters = {"fixed_ratio": LayerSkipDrafter(random_pattern(layers, ratio, g), **common), **drafters}
    rows: list[dict[str, Any]] = []
    refs: dict[int, dict[str, Any]] = {}
    switch_tokens: int | None = None
    t1 = time.perf_counter()
    for i, prompt in enumerate(stream):
        if i == n:
            switch_tokens = drafters["spirit"].tokens_seen  # the stream changes domain here
        ref = hf_generate(model, prompt, cfg["max_new"], eos, pad)
        runs: dict[str, dict[str, Any]] = {"generate": ref}
        order = list(drafters) + ["random"]
        for name in order[i % len(order):] + order[: i % len(order)]:
            if name == "random":
                runs[name] = engine_decode(target, RandomDrafter(model.config.vocab_size, 4, seed), prompt,
                                           cfg["control_new"], eos, 4)
            else:
                runs[name] = engine_decode(target, drafters[name], prompt, cfg["max_new"], eos)
        for name, r in runs.items():
            rows.append(_row(name, i, domains[i], r, ref, drafters.get(name), layers))
        refs[i] = ref
    test_seconds = time.perf_counter() - t1

    # the ceiling: an always-right drafter priced as a layer-skip draft at each ratio (offline pattern on
    # the grid, a random one off it), on the first prompts of each domain, against their generate runs
    t2 = time.perf_counter()
    k = cfg["ceiling_prompts"]
    ceiling_matchness: dict[str, float] = {}
    patterns = {}
    for r in cfg["ceiling_grid"]:
        patterns[r] = offline[r].pattern if r in offline else random_pattern(layers, r, g)
        ceiling_matchness[str(r)] = round(offline[r].result.best_score if r in offline else
                                          sequence_matchness(model, seqs, starts, patterns[r]), 3)
    for j, i in enumerate(list(range(k)) + list(range(n, n + k))):
        # its own generate run just before, over the same tokens: the pair is timed side by side
        ref = hf_generate(model, stream[i], cfg["ceiling_new"], eos, pad)
        rows.append(_row("ceiling_generate", i, domains[i], ref, refs[i], None, layers))
        ratios = list(cfg["ceiling_grid"])
        for r in ratios[j % len(ratios):] + ratios[: j % len(ratios)]:
            price = LayerSkipDrafter(patterns[r], stop_confidence=0.0, **common)
            run = engine_decode(target, OracleDrafter(refs[i]["tokens"], DRAFT_LENGTH, cost=price), stream[i],
                                cfg["ceiling_new"], eos)
            rows.append(_row(f"ceiling@{r}", i, domains[i], run, ref, None, layers, r))
    ceiling_seconds = time.perf_counter() - t2
    spirit = drafters["spirit"]
    premises, needed = _premises(rows, cfg["ceiling_grid"], ratio)
    claims, controls = _claims(rows, n, requires=needed)
    notes = {
        "target": "SmolLM2-135M-Instruct (fp32), greedy, 2 threads, no training",
        "stream": f"{n} Lee-news then {n} text8 instructions, {cfg['max_new']} new tokens at most; windows of "
                  f"{cfg['window']} tokens",
        "baseline_ratio": ratio, "baseline_val_tokens_per_s": val_rates,
        "offline_patterns": {str(r): od.pattern.describe() for r, od in offline.items()},
        "offline_matchness": {str(r): round(od.result.best_score, 3) for r, od in offline.items()},
        "spirit_events": spirit.events, "switch_tokens": switch_tokens,
        "spirit_windows": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in h.items()
                            if k in ("window", "tokens_seen", "ratio", "speed", "tau", "phase")}
                           for h in spirit.history],
        "profile": {"intercept_ms": round(1e3 * profile.intercept, 3),
                    "slope_us_per_token": round(1e6 * profile.slope, 3)},
        "seconds": {"total_before_test": round(t1 - t_start, 1), "offline_tuning": round(tuning_seconds, 1),
                    "test": round(test_seconds, 1), "ceiling": round(ceiling_seconds, 1)},
        "ceiling": _ceiling(rows, ceiling_matchness),
    }
    return BenchmarkResult(rows, claims, controls, notes, summary=_summary(rows), premises=premises,
                           competitors=_competitors(rows))


def _row(name: str, prompt: int, domain: str, r: dict[str, Any], ref: dict[str, Any], drafter: Any,
         layers: int, ceiling_ratio: float | None = None) -> dict[str, Any]:
    rounds = max(r.get("rounds", 0), 1)
    div = first_divergence(r["tokens"], ref["tokens"])
    n = min(r["tokens"].numel(), ref["tokens"].numel())
    row = {"method": name, "prompt": prompt, "domain": domain, "tokens_per_s": round(decode_rate(r), 3),
           "ratio_to_generate": round(decode_rate(r) / max(decode_rate(ref), 1e-9), 4), "new_tokens": r["new_tokens"],
           "tau": round((r.get("accepted", 0) + rounds) / rounds, 3) if "accepted" in r else 1.0,
           # the random control and the ceilings decode fewer tokens: identical on the shared prefix
           "identical_to_generate": div == -1 or (name in ("random", "ceiling_generate") or ceiling_ratio is not None)
           and div >= n,
           "first_divergence": div}
    pattern = getattr(drafter, "pattern", None)
    if pattern is not None:
        row["skip_ratio"] = round(pattern.size / (2 * (layers - 2)), 3)
    elif ceiling_ratio is not None:
        row["skip_ratio"] = ceiling_ratio
    if "draft_seconds" in r:
        row["draft_ms_per_round"] = round(1e3 * r["draft_seconds"] / rounds, 2)
    return row


def _ceiling(rows: list[dict[str, Any]], matchness: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per ratio: the always-right drafter's speed-up over generate (geometric mean over prompts), the
    per-token acceptance a real drafter at that cost needs to break even (i.i.d. model), and the
    matchness measured there (best offline pattern on the grid, a random pattern off it)."""
    out = {}
    for ratio, m in matchness.items():
        xs = [r["ratio_to_generate"] for r in rows if r["method"] == f"ceiling@{ratio}" and r["ratio_to_generate"] > 0]
        if not xs:
            continue
        x = statistics.geometric_mean(xs)
        need = break_even_acceptance(x, DRAFT_LENGTH)
        out[ratio] = {"x_generate": round(x, 3), "break_even_acceptance": None if need is None else round(need, 3),
                      "matchness": m}
    return out


def _premises(rows: list[dict[str, Any]], grid: tuple[float, ...], chosen: float) -> tuple[list[dict[str, Any]], str]:
    """Per ratio of the ceiling grid: the always-right drafter priced at that ratio beats generate (paired over
    the ceiling prompts). The speed claims need the premise at the grid ratio nearest the skip ratio the
    tuned baselines chose on validation: if even an always-right drafter is not faster there, no drafter is."""
    out = []
    for r in grid:
        a, b, units = paired(rows, "tokens_per_s", {"method": f"ceiling@{r}"}, {"method": "ceiling_generate"},
                             unit="prompt")
        out.append(premise(
            f"ceiling_{r}", f"an always-right layer-skip drafter at skip ratio {r} decodes faster than generate",
            needs="a speed-up ceiling above 1 at the skip ratio drafting runs at: the drafter's cost leaves room",
            quantity=f"decode tokens/s(ceiling@{r}) / tokens/s(generate, run just before), geometric mean "
                     "over prompts", values=a, baseline=b, units=units, unit="prompt", compare="ratio",
            target=1.0, op=">"))
    nearest = min(grid, key=lambda r: abs(r - chosen))
    return out, f"ceiling_{nearest}"


def _claims(rows: list[dict[str, Any]], n: int, requires: str | None = None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    kw = dict(compare="ratio", unit="prompt", requires=requires)

    def ratio(a: str, b: str, domain: str | None = None) -> tuple[list, list, list]:
        sel = [r for r in rows if domain is None or r["domain"] == domain]
        return paired(sel, "tokens_per_s", {"method": a}, {"method": b}, unit="prompt")

    q = "decode tokens/s({}) / tokens/s({}), geometric mean over prompts"
    claims = []
    for other, target, text in (
            ("generate", 1.0, "SPIRIT decodes faster than transformers generate (paper: up to 1.74x)"),
            ("agreement_only", 1.0, "SPIRIT decodes faster than SWIFT-style agreement-only search"),
            ("offline_bayes", 1.0, "SPIRIT decodes faster than the offline Bayesian (Draft&Verify-style) pattern")):
        a, b, units = ratio("spirit", other)
        claims.append(claim(text, paper=PAPER, quantity=q.format("spirit", other), values=a, baseline=b, units=units,
                            target=target, op=">", name=f"spirit_vs_{other}", **kw))
    a, b, units = ratio("spirit", "offline_bayes", "text8")
    claims.append(claim("after the domain switch SPIRIT decodes faster than the pattern tuned offline before it",
                        paper="rapid adaptation to task shifts in non-stationary request streams",
                        quantity=q.format("spirit", "offline_bayes") + ", text8 prompts only", values=a, baseline=b,
                        units=units, target=1.0, op=">", **kw))
    a, b, units = ratio("random", "generate")
    controls = [claim("a random 4-token drafter decodes >= 1.0x generate (must not hold: nothing is accepted)",
                      paper="(control) a drafter that knows nothing cannot beat plain decoding",
                      quantity=q.format("random", "generate"), values=a, baseline=b, units=units, target=1.0,
                      op=">=", compare="ratio", unit="prompt")]
    return claims, controls


def _competitors(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SPIRIT's speed-up over generate against the cheapest alternative in its place: the offline pattern, found
    once on validation, with no online search."""
    a, b, units = paired(rows, "tokens_per_s", {"method": "offline_bayes"}, {"method": "generate"}, unit="prompt")
    return [competitor("spirit_vs_generate", "the offline Bayesian pattern decodes faster than transformers generate",
                       competitor="the pattern tuned offline on validation (no online search) in SPIRIT's place",
                       quantity="decode tokens/s(offline_bayes) / tokens/s(generate), geometric mean over prompts",
                       values=a, baseline=b, units=units, unit="prompt", compare="ratio", target=1.0, op=">")]


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == name]
        row: dict[str, Any] = {"method": name}
        for dom in ("lee", "text8"):
            ratios = [r["ratio_to_generate"] for r in rs if r["domain"] == dom and r["ratio_to_generate"] > 0]
            row[f"x_generate_{dom}"] = round(statistics.geometric_mean(ratios), 3) if ratios else 0.0
        row["tokens_per_s"] = round(statistics.mean(r["tokens_per_s"] for r in rs), 2)
        row["tau"] = round(statistics.mean(r["tau"] for r in rs), 2)
        if any("skip_ratio" in r for r in rs):
            row["final_skip_ratio"] = rs[-1].get("skip_ratio")
        row["identical"] = f"{sum(r['identical_to_generate'] for r in rs)}/{len(rs)}"
        out.append(row)
    return out


