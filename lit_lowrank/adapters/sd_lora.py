"""SD-LoRA: a training-only heterogeneous graph teacher distilled into a CLIP-LoRA student (METHODS.md §16).

The student is a LoRA-adapted dual encoder (:class:`~lit_lowrank.tasks.FewShotCLIPModule`,
or any module honouring the protocol below). :class:`SDLoRA` is a
:class:`~lit_lowrank.core.MethodCallback` that owns the teacher: it is never attached to the
module, so it is not in the module's ``state_dict``, not in an exported classifier and never
runs at inference — by construction, not by a flag.

Each training step (``on_loss``):

1. the teacher's graph is built (:func:`~lit_lowrank.ops.sd_lora.build_hetero_graph`: patch–patch
   kNN, global/local–patch, global–local, visual–text) from the student's *own* step outputs —
   its patch tokens, global embedding and class-text embeddings, **with their gradients** — plus
   crop ("local") embeddings of the current adapted image tower (no gradient);
2. the :class:`~lit_lowrank.models.graph_teacher.HeteroGraphTeacher` scores it: class cosines (global
   node vs text nodes) and patch–patch / patch–text relations;
3. the loss becomes ``CE + λ_t·CE_teacher + λ_k·KD + λ_s·relation distillation + λ_p·PPA``. ``CE_teacher`` is
   the teacher's cross-entropy on ``exp(logit_scale)·cosines``: it trains the teacher *and*, through
   the graph, reaches the shared LoRA weights of both towers — the abstract's implicit distillation
   "into the shared CLIP-LoRA backbone". ``KD`` is Hinton's distillation of the teacher's (detached)
   logits into the student's deployed logit path ``s·f·Wcᵀ`` (``outputs["logits"]``, what the
   exported classifier computes before its cache), ``τ_k²·KL(softmax(z_t/τ_k) ‖ softmax(z_s/τ_k))``.
   Relation distillation is the row-wise KL from the teacher's
   (detached) relations to the student's; PPA is ``KL(softmax(f Pᵀ/τ) ‖ softmax(cos_t/τ))`` with ``P``
   the support-set class prototypes of the student's embeddings (a running mean over batches) and
   ``cos_t`` the teacher's cosines (detached): one scale per side, ``1/τ``.
4. after the backward pass the callback steps the teacher's own optimizer (``on_before_optimizer_step``).

Before the first student step the teacher is warmed up on the support set
(``teacher_warmup_steps``, its own loop on detached inputs), so the student never distils from a
random graph.

``teacher_inputs="frozen"`` reads the pretrained towers with LoRA bypassed instead (no gradient reaches
the student through the teacher: the ablation without implicit distillation).
``graph_structure="shuffled"`` builds graphs with random patch neighbours and crop coverage (the
control: the same edge counts, no structure). A random teacher is ``teacher_warmup_steps=0,
teacher_online=False``.

Module protocol: ``frozen_graph_inputs(x, crops, frozen) -> {"patches", "global", "local", "text"}`` (and
optionally ``crop_embeddings(x, crops, frozen) -> (B, K, D)``, so a step needs no other extra forward) and
step ``outputs`` with ``logits (B, C)`` (the deployed ``s·f·Wcᵀ`` logits), ``features (B, D)`` (L2-normalised image embeddings),
``patch_features (B, P, D)`` and ``text_features (C, D)``; the datamodule may offer
``support_dataloader()`` (else ``train_dataloader()`` is used for the warm-up).

Decisions (the spec leaves them open): the teacher is trained online with its own optimizer
(after a warm-up) rather than pre-trained and frozen; its graph reads the student's tokens so its
loss is the implicit-distillation path; prototypes are a momentum mean of detached student
embeddings per class.

.. code-block:: python

    trainer = L.Trainer(max_steps=200, callbacks=[SDLoRA(lambda_teacher=1.0, lambda_relation=0.1, lambda_ppa=0.5)])
    trainer.fit(FewShotCLIPModule(), datamodule=FewShotDigitsDataModule(shots=4))
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor

from lit_lowrank.core.loss_hooks import MethodCallback, require_outputs
from lit_lowrank.models.graph_teacher import HeteroGraphTeacher
from lit_lowrank.ops.sd_lora import (
    build_hetero_graph,
    logit_distillation_loss,
    prototype_predictive_alignment,
    quadrant_crop_mask,
    relation_agreement,
    relation_distillation_loss,
    relation_matrices,
)

_NEEDED = ("logits", "features", "patch_features", "text_features")
TEACHER_INPUTS = ("adapted", "frozen")
GRAPH_STRUCTURES = ("knn", "shuffled")


def target_entropy(cosines: Tensor, tau: float) -> Tensor:
    """Mean entropy (nats) of PPA's teacher target ``softmax(cosines / τ)``; at most ``log C``."""
    log_q = (cosines.detach() / tau).log_softmax(-1)
    return -(log_q.exp() * log_q).sum(-1).mean()


class SDLoRA(MethodCallback):
    """The SD-LoRA training-only graph teacher, implicit distillation, relation distillation and PPA.

    Args:
        lambda_teacher: weight ``λ_t`` of the teacher's cross-entropy in the student's loss (the
            implicit-distillation path into the shared LoRA; with ``teacher_inputs="frozen"`` it only
            trains the teacher).
        lambda_relation: weight ``λ_s`` of the relation distillation loss.
        lambda_ppa: weight ``λ_p`` of the PPA loss.
        lambda_logit: weight ``λ_k`` of the distillation of the teacher's logits into the student's
            deployed logits ``outputs["logits"]`` (0: the teacher reaches the student only through the graph).
        tau_logit: temperature ``τ_k`` of that distillation.
        tau_relation: temperature of the row-softmaxed relations (teacher and student).
        tau_ppa: temperature ``τ`` of both PPA softmaxes (both sides are cosines).
        patch_k: nearest patches each patch node receives edges from.
        crops: local nodes: 4 quadrants, 1 centre crop or 5 (both).
        teacher_layers / teacher_heads: size of the graph transformer.
        teacher_lr: AdamW learning rate of the teacher.
        teacher_warmup_steps: full-support-set teacher steps before the first student step.
        teacher_online: keep training the teacher during fit (one step per student step).
        prototype_momentum: running-mean momentum of the class prototypes (0 = latest batch only).
        teacher_inputs: ``"adapted"`` (the student's own tokens, with gradients: implicit distillation)
            or ``"frozen"`` (the pretrained towers with LoRA bypassed, no gradient to the student).
        graph_structure: ``"knn"`` or ``"shuffled"`` (control: random edges, same counts).
        seed: random source of the ``"shuffled"`` graphs.

    Diagnostics (``method/sd_lora/...``): ``teacher_loss``, ``teacher_acc``, ``logit_kd_loss``, ``relation_loss``,
    ``ppa_loss``, ``ppa_target_entropy`` (nats; ``log C`` is uniform), ``agreement_patch_text`` and
    ``agreement_patch_patch`` (mean histogram intersection of teacher and student relation rows).

    .. code-block:: python

        cb = SDLoRA(lambda_teacher=1.0, lambda_relation=0.1, lambda_ppa=0.5, patch_k=4, crops=4)
        L.Trainer(max_steps=200, callbacks=[cb]).fit(FewShotCLIPModule(), datamodule=FewShotDigitsDataModule())
    """

    method_name = "sd_lora"

    def __init__(self, lambda_teacher: float = 1.0, lambda_relation: float = 1.0, lambda_ppa: float = 1.0,
                 lambda_logit: float = 1.0, tau_logit: float = 2.0, tau_relation: float = 0.1, tau_ppa: float = 0.1, patch_k: int = 4, crops: int = 4,
                 teacher_layers: int = 2, teacher_heads: int = 4, teacher_lr: float = 1e-3,
                 teacher_warmup_steps: int = 100, teacher_online: bool = True, prototype_momentum: float = 0.5,
                 teacher_inputs: str = "adapted", graph_structure: str = "knn", seed: int = 0) -> None:
        super().__init__()
        for name, value in (("lambda_teacher", lambda_teacher), ("lambda_relation", lambda_relation),
                            ("lambda_ppa", lambda_ppa), ("lambda_logit", lambda_logit),
                            ("teacher_warmup_steps", teacher_warmup_steps)):
            if value < 0:
                raise ValueError(f"`{name}`={value}, expected >= 0.")
        for name, value in (("tau_relation", tau_relation), ("tau_ppa", tau_ppa), ("tau_logit", tau_logit),
                            ("teacher_lr", teacher_lr)):
            if value <= 0:
                raise ValueError(f"`{name}`={value}, expected > 0.")
        if teacher_inputs not in TEACHER_INPUTS:
            raise ValueError(f"`teacher_inputs`={teacher_inputs!r}, expected one of {TEACHER_INPUTS}.")
        if graph_structure not in GRAPH_STRUCTURES:
            raise ValueError(f"`graph_structure`={graph_structure!r}, expected one of {GRAPH_STRUCTURES}.")
        if not 0.0 <= prototype_momentum < 1.0:
            raise ValueError(f"`prototype_momentum`={prototype_momentum}, expected in [0, 1).")
        quadrant_crop_mask(2, crops)  # validates `crops`
        self.lambda_teacher, self.lambda_relation, self.lambda_ppa = lambda_teacher, lambda_relation, lambda_ppa
        self.tau_relation, self.tau_ppa = tau_relation, tau_ppa
        self.lambda_logit, self.tau_logit = lambda_logit, tau_logit
        self.patch_k, self.crops = patch_k, crops
        self.teacher_layers, self.teacher_heads = teacher_layers, teacher_heads
        self.teacher_lr, self.teacher_warmup_steps = teacher_lr, teacher_warmup_steps
        self.teacher_online, self.prototype_momentum = teacher_online, prototype_momentum
        self.teacher_inputs, self.graph_structure, self.seed = teacher_inputs, graph_structure, seed
        self.teacher: HeteroGraphTeacher | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.prototypes: Tensor | None = None
        self.seen: Tensor | None = None
        self.warmed_up = False
        self._pending: dict[str, Any] | None = None
        self._generator = torch.Generator().manual_seed(seed)

    # ------------------------------------------------------------------ setup and state
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not callable(getattr(pl_module, "frozen_graph_inputs", None)):
            raise TypeError(f"SDLoRA needs `{type(pl_module).__name__}.frozen_graph_inputs(x, crops, frozen)` returning "
                            "the towers' patches/global/local/text embeddings (FewShotCLIPModule has it).")
        dim = getattr(pl_module, "embed_dim", None)
        if not isinstance(dim, int):
            raise TypeError(f"SDLoRA needs an integer `{type(pl_module).__name__}.embed_dim` (joint embedding width).")
        if self.teacher is None:
            self.teacher = HeteroGraphTeacher(dim, num_layers=self.teacher_layers, heads=self.teacher_heads,
                                              tau=self.tau_relation)
            self.optimizer = torch.optim.AdamW(self.teacher.parameters(), lr=self.teacher_lr)
        self.teacher.to(pl_module.device)
        if self._pending is not None:
            self._load(self._pending)
            self._pending = None

    def state_dict(self) -> dict[str, Any]:
        if self.teacher is None:
            return {}
        return {"teacher": self.teacher.state_dict(), "optimizer": self.optimizer.state_dict(),
                "prototypes": self.prototypes, "seen": self.seen, "warmed_up": self.warmed_up}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.teacher is None:  # restored before setup built the teacher
            self._pending = state_dict
        else:
            self._load(state_dict)

    def _load(self, state: dict[str, Any]) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.prototypes, self.seen, self.warmed_up = state["prototypes"], state["seen"], state["warmed_up"]

    # ------------------------------------------------------------------ teacher
    def _detached_inputs(self, pl_module: pl.LightningModule, x: Tensor) -> dict[str, Tensor]:
        return pl_module.frozen_graph_inputs(x, self.crops, frozen=self.teacher_inputs == "frozen")

    def _step_inputs(self, pl_module: pl.LightningModule, x: Tensor, outputs: dict[str, Any]) -> dict[str, Tensor]:
        """The graph's node features this step: the student's own tokens (with gradients) or the frozen towers'."""
        if self.teacher_inputs == "frozen":
            return self._detached_inputs(pl_module, x)
        if callable(getattr(pl_module, "crop_embeddings", None)):  # optional protocol member: crops only
            local = pl_module.crop_embeddings(x, self.crops, frozen=False)
        else:
            local = pl_module.frozen_graph_inputs(x, self.crops, frozen=False)["local"]
        local = local.detach()  # crop views carry no gradient (a training-only cost kept forward-only)
        return {"patches": outputs["patch_features"], "global": F.normalize(outputs["features"], dim=-1),
                "local": local, "text": outputs["text_features"]}

    def _teacher_forward(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        grid = int(round(inputs["patches"].shape[1] ** 0.5))
        graph = build_hetero_graph(inputs["patches"], inputs["global"], inputs["local"], inputs["text"],
                                   quadrant_crop_mask(grid, self.crops), patch_k=self.patch_k,
                                   structure=self.graph_structure, generator=self._generator)
        return self.teacher(graph)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.teacher.requires_grad_(True)
        if not (self.warmed_up or self.teacher_warmup_steps == 0):
            dm = trainer.datamodule
            loader = dm.support_dataloader() if hasattr(dm, "support_dataloader") else trainer.train_dataloader
            parts, labels = [], []
            for batch in loader:
                x = batch["x"].to(pl_module.device)
                parts.append(self._detached_inputs(pl_module, x))
                labels.append(batch["y"].to(pl_module.device))
            inputs = {k: torch.cat([p[k] for p in parts]) if k != "text" else parts[0][k] for k in parts[0]}
            y = torch.cat(labels)
            self.teacher.train()
            with torch.enable_grad():
                for _ in range(self.teacher_warmup_steps):
                    loss = F.cross_entropy(self.teacher.logits(self._teacher_forward(inputs)["cosines"]), y)
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
        self.warmed_up = True
        self.optimizer.zero_grad(set_to_none=True)
        # a teacher that no longer trains still passes gradients to the student (implicit distillation)
        self.teacher.requires_grad_(self.teacher_online)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        # the student's backward filled the teacher's gradients (its cross-entropy is in the loss)
        grads = [p.grad for p in self.teacher.parameters() if p.grad is not None]
        if self.teacher_online and grads:
            # under mixed precision the loss was scaled and Lightning unscales only the module's optimizer
            scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None) if trainer else None
            if scaler is not None and scaler.is_enabled():
                inv = 1.0 / float(scaler.get_scale())
                for g in grads:
                    g.mul_(inv)
            if all(bool(torch.isfinite(g).all()) for g in grads):  # an overflowing step is skipped, as AMP does
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ the loss hook
    def _update_prototypes(self, features: Tensor, y: Tensor, num_classes: int) -> Tensor:
        onehot = F.one_hot(y, num_classes).to(features.dtype)
        counts = onehot.sum(0)
        means = onehot.T @ features.detach() / counts.clamp(min=1)[:, None]
        if self.prototypes is None or self.prototypes.shape != means.shape:
            self.prototypes, self.seen = torch.zeros_like(means), torch.zeros(num_classes, dtype=torch.bool,
                                                                              device=means.device)
        present = counts > 0
        m = torch.where(self.seen & present, self.prototype_momentum, 0.0)[:, None]
        self.prototypes = torch.where(present[:, None], m * self.prototypes + (1 - m) * means, self.prototypes)
        self.seen = self.seen | present
        return F.normalize(self.prototypes, dim=-1)

    def on_loss(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, outputs: dict[str, Any],
                loss: Tensor) -> Tensor:
        require_outputs(outputs, _NEEDED, "SDLoRA")
        x, y = batch["x"], batch["y"]
        self.teacher.train(self.teacher_online)
        teacher = self._teacher_forward(self._step_inputs(pl_module, x, outputs))
        cosines = teacher["cosines"]
        teacher_logits = self.teacher.logits(cosines)
        teacher_loss = F.cross_entropy(teacher_logits, y)
        logit_kd = logit_distillation_loss(outputs["logits"], teacher_logits, self.tau_logit)
        features = F.normalize(outputs["features"], dim=-1)
        text = outputs["text_features"]
        student = relation_matrices(outputs["patch_features"], text, self.tau_relation)
        relation = relation_distillation_loss((teacher["patch_patch"], teacher["patch_text"]), student)
        prototypes = self._update_prototypes(features, y, text.shape[0])
        ppa = prototype_predictive_alignment(features, prototypes, cosines, self.tau_ppa)
        for name, value in (("teacher_loss", teacher_loss), ("logit_kd_loss", logit_kd), ("relation_loss", relation),
                            ("ppa_loss", ppa),
                            ("ppa_target_entropy", target_entropy(cosines, self.tau_ppa)),
                            ("teacher_acc", (cosines.argmax(-1) == y).float().mean()),
                            ("agreement_patch_text", relation_agreement(teacher["patch_text"], student[1])),
                            ("agreement_patch_patch", relation_agreement(teacher["patch_patch"], student[0]))):
            self.log_method(pl_module, name, value.detach())
        return (loss + self.lambda_teacher * teacher_loss + self.lambda_logit * logit_kd
                + self.lambda_relation * relation + self.lambda_ppa * ppa)
