"""Self-distillation data for drafters: the target's own greedy answers to instruction prompts.

A drafter is scored by how often the *target's* greedy tokens match its guesses, on the
text the target itself writes. So it is trained on exactly that (Medusa-2 / EAGLE
"self-distillation"): instruction prompts built from the shipped corpora (Lee news, text8
Wikipedia) in the target's chat template, the target's greedy continuation of each
(batched ``generate``), and the target's teacher-forced last hidden states and argmax over
prompt + continuation. Everything is computed once and cached on disk under a key that
names the target, the prompts and the settings.

- :func:`instruction_prompts`: prompts from one split of a corpus (the same document split
  as :class:`~lit_lowrank.datamodules.PackedTextDataModule`: validation documents first).
- :func:`self_distillation_set`: prompts, continuations, features and argmax (cached).
- :class:`SelfDistillDataModule`: windows of that set for
  :class:`~lit_lowrank.decoding.training.DrafterDistillModule` (``lit-lowrank fit``).

.. code-block:: python

    from lit_lowrank.decoding.distill_data import SelfDistillDataModule

    dm = SelfDistillDataModule(target="smollm2", corpus="lee", prompts=192, max_new_tokens=96)
    dm.setup("fit")          # first time: ~minutes of target decoding on a CPU; cached afterwards
    batch = next(iter(dm.train_dataloader()))   # input_ids, doc_ids, features, target_ids
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_lowrank.decoding.engine import check_feature_layers, fused_features

#: Instruction templates; ``{text}`` is a document excerpt. Varied so the answers are not all one kind
#: (continuations copy little from the prompt, summaries copy more: prompt lookup's best case).
PROMPT_TEMPLATES: tuple[str, ...] = (
    "Continue this text:\n\n{text}",
    "Summarize the following text in a few sentences.\n\n{text}",
    "What are the main points of this passage?\n\n{text}",
    "Explain the following passage to a student.\n\n{text}",
)
SPLITS = ("train", "val", "test")


def _split_documents(docs: list[str], split: str, seed: int, holdout: float) -> list[str]:
    """Seeded document split: ``holdout`` of the documents for ``val``, as many for ``test``, the rest ``train``."""
    if split not in SPLITS:
        raise ValueError(f"`split`={split!r}, expected one of {SPLITS}.")
    if not 0 < holdout < 0.5:
        raise ValueError(f"`holdout`={holdout}: expected a fraction in (0, 0.5).")
    order = np.random.default_rng(seed).permutation(len(docs))
    k = max(1, round(holdout * len(docs)))
    part = {"val": order[:k], "test": order[k: 2 * k], "train": order[2 * k:]}[split]
    return [docs[i] for i in part]


def instruction_prompts(corpus: str = "lee", split: str = "train", n: int | None = None, words: int = 60,
                        seed: int = 0, holdout: float = 0.1) -> list[str]:
    """Instruction prompts over document excerpts of one split of ``corpus`` (user messages, no template).

    Document ``i`` of the split gets template ``i mod len(PROMPT_TEMPLATES)`` and an excerpt of
    ``words`` words (from a seeded offset in long documents, e.g. text8's). With ``n`` larger
    than the split, documents are reused with the next template and another excerpt.

    Args:
        corpus: ``"lee"``, ``"text8"`` or a local corpus path (see ``PackedTextDataModule``).
        split: ``"train"``, ``"val"`` or ``"test"`` (disjoint document sets).
        n: number of prompts (``None``: one per document).
        words: excerpt length in words.
        seed: the document split and excerpt offsets.
        holdout: fraction of documents in each of ``val`` and ``test``.

    .. code-block:: python

        prompts = instruction_prompts("lee", "test", n=8)
    """
    from lit_lowrank.datamodules.text import _read_source

    if words < 1:
        raise ValueError(f"`words` must be >= 1, got {words}.")
    docs = _split_documents(_read_source(corpus), split, seed, holdout)
    n = len(docs) if n is None else n
    rng = np.random.default_rng(seed + 1)
    out = []
    for i in range(n):
        doc = docs[i % len(docs)].split()
        rounds = i // len(docs)
        start = int(rng.integers(0, max(1, len(doc) - words))) if len(doc) > 2 * words or rounds else 0
        text = " ".join(doc[start: start + words])
        out.append(PROMPT_TEMPLATES[(i + rounds) % len(PROMPT_TEMPLATES)].format(text=text))
    return out


def chat_prompt_ids(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Each prompt as one user turn in the tokenizer's chat template, with the assistant turn opened."""
    out = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


@torch.no_grad()
def greedy_continuations(model: torch.nn.Module, prompt_ids: list[list[int]], max_new_tokens: int,
                         eos_token_id: int, pad_token_id: int, batch_size: int = 16) -> list[list[int]]:
    """The model's greedy continuation of every prompt (batched, left-padded), cut after the first EOS."""
    device = next(model.parameters()).device
    out: list[list[int]] = [[] for _ in prompt_ids]
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths pad less
    for start in range(0, len(order), batch_size):
        idx = order[start: start + batch_size]
        width = max(len(prompt_ids[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, width - len(prompt_ids[i]):] = torch.tensor(prompt_ids[i])
            mask[r, width - len(prompt_ids[i]):] = 1
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        for r, i in enumerate(idx):
            new = gen[r, width:].tolist()
            out[i] = new[: new.index(eos_token_id) + 1] if eos_token_id in new else new
    return out


@torch.no_grad()
def teacher_forced_outputs(model: torch.nn.Module, sequences: list[list[int]], batch_size: int = 8,
                           dtype: torch.dtype = torch.float16,
                           feature_layers: tuple[int, ...] | list[int] | None = None) -> tuple[list[Tensor], list[Tensor]]:
    """The model's features ``(T_i, H * L)`` (in ``dtype``) and argmax ``(T_i,)`` over each sequence.

    Features are the last hidden state (after the final norm, ``L = 1``) or, with ``feature_layers``,
    the hidden states of those layers concatenated low to high (EAGLE-3's fused features; indices into
    transformers' ``hidden_states``: ``0`` = embeddings, ``num_hidden_layers`` = the final, normed output).
    """
    device = next(model.parameters()).device
    layers = check_feature_layers(feature_layers, model.config.num_hidden_layers)
    feats: list[Tensor] = [torch.empty(0)] * len(sequences)
    argmax: list[Tensor] = [torch.empty(0)] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    for start in range(0, len(order), batch_size):
        idx = order[start: start + batch_size]
        width = max(len(sequences[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        for r, i in enumerate(idx):  # right padding: causal attention never looks at it
            ids[r, : len(sequences[i])] = torch.tensor(sequences[i])
        out = decoder(input_ids=ids.to(device), output_hidden_states=layers is not None)
        top = head(out.last_hidden_state).argmax(-1)
        hidden = fused_features(out.hidden_states, out.last_hidden_state, layers)  # what TargetLM returns
        for r, i in enumerate(idx):
            n = len(sequences[i])
            feats[i], argmax[i] = hidden[r, :n].to(dtype).cpu(), top[r, :n].cpu()
    return feats, argmax


def _cache_root() -> Path:
    return Path(os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank")


def _fingerprint(model: torch.nn.Module, ids: list[list[int]], max_new_tokens: int) -> str:
    probe = next(model.parameters())
    blob = {"ids": ids, "max_new": max_new_tokens, "config": model.config.to_dict(),
            "weights": float(probe.detach().double().sum())}
    return hashlib.sha1(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _cached(path: Path, make: Any) -> Any:
    if path.is_file():
        return torch.load(path, weights_only=True)
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(value, tmp)
    os.replace(tmp, path)  # atomic: other processes share the cache root
    return value


def self_distillation_set(model: torch.nn.Module, tokenizer: Any, corpus: str = "lee", split: str = "train",
                          prompts: int | None = 192, max_new_tokens: int = 96, words: int = 60, seed: int = 0,
                          cache_dir: str | os.PathLike | None = None, batch_size: int = 32,
                          feature_layers: tuple[int, ...] | list[int] | None = None) -> dict[str, Any]:
    """Prompts, the target's greedy continuations, its features and argmax; cached on disk.

    Returns ``{"prompt_ids": [[int]], "continuations": [[int]], "features": [(T_i, H * L) half],
    "target_ids": [(T_i,) long]}`` where sequence ``i`` is ``prompt_ids[i] + continuations[i]``
    (``feature_layers``: see :func:`teacher_forced_outputs`). The answers and the features are cached
    apart (keys hash the target's config and weights summary, the prompts and the settings), so
    other feature layers reuse the answers.

    .. code-block:: python

        data = self_distillation_set(model, tokenizer, "lee", "train", prompts=192, max_new_tokens=96)
    """
    layers = check_feature_layers(feature_layers, model.config.num_hidden_layers)
    texts = instruction_prompts(corpus, split, prompts, words, seed)
    ids = chat_prompt_ids(tokenizer, texts)
    key = _fingerprint(model, ids, max_new_tokens)
    root = Path(cache_dir) if cache_dir is not None else _cache_root() / "drafter-distill"
    stem = f"{corpus}-{split}-{len(ids)}-{max_new_tokens}-{key}"
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    conts = _cached(root / f"answers-{stem}.pt",
                    lambda: greedy_continuations(model, ids, max_new_tokens, eos, pad, batch_size))
    tag = "last" if layers is None else "-".join(map(str, layers))
    feats, argmax = _cached(root / f"features-{tag}-{stem}.pt",
                            lambda: teacher_forced_outputs(model, [p + c for p, c in zip(ids, conts)],
                                                           feature_layers=layers))
    return {"prompt_ids": ids, "continuations": conts, "features": feats, "target_ids": argmax}


def token_counts(data: dict[str, Any], vocab_size: int) -> Tensor:
    """How often each id is the target's argmax in a :func:`self_distillation_set` (the draft-vocabulary ranking)."""
    return torch.bincount(torch.cat(data["target_ids"]), minlength=vocab_size)


class DistillWindows(Dataset):
    """Fixed-length windows over the concatenated sequences, with ``doc_ids`` marking sequence boundaries.

    With ``assistant_only`` (the default) the loss targets of prompt positions are ``-100``: position
    ``t`` predicts token ``t + 1``, so only positions whose next token is the target's own answer
    (``t >= len(prompt) - 1``) are scored — what the drafter meets at decode time. The prompt
    tokens still enter the windows as context (inputs and features).
    """

    def __init__(self, data: dict[str, Any], seq_len: int, assistant_only: bool = True) -> None:
        seqs = [p + c for p, c in zip(data["prompt_ids"], data["continuations"])]
        self.tokens = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
        self.doc_ids = torch.repeat_interleave(torch.arange(len(seqs)), torch.tensor([len(s) for s in seqs]))
        self.features = torch.cat(data["features"])
        self.target_ids = torch.cat(data["target_ids"]).clone()
        if assistant_only:
            scored = torch.cat([torch.arange(len(s)) >= len(p) - 1 for s, p in zip(seqs, data["prompt_ids"])])
            self.target_ids[~scored] = -100
        self.seq_len = seq_len
        self.count = self.tokens.numel() // seq_len
        if self.count == 0:
            raise ValueError(f"DistillWindows: {self.tokens.numel()} tokens < seq_len={seq_len}.")

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        s = slice(index * self.seq_len, (index + 1) * self.seq_len)
        return {"input_ids": self.tokens[s], "doc_ids": self.doc_ids[s], "features": self.features[s].float(),
                "target_ids": self.target_ids[s]}


class SelfDistillDataModule(pl.LightningDataModule):
    """The target's own greedy answers (and features) as drafter training data.

    Args:
        target: ``"smollm2"`` or a local transformers folder (the frozen target; the same one
            :class:`~lit_lowrank.decoding.training.DrafterDistillModule` names).
        corpus: corpus of the prompts (``"lee"``, ``"text8"``, ``"lee+text8"``, a path).
        prompts: training prompts (per corpus); validation uses the corpus' ``val`` split.
        val_prompts: validation prompts (per corpus).
        max_new_tokens: greedy continuation length.
        seq_len: training window length.
        batch_size: windows per batch.
        seed: document split, excerpts and shuffling.
        assistant_only: score only positions that predict answer tokens (see :class:`DistillWindows`).
        feature_layers: the target's hidden states to fuse as features (EAGLE-3: low, mid, high; see
            :func:`teacher_forced_outputs`); ``None``: the last hidden state only.

    Batches carry ``input_ids``, ``doc_ids``, ``features`` (float) and ``target_ids`` (B, T), so the
    training module never runs the target.
    """

    def __init__(self, target: str = "smollm2", corpus: str = "lee", prompts: int = 192, val_prompts: int = 16,
                 max_new_tokens: int = 96, seq_len: int = 64, batch_size: int = 8, seed: int = 0,
                 num_workers: int = 0, assistant_only: bool = True,
                 feature_layers: list[int] | None = None) -> None:
        super().__init__()
        if prompts < 1 or val_prompts < 1 or max_new_tokens < 1 or seq_len < 2 or batch_size < 1:
            raise ValueError(f"SelfDistillDataModule: expected prompts, val_prompts, max_new_tokens, batch_size >= 1 "
                             f"and seq_len >= 2; got {prompts}, {val_prompts}, {max_new_tokens}, {batch_size}, "
                             f"{seq_len}.")
        self.save_hyperparameters()
        self.target, self.corpus, self.prompts, self.val_prompts = target, corpus, prompts, val_prompts
        self.max_new_tokens, self.seq_len, self.batch_size, self.seed = max_new_tokens, seq_len, batch_size, seed
        self.num_workers, self.assistant_only = num_workers, assistant_only
        self.feature_layers = None if feature_layers is None else list(feature_layers)
        self.train_data: dict[str, Any] | None = None
        self.val_data: dict[str, Any] | None = None

    def _load_target(self) -> tuple[torch.nn.Module, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lit_lowrank.models.pretrained import load_smollm2

        if self.target == "smollm2":
            return load_smollm2()
        path = Path(self.target).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"SelfDistillDataModule: `target`={self.target!r}: expected 'smollm2' or a local "
                                    "transformers folder.")
        return (AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval(),
                AutoTokenizer.from_pretrained(path, local_files_only=True))

    def _sets(self, model: torch.nn.Module, tokenizer: Any, split: str, n: int) -> dict[str, Any]:
        from lit_lowrank.datamodules.text import _source_names

        parts = [self_distillation_set(model, tokenizer, c, split, n, self.max_new_tokens, seed=self.seed,
                                       feature_layers=self.feature_layers)
                 for c in _source_names(self.corpus)]
        return {k: [x for p in parts for x in p[k]] for k in parts[0]}

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_data is not None:
            return
        model, tokenizer = self._load_target()
        self.vocab_size = int(model.config.vocab_size)
        self.train_data = self._sets(model, tokenizer, "train", self.prompts)
        self.val_data = self._sets(model, tokenizer, "val", self.val_prompts)
        del model

    def target_token_counts(self) -> Tensor:
        """How often each id is the target's argmax in the training set (ranks a reduced draft vocabulary)."""
        self.setup()
        return token_counts(self.train_data, self.vocab_size)

    def train_dataloader(self) -> DataLoader:
        windows = DistillWindows(self.train_data, self.seq_len, self.assistant_only)
        return DataLoader(windows, batch_size=self.batch_size, shuffle=True,
                          drop_last=True, num_workers=self.num_workers,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(DistillWindows(self.val_data, self.seq_len, self.assistant_only), batch_size=self.batch_size,
                          num_workers=self.num_workers)
