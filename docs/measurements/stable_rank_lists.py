"""Side measurement (issue #41 item 7): does stable rank see a *checkable* collapse — duplicates in SmolLM2's lists?

Run from the repository root: ``.venv/bin/python docs/measurements/stable_rank_lists.py`` (a few minutes on 2 CPU
cores). SmolLM2-135M-Instruct is asked for a numbered list of 15 different items of 40 categories ("List 15
different animals ..."), 6 sampled responses a prompt (T 0.9, top-p 0.95): the task's failure is representational
collapse (an item repeated), and it is checkable. Every response is scored by SmolLM2 itself on the same window, its
first 64 tokens (length controlled; shorter responses are dropped), and labelled from that window's complete lines:
*collapsed* when a normalised item occurs twice. Prints, per signal, the AUC of "a list without a duplicate scores
higher than one with" pooled over responses, within prompts (what GRPO's group baseline sees; the mean over
prompts with both kinds) and over pairs with the same number of items in the window (a collapsed list holds more,
shorter items), each with a 95% bootstrap interval, and writes the rows to
``docs/measurements/stable_rank_lists.json``; the card ``docs/methods/stable_rank.md`` quotes the result.
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from lit_lowrank.benchmarks.stable_rank_lists import CATEGORIES, WINDOW, line_items, list_prompt
from lit_lowrank.decoding.stable_rank import ResponseScorer, eos_token_ids, sample_responses
from lit_lowrank.models import load_smollm2

SAMPLES, NEW_TOKENS = 6, 96
SIGNALS = ("stable_rank_raw", "stable_rank", "mean_log_prob", "self_certainty")
items = line_items  # this measurement's reading: numbered lines only (the benchmark reads inline lists too)


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score(pos) > score(neg)), ties counted half."""
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def matched_auc(scores: np.ndarray, bad: np.ndarray, n_items: np.ndarray) -> float:
    """AUC over (clean, collapsed) pairs with the same number of items in the window: a collapsed list holds more
    (short) items, so this removes the item count as a route to the label."""
    same = (n_items[~bad][:, None] == n_items[bad][None, :])
    pos, neg = scores[~bad][:, None], scores[bad][None, :]
    return float((((pos > neg) + 0.5 * (pos == neg)) * same).sum() / max(1, same.sum()))


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, tok = load_smollm2()
    model.eval()
    prompts = [list_prompt(c) for c in CATEGORIES]
    scorer = ResponseScorer(model, tok, chat=True)
    pids = [scorer.prompt_ids(p) for p in prompts]
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    start = time.time()
    rows = []
    for i in range(0, len(pids), 4):
        out = sample_responses(model, pids[i:i + 4], SAMPLES, NEW_TOKENS, eos, pad, do_sample=True,
                               temperature=0.9, top_p=0.95, generator_seed=i)
        for j, ids in enumerate(out):
            rows.append({"prompt": i + j // SAMPLES, "ids": ids})
    keep = [r for r in rows if len(r["ids"]) >= WINDOW]
    for r in keep:
        r["ids"] = r["ids"][:WINDOW]
        got = items(tok.decode(r["ids"], skip_special_tokens=True))
        r["n_items"], r["distinct"] = len(got), len(set(got))
        r["collapsed"] = len(set(got)) < len(got)
    scores = scorer.score_ids([pids[r["prompt"]] for r in keep], [r["ids"] for r in keep])
    for k in SIGNALS:
        for r, v in zip(keep, scores[k].tolist()):
            r[k] = v
    bad = np.array([r["collapsed"] for r in keep])
    groups = sorted({r["prompt"] for r in keep})
    mixed = [p for p in groups if 0 < sum(r["collapsed"] for r in keep if r["prompt"] == p)
             < sum(1 for r in keep if r["prompt"] == p)]
    print(f"{len(rows)} responses, {len(keep)} with >= {WINDOW} tokens, {int(bad.sum())} collapsed; "
          f"{len(mixed)} prompts with both; {time.time() - start:.0f} s")
    n_items = np.array([r["n_items"] for r in keep])
    print(f"items in the window: clean {n_items[~bad].mean():.1f}, collapsed {n_items[bad].mean():.1f}; "
          f"{int((n_items[~bad][:, None] == n_items[bad][None, :]).sum())} pairs with equal counts")
    rng = np.random.default_rng(0)
    summary = {}
    for k in SIGNALS:
        s = np.array([r[k] for r in keep])
        good, worse = s[~bad], s[bad]
        pooled = [auc(good[rng.integers(0, len(good), len(good))], worse[rng.integers(0, len(worse), len(worse))])
                  for _ in range(2000)]
        per = {}
        for p in mixed:
            g = np.array([r[k] for r in keep if r["prompt"] == p and not r["collapsed"]])
            b = np.array([r[k] for r in keep if r["prompt"] == p and r["collapsed"]])
            per[p] = auc(g, b)
        within = np.array(list(per.values()))
        boots = [within[rng.integers(0, len(within), len(within))].mean() for _ in range(2000)]
        idx = [rng.integers(0, len(s), len(s)) for _ in range(2000)]
        matched = [matched_auc(s[i], bad[i], n_items[i]) for i in idx]
        ci = {"pooled": pooled, "within": boots, "matched": matched}
        summary[k] = {"pooled": auc(good, worse), "within": float(within.mean()),
                      "matched": matched_auc(s, bad, n_items)}
        summary[k].update({f"{n}_ci": [float(np.quantile(b, q)) for q in (0.025, 0.975)] for n, b in ci.items()})
        print(f"{k}: " + "; ".join(f"{n} AUC {summary[k][n]:.3f} [{summary[k][n + '_ci'][0]:.3f}, "
                                    f"{summary[k][n + '_ci'][1]:.3f}]" for n in ci))
    with open("docs/measurements/stable_rank_lists.json", "w") as f:
        json.dump({"summary": summary, "n_prompts_mixed": len(mixed),
                   "rows": [{k: v for k, v in r.items() if k != "ids"} for r in keep]}, f)


if __name__ == "__main__":
    main()
