"""Fine-tuning a pretrained encoder with every LoRA-family adapter on the embedded tweets (``lora_variants``' runner).

Real model, real data: the offline all-MiniLM-L6-v2 (or SmolLM2-135M in full mode) as a sentence encoder (masked
mean of its last token states) with a new linear head, on the 38k embedded sentiment tweets (3 classes), one fixed
stratified train / validation / test split. The *seed* is the paired unit: it fixes the adapter and head
initialisation and the order of the training batches, identical across methods.

Cheap quick mode (**decision**): the whole 6-layer MiniLM runs, but its bottom ``6 − adapt_layers`` layers are frozen
and their output states computed once (:func:`cached_states`); the adapters sit on *every* Linear of the top
``adapt_layers`` layers (query, key, value, attention output, FFN in and out). Full mode adapts every layer and
needs no cache.

Methods (:data:`METHODS`): ``full`` (every trunk weight), PEFT's ``lora``, ``dora``, ``pissa``
(``init_lora_weights="pissa"``) and ``lokr`` (parameter-matched: :func:`lokr_matched_kwargs`), ``scaled_gd`` (LoRA +
:func:`~lit_lowrank.adapters.scaled_gd.precondition_lora_grads_`), and the registered variants ``sds_lora``,
``sama``, ``polar`` (+ landing) and ``mora`` (all LoRA-budget matched by construction). Every method gets the same
learning-rate grid for its trained body (full fine-tuning the same number of points on its own scale), the head a
fixed learning rate, and is selected on the validation split (:func:`select_lr`); claims read the test split.

.. code-block:: python

    splits = tweet_splits("minilm", max_length=16, sizes=(512, 128, 256))
    trunk = MiniLMTop.from_pretrained(adapt_layers=1)
    data = trunk.prepare(splits)                 # cached states of the frozen layers
    row = finetune_run(trunk, "sds_lora", lr=3e-3, seed=0, data=data, config=FinetuneConfig(steps=30))
"""

from __future__ import annotations

import copy
import math
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.adapters.diagnostics import (
    FullGradientCapture,
    adapter_gradient_eranks,
    delta_weights,
    induced_cosine,
)
from lit_lowrank.ops.lowrank import effective_rank_of, stable_rank_of

#: every method the runner knows; ``full`` trains every trunk weight
METHODS: tuple[str, ...] = ("full", "lora", "dora", "pissa", "scaled_gd", "lokr", "mora", "sds_lora", "sama", "polar")
MINILM_LINEARS = r"(query|key|value|attention\.output\.dense|intermediate\.dense|output\.dense)$"
SMOLLM2_LINEARS = r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"
NUM_CLASSES = 3


# ----------------------------------------------------------------------------- data
Split = dict[str, Tensor]


def tweet_splits(tokenizer: str, max_length: int, sizes: tuple[int, int, int], seed: int = 0) -> dict[str, Split]:
    """``{"train", "val", "test"}`` of the embedded tweets: ``x`` ids ``(N, T)``, ``attention_mask``, ``y``.

    ``sizes`` = (train, validation, test) tweets, drawn stratified from one seeded sample of the 38,158.
    """
    from lit_lowrank.datamodules import TextClassificationDataModule

    total = sum(sizes)
    dm = TextClassificationDataModule(source="tweets", tokenizer=tokenizer, max_length=max_length, max_samples=total,
                                      val_fraction=sizes[1] / total, test_fraction=sizes[2] / total, seed=seed)
    dm.setup("fit")
    return {name: dict(part.tensors) for name, part in
            (("train", dm.train_set), ("val", dm.val_set), ("test", dm.test_set))}


def _pool(states: Tensor, mask: Tensor) -> Tensor:
    weights = mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(1) / weights.sum(1).clamp_min(1.0)


# ----------------------------------------------------------------------------- trunks
class MiniLMTop(nn.Module):
    """The top layers of the pretrained all-MiniLM-L6-v2 on cached states of its frozen bottom layers.

    ``forward(batch)`` with ``batch["states"]: (B, T, 384)`` (the output of layer ``6 − adapt_layers``) and
    ``batch["attention_mask"]`` returns mean-pooled sentence features ``(B, 384)``.
    """

    def __init__(self, bert: nn.Module, adapt_layers: int) -> None:
        super().__init__()
        total = len(bert.encoder.layer)
        if not 1 <= adapt_layers <= total:
            raise ValueError(f"`adapt_layers`={adapt_layers!r}: expected an integer in [1, {total}].")
        self.config = bert.config
        self.start = total - adapt_layers
        self.layer = nn.ModuleList(bert.encoder.layer[self.start:])
        self._frozen = [bert]  # kept out of the module tree: only the top layers are copied per run
        self.num_features = int(bert.config.hidden_size)

    @classmethod
    def from_pretrained(cls, adapt_layers: int) -> MiniLMTop:
        from lit_lowrank.models.pretrained import load_minilm

        bert, _ = load_minilm()
        bert.eval()  # no dropout: the seed alone decides a run (paired units)
        return cls(bert, adapt_layers)

    def _mask(self, states: Tensor, mask: Tensor) -> Tensor | None:
        from transformers.masking_utils import create_bidirectional_mask

        return create_bidirectional_mask(config=self.config, inputs_embeds=states, attention_mask=mask.long())

    def _run(self, layers: Sequence[nn.Module], states: Tensor, mask: Tensor) -> Tensor:
        extended = self._mask(states, mask)
        for layer in layers:
            out = layer(states, attention_mask=extended)
            states = out[0] if isinstance(out, tuple) else out
        return states

    @torch.no_grad()
    def prepare(self, splits: dict[str, Split], chunk: int = 256) -> dict[str, Split]:
        """The splits with ``states``: the frozen bottom layers' output, computed once for every run."""
        bert = self._frozen[0]
        out = {}
        for name, split in splits.items():
            states = []
            for i in range(0, len(split["y"]), chunk):
                ids, mask = split["x"][i:i + chunk], split["attention_mask"][i:i + chunk]
                h = bert.embeddings(input_ids=ids)
                states.append(self._run(bert.encoder.layer[:self.start], h, mask))
            out[name] = {**split, "states": torch.cat(states)}
        return out

    def forward(self, batch: Split) -> Tensor:
        mask = batch["attention_mask"]
        return _pool(self._run(self.layer, batch["states"], mask), mask)


class PretrainedTrunk(nn.Module):
    """A whole pretrained encoder or decoder (MiniLM's ``BertModel``, SmolLM2's ``LlamaModel``) from token ids."""

    def __init__(self, model: nn.Module, num_features: int) -> None:
        super().__init__()
        self.model, self.num_features = model, num_features

    @classmethod
    def minilm(cls) -> PretrainedTrunk:
        from lit_lowrank.models.pretrained import load_minilm

        bert, _ = load_minilm()
        return cls(bert.eval(), int(bert.config.hidden_size))

    @classmethod
    def smollm2(cls) -> PretrainedTrunk:
        from lit_lowrank.models.pretrained import load_smollm2

        lm, _ = load_smollm2()
        return cls(lm.model.eval(), int(lm.config.hidden_size))

    def prepare(self, splits: dict[str, Split]) -> dict[str, Split]:
        return splits

    def forward(self, batch: Split) -> Tensor:
        mask = batch["attention_mask"]
        states = self.model(input_ids=batch["x"], attention_mask=mask.long()).last_hidden_state
        return _pool(states, mask)


class Classifier(nn.Module):
    """``head(trunk(batch))``: the module every method fine-tunes (adapters go into ``trunk``)."""

    def __init__(self, trunk: nn.Module, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.num_features, num_classes)

    def forward(self, batch: Split) -> Tensor:
        return self.head(self.trunk(batch))


# ----------------------------------------------------------------------------- methods
def lokr_parameters(out_features: int, in_features: int, rank: int, decompose_factor: int) -> int:
    """Trainable parameters PEFT's LoKr puts on a Linear ``(out, in)`` (its own shape rules, ``decompose_both=False``).

    ``w1`` is the full ``(out_l, in_m)`` Kronecker factor; ``w2`` the ``(out_k, in_n)`` one, low-rank
    ``r·(out_k + in_n)`` unless ``r ≥ max(out_k, in_n)/2`` (then full), with ``(out_l, out_k)``, ``(in_m, in_n)``
    PEFT's ``factorization`` of ``out`` and ``in`` (checked against PEFT's layers in the tests).
    """
    from peft.tuners.lokr.layer import factorization

    out_l, out_k = factorization(out_features, decompose_factor)
    in_m, in_n = factorization(in_features, decompose_factor)
    w2 = out_k * in_n if rank >= max(out_k, in_n) / 2 else rank * (out_k + in_n)
    return out_l * in_m + w2


def lokr_matched_kwargs(shapes: Sequence[tuple[int, int]], lora_rank: int) -> dict[str, int]:
    """LoKr ``(decompose_factor, rank)`` with the most parameters within a rank-``lora_rank`` LoRA's budget.

    ``shapes`` are the targeted layers' ``(out, in)``. Only genuine Kronecker structures are searched
    (``decompose_factor ≥ 2``: ``factor = 1`` makes LoKr's first factor 1×1, i.e. LoRA plus one scalar).
    """
    budget = sum(lora_rank * (o + i) for o, i in shapes)
    best: tuple[int, dict[str, int]] | None = None
    for factor in (2, 4, 8, 16):
        for rank in range(1, 8 * lora_rank + 1):
            total = sum(lokr_parameters(o, i, rank, factor) for o, i in shapes)
            if total <= budget and (best is None or total > best[0]):
                best = (total, {"decompose_factor": factor, "rank": rank})
    if best is None:
        raise ValueError(f"no LoKr configuration fits a rank-{lora_rank} LoRA budget of {budget} parameters.")
    return best[1]


@dataclass
class FinetuneConfig:
    """Schedule and adapter settings shared by every method of one run."""

    steps: int = 30
    batch_size: int = 16
    rank: int = 8
    head_lr: float = 3e-3
    landing: float = 1.0               # PoLAR's landing λ (the library default)
    scaled_gd_delta: float = 1e-6
    measure_every: int = 10            # diagnostics on steps measure_every, 2·measure_every, ...
    target: str = MINILM_LINEARS


def _inject(model: Classifier, method: str, config: FinetuneConfig, lokr: dict[str, int] | None) -> None:
    from lit_lowrank.adapters.injector import inject_adapters

    if method == "full":
        return
    rank, kwargs = config.rank, {}
    name = method
    if method == "pissa":
        name, kwargs = "lora", {"init_lora_weights": "pissa"}
    elif method == "scaled_gd":
        name = "lora"
    elif method == "lokr":
        if lokr is None:
            raise ValueError("method 'lokr' needs the parameter-matched kwargs (lokr_matched_kwargs).")
        rank, kwargs = lokr["rank"], {"decompose_factor": lokr["decompose_factor"]}
    inject_adapters(model.trunk, method=name, target_modules=config.target, rank=rank, alpha=2 * rank, **kwargs)


def _body_params(model: Classifier, method: str) -> list[nn.Parameter]:
    if method == "full":
        return [p for p in model.trunk.parameters() if p.requires_grad]
    return [p for p in model.trunk.parameters() if p.requires_grad]


def _before_step(model: nn.Module, method: str, config: FinetuneConfig) -> None:
    if method == "polar":
        from lit_lowrank.adapters.polar_landing import apply_landing_

        apply_landing_(model, config.landing)
    elif method == "scaled_gd":
        from lit_lowrank.adapters.scaled_gd import precondition_lora_grads_

        precondition_lora_grads_(model, config.scaled_gd_delta)


def _take(split: Split, index: Tensor) -> Split:
    return {k: v[index] for k, v in split.items()}


@torch.no_grad()
def evaluate(model: nn.Module, split: Split, chunk: int = 128) -> dict[str, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``split``."""
    model.eval()
    loss, correct, n = 0.0, 0, len(split["y"])
    for i in range(0, n, chunk):
        part = _take(split, torch.arange(i, min(i + chunk, n)))
        logits = model(part)
        loss += float(F.cross_entropy(logits, part["y"], reduction="sum"))
        correct += int((logits.argmax(-1) == part["y"]).sum())
    model.train()
    return {"loss": loss / n, "acc": correct / n}


def target_weights(model: nn.Module, target: str) -> dict[str, Tensor]:
    """Copies of the weights of every Linear in ``model`` whose name matches ``target``, by name."""
    return {n: m.weight.detach().clone() for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and re.search(target, n)}


def finetune_run(trunk: nn.Module, method: str, lr: float, seed: int, data: dict[str, Split],
                 config: FinetuneConfig, lokr: dict[str, int] | None = None,
                 train_labels: Tensor | None = None, deltas: dict[str, Tensor] | None = None) -> dict[str, Any]:
    """Fine-tune one copy of ``trunk`` + a new head with ``method`` at body learning rate ``lr``; one row.

    Args:
        trunk: the pretrained trunk (deep-copied: never modified).
        data: ``{"train", "val", "test"}`` splits as :meth:`prepare` returned them.
        train_labels: replaces the training labels (a control: shuffled labels).
        deltas: full fine-tuning only: filled with ``W_T − W_0`` of every Linear matching ``config.target``
            (the real ``ΔW`` the matched-parameter fit section reads).

    Returns:
        ``method, lr, seed, trainable, val_loss, val_acc, test_loss, test_acc, train_loss`` (mean over the last
        quarter of steps) and, for adapters, ``grad_erank``, ``induced_cosine`` (means over the measured steps),
        ``delta_stable_rank`` and ``delta_erank`` (of the learned update ``ΔW_T − ΔW_0``, mean over layers),
        and ``sec_per_step``.
    """
    if method not in METHODS:
        raise ValueError(f"`method`={method!r}: expected one of {METHODS}.")
    torch.manual_seed(seed)
    model = Classifier(copy.deepcopy(trunk))
    if method == "full":
        model.trunk.requires_grad_(True)
    else:
        model.trunk.requires_grad_(False)
        _inject(model, method, config, lokr)
    body = _body_params(model, method)
    opt = torch.optim.AdamW([{"params": body, "lr": lr}, {"params": list(model.head.parameters()),
                                                          "lr": config.head_lr}], weight_decay=0.0)
    if deltas is not None and method != "full":
        raise ValueError(f"`deltas` is filled by full fine-tuning only, got method={method!r}.")
    start = delta_weights(model) if method != "full" else {}
    before = target_weights(model, config.target) if deltas is not None else {}
    train = data["train"]
    labels = train["y"] if train_labels is None else train_labels
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    losses, granks, cosines = [], [], []
    model.train()
    tic = time.perf_counter()
    for step in range(config.steps):
        idx = order[(torch.arange(config.batch_size) + step * config.batch_size) % len(order)]
        batch = _take(train, idx)
        measure = method != "full" and (step + 1) % config.measure_every == 0
        opt.zero_grad(set_to_none=True)
        if measure:
            with FullGradientCapture(model) as cap:
                loss = F.cross_entropy(model(batch), labels[idx])
                loss.backward()
        else:
            loss = F.cross_entropy(model(batch), labels[idx])
            loss.backward()
        _before_step(model, method, config)
        if measure:
            granks += adapter_gradient_eranks(model)
            cosines.append(induced_cosine(model, cap.grads).mean)
        opt.step()
        losses.append(float(loss.detach()))
    seconds = (time.perf_counter() - tic) / config.steps
    val, test = evaluate(model, data["val"]), evaluate(model, data["test"])
    tail = losses[-max(1, config.steps // 4):]
    row: dict[str, Any] = {"method": method, "lr": lr, "seed": seed,
                           "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                           "train_loss": statistics.fmean(tail), "val_loss": val["loss"], "val_acc": val["acc"],
                           "test_loss": test["loss"], "test_acc": test["acc"], "sec_per_step": seconds}
    if deltas is not None:
        deltas.update({n: w - before[n] for n, w in target_weights(model, config.target).items()})
    if method != "full":
        end = delta_weights(model)
        learned = [end[n] - start[n] for n in end]
        row["grad_erank"] = statistics.fmean(granks) if granks else math.nan
        row["induced_cosine"] = statistics.fmean(cosines) if cosines else math.nan
        row["delta_stable_rank"] = statistics.fmean(float(stable_rank_of(d)) for d in learned)
        row["delta_erank"] = statistics.fmean(float(effective_rank_of(d)) for d in learned)
    return row


def select_lr(rows: Sequence[dict[str, Any]], method: str, seeds: Sequence[int]) -> float:
    """The grid learning rate with the lowest mean *validation* loss of ``method`` over ``seeds``."""
    by_lr: dict[float, list[float]] = {}
    for row in rows:
        if row["method"] == method and row["seed"] in seeds:
            by_lr.setdefault(row["lr"], []).append(row["val_loss"])
    if not by_lr:
        raise ValueError(f"select_lr: no row of method {method!r} on seeds {list(seeds)}.")
    complete = {lr: v for lr, v in by_lr.items() if len(v) == len(seeds)}
    return min(complete or by_lr, key=lambda lr: statistics.fmean((complete or by_lr)[lr]))
