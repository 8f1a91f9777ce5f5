"""Tasks, variants and measured steps of the STAC-R benchmark (:mod:`lit_lowrank.benchmarks.stac_r`).

Two pretrained transformers that ship offline, fine-tuned in plain PyTorch loops (no
Lightning, so the measured memory is the method's and the model's only):

- **SmolLM2-135M** (:func:`~lit_lowrank.models.pretrained.load_smollm2`, a Llama: SwiGLU
  MLP, grouped-query attention, tied embeddings): causal-LM fine-tuning on packed windows
  of the Lee corpus, every ``q/k/v/o/gate/up/down_proj`` of the 30 blocks compressed.
- **all-MiniLM-L6-v2** (:func:`~lit_lowrank.models.pretrained.load_minilm`, a 6-layer BERT
  with GELU MLP): sentiment classification of the embedded tweets (masked-mean pooling and
  a linear head), every Linear of the 6 blocks compressed.

A :class:`Variant` is one method on a fresh copy of the pretrained weights: STAC-R (or a
control basis), activation checkpointing, GaLore, or a composition. Its steps can run
inside a :class:`~lit_lowrank.ops.peak_memory.PeakMemory` session (the total training peak,
two phases per step: forward + backward, optimizer step) and can measure the
weight-gradient cosine to the exact gradient of the same step: STAC-R leaves every input
gradient exact (``∂X = G W``), so each layer's output gradient ``G`` is the exact one and
``cos(GᵀX̂, GᵀX)`` per layer is the cosine of its weight gradient to the exact run's.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.callbacks.stac_r import STACRLinear, apply_stac_r, galore_param_groups
from lit_lowrank.ops.stac_r.peak_memory import PeakMemory
from lit_lowrank.ops.stac_r.saved_tensors import SavedTensorCounter

SMOL_TARGET = r"layers\.\d+\.(self_attn|mlp)\.[a-z]+_proj$"
MINILM_TARGET = (r"encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense"
                 r"|intermediate\.dense|output\.dense)$")


@dataclass
class Task:
    """A pretrained model, its loss, the Linear layers STAC-R compresses, and fixed batches."""

    name: str
    model: nn.Module
    loss: Callable[[nn.Module, dict[str, Tensor]], Tensor]
    target: str
    train: list[dict[str, Tensor]]
    val: list[dict[str, Tensor]]
    tokens_per_step: int


def _lm_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    logits = model(input_ids=batch["input_ids"]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)


def smollm2_task(seq: int, batch: int, n_train: int, n_val: int, seed: int) -> Task:
    """SmolLM2-135M on packed ``seq``-token windows of the Lee corpus, ``batch`` windows per step."""
    from lit_lowrank.datamodules import PackedTextDataModule
    from lit_lowrank.models.pretrained import load_smollm2

    model, _ = load_smollm2()
    model.config.use_cache = False
    model.train()
    data = PackedTextDataModule(corpus="lee", tokenizer="smollm2", seq_len=seq, batch_size=batch, seed=seed)
    data.setup("fit")
    torch.manual_seed(seed)
    train = _take(data.train_dataloader(), n_train)
    val = _take(data.val_dataloader(), n_val)
    return Task("smollm2", model, _lm_loss, SMOL_TARGET, train, val, seq * batch)


class MiniLMClassifier(nn.Module):
    """all-MiniLM-L6-v2 with masked-mean pooling (its sentence embedding) and a linear head."""

    def __init__(self, encoder: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, num_classes)

    def forward(self, x: Tensor, attention_mask: Tensor) -> Tensor:
        states = self.encoder(input_ids=x, attention_mask=attention_mask.long()).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        return self.head((states * mask).sum(1) / mask.sum(1).clamp_min(1.0))


def _cls_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    return F.cross_entropy(model(batch["x"], batch["attention_mask"]), batch["y"])


def minilm_task(batch: int, max_length: int, n_train: int, n_val: int, seed: int) -> Task:
    """all-MiniLM-L6-v2 fine-tuned on the embedded sentiment tweets (3 classes), ``max_length`` tokens padded."""
    from lit_lowrank.datamodules import TextClassificationDataModule
    from lit_lowrank.models.pretrained import load_minilm

    encoder, _ = load_minilm()
    data = TextClassificationDataModule(source="tweets", tokenizer="minilm", max_length=max_length, batch_size=batch,
                                        seed=seed, max_samples=max(2000, 2 * batch * (n_train + n_val)))
    data.setup("fit")
    torch.manual_seed(seed)
    model = MiniLMClassifier(encoder, data.num_classes).train()
    train = _take(data.train_dataloader(), n_train)
    val = _take(data.val_dataloader(), n_val)
    return Task("minilm", model, _cls_loss, MINILM_TARGET, train, val, batch * max_length)


def to_device(task: Task, device: str) -> Task:
    """``task`` with its model and batches on ``device`` (the full run on a GPU)."""
    def move(batches: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        return [{k: v.to(device) if isinstance(v, Tensor) else v for k, v in b.items()} for b in batches]

    task.model.to(device)
    task.train, task.val = move(task.train), move(task.val)
    return task


def _take(loader: Any, n: int) -> list[dict[str, Tensor]]:
    out: list[dict[str, Tensor]] = []
    while len(out) < n:
        for b in loader:
            out.append(b)
            if len(out) == n:
                break
    return out


@dataclass(frozen=True)
class Spec:
    """One method: a STAC-R basis (``None`` = exact activations) with its code, checkpointing, GaLore.

    ``rank`` 0 means full rank: every layer coded at its own input width (the no-compression control).
    ``target``: each layer's rank chosen at the calibration step for this weight-gradient cosine
    (:func:`~lit_lowrank.ops.stac_r_rank.select_rank`, margin ``margin``); ``rank`` is then only the
    calibration forward's.
    """

    name: str
    basis: str | None = None
    rank: int = 32
    density: float = 0.01
    coef_dtype: str = "bfloat16"
    update_every: int = 1
    galore_rank: int | None = None
    checkpoint: bool = False
    target: float | None = None
    margin: float = 0.005


class Variant:
    """A fresh copy of ``task.model`` trained with ``spec`` (AdamW, or GaLoreAdamW on the compressed Linears)."""

    def __init__(self, task: Task, spec: Spec, lr: float, meter: PeakMemory | None = None, seed: int = 0) -> None:
        self.task, self.spec, self.steps = task, spec, 0
        torch.manual_seed(seed)  # the random projection's seeds
        if meter is None:
            self._build(task, spec, lr)
        else:
            with meter.segment("build"):
                self._build(task, spec, lr)

    def _build(self, task: Task, spec: Spec, lr: float) -> None:
        self.model = copy.deepcopy(task.model).train()
        self.layers: dict[str, STACRLinear] = {}
        self.ranks: dict[str, int] = {}
        self.calibration_bases: dict[str, Tensor] = {}
        self.curves: dict[str, Tensor] = {}
        if spec.basis is not None:
            kwargs = dict(residual_density=spec.density, basis=spec.basis, coef_dtype=spec.coef_dtype,
                          update_every=spec.update_every)
            if spec.rank:
                self.layers = apply_stac_r(self.model, target=task.target, rank=spec.rank, **kwargs)
            else:  # rank 0: full rank, each layer at its own input width (the no-compression control); any
                widths: dict[int, list[str]] = {}  # orthonormal basis is lossless there, so the identity, frozen
                for name, module in self.model.named_modules():
                    if isinstance(module, nn.Linear) and re.search(task.target, name):
                        widths.setdefault(module.in_features, []).append(name)
                for width, names in widths.items():
                    kwargs["basis"] = "untracked"
                    self.layers.update(apply_stac_r(self.model, target=names, rank=width, **kwargs))
                for layer in self.layers.values():
                    layer.stac_r_basis = torch.eye(layer.in_features, device=layer.weight.device)
        if spec.checkpoint:  # transformers' own (non-reentrant) checkpointing of every block
            inner = self.model.encoder if isinstance(self.model, MiniLMClassifier) else self.model
            if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5 names it so
                inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if spec.galore_rank is not None:
            from galore_torch import GaLoreAdamW

            groups = galore_param_groups(self.model, self.task.target, rank=spec.galore_rank, update_proj_gap=200)
            self.opt: torch.optim.Optimizer = GaLoreAdamW(groups, lr=lr, weight_decay=0.0, no_deprecation_warning=True)
        else:
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)

    def step(self, batch: dict[str, Tensor], meter: PeakMemory | None = None, diagnose: bool = False,
             counter: SavedTensorCounter | None = None) -> dict[str, float]:
        """One training step (the first one calibrates STAC-R: exact, bases from its SVD).

        ``meter``: measure it in two segments (``forward_backward``, ``optimizer``).
        ``diagnose``: keep the exact inputs aside and return the per-layer weight-gradient
        cosines' mean (``cosine``) and minimum (never in a measured step).
        ``counter``: an outer saved-tensor region to run forward + backward in (the
        :class:`~lit_lowrank.ops.saved_surface.SurfaceRecorder` of the predictor).
        """
        if diagnose and meter is not None:
            raise ValueError("a diagnosed step keeps the exact inputs: it must not be a measured one.")
        mode = "calibrate" if self.steps == 0 else "compress"
        select = None if self.spec.target is None or mode != "calibrate" else dict(
            target=self.spec.target, criterion="grad_cosine", margin=self.spec.margin, multiple=8)
        for layer in self.layers.values():
            layer.mode, layer.diagnose = mode, diagnose and mode == "compress"
            layer.diagnostics.clear()
            layer.rank_select = select
            if diagnose and mode == "compress":
                layer.diagnostics["capture"] = True  # the exact (X, G): controls scored on the same step
        start = time.perf_counter()
        if meter is not None:
            meter.start_segment("forward_backward")
        self.opt.zero_grad(set_to_none=True)
        if counter is not None:
            with counter:
                loss = self.task.loss(self.model, batch)
                loss.backward()
        else:
            loss = self.task.loss(self.model, batch)
            loss.backward()
        if meter is not None:
            meter.end_segment()
            meter.start_segment("optimizer")
        self.opt.step()
        if meter is not None:
            meter.end_segment()
        if loss.is_cuda:  # the step's kernels have finished when the clock is read
            torch.cuda.synchronize(loss.device)
        out: dict[str, Any] = {"loss": float(loss.detach()), "seconds": time.perf_counter() - start}
        if select is not None:
            self._choose_ranks()
        elif mode == "calibrate":
            self.calibration_bases = {n: layer.stac_r_basis for n, layer in self.layers.items()
                                      if layer.stac_r_basis is not None}
        if diagnose and self.layers:
            cos = [layer.diagnostics["bridge"].cosine for layer in self.layers.values()
                   if "bridge" in layer.diagnostics]
            out.update(cosine=sum(cos) / len(cos), cosine_min=min(cos), cosine_layers=len(cos))
            out["captured"] = {n: (layer.diagnostics.pop("x"), layer.diagnostics.pop("g"))
                               for n, layer in self.layers.items() if "x" in layer.diagnostics}
            for layer in self.layers.values():
                layer.diagnostics.clear()
        self.steps += 1
        return out

    def _choose_ranks(self) -> None:
        """Each layer's rank and basis from its calibration choice; the bases at calibration are kept aside
        (the untracked control: the same choice, frozen)."""
        for name, layer in self.layers.items():
            layer.rank_select = None
            layer.diagnostics.pop("select", None)
            choice = layer.diagnostics.pop("choice")
            layer.rank, layer.stac_r_basis = choice.rank, choice.basis.to(layer.weight.device)
            self.ranks[name] = choice.rank
            self.calibration_bases[name] = layer.stac_r_basis
            self.curves[name] = choice.curve.cpu()  # the cosine at every rank: the frontier over targets

    def calibrate_forward(self, batch: dict[str, Tensor]) -> None:
        """Start the bases from one forward on ``batch`` (no backward, no update): a control's calibration
        that costs a third of a step. Counts as the variant's first step."""
        for layer in self.layers.values():
            layer.mode, layer.diagnose = "calibrate", False
        loss = self.task.loss(self.model, batch)
        del loss
        self.steps = max(self.steps, 1)

    @torch.no_grad()
    def val_losses(self) -> list[float]:
        """The loss of every validation batch (exact forward: STAC-R acts on training steps only)."""
        self.model.eval()
        losses = [float(self.task.loss(self.model, b)) for b in self.task.val]
        self.model.train()
        return losses


def forward_saved_bytes(model: nn.Module, task: Task, batch: dict[str, Tensor]) -> int:
    """Saved-activation bytes held at the end of one forward (the saved peak; no backward is run)."""
    with SavedTensorCounter() as counter:
        loss = task.loss(model, batch)
        held = counter.current_bytes
    del loss
    return held


def set_code(layers: dict[str, STACRLinear], chosen: set[str], rank: int, coef_dtype: torch.dtype) -> None:
    """Compress only ``chosen`` (the others run plainly) at rank ``rank``; bases restart from the next batch."""
    for name, layer in layers.items():
        layer.mode = "compress" if name in chosen else "off"
        layer.diagnose = False
        if layer.rank != rank or layer.coef_dtype != coef_dtype:
            layer.rank, layer.coef_dtype, layer.stac_r_basis = rank, coef_dtype, None


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def control_cosines(captured: dict[str, tuple[Tensor, Tensor]], variant: Variant) -> dict[str, float]:
    """Mean over layers of the weight-gradient cosine other codes reach on the same step's exact ``(X, G)``.

    Each layer at the rank STAC-R uses there: ``untracked`` (the calibration basis, frozen),
    ``svd`` (a per-step SVD stored with its basis, iso-byte rank), ``random`` (a fresh Gaussian
    projection, no residual, iso-byte width) and ``oracle`` (the step's own top-``r`` SVD basis
    at STAC-R's rank and residual, not stored: the best a rank-``r`` principal basis can do on
    this batch — the premise of the cosine claim).
    """
    from lit_lowrank.ops.stac_r.compress import (
        compress_activation,
        decompress_activation,
        gradient_bridge,
        iso_byte_rank,
        random_projection,
        random_projection_rank,
    )

    out: dict[str, list[float]] = {"untracked": [], "svd": [], "random": [], "oracle": []}
    for i, (name, (x, g)) in enumerate(sorted(captured.items())):
        layer = variant.layers[name]
        n, d = x.shape
        r, rho = layer.rank, layer.residual_density
        _, _, vh = torch.linalg.svd(x.float(), full_matrices=False)
        bases = {"untracked": (variant.calibration_bases[name], rho),
                 "svd": (vh[:iso_byte_rank(n, d, r)].T.to(torch.bfloat16).float(), rho),
                 "random": (random_projection(d, random_projection_rank(n, d, r, rho), seed=7919 * i + n,
                                              device=x.device), 0.0),
                 "oracle": (vh[:r].T.contiguous(), rho)}
        for key, (basis, density) in bases.items():
            code = compress_activation(x, basis.to(x.device), density)
            out[key].append(gradient_bridge(g, x, decompress_activation(code)).cosine)
    return {k: sum(v) / len(v) for k, v in out.items() if v}


def ranks_for_target(curves: dict[str, Tensor], widths: dict[str, int], target: float, margin: float,
                     multiple: int = 8) -> dict[str, int]:
    """Per-layer ranks :func:`~lit_lowrank.ops.stac_r_rank.select_rank` would choose for ``target`` from the
    calibration step's cosine curves (the frontier over targets without another calibration)."""
    out = {}
    for name, curve in curves.items():
        reached = (curve >= min(1.0, target + margin) - 1e-6).nonzero()
        need = int(reached[0]) + 1 if reached.numel() else widths[name]
        out[name] = min(widths[name], multiple * math.ceil(need / multiple))
    return out
