"""Multiple-choice reasoning for causal LMs: an embedded set and the common-sense JSONL loaders.

Two scorings (``scoring=``), both read by :class:`~lit_lowrank.models.mc_lm.MultipleChoiceLM`:

- ``"letter"``: every item becomes one prompt that lists the options with letters and ends with
  ``"Answer:"``; the model reads it once and a head over the answer options scores the letters (the
  head starts at the LM's output rows of ``" A"``, ``" B"``, ...). Batches are
  ``{"x": (B, L) token ids right-padded with -1, "y": (B,)}``.
- ``"options"``: every option is read as the answer text after ``"Question: ...\nAnswer:"`` (the
  cloze scoring of lm-evaluation-harness); the LM's mean log-probability of each option's tokens is
  its score. Batches are ``{"x": (B, C, 1 + L), "y": (B,)}``: column 0 holds the number ``k`` of answer
  tokens, columns ``1..`` the question + answer token ids right-padded with -1 (the answer is the last
  ``k`` real tokens). Small LMs that cannot bind an answer to a letter still rank option texts.

Either way :class:`~lit_lowrank.tasks.ClassificationModule` trains on the batches unchanged.

Sources:

- ``"embedded"``: :data:`EMBEDDED_ITEMS`, 82 four-option questions written for this project from
  small fact tables (animals, colours, opposites, units, everyday physics, ...): each fact is the
  question, the three distractors are other facts' answers from the same table, the answer
  position is drawn per item with a fixed seed.
- a local JSONL file of BoolQ, PIQA, ARC (Challenge/Easy), OpenBookQA, WinoGrande or HellaSwag in
  the field layout of their Hugging Face releases (:func:`load_mc_jsonl`; ``format="auto"`` tells
  them apart by their fields).

.. code-block:: python

    dm = MultipleChoiceDataModule(source="embedded", tokenizer="smollm2")
    dm = MultipleChoiceDataModule(source="/data/arc_challenge/train.jsonl", tokenizer="smollm2",
                                  val_source="/data/arc_challenge/validation.jsonl")
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lit_lowrank.datamodules.tokenizers import encode_batch, get_tokenizer

LETTERS = "ABCDEFGH"
SCORINGS: tuple[str, ...] = ("letter", "options")
FORMATS: tuple[str, ...] = ("boolq", "piqa", "arc", "obqa", "winogrande", "hellaswag")
#: Options per item of each format (ARC items with another count are skipped and counted).
NUM_CHOICES: dict[str, int] = {"boolq": 2, "piqa": 2, "arc": 4, "obqa": 4, "winogrande": 2, "hellaswag": 4,
                               "embedded": 4}

# (question template, {subject: answer}) — each table's answers are its own distractors.
_TABLES: list[tuple[str, dict[str, str]]] = [
    ("What sound does a {} make?", {"dog": "bark", "cat": "meow", "cow": "moo", "sheep": "baa", "duck": "quack",
                                    "lion": "roar", "snake": "hiss", "owl": "hoot"}),
    ("What colour is {}?", {"grass": "green", "the clear daytime sky": "blue", "snow": "white", "coal": "black",
                            "a ripe banana": "yellow", "a ripe tomato": "red", "an orange": "orange",
                            "milk": "white"}),
    ("What is the opposite of {}?", {"hot": "cold", "up": "down", "big": "small", "fast": "slow", "open": "closed",
                                     "wet": "dry", "early": "late", "heavy": "light", "happy": "sad",
                                     "inside": "outside"}),
    ("Where does a {} live?", {"fish": "water", "bird": "nest", "bee": "hive", "horse": "stable", "bear": "den",
                               "spider": "web", "rabbit": "burrow", "pig": "sty"}),
    ("What do you use {}?", {"to cut paper": "scissors", "to write on a blackboard": "chalk",
                             "to unlock a door": "key", "to dig a hole": "shovel", "to sweep the floor": "broom",
                             "to boil water": "kettle", "to see in the dark": "flashlight",
                             "to hammer a nail": "hammer"}),
    ("Which unit measures {}?", {"distance": "metre", "mass": "kilogram", "time": "second",
                                 "temperature": "degree Celsius", "electric current": "ampere",
                                 "volume of a liquid": "litre", "energy": "joule", "power": "watt"}),
    ("What is the young of a {} called?", {"dog": "puppy", "cat": "kitten", "cow": "calf", "sheep": "lamb",
                                          "horse": "foal", "frog": "tadpole", "goose": "gosling", "bear": "cub"}),
    ("What happens to {}?", {"ice left in the sun": "it melts", "water cooled below zero degrees": "it freezes",
                             "a ball dropped from a roof": "it falls", "bread left in a toaster": "it browns",
                             "a candle that is lit": "it burns down", "a balloon pricked by a pin": "it pops",
                             "wet clothes hung in the wind": "they dry",
                             "a seed planted in wet soil": "it sprouts"}),
    ("Which body part do you use to {}?", {"see": "eyes", "hear": "ears", "smell": "nose", "taste": "tongue",
                                           "walk": "legs", "hold a cup": "hands", "think": "brain",
                                           "chew food": "teeth"}),
    ("In which season is it usually {}?", {"coldest": "winter", "hottest": "summer",
                                           "the time leaves fall from trees": "autumn",
                                           "the time flowers start to bloom": "spring"}),
    ("What do people usually eat {}?", {"soup with": "spoon", "steak with": "knife and fork",
                                        "sushi with": "chopsticks", "an apple with": "hands"}),
]


def _embedded_items(seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    items = []
    for template, facts in _TABLES:
        answers = sorted(set(facts.values()))
        if len(answers) < 4:
            continue  # too few distinct answers in this table for three distractors
        for subject, answer in facts.items():
            distractors = rng.sample([a for a in answers if a != answer], 3)
            label = rng.randrange(4)
            choices = distractors[:label] + [answer] + distractors[label:]
            items.append({"question": template.format(subject), "choices": choices, "label": label})
    return items


#: The embedded set (built deterministically at import).
EMBEDDED_ITEMS: list[dict[str, Any]] = _embedded_items()


def detect_format(record: dict[str, Any]) -> str:
    """Which common-sense set a JSONL record comes from (by its fields)."""
    keys = set(record)
    if {"passage", "question", "answer"} <= keys:
        return "boolq"
    if {"goal", "sol1", "sol2"} <= keys:
        return "piqa"
    if {"sentence", "option1", "option2"} <= keys:
        return "winogrande"
    if {"ctx", "endings"} <= keys:
        return "hellaswag"
    if "question_stem" in keys:
        return "obqa"
    if {"question", "choices", "answerKey"} <= keys:
        return "arc"
    raise ValueError(f"cannot tell the multiple-choice format from fields {sorted(keys)}; pass "
                     f"format= one of {FORMATS}.")


def parse_record(record: dict[str, Any], fmt: str) -> dict[str, Any]:
    """One JSONL record -> ``{"question", "choices", "label"}`` (label: index of the correct choice)."""
    if fmt == "boolq":
        return {"question": f"{record['passage']}\nQuestion: {record['question']}?", "choices": ["no", "yes"],
                "label": int(bool(record["answer"]))}
    if fmt == "piqa":
        return {"question": f"Goal: {record['goal']}", "choices": [record["sol1"], record["sol2"]],
                "label": int(record["label"])}
    if fmt == "winogrande":
        return {"question": f"Fill the blank: {record['sentence']}", "choices": [record["option1"],
                                                                                record["option2"]],
                "label": int(record["answer"]) - 1}
    if fmt == "hellaswag":
        return {"question": f"Complete: {record['ctx']}", "choices": list(record["endings"]),
                "label": int(record["label"])}
    if fmt in ("arc", "obqa"):
        stem = record["question_stem"] if fmt == "obqa" else record["question"]
        if isinstance(stem, dict):  # the original ARC/OBQA layout nests the stem and choices
            choices = stem["choices"]
            stem = stem["stem"]
            labels, texts = [c["label"] for c in choices], [c["text"] for c in choices]
        else:
            labels, texts = list(record["choices"]["label"]), list(record["choices"]["text"])
        key = str(record["answerKey"])
        return {"question": stem, "choices": texts, "label": labels.index(key)}
    raise ValueError(f"`format`={fmt!r}, expected one of {FORMATS}.")


def load_mc_jsonl(path: str | Path, format: str = "auto", num_choices: int | None = None,
                  max_items: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Items of a local common-sense JSONL file, and how many were skipped (wrong number of options).

    Raises:
        FileNotFoundError: ``path`` does not exist (names the sets it reads).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"`source`={str(path)!r} does not exist; expected a local JSONL file of one of "
                                f"{FORMATS} (Hugging Face field layout).")
    items, skipped = [], 0
    with path.open() as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            fmt = detect_format(record) if format == "auto" else format
            item = parse_record(record, fmt)
            want = num_choices or NUM_CHOICES[fmt]
            if len(item["choices"]) != want:
                skipped += 1
                continue
            items.append(item)
            if max_items is not None and len(items) >= max_items:
                break
    return items, skipped


def format_prompt(item: dict[str, Any]) -> str:
    """``"Question: ...\\nA. ...\\nB. ...\\nAnswer:"`` (the head scores the next token: a letter)."""
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(item["choices"]))
    return f"Question: {item['question']}\n{options}\nAnswer:"


def format_cloze(item: dict[str, Any]) -> tuple[str, list[str]]:
    """``("Question: ...\\nAnswer:", [" option 1", ...])``: the context and each option's answer text."""
    return f"Question: {item['question']}\nAnswer:", [f" {c}" for c in item["choices"]]


def encode_cloze(tokenizer: Any, context: str, continuations: list[str]) -> list[tuple[list[int], int]]:
    """``(ids of context + continuation, number of continuation tokens)`` per continuation.

    The whole string is encoded and the context's tokens are cut off its front, as lm-evaluation-harness
    does, so a merge across the boundary (``":"`` + ``" red"``) is tokenized as the model saw it in training.
    """
    n_context = len(encode_batch(tokenizer, [context])[0])
    out = []
    for whole in encode_batch(tokenizer, [context + c for c in continuations]):
        k = len(whole) - n_context
        if k < 1:
            raise ValueError(f"encode_cloze: the continuation adds no token to context {context!r}.")
        out.append((whole, k))
    return out


class _ClozeItems(torch.utils.data.Dataset):
    """Items as ``(C, 1 + max_length)``: column 0 = answer-token count, then ids right-padded with -1."""

    def __init__(self, encoded: list[list[tuple[list[int], int]]], labels: list[int], max_length: int) -> None:
        longest = max(k for item in encoded for _, k in item)
        if longest >= max_length:
            raise ValueError(f"`max_length`={max_length}: an answer has {longest} tokens alone; expected "
                             "max_length > the longest answer (the question's end must fit before it).")
        self.encoded, self.labels, self.max_length = encoded, labels, max_length

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = torch.full((len(self.encoded[i]), 1 + self.max_length), -1, dtype=torch.long)
        for c, (ids, k) in enumerate(self.encoded[i]):
            ids = ids[-self.max_length:]  # keep the end: the answer and the question's end
            x[c, 0] = k
            x[c, 1: 1 + len(ids)] = torch.tensor(ids)
        return {"x": x, "y": self.labels[i]}


class _Items(torch.utils.data.Dataset):
    def __init__(self, ids: list[list[int]], labels: list[int], max_length: int) -> None:
        self.ids, self.labels, self.max_length = ids, labels, max_length

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = self.ids[i][-self.max_length:]  # keep the end: the options and "Answer:"
        x = torch.full((self.max_length,), -1, dtype=torch.long)
        x[: len(ids)] = torch.tensor(ids)
        return {"x": x, "y": self.labels[i]}


class MultipleChoiceDataModule(pl.LightningDataModule):
    """Multiple-choice prompts for a causal LM (see the module docstring).

    Args:
        source: ``"embedded"`` or a local JSONL file (training items).
        val_source: a local JSONL file for validation; ``None`` = a ``val_fraction`` split of ``source``.
        format: ``"auto"`` or one of :data:`FORMATS` (JSONL only).
        tokenizer: ``"smollm2"``, ``"byte"`` or a local tokenizer folder.
        max_length: prompts longer than this keep their last ``max_length`` tokens.
        val_fraction: the held-out share when ``val_source`` is ``None``.
        max_items: cap on the items read per file.
        batch_size / seed: loaders.
        scoring: ``"letter"`` (one prompt listing the options, the head scores the letters) or
            ``"options"`` (each option's text scored as the answer; see the module docstring).
        num_folds / fold: cross-validation instead of ``val_fraction``: the shuffled items (``seed``) are
            cut into ``num_folds`` parts and part ``fold`` is held out, so ``num_folds`` fits score every
            item once while it is unseen.

    .. code-block:: python

        dm = MultipleChoiceDataModule(source="embedded", tokenizer="byte", max_length=160)
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))   # {"x": (B, 160), "y": (B,)}
        dm = MultipleChoiceDataModule(source="embedded", tokenizer="byte", scoring="options")
        # batches {"x": (B, 4, 1 + 128), "y": (B,)}: each option's text scored by the LM
    """

    def __init__(self, source: str = "embedded", val_source: str | None = None, format: str = "auto",
                 tokenizer: str = "smollm2", max_length: int = 128, val_fraction: float = 0.25,
                 max_items: int | None = None, batch_size: int = 8, seed: int = 0,
                 scoring: str = "letter", num_folds: int | None = None, fold: int = 0) -> None:
        super().__init__()
        if num_folds is not None and not (num_folds >= 2 and 0 <= fold < num_folds):
            raise ValueError(f"`num_folds`={num_folds}, `fold`={fold}: expected num_folds >= 2 and "
                             "0 <= fold < num_folds.")
        if num_folds is not None and val_source is not None:
            raise ValueError("`num_folds` cuts `source` into folds; it cannot be combined with `val_source`.")
        if scoring not in SCORINGS:
            raise ValueError(f"`scoring`={scoring!r}, expected one of {SCORINGS}.")
        if format != "auto" and format not in FORMATS:
            raise ValueError(f"`format`={format!r}, expected 'auto' or one of {FORMATS}.")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"`val_fraction`={val_fraction}, expected a number in (0, 1).")
        self.save_hyperparameters()
        self.skipped = 0
        self.val_indices: list[int] | None = None

    @property
    def num_choices(self) -> int:
        """Options per item (the classification head's width)."""
        if self.hparams.source == "embedded":
            return NUM_CHOICES["embedded"]
        if self.hparams.format != "auto":
            return NUM_CHOICES[self.hparams.format]
        with Path(self.hparams.source).open() as handle:
            return NUM_CHOICES[detect_format(json.loads(handle.readline()))]

    def _items(self, source: str) -> list[dict[str, Any]]:
        if source == "embedded":
            return list(EMBEDDED_ITEMS)
        items, skipped = load_mc_jsonl(source, self.hparams.format, self.num_choices, self.hparams.max_items)
        self.skipped += skipped
        return items

    def _dataset(self, items: list[dict[str, Any]]) -> _Items | _ClozeItems:
        if self.hparams.scoring == "options":
            encoded = [encode_cloze(self.tokenizer, *format_cloze(it)) for it in items]
            return _ClozeItems(encoded, [it["label"] for it in items], self.hparams.max_length)
        ids = encode_batch(self.tokenizer, [format_prompt(it) for it in items])
        return _Items(ids, [it["label"] for it in items], self.hparams.max_length)

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, "train_set", None) is not None:
            return
        self.tokenizer = get_tokenizer(self.hparams.tokenizer)
        items = self._items(self.hparams.source)
        if self.hparams.val_source is not None:
            train, val = items, self._items(self.hparams.val_source)
        else:
            order = list(range(len(items)))
            random.Random(self.hparams.seed).shuffle(order)
            if self.hparams.num_folds is not None:
                held = set(order[self.hparams.fold::self.hparams.num_folds])
            else:
                held = set(order[: int(round(len(items) * self.hparams.val_fraction))])
            self.val_indices = [i for i in order if i in held]  # positions in `source`: paired units across fits
            val = [items[i] for i in self.val_indices]
            train = [items[i] for i in order if i not in held]
        self.train_set, self.val_set = self._dataset(train), self._dataset(val)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.hparams.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
