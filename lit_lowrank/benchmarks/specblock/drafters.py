"""The specblock benchmark's drafters on SmolLM2-135M-Instruct: training settings, shipped files and the cache.

Each drafter is trained once by :class:`~lit_lowrank.decoding.training.DrafterDistillModule` on
:class:`~lit_lowrank.decoding.distill_data.SelfDistillDataModule` (the target's own greedy answers
to Lee-news instructions, its teacher-forced features and argmax) — exactly what
``lit-lowrank fit --config configs/language_model/real/<name>_smollm2.yaml`` runs (a test keeps
the YAML files equal to :data:`DRAFTERS`). The trained network is saved under
``$LIT_LOWRANK_CACHE/specblock-drafters/<name>-<key>.pt`` (``key`` hashes the settings), so the
benchmark trains only on its first run. The SpecBlock and EAGLE-style drafters also ship with the
package (:mod:`lit_lowrank.decoding.shipped`, float16 safetensors): when a shipped file's settings key
equals today's, it is loaded and nothing is trained.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

#: Training data of every drafter (SelfDistillDataModule arguments).
#: EAGLE-3's recipe at this scale: 10x the first set (1,200 instructions per corpus over the Lee and text8
#: training documents, ~210k answer tokens), the target's low / mid / high states fused (layers 2, 15 and
#: the final output of 30), answer positions scored only.
FEATURE_LAYERS = [2, 15, 30]
DATA: dict[str, Any] = dict(target="smollm2", corpus="lee+text8", prompts=1200, val_prompts=24, max_new_tokens=96,
                            seq_len=64, batch_size=8, seed=0, assistant_only=True, feature_layers=FEATURE_LAYERS)
# one SmolLM2-sized decoder layer; its head reads the features as the target's head does (no fresh norm)
_LAYER = dict(num_layers=1, num_heads=9, intermediate_size=1536, context_window=16, head_norm=False,
              feature_layers=FEATURE_LAYERS)
#: DrafterDistillModule arguments per drafter (sized as in their papers relative to the target).
DRAFTERS: dict[str, dict[str, Any]] = {
    "eagle": dict(architecture="block", draft_vocab="top:4096",
                  drafter=dict(block_size=1, layer_shift=False, rank_head=False, valid_prefix=False, **_LAYER)),
    "specblock": dict(architecture="block", draft_vocab="top:4096",
                      drafter=dict(block_size=4, layer_shift=True, rank_head=True, valid_prefix=True, **_LAYER)),
    "medusa": dict(architecture="medusa", draft_vocab="top:4096", drafter=dict(num_heads=4)),
}
#: Optimiser and trainer settings (the same for every drafter).
OPTIM: dict[str, Any] = dict(lr=1e-3, weight_decay=0.0, pct_start=0.1)
STEPS: dict[str, int] = {"eagle": 1000, "specblock": 1000, "medusa": 1000}  # ~1 epoch of the set at batch 8
SEED = 0


def _cache_dir() -> Path:
    root = os.environ.get("LIT_LOWRANK_CACHE") or Path.home() / ".cache" / "lit_lowrank"
    return Path(root) / "specblock-drafters"


def settings_key(name: str) -> str:
    """A hash of everything that determines drafter ``name`` (data, network, optimiser, steps, seed)."""
    blob = json.dumps({"data": DATA, "module": DRAFTERS[name], "optim": OPTIM, "steps": STEPS[name], "seed": SEED},
                      sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _shipped(name: str) -> tuple[torch.nn.Module, dict[str, Any]] | None:
    """The packaged drafter (:mod:`lit_lowrank.decoding.shipped`) when it was trained with today's settings."""
    from lit_lowrank.decoding.shipped import SHIPPED, load_drafter_file, read_metadata, shipped_path
    from lit_lowrank.models.pretrained import load_smollm2

    if name not in SHIPPED or DATA["target"] != "smollm2" or not shipped_path(name).is_file():
        return None
    if read_metadata(shipped_path(name))["key"] != settings_key(name):
        return None  # the settings changed since it was trained: train (and cache) anew
    model, _ = load_smollm2()
    net, meta = load_drafter_file(shipped_path(name), model)
    return net, dict(meta["info"], cached=True, shipped=True)


def train_drafter(name: str, callbacks: list[Any] | None = None) -> tuple[torch.nn.Module, dict[str, float]]:
    """Fit drafter ``name`` with Lightning (the ``lit-lowrank fit`` recipe); returns the network and train info."""
    import functools

    import lightning.pytorch as pl

    from lit_lowrank.decoding.distill_data import SelfDistillDataModule
    from lit_lowrank.decoding.training import DrafterDistillModule

    pl.seed_everything(SEED, verbose=False)
    steps = STEPS[name]
    optimizer = functools.partial(torch.optim.AdamW, lr=OPTIM["lr"], weight_decay=OPTIM["weight_decay"])
    scheduler = functools.partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=OPTIM["lr"], total_steps=steps,
                                  pct_start=OPTIM["pct_start"])
    module = DrafterDistillModule(pretrained_path=DATA["target"], optimizer=optimizer, lr_scheduler=scheduler,
                                  **DRAFTERS[name])
    data = SelfDistillDataModule(**DATA)
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, gradient_clip_val=1.0,
                         num_sanity_val_steps=0, val_check_interval=steps, check_val_every_n_epoch=None,
                         callbacks=callbacks)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    info = {"train_seconds": time.perf_counter() - start, "steps": steps}
    info.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    return module.drafter.eval(), info


def trained_drafter(name: str, callbacks: list[Any] | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Drafter ``name`` from the cache, trained and cached first if absent; ``(network, info)``.

    ``info`` holds the training time (``train_seconds``, wall, of the run that made the cache) and
    the last logged metrics; ``cached`` says whether this call trained.
    """
    from lit_lowrank.models.spec_drafter import BlockDrafterNet, MedusaHeads

    if name not in DRAFTERS:
        raise ValueError(f"Unknown drafter {name!r}; expected one of {sorted(DRAFTERS)}.")
    shipped = _shipped(name)
    if shipped is not None:
        return shipped
    path = _cache_dir() / f"{name}-{settings_key(name)}.pt"
    cls = MedusaHeads if DRAFTERS[name]["architecture"] == "medusa" else BlockDrafterNet
    if path.is_file():
        from lit_lowrank.core.safe_load import load_weights_file

        blob = load_weights_file(path, param="cache file", map_location="cpu")  # config, tensors, numbers only
        net = cls(**blob["config"])
        net.load_state_dict(blob["state_dict"])
        return net.eval(), dict(blob["info"], cached=True)
    net, info = train_drafter(name, callbacks)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"config": net.config, "state_dict": net.state_dict(), "info": info}, tmp)
    os.replace(tmp, path)  # atomic: other processes share the cache root
    return net, dict(info, cached=False)


def ship_drafter(name: str) -> Path:
    """Write drafter ``name`` (trained with today's settings, from the cache or trained now) into the package.

    This is how ``lit_lowrank/decoding/weights/<name>-smollm2.safetensors`` were made; rerun it after a
    settings change (the benchmark ignores a shipped file whose settings key differs).

    .. code-block:: python

        python -c "from lit_lowrank.benchmarks.specblock.drafters import ship_drafter; ship_drafter('specblock')"
    """
    from lit_lowrank.decoding.shipped import load_drafter_file, save_drafter, shipped_path
    from lit_lowrank.models.pretrained import load_smollm2

    net, info = trained_drafter(name)
    model, tokenizer = load_smollm2()
    keep = {k: v for k, v in info.items() if k not in ("cached", "shipped")}
    path = shipped_path(name)
    head = model.get_output_embeddings().weight
    save_drafter(net, path, key=settings_key(name), info=keep, target_head=head)
    # τ of the file as stored (float16 weights), so a reload can be checked against it
    keep["tau_check"] = shipped_tau(name, load_drafter_file(path, model)[0], model, tokenizer)
    save_drafter(net, path, key=settings_key(name), info=keep, target_head=head)
    return path


#: how :func:`shipped_tau` decodes with each shipped drafter
TAU_CHECK = dict(prompt_split="test", max_new_tokens=16, specblock=dict(blocks=1, expand=4), eagle=dict(depth=4, topk=4),
                 budget=8)


def shipped_tau(name: str, net: torch.nn.Module, model: torch.nn.Module, tokenizer: Any) -> float:
    """τ (tokens per target forward) of drafter ``name`` on the first Lee test instruction, greedy, 16 tokens.

    Stored in a shipped file's metadata (``info["tau_check"]``) so a reload can be shown to reproduce it.
    """
    from lit_lowrank.decoding import EagleDrafter, SpecBlockDrafter, SpeculativeDecoder
    from lit_lowrank.decoding.distill_data import chat_prompt_ids, instruction_prompts

    prompt = torch.tensor(chat_prompt_ids(tokenizer, instruction_prompts("lee", TAU_CHECK["prompt_split"], 1))[0])
    drafter = (SpecBlockDrafter(net, **TAU_CHECK["specblock"]) if name == "specblock"
               else EagleDrafter(net, **TAU_CHECK["eagle"]))
    _, stats = SpeculativeDecoder(model, drafter, budget=TAU_CHECK["budget"]).generate(
        prompt, TAU_CHECK["max_new_tokens"], eos_token_id=int(tokenizer.eos_token_id))
    return round(stats.mean_acceptance_length, 6)
