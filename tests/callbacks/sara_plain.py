"""A plain user diffusion LightningModule (not ours) for SARA's contract case: an MLP denoiser on the
8x8 digits, trained on ε, sampled with diffusers' DDIM; it has ``sample`` and ``sample_shape`` but no
step hooks, so SARA reads the step from the timestep argument."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class TinyDenoiser(nn.Module):
    def __init__(self, hidden: int = 48) -> None:
        super().__init__()
        self.inp = nn.Linear(65, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 64)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        h = torch.cat([x.flatten(1), (t.float() / 1000).reshape(-1, 1).expand(x.shape[0], 1)], 1)
        return self.out(F.silu(self.mid(F.silu(self.inp(h))))).reshape_as(x)


class TinyConditionalDenoiser(nn.Module):
    """``model(x, t, class_labels=...)`` with two numbered blocks, for a fast ``DiffusionModule(model=...)``."""

    sample_shape = (1, 8, 8)

    def __init__(self, hidden: int = 48, num_classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_classes, hidden)
        self.inp = nn.Linear(65, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden)) for _ in range(2))
        self.out = nn.Linear(hidden, 64)

    def forward(self, x: Tensor, t: Tensor, class_labels: Tensor | None = None) -> Tensor:
        h = torch.cat([x.flatten(1), (t.float() / 1000).reshape(-1, 1).expand(x.shape[0], 1)], 1)
        h = self.inp(h) + (0 if class_labels is None else self.embed(class_labels))
        for block in self.blocks:
            h = h + block(h)
        return self.out(F.silu(h)).reshape_as(x)


class PlainUserDiffusion(pl.LightningModule):
    sample_shape = (1, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        from diffusers import DDPMScheduler

        self.model = TinyDenoiser()
        self.scheduler = DDPMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2")

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        x0 = batch["x"]
        noise = torch.randn_like(x0)
        t = torch.randint(0, 100, (x0.shape[0],))
        return F.mse_loss(self.model(self.scheduler.add_noise(x0, noise, t), t), noise)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch))

    @torch.no_grad()
    def sample(self, num_samples: int, class_labels: Tensor | None = None, num_inference_steps: int = 10,
               noise: Tensor | None = None) -> Tensor:
        from diffusers import DDIMScheduler

        scheduler = DDIMScheduler.from_config(self.scheduler.config)
        scheduler.set_timesteps(num_inference_steps)
        x = torch.randn(num_samples, *self.sample_shape) if noise is None else noise
        for t in scheduler.timesteps:
            x = scheduler.step(self.model(x, t.expand(num_samples)), t, x).prev_sample
        return x

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
