"""STAC-R's per-layer rank for a cosine target, one-off logging, the explicit stages, and GPT-2 ``Conv1D`` layers."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from lit_lowrank.callbacks import STACR, STACRLinear, apply_stac_r
from lit_lowrank.callbacks.stac_r import Stage
from tests.callbacks.test_stac_r import GeluUser, _loader


def _spread_loader(n: int = 256, d: int = 32, decay: float = 0.85) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g) * decay ** torch.arange(d, dtype=torch.float32)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.randint(0, 4, (n,), generator=g)),
                                       batch_size=64)


def _fit(callback, module, loader, steps, tmp_path=None, **kwargs):
    logger = CSVLogger(tmp_path, name="run") if tmp_path is not None else False
    trainer = pl.Trainer(max_steps=steps, logger=logger, log_every_n_steps=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                         callbacks=[callback], **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=loader)
    return trainer


def test_target_cosine_chooses_per_layer_ranks_that_meet_it():
    torch.manual_seed(0)
    callback = STACR(rank=2, residual_density=0.0, target_cosine=0.98, rank_margin=0.0, rank_multiple=2,
                     bridge_every=1, measure_total=False)
    module = GeluUser()
    trainer = _fit(callback, module, _spread_loader(), steps=2)
    ranks = callback.ranks
    assert set(ranks) == {"up", "down", "head"}
    assert all(r % 2 == 0 and r == module.get_submodule(n).rank for n, r in ranks.items())
    assert callback.report["ranks"] == ranks  # the predictor priced the chosen ranks, before compressing
    assert ranks["up"] < 32  # the decaying input spectrum needs fewer than all its directions
    metrics = trainer.callback_metrics
    assert float(metrics["method/stac_r/selected_cosine_min"]) >= 0.98
    # the next (compressed, tracked) step keeps the fidelity the calibration step chose for
    assert float(metrics["method/stac_r/grad_cosine_mean"]) >= 0.97
    # a fixed rank of the smallest chosen size everywhere misses it on the widest-spread layer
    fixed = STACR(rank=2, residual_density=0.0, bridge_every=1, measure_total=False)
    torch.manual_seed(0)
    _fit(fixed, GeluUser(), _spread_loader(), steps=2)
    assert fixed.ranks == {}


def test_chosen_ranks_survive_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    callback = STACR(rank=2, residual_density=0.0, target_cosine=0.95, rank_multiple=2, measure_total=False)
    trainer = _fit(callback, GeluUser(), _spread_loader(), steps=2)
    path = tmp_path / "x.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["callbacks"][callback.state_key]
    assert state["stage"] == "train" and state["ranks"] == callback.ranks
    restored = STACR(rank=2, residual_density=0.0, target_cosine=0.95, rank_multiple=2, measure_total=False)
    restored.load_state_dict(state)
    module = GeluUser()
    restored.setup(None, module, "fit")  # type: ignore[arg-type]
    assert {n: module.get_submodule(n).rank for n in callback.ranks} == callback.ranks
    assert restored.stage == Stage.TRAIN


def test_one_off_diagnostics_are_logged_once_and_the_figure_has_its_own_key(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr("lit_lowrank.core.figures.log_figure", lambda trainer, key, fig: figures.append(key))
    torch.manual_seed(0)
    callback = STACR(rank=4, residual_density=0.02, bridge_every=4)
    _fit(callback, GeluUser(), _loader(), steps=9, tmp_path=tmp_path)
    rows = list(csv.DictReader(open(next(Path(tmp_path).rglob("metrics.csv")))))

    def steps(key: str) -> list[int]:
        return [int(r["step"]) for r in rows if r.get(f"method/stac_r/{key}")]

    # at the optimizer step each belongs to (global_step after the step): once each, never re-emitted
    assert steps("ssp_saved") == steps("predicted_saved_reduction") == [1]  # the calibration step
    assert steps("total_reduction") == steps("ssp") == [3]  # the measured (compressed) step
    assert steps("grad_cosine_mean") == [1, 5, 9]  # the diagnosed steps only (global steps 0, 4, 8)
    assert len(steps("saved_mib")) >= 5  # per step
    assert figures and set(figures) == {"method/stac_r/ssp_figure"}  # one per epoch, never the scalar key


def test_stages_run_in_order():
    torch.manual_seed(0)
    callback = STACR(rank=4, residual_density=0.02, bridge_every=0)
    seen = []

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(callback.stage)

    trainer = pl.Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, callbacks=[Spy(), callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(GeluUser(), train_dataloaders=_loader())
    assert seen == [Stage.CALIBRATE, Stage.REFERENCE, Stage.MEASURE, Stage.TRAIN]


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).train()


def test_gpt2_conv1d_layers_are_compressed_with_their_parameters_unchanged():
    from transformers.pytorch_utils import Conv1D

    plain = _tiny_gpt2()
    model = _tiny_gpt2()
    keys = list(model.state_dict())
    layers = apply_stac_r(model, target=r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)$", rank=32,
                          residual_density=0.0)
    assert len(layers) == 8 and all(isinstance(m, STACRLinear) and m.weight_transposed for m in layers.values())
    assert list(model.state_dict()) == keys
    assert not any(isinstance(m, Conv1D) for n, m in model.named_modules() if n in layers)
    assert layers["transformer.h.0.mlp.c_proj"].in_features == 128  # Conv1D weight (in=128, out=32)
    ids = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1))
    for mode, tol in (("calibrate", 1e-5), ("compress", 2e-2)):  # exact; then full rank 32 (c_fc/c_attn) in bf16
        for layer in layers.values():
            layer.mode = mode
        for m in (plain, model):
            m.zero_grad()
            m(input_ids=ids, labels=ids).loss.backward()
        for n in layers:
            g, ref = model.get_submodule(n).weight.grad, plain.get_submodule(n).weight.grad
            assert g.shape == ref.shape
            if mode == "calibrate" or layers[n].in_features == 32:
                cos = torch.nn.functional.cosine_similarity(g.flatten(), ref.flatten(), dim=0)
                assert float(cos) > 1 - tol, (n, mode)
    # the untargeted form finds the Conv1D layers too (every one wider than the rank)
    assert len(apply_stac_r(_tiny_gpt2(), rank=16)) == 9  # 8 in the blocks + the tied lm_head Linear


def test_conv1d_wrong_type_is_refused():
    with pytest.raises(TypeError, match="Conv1D"):
        STACRLinear(nn.Conv1d(4, 4, 1))  # type: ignore[arg-type]
