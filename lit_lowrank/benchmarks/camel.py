"""CAMEL benchmark: created concepts vs class embeddings, random, novelty-only and familiarity-only.

Workload: a small class-conditional diffusers UNet (channels 16/32, no attention) trained
as an ε-prediction DDPM on the embedded 8×8 digits (pixels in [−1, 1]) inside the benchmark,
cached under ``$LIT_LOWRANK_CACHE`` or the temp dir keyed by its training config and seed; an
:class:`~lit_lowrank.models.autoencoder.MLPAutoencoder` Appraiser φ₀ (bottleneck 8) trained
on the same digits; a logistic-regression digit classifier (scikit-learn) trained on the same
digits as the off-the-shelf observer. Samples come from deterministic DDIM (5 steps quick).

Creators (one concept per prompt class, each starting at the class embedding e_c and kept in
the ball ‖z − e_c‖ ≤ ``max_shift``·‖e_c‖): ``class_embedding`` (z = e_c: vanilla sampling),
``random`` (a Gaussian z with ‖z‖ = ‖e_c‖), ``familiarity`` (min L₀), ``novelty`` (max L₀),
``camel`` (max R, second-order inner loop). Each optimised creator gets the same Adam
budget on the same training seeds.

Metrics on **fresh seeds** (never used in optimisation), mean over concepts: ``l0`` =
L(φ₀; X'), ``lk`` = L(φ_K; X') after K inner steps on other fresh seeds X, ``reward`` = l0 − lk,
``recognised`` = fraction of samples the classifier labels as the prompt class (chance 0.1),
``basin_dist`` = mean distance of a sample to its nearest vanilla sample of the same class
among ``bank`` vanilla seeds; the ``class_embedding`` row's basin_dist is the vanilla-to-vanilla
spread (its eval seeds are not in the bank).

Claims: CAMEL's L₀ is above vanilla's; its L_K is below novelty-only's; its basin distance is
above the vanilla-to-vanilla spread; the classifier recognises its class above chance.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_lowrank.benchmarks.harness import BenchmarkResult, legacy_claim
from lit_lowrank.models.autoencoder import MLPAutoencoder
from lit_lowrank.ops.camel import basin_distance
from lit_lowrank.tasks.camel import CAMELModule
from lit_lowrank.tasks.diffusion import DiffusionModule

UNET: dict[str, Any] = {"sample_size": 8, "in_channels": 1, "out_channels": 1, "layers_per_block": 1,
                        "block_out_channels": [16, 32], "down_block_types": ["DownBlock2D", "DownBlock2D"],
                        "up_block_types": ["UpBlock2D", "UpBlock2D"], "norm_num_groups": 8}
#: Trust-region radius ‖z − e_c‖ ≤ MAX_SHIFT·‖e_c‖ shared by every optimised creator.
MAX_SHIFT = 0.6


def _digits() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images / 16.0 * 2 - 1, dtype=torch.float32).unsqueeze(1)
    return x, torch.tensor(d.target, dtype=torch.long)


def _cache_dir() -> Path:
    root = Path(os.environ.get("LIT_LOWRANK_CACHE", Path(tempfile.gettempdir()) / "lit_lowrank_cache"))
    path = root / "camel"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _trained_creator(x: Tensor, y: Tensor, steps: int, seed: int) -> DiffusionModule:
    """The class-conditional DDPM Creator, trained once per (config, steps, seed) and cached."""
    config = {"unet": UNET, "steps": steps, "seed": seed, "lr": 2e-3, "batch": 128, "v": 1}
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    path = _cache_dir() / f"creator_{key}.pt"
    torch.manual_seed(seed)
    creator = DiffusionModule(unet_config=dict(UNET), num_classes=10)
    if path.is_file():
        creator.load_state_dict(torch.load(path, map_location="cpu"))
        return creator.eval()
    opt = torch.optim.AdamW(creator.parameters(), lr=config["lr"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (config["batch"],), generator=gen)
        loss = creator.step({"x": x[idx], "y": y[idx]}, generator=gen)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    torch.save(creator.state_dict(), path)
    return creator.eval()


def _trained_appraiser(x: Tensor, steps: int, seed: int) -> MLPAutoencoder:
    torch.manual_seed(seed)
    ae = MLPAutoencoder((1, 8, 8), hidden_sizes=(64,), latent_dim=8)
    opt = torch.optim.Adam(ae.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        batch = x[torch.randint(0, x.shape[0], (128,), generator=gen)]
        loss = (ae(batch) - batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ae.eval()


def _optimise(module: CAMELModule, objective: str, steps: int, lr: float) -> Tensor:
    module.objective = objective
    with torch.no_grad():
        module.concepts.copy_(module.anchors)
    opt = torch.optim.Adam([module.concepts], lr=lr)
    for _ in range(steps):
        terms = module.objective_terms(module.concepts, module.train_noise, module.heldout_noise)
        loss = module.outer_loss(terms)
        opt.zero_grad()
        loss.backward()
        opt.step()
        module.project_concepts()
    return module.concepts.detach().clone()


def run(quick: bool = True, seed: int = 0) -> BenchmarkResult:
    torch.set_num_threads(1)
    x, y = _digits()
    classes = [0, 3, 5, 8] if quick else list(range(10))
    creator_steps, outer_steps = (600, 20) if quick else (4000, 100)
    n_seeds, n_eval, n_bank = (12, 16, 48) if quick else (16, 64, 512)
    ddim_steps = 5 if quick else 10
    creator = _trained_creator(x, y, creator_steps, seed)
    appraiser = _trained_appraiser(x, 400 if quick else 2000, seed)
    from sklearn.linear_model import LogisticRegression

    classifier = LogisticRegression(max_iter=2000).fit(x.flatten(1).numpy(), y.numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = CAMELModule(creator=creator, appraiser=appraiser, concept_classes=classes, inner_steps=3,
                             inner_lr=0.5, num_train_seeds=n_seeds, num_heldout_seeds=n_seeds,
                             num_eval_seeds=2 * n_eval, num_inference_steps=ddim_steps, max_shift=MAX_SHIFT,
                             noise_seed=seed)
    module.start_concepts()
    anchors = module.anchors.clone()
    gen = torch.Generator().manual_seed(seed + 7)
    random_z = torch.randn(anchors.shape, generator=gen)
    random_z = random_z / random_z.norm(dim=1, keepdim=True) * anchors.norm(dim=1, keepdim=True)
    concepts = {"class_embedding": anchors, "random": random_z}
    for objective in ("familiarity", "novelty", "camel"):
        concepts[objective] = _optimise(module, objective, outer_steps, lr=0.05)

    eval_train, eval_heldout = module.eval_noise[:n_eval], module.eval_noise[n_eval:]
    bank_noise = torch.randn((n_bank, 1, 8, 8), generator=gen)
    labels = torch.tensor(classes).repeat_interleave(n_eval).numpy()
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        bank = module.generate(anchors, bank_noise)
        for name, z in concepts.items():
            terms = module.objective_terms(z, eval_train, eval_heldout)
            samples = terms["x_heldout"]
            predicted = classifier.predict(samples.flatten(2).flatten(0, 1).numpy())
            dist = torch.stack([basin_distance(samples[i], bank[i]) for i in range(len(classes))])
            shift = ((z - anchors).norm(dim=1) / anchors.norm(dim=1)).mean()
            rows.append({"method": name, "l0": terms["l0"].mean().item(), "lk": terms["lk"].mean().item(),
                         "reward": terms["reward"].mean().item(),
                         "recognised": float(np.mean(predicted == labels)),
                         "basin_dist": dist.mean().item(), "shift": shift.item()})
    by = {r["method"]: r for r in rows}
    camel, vanilla, novelty = by["camel"], by["class_embedding"], by["novelty"]
    claims = [
        legacy_claim("CAMEL concepts more unfamiliar than vanilla samples (L0 ratio camel/vanilla > 1)",
              camel["l0"] / vanilla["l0"], 1.0, ">"),
        legacy_claim("CAMEL concepts more learnable than novelty-only (L_K ratio camel/novelty < 1)",
              camel["lk"] / novelty["lk"], 1.0, "<"),
        legacy_claim("CAMEL samples outside the vanilla basin (basin distance / vanilla-to-vanilla spread > 1)",
              camel["basin_dist"] / vanilla["basin_dist"], 1.0, ">"),
        legacy_claim("CAMEL samples still recognised as the prompt class above chance (0.1)", camel["recognised"], 0.1, ">"),
    ]
    return BenchmarkResult(rows=rows, claims=claims)
