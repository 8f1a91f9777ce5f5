"""DiffusionModule: a diffusers UNet trained as a DDPM, sampled with DDPM or DDIM."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from lit_lowrank.core.loss_hooks import apply_loss_hooks
from lit_lowrank.tasks.base import TaskModule

#: A small UNet for the embedded 8x8 digits (~0.3M parameters).
TINY_UNET: dict[str, Any] = {
    "sample_size": 8, "in_channels": 1, "out_channels": 1, "layers_per_block": 1,
    "block_out_channels": (32, 64), "down_block_types": ("DownBlock2D", "AttnDownBlock2D"),
    "up_block_types": ("AttnUpBlock2D", "UpBlock2D"), "norm_num_groups": 8,
}

#: ``hook(module, step_index, timestep, sample)`` called before each denoiser call.
StepHook = Callable[["DiffusionModule", int, int, Tensor], None]


class DiffusionModule(TaskModule):
    """Denoising diffusion with a ``diffusers.UNet2DModel`` and diffusers schedulers.

    Training minimises the MSE of the ``prediction_type`` target (``"epsilon"``,
    ``"v_prediction"`` or ``"sample"``) at uniformly drawn timesteps. Sampling
    (:meth:`sample`) runs DDPM or DDIM and calls every registered step hook before
    each denoiser forward with the current step index and timestep; the same
    values are readable as ``module.current_step_index`` / ``module.current_timestep``
    (e.g. from a forward pre-hook on a Linear).

    Args:
        unet_config: ``UNet2DModel`` keyword arguments (default :data:`TINY_UNET`).
        model: a denoiser ``nn.Module`` called as ``model(x, t, class_labels)`` that
            returns a tensor or an object with ``.sample``; overrides ``unet_config``.
        num_classes: class-conditional when set (``num_class_embeds`` of the UNet).
        num_train_timesteps: diffusion steps of the training scheduler.
        beta_schedule: ``"linear"``, ``"scaled_linear"`` or ``"squaredcos_cap_v2"``.
        prediction_type: ``"epsilon"``, ``"v_prediction"`` or ``"sample"``.

    .. code-block:: python

        model = DiffusionModule(num_classes=10)
        L.Trainer(max_epochs=5).fit(model, datamodule=DigitsDataModule())
        images = model.sample(16, class_labels=torch.arange(16) % 10, num_inference_steps=25)
    """

    def __init__(
        self,
        unet_config: dict[str, Any] | None = None,
        model: nn.Module | None = None,
        num_classes: int | None = None,
        num_train_timesteps: int = 1000,
        beta_schedule: str = "squaredcos_cap_v2",
        prediction_type: Literal["epsilon", "v_prediction", "sample"] = "epsilon",
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr_scheduler_interval: str = "epoch",
        figure_every_n_epochs: int = 1,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, lr_scheduler_interval)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler", "model"])
        self.figure_every_n_epochs = figure_every_n_epochs  # the validation sample grid (0: never)
        from diffusers import DDPMScheduler, UNet2DModel

        if prediction_type not in ("epsilon", "v_prediction", "sample"):
            raise ValueError(f"`prediction_type`={prediction_type!r}, expected 'epsilon', 'v_prediction' or 'sample'.")
        if model is None:
            config = dict(TINY_UNET if unet_config is None else unet_config)
            if num_classes is not None:
                config["num_class_embeds"] = num_classes
            model = UNet2DModel(**config)
        self.model = model
        self.num_classes = num_classes
        self.noise_scheduler = DDPMScheduler(
            num_train_timesteps=num_train_timesteps, beta_schedule=beta_schedule,
            prediction_type=prediction_type, clip_sample=False,
        )
        self.prediction_type = prediction_type
        self._step_hooks: OrderedDict[int, StepHook] = OrderedDict()
        self.current_step_index: int | None = None
        self.current_timestep: int | None = None

    # -- denoiser -------------------------------------------------------------------
    def forward(self, x: Tensor, timesteps: Tensor, class_labels: Tensor | None = None) -> Tensor:
        """The denoiser output ``(B, C, H, W)`` for noisy ``x`` at ``timesteps``."""
        if self.num_classes is not None and class_labels is None:
            raise ValueError("This DiffusionModule is class-conditional (`num_classes` set): pass `class_labels`.")
        out = self.model(x, timesteps, class_labels=class_labels)
        return out.sample if hasattr(out, "sample") else out

    def _target(self, x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
        if self.prediction_type == "epsilon":
            return noise
        if self.prediction_type == "v_prediction":
            return self.noise_scheduler.get_velocity(x0, noise, t)
        return x0

    def step(self, batch: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """Noise a clean batch at random timesteps; returns the ``outputs`` dict."""
        if not isinstance(batch, dict) or "x" not in batch:
            raise ValueError("DiffusionModule expects dict batches with key 'x' (and 'y' when class-conditional).")
        x0 = batch["x"]
        if x0.dim() != 4:
            raise ValueError(f"DiffusionModule expects images (B, C, H, W); got batch['x'] of shape {tuple(x0.shape)}.")
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        t = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (x0.shape[0],),
                          generator=generator, device=x0.device)
        noisy = self.noise_scheduler.add_noise(x0, noise, t)
        labels = batch.get("y") if self.num_classes is not None else None
        prediction = self(noisy, t, labels)
        loss = F.mse_loss(prediction, self._target(x0, noise, t))
        return {"loss": loss, "prediction": prediction, "timesteps": t, "category": batch.get("category")}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        outputs = self.step(batch)
        loss = apply_loss_hooks(self, batch, outputs, outputs["loss"])
        self.log_split("train", {"loss": loss}, batch_size=batch["x"].shape[0])
        return loss

    def _eval(self, split: str, batch: dict[str, Any], batch_idx: int) -> None:
        # fixed noise per batch so validation losses are comparable across epochs
        generator = torch.Generator(device=batch["x"].device).manual_seed(batch_idx)
        outputs = self.step(batch, generator=generator)
        self.log_split(split, {"loss": outputs["loss"]}, batch_size=batch["x"].shape[0])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval("val", batch, batch_idx)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval("test", batch, batch_idx)

    @torch.no_grad()
    def on_validation_epoch_end(self) -> None:
        """A grid of 16 DDIM samples (20 steps) from fixed noise, so epochs compare image to image."""
        if not self.figures_due():
            return
        from lit_lowrank.core.figures import image_grid, log_figure

        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((16, *self._sample_shape()), generator=generator).to(self.device)
        labels = torch.arange(16, device=self.device) % self.num_classes if self.num_classes else None
        images = self.sample(16, class_labels=labels, num_inference_steps=20, noise=noise)
        titles = None if labels is None else [f"class {int(c)}" for c in labels]
        log_figure(self.trainer, "val/samples", image_grid(images, titles, title=f"DDIM samples, epoch {self.current_epoch}"))

    # -- sampling -------------------------------------------------------------------
    def register_step_hook(self, hook: StepHook) -> RemovableHandle:
        """Call ``hook(module, step_index, timestep, sample)`` before every denoiser call
        of :meth:`sample`; returns a handle whose ``remove()`` detaches it."""
        handle = RemovableHandle(self._step_hooks)
        self._step_hooks[handle.id] = hook
        return handle

    @torch.no_grad()
    def sample(
        self,
        num_samples: int,
        class_labels: Tensor | None = None,
        num_inference_steps: int = 50,
        sampler: Literal["ddim", "ddpm"] = "ddim",
        eta: float = 0.0,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> Tensor:
        """Draw ``num_samples`` images ``(N, C, H, W)``.

        Args:
            class_labels: ``(N,)`` labels for a class-conditional model.
            num_inference_steps: solver steps (DDIM may use far fewer than training).
            sampler: ``"ddim"`` (deterministic for ``eta=0``) or ``"ddpm"``.
            generator / noise: fix the initial noise for reproducible samples.
        """
        from diffusers import DDIMScheduler, DDPMScheduler

        if sampler not in ("ddim", "ddpm"):
            raise ValueError(f"`sampler`={sampler!r}, expected 'ddim' or 'ddpm'.")
        cls = DDIMScheduler if sampler == "ddim" else DDPMScheduler
        scheduler = cls.from_config(self.noise_scheduler.config)
        scheduler.set_timesteps(num_inference_steps, device=self.device)
        shape = (num_samples, *self._sample_shape())
        if noise is None:
            noise = torch.randn(shape, generator=generator, device=self.device)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"`noise` has shape {tuple(noise.shape)}, expected {shape}.")
        if class_labels is not None and class_labels.shape != (num_samples,):
            raise ValueError(f"`class_labels` has shape {tuple(class_labels.shape)}, expected ({num_samples},).")
        x = noise
        kwargs = {"eta": eta} if sampler == "ddim" else {}
        for i, t in enumerate(scheduler.timesteps):
            self.current_step_index, self.current_timestep = i, int(t)
            for hook in list(self._step_hooks.values()):
                hook(self, i, int(t), x)
            t_batch = torch.full((num_samples,), int(t), device=x.device, dtype=torch.long)
            model_output = self(x, t_batch, class_labels)
            x = scheduler.step(model_output, t, x, generator=generator, **kwargs).prev_sample
        self.current_step_index = self.current_timestep = None
        return x

    def _sample_shape(self) -> tuple[int, int, int]:
        config = getattr(self.model, "config", None)
        if config is not None and hasattr(config, "sample_size"):
            size = config.sample_size
            h, w = (size, size) if isinstance(size, int) else tuple(size)
            return (config.in_channels, h, w)
        shape = getattr(self.model, "sample_shape", None)
        if shape is None:
            raise ValueError("A custom `model` must expose `sample_shape` = (C, H, W) for sampling.")
        return tuple(shape)
