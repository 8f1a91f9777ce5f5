"""Few-shot vision–language classification with a CLIP-style dual encoder, LoRA and a cache classifier.

:class:`FewShotCLIPModule` is CLIP-LoRA (LoRA on q/k/v of both towers, cross-entropy of the
class-prompt logits on the N-shot support set). At evaluation it adds a Tip-Adapter cache built
from the support set with the adapted towers; :meth:`FewShotCLIPModule.export_inference_model`
returns that deployed classifier (one image-tower forward, LoRA merged, text weights and cache
precomputed). SD-LoRA is this module plus the :class:`~lit_lowrank.adapters.SDLoRA` callback,
whose graph teacher lives in the callback — so the module, its checkpoints' ``state_dict`` and
the exported classifier never contain it.

Baselines with the same module: ``lora=False, cache=False`` is zero-shot CLIP; ``lora=False,
cache=True`` is Tip-Adapter (``fit_tip_adapter_f`` on the export gives Tip-Adapter-F);
``lora=True, cache=False`` without the callback is CLIP-LoRA.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.models.dual_encoder import (
    QKV_TARGETS,
    DualEncoder,
    ImageTower,
    adapters_disabled,
    build_dual_encoder,
    crop_embeddings,
    frozen_graph_inputs,
)
from lit_lowrank.ops.sd_lora import search_tip_hparams, tip_adapter_logits
from lit_lowrank.tasks.base import TaskModule

#: Tip-Adapter's default (α, β) when no val split is given to search them; α relative to the zero-shot spread.
DEFAULT_CACHE_ALPHA, DEFAULT_CACHE_BETA = 1.0, 5.5


class FewShotCLIPClassifier(nn.Module):
    """The deployed few-shot classifier: one image-tower forward, then zero-shot + cache logits.

    ``logits = s·f Wcᵀ + α·exp(−β(1 − f Kᵀ)) V`` (no cache: the first term only). Holds only
    the image tower (LoRA merged), the class-text weights and the cache — no text tower, no teacher.

    .. code-block:: python

        clf = module.export_inference_model()
        probs = clf(images).softmax(-1)
    """

    def __init__(self, image: ImageTower, text_weights: Tensor, logit_scale: float,
                 cache_keys: Tensor | None = None, cache_values: Tensor | None = None, alpha: float = 0.0,
                 beta: float = DEFAULT_CACHE_BETA) -> None:
        super().__init__()
        self.image = image
        self.register_buffer("text_weights", text_weights.detach().clone())
        self.use_cache = cache_keys is not None
        if self.use_cache:
            self.register_buffer("cache_keys", cache_keys.detach().clone())
            self.register_buffer("cache_values", cache_values.detach().clone())
        self.logit_scale, self.alpha, self.beta = float(logit_scale), float(alpha), float(beta)

    def features(self, pixels: Tensor) -> Tensor:
        """L2-normalised image embeddings ``(B, D)``."""
        return self.image(pixels)[0]

    def logits_from_features(self, f: Tensor) -> Tensor:
        if not self.use_cache:
            return self.logit_scale * f @ self.text_weights.T
        return tip_adapter_logits(f, self.text_weights, self.cache_keys, self.cache_values, self.alpha, self.beta,
                                  self.logit_scale)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.logits_from_features(self.features(pixels))


class FewShotCLIPModule(TaskModule):
    """CLIP-LoRA few-shot adaptation of a dual encoder, evaluated with a Tip-Adapter cache.

    Batches: ``{"x": images in [0, 1], "y": class index}`` (the few-shot datamodules).
    ``training_step`` passes the cross-entropy through :func:`~lit_lowrank.core.apply_loss_hooks`
    with ``outputs`` ``logits``, ``features (B, D)``, ``patch_features (B, P, D)`` and
    ``text_features (C, D)``.

    Args:
        encoder: ``"tiny_digit_clip"`` (the embedded CLIP-like default) or a local transformers CLIP folder.
        encoder_kwargs: options of :func:`~lit_lowrank.models.dual_encoder.tiny_digit_clip`.
        class_names: one name per class; ``None`` takes the datamodule's ``class_names`` at setup
            (then saved in the hyper-parameters, so checkpoints reload without the datamodule).
        template: prompt template; ``None`` takes the datamodule's ``template`` (else ``"a photo of a {}."``).
        lora: inject LoRA (``False``: the frozen model, for the zero-shot / Tip-Adapter baselines).
        lora_rank / lora_alpha / lora_dropout / lora_targets: the LoRA layers (CLIP-LoRA's r=2, α=1,
            dropout 0.25 on q/k/v of both towers by default).
        lora_method: the adapter of :func:`~lit_lowrank.adapters.inject_adapters` (``"lora"``, ``"dora"``, a
            registered variant such as ``"sds_lora"``).
        cache: evaluate (val/test) and export with the Tip-Adapter cache of the support set.
        cache_alpha / cache_beta: the cache's (α relative to the zero-shot logit spread, β); ``None``
            searches them on the val split at test time / export (Tip-Adapter's protocol).
        optimizer / lr_scheduler / lr_scheduler_interval: as every task module.

    .. code-block:: python

        module = FewShotCLIPModule()                                 # CLIP-LoRA on the embedded digits
        L.Trainer(max_steps=200, callbacks=[SDLoRA()]).fit(module, datamodule=FewShotDigitsDataModule(shots=4))
        classifier = module.export_inference_model(datamodule)       # no teacher inside
    """

    def __init__(
        self,
        encoder: str | DualEncoder = "tiny_digit_clip",
        encoder_kwargs: dict[str, Any] | None = None,
        class_names: list[str] | None = None,
        template: str | None = None,
        lora: bool = True,
        lora_rank: int = 2,
        lora_alpha: float = 1.0,
        lora_dropout: float = 0.25,
        lora_targets: str | list[str] = QKV_TARGETS,
        lora_method: str = "lora",
        cache: bool = True,
        cache_alpha: float | None = None,
        cache_beta: float | None = None,
        label_smoothing: float = 0.0,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "epoch",
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        ignore = ["optimizer", "lr_scheduler"] + ([] if isinstance(encoder, str) else ["encoder"])
        # an unset template is the datamodule's: logging it as None beside the datamodule's string would make
        # Lightning refuse to merge the two hyperparameter sets as soon as a logger is attached
        ignore += ["template"] if template is None else []
        self.save_hyperparameters(ignore=ignore)
        if template is not None and "{}" not in template:
            raise ValueError(f"`template`={template!r}: expected a '{{}}' placeholder for the class name.")
        if class_names is not None and len(class_names) < 2:
            raise ValueError(f"`class_names`={class_names}: expected >= 2 names.")
        if lora and lora_rank < 1:
            raise ValueError(f"`lora_rank`={lora_rank}, expected >= 1.")
        self.encoder = build_dual_encoder(encoder, **(encoder_kwargs or {})) if isinstance(encoder, str) else encoder
        self.encoder.requires_grad_(False)
        if lora:
            inject_lora(self.encoder, lora_rank, lora_alpha, lora_dropout, lora_targets, lora_method)
        self.class_names, self.template = class_names, template
        self.cache, self.cache_alpha, self.cache_beta = cache, cache_alpha, cache_beta
        self.label_smoothing = label_smoothing
        self._cache_state: dict[str, Any] | None = None
        self._tokens: dict[str, Tensor] | None = None
        self._frozen_text: Tensor | None = None
        self._fixed_text: Tensor | None = None
        if class_names is not None:
            self._set_prompts(class_names, template)

    # ------------------------------------------------------------------ prompts
    @property
    def embed_dim(self) -> int:
        """Width of the joint embedding space (read by SDLoRA to size its teacher)."""
        return self.encoder.embed_dim

    @property
    def num_classes(self) -> int:
        return len(self.class_names or ())

    def _set_prompts(self, class_names: list[str], template: str | None) -> None:
        template = template or "a photo of a {}."
        self.class_names, self.template = list(class_names), template
        self._frozen_text = self._fixed_text = None
        self._tokens = self.encoder.tokenize([template.format(n.replace("_", " ")) for n in class_names])
        metric = lambda: torchmetrics.Accuracy(task="multiclass", num_classes=len(class_names))  # noqa: E731
        self.train_acc, self.val_acc, self.test_acc = metric(), metric(), metric()
        self.val_ece = torchmetrics.CalibrationError(task="multiclass", num_classes=len(class_names), n_bins=15,
                                                     norm="l1")
        self.test_ece = self.val_ece.clone()

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if self.class_names is None:
            names = getattr(dm, "class_names", None)
            if dm is not None and not names and hasattr(dm, "setup"):
                dm.setup(stage)
                names = getattr(dm, "class_names", None)
            if not names:
                raise ValueError("FewShotCLIPModule: `class_names` is None and the datamodule has no `class_names`; "
                                 "pass class_names=[...] or use a few-shot datamodule.")
            self._set_prompts(list(names), self.template or getattr(dm, "template", None))
            self.hparams["class_names"], self.hparams["template"] = self.class_names, self.template
        self.train_acc.to(self.device), self.val_acc.to(self.device), self.test_acc.to(self.device)
        self.val_ece.to(self.device), self.test_ece.to(self.device)

    def prompt_tokens(self) -> dict[str, Tensor]:
        if self._tokens is None:
            raise RuntimeError("FewShotCLIPModule has no class prompts yet: pass `class_names` or fit with a few-shot "
                               "datamodule first.")
        return {k: v.to(self.device) for k, v in self._tokens.items()}

    # ------------------------------------------------------------------ forward passes
    def text_features(self) -> Tensor:
        """Class-text embeddings ``(C, D)`` through the (adapted) text tower.

        What does not train is not recomputed: with a frozen text transformer its pooled prompt
        states are computed once (only the projection runs per step, e.g. LoRA on ``text_projection``);
        with nothing trainable on the text side (zero-shot, Tip-Adapter) the embeddings are cached whole.
        """
        def trains(prefix: str) -> bool:
            return any(p.requires_grad for n, p in self.encoder.named_parameters() if n.startswith(prefix))

        if trains("text_model."):
            return self.encoder.encode_text(**self.prompt_tokens())
        if self._fixed_text is None or self._fixed_text.device != self.device:
            with torch.no_grad():  # pooled states of the frozen text transformer
                self._fixed_text = self.encoder.pool_text(**self.prompt_tokens())
        if trains("text_projection."):
            return F.normalize(self.encoder.text_projection(self._fixed_text), dim=-1)
        with torch.no_grad():
            return F.normalize(self.encoder.text_projection(self._fixed_text), dim=-1)

    def frozen_graph_inputs(self, x: Tensor, crops: int = 4, frozen: bool = True) -> dict[str, Tensor]:
        """The SD-LoRA teacher's inputs: patch/global/crop/text embeddings of the frozen towers (no grad).

        ``frozen=False`` reads the current adapted towers instead (detached). The frozen class-text
        embeddings are computed once and reused (the prompts and the frozen text tower never change).
        """
        if not frozen:
            with torch.no_grad():
                text = self.text_features()
            return frozen_graph_inputs(self.encoder, x, crops=crops, frozen=False, text=text)
        if self._frozen_text is None or self._frozen_text.device != x.device:
            with torch.no_grad(), adapters_disabled(self.encoder):
                self._frozen_text = self.encoder.encode_text(**self.prompt_tokens())
        return frozen_graph_inputs(self.encoder, x, crops=crops, text=self._frozen_text)

    def crop_embeddings(self, x: Tensor, crops: int = 4, frozen: bool = True) -> Tensor:
        """``(B, K, D)`` embeddings of each image's crops, no gradient (SD-LoRA's local nodes; ``frozen`` bypasses
        LoRA)."""
        return crop_embeddings(self.encoder, x, crops, frozen)

    def step(self, batch: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(batch, dict) or "x" not in batch or "y" not in batch:
            raise ValueError("FewShotCLIPModule expects dict batches with keys 'x' (images in [0, 1]) and 'y'; got "
                             f"{type(batch).__name__}" + (f" with keys {sorted(batch)}" if isinstance(batch, dict)
                                                           else ""))
        glob, patches = self.encoder.encode_image(batch["x"])
        text = self.text_features()
        logits = self.encoder.logit_scale.exp() * glob @ text.T
        loss = F.cross_entropy(logits, batch["y"], label_smoothing=self.label_smoothing)
        return {"loss": loss, "logits": logits, "features": glob, "patch_features": patches, "text_features": text}

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, C)``: with the cache once :meth:`fit_cache` ran (and ``cache=True``), else zero-shot-style."""
        glob, _ = self.encoder.encode_image(x)
        state = self._cache_state
        if state is None:
            return self.encoder.logit_scale.exp() * glob @ self.text_features().T
        return tip_adapter_logits(glob, state["text"], state["keys"], state["values"], state["alpha"], state["beta"],
                                  state["scale"])

    # ------------------------------------------------------------------ the cache
    @torch.no_grad()
    def encode_loader(self, loader: DataLoader) -> tuple[Tensor, Tensor]:
        """Image embeddings and labels of every batch of ``loader`` (eval mode, no grad)."""
        was_training = self.training
        self.eval()
        feats, labels = [], []
        for batch in loader:
            feats.append(self.encoder.encode_image(batch["x"].to(self.device))[0])
            labels.append(batch["y"].to(self.device))
        self.train(was_training)
        return torch.cat(feats), torch.cat(labels)

    @torch.no_grad()
    def fit_cache(self, support: DataLoader, val: DataLoader | None = None) -> dict[str, Any]:
        """Build the Tip-Adapter cache from ``support`` with the current towers; search (α, β) on ``val``.

        Returns the cache state (``keys``, ``values``, ``text``, ``alpha``, ``beta``, ``scale``). ``α``/``β``
        come from ``cache_alpha``/``cache_beta`` when set, else the search on ``val``, else Tip-Adapter's defaults.
        """
        was_training = self.training
        self.eval()
        keys, labels = self.encode_loader(support)
        text = self.text_features()
        scale = float(self.encoder.logit_scale.exp())
        values = F.one_hot(labels, self.num_classes).to(keys.dtype)
        spread = float((scale * keys @ text.T).std().clamp(min=1e-6))
        alpha = None if self.cache_alpha is None else self.cache_alpha * spread
        beta = self.cache_beta
        if (alpha is None or beta is None) and val is not None:
            f_val, y_val = self.encode_loader(val)
            alpha_s, beta_s, _ = search_tip_hparams(f_val, y_val, text, keys, values, scale)
            alpha, beta = alpha if alpha is not None else alpha_s, beta if beta is not None else beta_s
        alpha = DEFAULT_CACHE_ALPHA * spread if alpha is None else alpha
        beta = DEFAULT_CACHE_BETA if beta is None else beta
        self._cache_state = {"keys": keys, "values": values, "text": text, "alpha": alpha, "beta": beta,
                             "scale": scale}
        self.train(was_training)
        return self._cache_state

    def clear_cache(self) -> None:
        """Drop the cache (training changes the towers; the cache is rebuilt at the next evaluation)."""
        self._cache_state = None

    def export_inference_model(self, datamodule: Any | None = None, use_cache: bool | None = None
                               ) -> FewShotCLIPClassifier:
        """The deployed classifier: LoRA merged into a copy of the image tower, text weights and cache precomputed.

        Args:
            datamodule: supplies ``support_dataloader()`` (and ``val_dataloader()`` for the α/β search) when the
                cache has not been fitted yet.
            use_cache: default ``cache`` of the constructor.
        """
        use_cache = self.cache if use_cache is None else use_cache
        if use_cache and self._cache_state is None:
            if datamodule is None or not hasattr(datamodule, "support_dataloader"):
                raise ValueError("export_inference_model: the cache is not fitted; pass the few-shot `datamodule` "
                                 "(with support_dataloader()) or call fit_cache first.")
            self.fit_cache(datamodule.support_dataloader(), datamodule.val_dataloader())
        with torch.no_grad():
            text = self.text_features() if self._cache_state is None else self._cache_state["text"]
        from lit_lowrank.adapters.injector import merge_adapters

        image = merge_adapters(copy.deepcopy(self.encoder.image)).eval().requires_grad_(False)
        scale = float(self.encoder.logit_scale.exp())
        if not use_cache:
            return FewShotCLIPClassifier(image, text, scale)
        s = self._cache_state
        return FewShotCLIPClassifier(image, s["text"], s["scale"], s["keys"], s["values"], s["alpha"], s["beta"])

    # ------------------------------------------------------------------ Lightning steps
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        self._cache_state = None
        outputs = self.step(batch)
        loss = apply_loss_hooks(self, batch, outputs, outputs["loss"])
        self.train_acc(outputs["logits"].detach(), batch["y"])
        self.log_split("train", {"loss": loss, "acc": self.train_acc}, batch_size=batch["y"].numel())
        return loss

    def _prepare_cache(self, with_search: bool) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if self.cache and dm is not None and hasattr(dm, "support_dataloader"):
            self.fit_cache(dm.support_dataloader(), dm.val_dataloader() if with_search else None)

    def on_validation_epoch_start(self) -> None:
        self._prepare_cache(with_search=False)

    def on_test_epoch_start(self) -> None:
        self._prepare_cache(with_search=True)

    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        logits = self(batch["x"])
        acc, ece = (self.val_acc, self.val_ece) if split == "val" else (self.test_acc, self.test_ece)
        acc(logits, batch["y"])
        ece(logits.softmax(-1), batch["y"])
        self.log_split(split, {"loss": F.cross_entropy(logits, batch["y"]), "acc": acc, "ece": ece},
                       batch_size=batch["y"].numel())
        if split == "val":
            self.update_confusion(logits.detach(), batch["y"])

    def on_validation_epoch_end(self) -> None:
        self.log_confusion()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self(batch["x"]).softmax(-1)


def inject_lora(model: nn.Module, rank: int, alpha: float, dropout: float, targets: str | list[str],
                method: str = "lora") -> nn.Module:
    """LoRA-family adapters (:func:`~lit_lowrank.adapters.inject_adapters`) on ``targets`` of ``model``, in place.

    Only the adapter weights train afterwards; idempotent (a second call changes nothing).
    """
    from lit_lowrank.adapters.injector import inject_adapters

    return inject_adapters(model, method=method, target_modules=targets, rank=rank, alpha=alpha, dropout=dropout)
