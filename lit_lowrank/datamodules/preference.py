"""Preference pairs (prompt, chosen, rejected): the RewardBench loader and an embedded pair set.

- :func:`load_rewardbench`: RewardBench-format data from a local path (``.json`` list, ``.jsonl``
  or ``.parquet`` with the columns ``prompt``, ``chosen``, ``rejected`` and optionally ``subset``,
  as in ``allenai/reward-bench``'s ``filtered`` split). No hub access: download the file where a
  network exists and pass its path.
- :func:`degradation_pairs`: the embedded default. Prompts ask to continue a news article of
  gensim's Lee corpus (ships with ``gensim``); the chosen response is the article's real
  continuation and the rejected one the same continuation degraded in one of five documented,
  seeded ways (:data:`DEGRADATIONS`): a repetition loop, truncation, words shuffled within each
  sentence, an off-topic continuation taken from another article, or the continuation followed by
  a loop of its last words. Truncation makes the rejected response shorter and the looped tail
  makes it longer, so response length alone cannot sort the pairs.

.. code-block:: python

    pairs = degradation_pairs(n_prompts=16, seed=0)          # 16 x 5 pairs
    pairs = load_rewardbench("~/data/reward-bench/filtered.parquet")
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from lit_lowrank.datamodules._paths import package_file, require_path

__all__ = ["DEGRADATIONS", "PreferencePair", "degradation_pairs", "lee_documents", "load_rewardbench",
           "reference_texts"]

#: How a good response is degraded into the rejected one:
#:   repetition: the first sentence's opening words looped until the length of the original;
#:   truncation: cut after the first third of its words, mid-sentence;
#:   shuffled:   the words of each sentence put in a random order (fluency destroyed, topic kept);
#:   off_topic:  the continuation of a different article (fluent, wrong topic);
#:   looped_tail: the whole continuation, then its last four words looped until it is twice as long.
DEGRADATIONS: tuple[str, ...] = ("repetition", "truncation", "shuffled", "off_topic", "looped_tail")


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: ``chosen`` should score above ``rejected`` for ``prompt``."""

    prompt: str
    chosen: str
    rejected: str
    subset: str = ""


def lee_documents() -> list[str]:
    """The 300 articles of gensim's Lee news corpus, one string each."""
    lines = package_file("gensim", "test/test_data/lee_background.cor").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


def reference_texts(n: int = 32) -> list[str]:
    """The first ``n`` articles of gensim's Lee *test* corpus (``lee.cor``, 50 articles, disjoint from
    :func:`lee_documents`): the natural text whose stable rank at each length normalises a response's
    (:meth:`~lit_lowrank.decoding.ResponseScorer.length_reference`)."""
    # lee.cor is latin-1 (a pound sign), unlike lee_background.cor
    lines = package_file("gensim", "test/test_data/lee.cor").read_text(encoding="latin-1").splitlines()
    return [line.strip() for line in lines if line.strip()][:n]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _degrade(kind: str, response: str, other: str, rng: random.Random) -> str:
    words = response.split()
    if kind == "repetition":
        loop = _sentences(response)[0].split()[:6]
        out: list[str] = []
        while len(out) < len(words):
            out += loop
        return " ".join(out[: len(words)])
    if kind == "truncation":
        return " ".join(words[: max(3, len(words) // 3)])
    if kind == "shuffled":
        shuffled = []
        for sentence in _sentences(response):
            tokens = sentence.split()
            rng.shuffle(tokens)
            shuffled.append(" ".join(tokens))
        return " ".join(shuffled)
    if kind == "off_topic":
        return other
    if kind == "looped_tail":
        tail = words[-4:]
        out = list(words)
        while len(out) < 2 * len(words):
            out += tail
        return " ".join(out[: 2 * len(words)])
    raise ValueError(f"degradation {kind!r} unknown, expected one of {DEGRADATIONS}.")


def degradation_pairs(
    n_prompts: int = 16,
    seed: int = 0,
    kinds: tuple[str, ...] = DEGRADATIONS,
    context_sentences: int = 2,
    response_sentences: int = 2,
) -> list[PreferencePair]:
    """Good vs degraded continuations of Lee-corpus news articles (``n_prompts * len(kinds)`` pairs).

    Args:
        n_prompts: articles used (chosen at random among those with enough sentences).
        seed: seeds the article choice, the shuffles and the off-topic partner.
        kinds: degradations among :data:`DEGRADATIONS`.
        context_sentences: sentences of the article shown in the prompt.
        response_sentences: sentences of the real continuation (the chosen response).
    """
    unknown = [k for k in kinds if k not in DEGRADATIONS]
    if unknown:
        raise ValueError(f"`kinds` has unknown degradations {unknown}, expected among {DEGRADATIONS}.")
    rng = random.Random(seed)
    need = context_sentences + response_sentences
    docs = [d for d in (_sentences(doc) for doc in lee_documents()) if len(d) >= need]
    if n_prompts > len(docs) // 2:
        raise ValueError(f"`n_prompts`={n_prompts} is more than half of the {len(docs)} usable articles.")
    chosen_docs = rng.sample(docs, 2 * n_prompts)
    pairs = []
    for i in range(n_prompts):
        doc, partner = chosen_docs[i], chosen_docs[n_prompts + i]
        context = " ".join(doc[:context_sentences])
        response = " ".join(doc[context_sentences:need])
        other = " ".join(partner[context_sentences:need])
        more = "one more sentence" if response_sentences == 1 else f"{response_sentences} more sentences"
        prompt = f"Continue this news article with {more}.\n\n{context}"
        for kind in kinds:
            pairs.append(PreferencePair(prompt, response, _degrade(kind, response, other, rng), kind))
    return pairs


def load_rewardbench(path: str | Path) -> list[PreferencePair]:
    """RewardBench-format pairs from a local ``.json`` / ``.jsonl`` / ``.parquet`` file.

    Raises:
        FileNotFoundError: the path does not exist (names it).
        ValueError: a required column is missing, or the suffix is not supported.
    """
    file = require_path(str(path), "path", "a RewardBench-format .json, .jsonl or .parquet file "
                        "(columns prompt, chosen, rejected[, subset])")
    suffix = file.suffix.lower()
    if suffix == ".jsonl":
        records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    elif suffix == ".json":
        records = json.loads(file.read_text(encoding="utf-8"))
    elif suffix == ".parquet":
        import pandas as pd

        try:
            records = pd.read_parquet(file).to_dict("records")
        except ImportError as err:
            raise ImportError(f"reading {file} needs a parquet engine: `pip install pyarrow` ({err}).") from err
    else:
        raise ValueError(f"`path`={str(file)!r}: unsupported suffix {suffix!r}, expected .json, .jsonl or .parquet.")
    pairs = []
    for i, rec in enumerate(records):
        missing = [k for k in ("prompt", "chosen", "rejected") if k not in rec]
        if missing:
            raise ValueError(f"{file}: record {i} lacks the columns {missing} (RewardBench format: prompt, chosen, "
                             "rejected[, subset]).")
        pairs.append(PreferencePair(str(rec["prompt"]), str(rec["chosen"]), str(rec["rejected"]),
                                    str(rec.get("subset", ""))))
    return pairs
