"""Side measurement (issue #41 item 7): does stable rank see SmolLM2's own representational collapse (loops)?

Run from the repository root: ``.venv/bin/python docs/measurements/stable_rank_loops.py`` (~6 min on 2 CPU cores).
SmolLM2-135M-Instruct continues 40 Lee-corpus news prompts for 224 tokens, greedily and sampled; every response is
scored by SmolLM2 itself on the same window (tokens 128-223, the first 128 join the prompt: length controlled), and
a response is a loop when over 30% of its 4-grams in the window repeat. Prints the AUC of "not a loop scores higher"
per signal (95% bootstrap interval) and writes the per-response rows to ``docs/measurements/stable_rank_loops.json``;
the card ``docs/methods/stable_rank.md`` quotes the result.
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from lit_lowrank.datamodules.preference import degradation_pairs
from lit_lowrank.decoding.stable_rank import ResponseScorer, eos_token_ids, sample_responses
from lit_lowrank.models import load_smollm2

PROMPTS, NEW_TOKENS, START, WINDOW, LOOP = 40, 224, 128, 96, 0.3
SIGNALS = ("stable_rank_raw", "stable_rank", "mean_log_prob", "self_certainty")


def repeat_rate(ids: list[int], n: int = 4) -> float:
    """Share of the n-grams of ``ids`` that repeat an earlier one."""
    grams = [tuple(ids[k:k + n]) for k in range(len(ids) - n + 1)]
    return 1 - len(set(grams)) / max(1, len(grams))


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score(pos) > score(neg)), ties counted half."""
    return float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())


def main() -> None:
    torch.set_num_threads(2)
    model, tok = load_smollm2()
    model.eval()
    prompts = [p.prompt.replace("with 2 more sentences", "")
               for p in degradation_pairs(n_prompts=PROMPTS, seed=1, kinds=("shuffled",))]
    scorer = ResponseScorer(model, tok, chat=True)
    pids = [scorer.prompt_ids(p) for p in prompts]
    eos = eos_token_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    start = time.time()
    rows = []
    for mode, kw in (("greedy", {"do_sample": False}),
                     ("sampled", {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "generator_seed": 0})):
        for i in range(0, len(pids), 8):
            for j, ids in enumerate(sample_responses(model, pids[i:i + 8], 1, NEW_TOKENS, eos, pad, **kw)):
                rows.append({"prompt": i + j, "mode": mode, "ids": ids})
    keep = [r for r in rows if len(r["ids"]) >= START + WINDOW]
    for r in keep:
        r["ctx"] = list(pids[r["prompt"]]) + r["ids"][:START]
        r["ids"] = r["ids"][START:START + WINDOW]
        r["rep4"] = repeat_rate(r["ids"])
    scores = scorer.score_ids([r["ctx"] for r in keep], [r["ids"] for r in keep])
    for k in SIGNALS:
        for r, v in zip(keep, scores[k].tolist()):
            r[k] = v
    loop = np.array([r["rep4"] > LOOP for r in keep])
    print(f"{len(keep)} responses, {int(loop.sum())} loops, {time.time() - start:.0f} s")
    rng = np.random.default_rng(0)
    for k in SIGNALS:
        s = np.array([r[k] for r in keep])
        good, bad = s[~loop], s[loop]
        boots = [auc(good[rng.integers(0, len(good), len(good))], bad[rng.integers(0, len(bad), len(bad))])
                 for _ in range(2000)]
        print(f"{k}: AUC(not a loop above a loop) {auc(good, bad):.3f} "
              f"[{np.quantile(boots, 0.025):.3f}, {np.quantile(boots, 0.975):.3f}]")
    with open("docs/measurements/stable_rank_loops.json", "w") as f:
        json.dump([{k: v for k, v in r.items() if k not in ("ids", "ctx")} for r in keep], f)


if __name__ == "__main__":
    main()
