"""CAMELModule: Creator–Appraiser meta-learning of new concepts on a frozen conditional diffusion model.

The Creator is a class-conditional :class:`~lit_lowrank.tasks.diffusion.DiffusionModule`
whose denoiser (any model called as ``model(x, t, class_labels=...)``) looks its class labels up in
one ``nn.Embedding`` table (:func:`find_class_table`); a created concept is a new row z of that table
(initialised at a prompt class's embedding e_c and optimised). Samples X_z come from
deterministic DDIM with fixed noise (:func:`lit_lowrank.ops.camel.ddim_sample`), so they are
differentiable in z. The Appraiser (an autoencoder φ₀ for MNIST-like data, or for natural
images a frozen CLIP whose text-projection LoRA adapter is φ) is adapted for K inner SGD
steps on X_z from φ₀ at every outer step, and the Creator ascends
R(z) = L(φ₀; X'_z) − L(φ_K; X'_z) on held-out seeds (:func:`lit_lowrank.ops.camel.camel_reward`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.func import functional_call

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.models.autoencoder import MLPAutoencoder
from lit_lowrank.models.clip_appraiser import CLIPAppraiser
from lit_lowrank.ops.camel import (
    alignment_loss,
    camel_reward,
    classification_loss,
    ddim_sample,
    recognition_hinge,
    reconstruction_loss,
)
from lit_lowrank.tasks.base import TaskModule
from lit_lowrank.tasks.diffusion import DiffusionModule

OBJECTIVES = ("camel", "novelty", "familiarity")
APPRAISERS = ("autoencoder", "clip")
CLIP_LOSSES = ("alignment", "classification")


def find_class_table(model: nn.Module, name: str | None = None, num_classes: int | None = None) -> str:
    """The dotted name of the ``nn.Embedding`` in ``model`` that its class labels index.

    ``name`` given: that submodule, checked to be an ``nn.Embedding``. Otherwise ``class_embedding``
    when it is one (diffusers ``UNet2DModel`` with ``num_class_embeds``), else the single
    ``nn.Embedding`` with ``num_classes`` rows. A model with several such tables (diffusers'
    ``DiTTransformer2DModel`` has one per block) is refused: a concept is one row of one table.

    .. code-block:: python

        find_class_table(UNet2DModel(sample_size=8, num_class_embeds=10, ...))   # 'class_embedding'
    """
    modules = dict(model.named_modules())
    if name is not None:
        if not isinstance(modules.get(name), nn.Embedding):
            raise ValueError(f"`class_embedding`={name!r}: expected the name of an nn.Embedding in the Creator's model; "
                             f"its embeddings are {[n for n, m in modules.items() if isinstance(m, nn.Embedding)]}.")
        return name
    if isinstance(modules.get("class_embedding"), nn.Embedding):
        return "class_embedding"
    found = [n for n, m in modules.items() if isinstance(m, nn.Embedding)
             and (num_classes is None or m.num_embeddings == num_classes)]
    if len(found) != 1:
        raise ValueError(f"CAMEL needs a class-conditional Creator with one class embedding table (an nn.Embedding "
                         f"with num_classes={num_classes} rows); found {found or 'none'} in "
                         f"{type(model).__name__}: pass `class_embedding`= the table's name.")
    return found[0]


class CAMELModule(TaskModule):
    """Bilevel CAMEL: optimise new conditioning embeddings of a frozen diffusion Creator.

    Training has two phases on the datamodule's real batches: for the first
    ``warmup_steps`` steps the Creator (diffusion loss) and the Appraiser φ₀ (reconstruction)
    learn the data — the familiar world; set 0 when both come pretrained
    (``creator_checkpoint``). Then both are frozen, the concepts are initialised at the
    class embeddings of ``concept_classes``, and every step maximises the objective:

    - ``"camel"``: R = L(φ₀; X') − L(φ_K; X') (unfamiliar yet learnable);
    - ``"novelty"``: L(φ₀; X') only (baseline: unfamiliar);
    - ``"familiarity"``: −L(φ₀; X') (baseline: familiar).

    With ``recognition_weight > 0`` every objective adds ``recognition_weight ×`` the mean
    :func:`~lit_lowrank.ops.camel.recognition_hinge` of a frozen recogniser on the concept's samples
    (``recognizer``: any module mapping images to class logits; with a CLIP Appraiser, by default
    CLIP's own zero-shot logits at φ₀): the paper's concepts stay "recognizable as the prompt's class
    to an off-the-shelf observer", which the Appraiser's unfamiliarity term alone does not ask for.

    After each step a concept is projected into the trust region
    ‖z − e_c‖ ≤ ``max_shift``·‖e_c‖ (**decide**: the paper bounds the search implicitly; an
    explicit ball keeps the concept conditioned on its prompt class; ``None`` disables it).

    Args:
        creator: a class-conditional DiffusionModule (default: ``unet_config`` + ``num_classes``).
        creator_checkpoint: a DiffusionModule checkpoint to load into the Creator.
        unet_config / num_classes: the default Creator's UNet and number of classes.
        class_embedding: dotted name (in ``creator.model``) of the ``nn.Embedding`` that the class labels
            index, the table a concept is appended to. Default: ``class_embedding`` (diffusers
            ``UNet2DModel``), else the one ``nn.Embedding`` with the Creator's ``num_classes`` rows.
        appraiser: ``"autoencoder"`` (default: an :class:`MLPAutoencoder`, reconstruction loss, all its
            parameters adapted), ``"clip"`` (a :class:`CLIPAppraiser` loaded from ``clip_path``), a
            :class:`CLIPAppraiser` instance, or any ``nn.Module`` mapping images to reconstructions.
        appraiser_hidden_sizes / appraiser_latent_dim: the default autoencoder Appraiser.
        clip_path: local transformers CLIP directory for ``appraiser="clip"``.
        clip_class_names: one name per Creator class for the prompts (required with ``appraiser="clip"``).
        clip_prompt_template: prompt per class, ``template.format(name)``.
        clip_rank / clip_alpha: LoRA rank and α of the text-projection adapter.
        clip_data_mean / clip_data_std: per-channel statistics the data (and so the Creator's samples)
            are normalised with, undone before CLIP's own preprocessing (default: data in [-1, 1]).
        clip_loss: the CLIP Appraiser's inner loss: ``"alignment"`` (``1 − cos`` to the prompt's text
            embedding, :func:`~lit_lowrank.ops.camel.alignment_loss`; the default) or ``"classification"``
            (zero-shot cross-entropy against the prompt class; its L₀ rewards CLIP *not* recognising the class).
        recognizer: a frozen module mapping Creator images ``(N, C, H, W)`` to class logits ``(N, num_classes)``.
        recognition_weight / recognition_margin: weight and logit margin of the recognition hinge (0 = off).
        concept_classes: prompt class of each concept (default: every class).
        objective: ``"camel"``, ``"novelty"`` or ``"familiarity"``.
        inner_steps / inner_lr: K and the SGD step of the Appraiser's inner loop.
        first_order: detach the inner-loop gradients (first-order approximation).
        num_train_seeds / num_heldout_seeds: samples per concept for X_z and X'_z.
        num_eval_seeds: samples per concept (separate noise) for validation metrics and grids.
        num_inference_steps: DDIM steps of the differentiable sampler.
        concept_lr: learning rate of the concepts' parameter group (weight decay 0).
        noise_seed: seed of the fixed sampler noise.

    .. code-block:: python

        model = CAMELModule(num_classes=10, warmup_steps=300, concept_classes=[3, 5])
        L.Trainer(max_steps=400).fit(model, datamodule=DigitsDataModule())
        images = model.generate(model.concepts.detach(), model.eval_noise)   # (2, n, 1, 8, 8)
    """

    def __init__(
        self,
        creator: DiffusionModule | None = None,
        creator_checkpoint: str | None = None,
        unet_config: dict[str, Any] | None = None,
        num_classes: int = 10,
        class_embedding: str | None = None,
        appraiser: nn.Module | str | None = None,
        appraiser_hidden_sizes: tuple[int, ...] = (64,),
        appraiser_latent_dim: int = 8,
        clip_path: str | None = None,
        clip_class_names: list[str] | None = None,
        clip_prompt_template: str = "a photo of a {}.",
        clip_rank: int = 4,
        clip_alpha: float = 8.0,
        clip_data_mean: list[float] | None = None,
        clip_data_std: list[float] | None = None,
        clip_loss: Literal["alignment", "classification"] = "alignment",
        recognizer: nn.Module | None = None,
        recognition_weight: float = 0.0,
        recognition_margin: float = 1.0,
        concept_classes: list[int] | None = None,
        objective: Literal["camel", "novelty", "familiarity"] = "camel",
        inner_steps: int = 3,
        inner_lr: float = 0.5,
        first_order: bool = False,
        num_train_seeds: int = 16,
        num_heldout_seeds: int = 16,
        num_eval_seeds: int = 32,
        num_inference_steps: int = 5,
        max_shift: float | None = 1.0,
        concept_lr: float = 0.05,
        warmup_steps: int = 0,
        noise_seed: int = 0,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "epoch",
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        self.save_hyperparameters(ignore=["creator", "appraiser", "recognizer", "optimizer", "lr_scheduler"])
        if isinstance(appraiser, str):  # a named Appraiser is rebuilt by load_from_checkpoint; a module is not saved
            self.hparams["appraiser"] = appraiser
        if objective not in OBJECTIVES:
            raise ValueError(f"`objective`={objective!r}, expected one of {OBJECTIVES}.")
        for name, value, low in (("inner_steps", inner_steps, 0), ("num_train_seeds", num_train_seeds, 1),
                                 ("num_heldout_seeds", num_heldout_seeds, 1), ("num_eval_seeds", num_eval_seeds, 1),
                                 ("num_inference_steps", num_inference_steps, 1), ("warmup_steps", warmup_steps, 0)):
            if value < low:
                raise ValueError(f"`{name}`={value}, expected >= {low}.")
        if max_shift is not None and max_shift <= 0:
            raise ValueError(f"`max_shift`={max_shift}, expected > 0 or None.")
        if clip_loss not in CLIP_LOSSES:
            raise ValueError(f"`clip_loss`={clip_loss!r}, expected one of {CLIP_LOSSES}.")
        if recognition_weight < 0 or recognition_margin < 0:
            raise ValueError(f"`recognition_weight`={recognition_weight} and `recognition_margin`={recognition_margin}: "
                             "expected both >= 0.")
        if creator is None:
            creator = DiffusionModule(unet_config=unet_config, num_classes=num_classes)
        if creator_checkpoint is not None:
            if not Path(creator_checkpoint).is_file():
                raise FileNotFoundError(f"`creator_checkpoint`={creator_checkpoint!r}: no such file.")
            from lit_lowrank.core.safe_load import load_weights_file

            state = load_weights_file(creator_checkpoint, param="creator_checkpoint")
            creator.load_state_dict(state.get("state_dict", state))
        self.class_table_name = find_class_table(creator.model, class_embedding, creator.num_classes)
        table = creator.model.get_submodule(self.class_table_name)
        self.creator = creator
        self.num_classes = table.num_embeddings
        image_shape = creator._sample_shape()
        if isinstance(appraiser, str) and appraiser not in APPRAISERS:
            raise ValueError(f"`appraiser`={appraiser!r}, expected one of {APPRAISERS} or an nn.Module.")
        if appraiser == "clip":
            if clip_path is None:
                raise ValueError("`appraiser`='clip' needs `clip_path` (a local transformers CLIP directory); got None.")
            if clip_class_names is None or len(clip_class_names) != self.num_classes:
                raise ValueError(f"`clip_class_names`={clip_class_names}: expected one name per Creator class "
                                 f"({self.num_classes}) with `appraiser`='clip'.")
            stats = {k: tuple(v) for k, v in (("data_mean", clip_data_mean), ("data_std", clip_data_std))
                     if v is not None}
            appraiser = CLIPAppraiser.from_pretrained(clip_path, clip_class_names, clip_prompt_template,
                                                      rank=clip_rank, alpha=clip_alpha, **stats)
        elif appraiser is None or appraiser == "autoencoder":
            appraiser = MLPAutoencoder(image_shape, appraiser_hidden_sizes, appraiser_latent_dim)
        self.appraiser = appraiser
        #: "clip": frozen pretrained CLIP whose LoRA adapter is φ; otherwise a reconstruction Appraiser (all of φ).
        self.appraiser_kind = "clip" if isinstance(appraiser, CLIPAppraiser) else "autoencoder"
        if self.appraiser_kind == "clip" and appraiser.num_prompts != self.num_classes:
            raise ValueError(f"The CLIP appraiser has {appraiser.num_prompts} class prompts, expected one per Creator "
                             f"class ({self.num_classes}).")
        if recognition_weight > 0 and recognizer is None and self.appraiser_kind != "clip":
            raise ValueError(f"`recognition_weight`={recognition_weight} needs a `recognizer` (a frozen classifier of the "
                             "Creator's images); only a CLIP Appraiser brings its own.")
        self.recognizer = recognizer
        if recognizer is not None:
            recognizer.requires_grad_(False)
        classes = list(range(self.num_classes)) if concept_classes is None else [int(c) for c in concept_classes]
        if not classes or any(not 0 <= c < self.num_classes for c in classes):
            raise ValueError(f"`concept_classes`={concept_classes}, expected a non-empty list in [0, {self.num_classes}).")
        self.register_buffer("concept_classes", torch.tensor(classes, dtype=torch.long))
        self.concepts = nn.Parameter(torch.zeros(len(classes), table.embedding_dim))
        self.register_buffer("anchors", torch.zeros(len(classes), table.embedding_dim))
        self.register_buffer("initialised", torch.tensor(False))
        gen = torch.Generator().manual_seed(noise_seed)
        # One fixed noise set per role, shared by all concepts (the "fixed seeds" of the sampler).
        self.register_buffer("train_noise", torch.randn((num_train_seeds, *image_shape), generator=gen))
        self.register_buffer("heldout_noise", torch.randn((num_heldout_seeds, *image_shape), generator=gen))
        self.register_buffer("eval_noise", torch.randn((num_eval_seeds, *image_shape), generator=gen))
        self.objective = objective
        self._last_eval: Tensor | None = None
        if warmup_steps == 0 and creator_checkpoint is None:
            rank_zero_warn("CAMELModule: warmup_steps=0 and no creator_checkpoint: the Creator and Appraiser start "
                           "untrained unless you passed trained ones.")

    # -- Creator ---------------------------------------------------------------------
    def generate(self, embeddings: Tensor, noise: Tensor) -> Tensor:
        """Deterministic DDIM samples ``(M, n, C, H, W)`` for ``embeddings`` ``(M, D)`` and ``noise`` ``(n, C, H, W)``.

        Differentiable in ``embeddings``: each one is appended to the Creator's class
        embedding table and selected by its new label (``torch.func.functional_call``, no
        change to the Creator itself).
        """
        from diffusers import DDIMScheduler

        table = self._class_table()
        if embeddings.dim() != 2 or embeddings.shape[1] != table.shape[1]:
            raise ValueError(f"`embeddings` has shape {tuple(embeddings.shape)}, expected (M, {table.shape[1]}).")
        m, n = embeddings.shape[0], noise.shape[0]
        scheduler = DDIMScheduler.from_config(self.creator.noise_scheduler.config)
        scheduler.set_timesteps(self.hparams.num_inference_steps)
        extended = torch.cat([table.detach(), embeddings.to(table.dtype)])
        labels = (table.shape[0] + torch.arange(m, device=noise.device)).repeat_interleave(n)

        def denoise(x: Tensor, t: int) -> Tensor:
            steps = torch.full((x.shape[0],), t, device=x.device, dtype=torch.long)
            out = functional_call(self.creator.model, {f"{self.class_table_name}.weight": extended}, (x, steps),
                                  {"class_labels": labels})
            return out.sample if hasattr(out, "sample") else out

        x0 = ddim_sample(denoise, noise.repeat(m, 1, 1, 1), scheduler.timesteps.tolist(),
                         scheduler.alphas_cumprod, float(scheduler.final_alpha_cumprod),
                         self.creator.prediction_type)
        return x0.view(m, n, *noise.shape[1:])

    def class_embeddings(self, classes: Tensor) -> Tensor:
        """The Creator's own conditioning embeddings e_c ``(M, D)`` (the vanilla prompts)."""
        return self._class_table()[classes]

    def _class_table(self) -> Tensor:
        return self.creator.model.get_submodule(self.class_table_name).weight

    # -- Appraiser -------------------------------------------------------------------
    def objective_terms(self, concepts: Tensor, train_noise: Tensor, heldout_noise: Tensor,
                        first_order: bool | None = None, classes: Tensor | None = None) -> dict[str, Tensor]:
        """Per-concept ``reward``, ``l0``, ``lk``, ``recognition`` (mean hinge, 0 without a recogniser)
        ``(M,)`` plus the samples ``x_heldout`` ``(M, n, C, H, W)``.

        ``classes`` ``(M,)``: each concept's prompt class, the CLIP Appraiser's and the recogniser's
        target (default ``concept_classes``; unused by reconstruction Appraisers).
        """
        first_order = self.hparams.first_order if first_order is None else first_order
        samples = self.generate(concepts, torch.cat([train_noise, heldout_noise]))
        n_train = train_noise.shape[0]
        x_heldout = samples[:, n_train:]
        classes = self.concept_classes if classes is None else classes
        if classes.shape[0] != concepts.shape[0]:
            raise ValueError(f"`classes` has {classes.shape[0]} entries for {concepts.shape[0]} concepts.")
        if self.appraiser_kind == "clip":
            # The image tower is frozen: embed every sample once (differentiable in the samples) and adapt
            # only the text-projection adapter on the embeddings, instead of re-running the tower K times.
            inputs = self.appraiser.embed_images(samples.flatten(0, 1)).view(*samples.shape[:2], -1)
            phi0 = {k: v.detach() for k, v in self.appraiser.adapter_params().items()}
            make_loss = alignment_loss if self.hparams.clip_loss == "alignment" else classification_loss
            loss_fns = [make_loss(int(c)) for c in classes]
        else:
            inputs = samples
            phi0 = {k: v.detach() for k, v in self.appraiser.named_parameters()}
            loss_fns = [reconstruction_loss] * concepts.shape[0]
        terms = [camel_reward(self.appraiser, phi0, inputs[i, :n_train], inputs[i, n_train:], self.hparams.inner_steps,
                              self.hparams.inner_lr, first_order, loss_fns[i]) for i in range(concepts.shape[0])]
        out = {k: torch.stack([t[k] for t in terms]) for k in ("reward", "l0", "lk")}
        out["recognition"] = self._recognition(samples, inputs, classes)
        out["x_heldout"] = x_heldout
        return out

    def _recognition(self, samples: Tensor, inputs: Tensor, classes: Tensor) -> Tensor:
        """Mean recognition hinge per concept ``(M,)`` over all its samples (zeros when off)."""
        m, n = samples.shape[:2]
        if self.hparams.recognition_weight == 0:
            return samples.new_zeros(m)
        if self.recognizer is not None:
            logits = self.recognizer(samples.flatten(0, 1))
        else:  # CLIP's own zero-shot logits at φ₀ on the embedded samples
            logits = self.appraiser(inputs.flatten(0, 1))
        hinge = recognition_hinge(logits, classes.repeat_interleave(n), self.hparams.recognition_margin)
        return hinge.view(m, n).mean(1)

    def outer_loss(self, terms: dict[str, Tensor]) -> Tensor:
        """The Creator's loss for ``objective``: −R (camel), −L₀ (novelty) or +L₀ (familiarity), plus
        ``recognition_weight ×`` the recognition hinge (the same for every objective)."""
        if self.objective == "camel":
            loss = -terms["reward"].mean()
        else:
            loss = -terms["l0"].mean() if self.objective == "novelty" else terms["l0"].mean()
        if self.hparams.recognition_weight > 0:
            loss = loss + self.hparams.recognition_weight * terms["recognition"].mean()
        return loss

    # -- concepts --------------------------------------------------------------------
    def start_concepts(self) -> None:
        """Freeze Creator and Appraiser and initialise each concept at its class embedding (once)."""
        self.creator.requires_grad_(False)
        self.appraiser.requires_grad_(False)
        if self.recognizer is not None:
            self.recognizer.requires_grad_(False)
        if bool(self.initialised):
            return
        with torch.no_grad():
            anchors = self.class_embeddings(self.concept_classes).detach()
            self.anchors.copy_(anchors)
            self.concepts.copy_(anchors)
            self.initialised.fill_(True)

    @torch.no_grad()
    def project_concepts(self) -> None:
        """Pull every concept back into ‖z − e_c‖ ≤ max_shift·‖e_c‖."""
        if self.hparams.max_shift is None or not bool(self.initialised):
            return
        delta = self.concepts - self.anchors
        radius = self.hparams.max_shift * self.anchors.norm(dim=1, keepdim=True)
        scale = (radius / delta.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
        self.concepts.copy_(self.anchors + delta * scale)

    # -- Lightning -------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        # A CLIP Appraiser is pretrained and frozen (its adapter is only ever adapted functionally).
        skip = ("concepts", "recognizer.") if self.appraiser_kind == "autoencoder" else ("concepts", "appraiser.",
                                                                                      "recognizer.")
        others = [p for n, p in self.named_parameters() if not n.startswith(skip)]
        groups = [{"params": [self.concepts], "lr": self.hparams.concept_lr, "weight_decay": 0.0}]
        # The Creator/Appraiser group exists iff there is a warm-up, so resumed runs see the same groups.
        if others and self.hparams.warmup_steps > 0:
            groups.insert(0, {"params": others})
        optimizer = self.optimizer_factory(groups)
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.lr_scheduler_factory(optimizer),
                                                         "interval": self.lr_scheduler_interval}}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        if self.global_step < self.hparams.warmup_steps and not bool(self.initialised):
            creator_loss = self.creator.step(batch)["loss"]
            if self.appraiser_kind == "autoencoder":
                appraiser_loss = F.mse_loss(self.appraiser(batch["x"]), batch["x"])
            else:  # pretrained CLIP: only the Creator warms up
                appraiser_loss = creator_loss.new_zeros(())
            loss = apply_loss_hooks(self, batch, {"category": batch.get("category")}, creator_loss + appraiser_loss)
            self.log_split("train", {"loss": loss, "creator_loss": creator_loss, "appraiser_loss": appraiser_loss},
                           batch_size=batch["x"].shape[0])
            return loss
        self.start_concepts()
        terms = self.objective_terms(self.concepts, self.train_noise, self.heldout_noise)
        loss = apply_loss_hooks(self, batch, {"category": batch.get("category")}, self.outer_loss(terms))
        self.log_split("train", {"loss": loss}, batch_size=batch["x"].shape[0])
        for name in ("reward", "l0", "lk"):
            log_method(self, "camel", name, terms[name].mean())
        shift = (self.concepts - self.anchors).norm(dim=1) / self.anchors.norm(dim=1).clamp_min(1e-12)
        log_method(self, "camel", "shift", shift.mean())
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.project_concepts()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if batch_idx != 0 or not bool(self.initialised):
            return
        half = self.eval_noise.shape[0] // 2 or 1
        with torch.no_grad():
            terms = self.objective_terms(self.concepts, self.eval_noise[:half], self.eval_noise[half:] if
                                         self.eval_noise.shape[0] > 1 else self.eval_noise, first_order=True)
        self.log_split("val", {k: terms[k].mean() for k in ("reward", "l0", "lk")})
        self._last_eval = terms["x_heldout"].detach().cpu()

    def on_validation_epoch_end(self) -> None:
        if self._last_eval is not None and not self.trainer.sanity_checking:
            self.log_concept_grid(self._last_eval)
        self._last_eval = None

    def on_train_end(self) -> None:
        directory = self._output_dir()
        if directory is not None and bool(self.initialised) and self.trainer.is_global_zero:
            torch.save({"concepts": self.concepts.detach().cpu(), "classes": self.concept_classes.cpu()},
                       directory / "camel_concepts.pt")

    def log_concept_grid(self, samples: Tensor, key: str = "method/camel/concepts") -> None:
        """Log ``samples`` ``(M, n, C, H, W)`` as one labelled image grid (a row per concept, titled
        with the concept's anchor class) to every logger (core/figures.py: W&B ``log_image``,
        TensorBoard ``add_image``, else a PNG under the log dir's ``images/``)."""
        from lit_lowrank.core.figures import has_real_logger, image_grid, log_figure

        if not self.trainer.is_global_zero or not has_real_logger(self.trainer):
            return
        m, n = samples.shape[:2]
        classes = getattr(self, "concept_classes", None)
        titles = [f"concept {i}" + (f" (class {int(classes[i])})" if classes is not None and i < len(classes) else "")
                  if j == 0 else "" for i in range(m) for j in range(n)]
        fig = image_grid(samples.flatten(0, 1), titles, ncols=n,
                         title=f"CAMEL concepts (rows) from held-out noise, step {self.global_step}")
        log_figure(self.trainer, key, fig)

    def _output_dir(self) -> Path | None:
        log_dir = getattr(self.logger, "log_dir", None) if self.logger is not None else None
        if log_dir is None:
            return None
        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
