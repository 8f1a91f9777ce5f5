"""SaMA: the relaxed-Kronecker math (ops/sama.py) and its PEFT layer (adapters/sama.py)."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from lit_lowrank.ops.sama import (
    SaMAShape,
    lora_budget,
    sama_apply,
    sama_delta_weight,
    sama_init,
    sama_matched_to_lora,
    sama_min_parameters,
    sama_rank_report,
    sama_shape,
)

# (in, out, explicit num_blocks, block_cols): divisible, non-divisible on either side, m1 > n1, q > m2, tall, wide
SHAPES = [(64, 64, 8, 4), (67, 31, 11, 9), (13, 17, 6, 2), (10, 100, 20, 1), (100, 10, 3, 41), (7, 7, 7, 7)]


def _random_factors(shape: SaMAShape, seed: int = 0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape.a_shape, generator=gen, dtype=dtype), torch.randn(shape.b_shape, generator=gen, dtype=dtype)


def _kron_reference(a: torch.Tensor, b: torch.Tensor, shape: SaMAShape) -> torch.Tensor:
    """blockdiag(B_1..B_m1) @ kron(A, I_q), cropped — the definition, built with torch.block_diag / torch.kron."""
    full = torch.block_diag(*b) @ torch.kron(a, torch.eye(shape.block_cols, dtype=a.dtype))
    return full[: shape.out_features, : shape.in_features]


@pytest.mark.parametrize("n, m, m1, q", SHAPES)
def test_fast_apply_equals_explicit_matrix(n, m, m1, q):
    shape = sama_shape(n, m, num_blocks=m1, block_cols=q)
    a, b = _random_factors(shape)
    delta = sama_delta_weight(a, b, shape, scale=0.3)
    torch.testing.assert_close(delta, 0.3 * _kron_reference(a, b, shape))
    x = torch.randn(3, 5, n, dtype=torch.float64)
    torch.testing.assert_close(sama_apply(x, a, b, shape, scale=0.3), x @ delta.T)


def test_shared_blocks_reduce_to_the_kronecker_product():
    shape = sama_shape(12, 15, num_blocks=3, block_cols=4)  # A: (3, 3), B_i: (5, 4)
    a, b = _random_factors(shape)
    b = b[:1].expand_as(b).clone()  # every block equal: the shared-block constraint
    torch.testing.assert_close(sama_delta_weight(a, b, shape), torch.kron(a, b[0]))


@pytest.mark.parametrize("n, m, m1, q", SHAPES)
def test_zero_at_init_and_explicit_rank_formula(n, m, m1, q):
    shape = sama_shape(n, m, num_blocks=m1, block_cols=q)
    a, b = sama_init(shape, generator=torch.Generator().manual_seed(0))
    assert torch.count_nonzero(sama_delta_weight(a, b, shape)) == 0
    assert torch.linalg.matrix_rank(a) == min(a.shape)  # A starts orthonormal, so B's first gradient is non-zero
    report = sama_rank_report(n, m, budget=shape.num_parameters, shape=shape)
    assert report["rank"] == shape.generic_rank


def test_generic_rank_formula_on_random_shapes():
    rng = random.Random(0)
    for trial in range(200):
        n, m = rng.randint(1, 30), rng.randint(1, 30)
        shape = sama_shape(n, m, num_blocks=rng.randint(1, m), block_cols=rng.randint(1, n))
        assert sama_rank_report(n, m, 10**9, shape=shape, seed=trial)["rank"] == shape.generic_rank, shape


@pytest.mark.parametrize("n, m", [(64, 64), (67, 31), (384, 384), (576, 1536)])
@pytest.mark.parametrize("lora_rank", [1, 2, 4, 8])
def test_parameter_count_respects_budget(n, m, lora_rank):
    budget = lora_budget(n, m, lora_rank)
    shape = sama_matched_to_lora(n, m, lora_rank)
    assert shape == sama_shape(n, m, budget)
    assert shape.num_parameters <= budget
    a, b = sama_init(shape)
    assert a.numel() + b.numel() == shape.num_parameters
    # the chooser never leaves the rank LoRA would get on the table
    assert shape.generic_rank >= min(lora_rank, n, m)


def test_effective_rank_grows_with_budget_faster_than_lora():
    n = m = 128
    reports = [sama_rank_report(n, m, lora_budget(n, m, r)) for r in (1, 2, 4, 8)]
    ranks = [r["effective_rank"] for r in reports]
    assert all(b > a for a, b in zip(ranks, ranks[1:])), ranks
    assert all(r["parameters"] <= lora_budget(n, m, k) for r, k in zip(reports, (1, 2, 4, 8)))
    assert reports[0]["rank"] == 1  # the smallest budget is rank-1 LoRA-like
    # LoRA at these budgets has rank 1, 2, 4, 8; SaMA's grows at least quadratically, full rank at r=8
    assert reports[1]["rank"] >= 2**2 and reports[2]["rank"] >= 4**2 and reports[3]["rank"] == 128


def test_gradients_match_autograd_through_explicit_form():
    shape = sama_shape(67, 31, num_blocks=11, block_cols=9)
    a0, b0 = _random_factors(shape, seed=1)
    x = torch.randn(6, 67, dtype=torch.float64)
    target = torch.randn(6, 31, dtype=torch.float64)
    grads = []
    for fast in (True, False):
        a, b = a0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
        xx = x.clone().requires_grad_(True)
        y = sama_apply(xx, a, b, shape, 0.5) if fast else xx @ (0.5 * _kron_reference(a, b, shape)).T
        ((y - target) ** 2).sum().backward()
        grads.append((a.grad, b.grad, xx.grad))
    for fast_g, ref_g in zip(*grads):
        torch.testing.assert_close(fast_g, ref_g)


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="budget=10 is below"):
        sama_shape(64, 64, budget=10)
    assert sama_min_parameters(64, 64) <= lora_budget(64, 64, 1)
    sama_shape(64, 64, budget=sama_min_parameters(64, 64))  # the minimum itself is feasible
    with pytest.raises(ValueError, match="num_blocks must be an integer"):
        sama_shape(64, 32, num_blocks=33, block_cols=2)
    with pytest.raises(ValueError, match="block_cols must be an integer"):
        sama_shape(64, 32, num_blocks=2, block_cols=65)
    with pytest.raises(ValueError, match="num_blocks and block_cols must be given together"):
        sama_shape(64, 32, num_blocks=2)
    with pytest.raises(ValueError, match="budget=100 is below the .* explicit shape"):
        sama_shape(64, 32, 100, num_blocks=8, block_cols=8)
    with pytest.raises(ValueError, match="in_features must be a positive integer"):
        sama_shape(0, 32, 100)
    with pytest.raises(ValueError, match="lora_rank must be a positive integer"):
        sama_matched_to_lora(64, 32, 0)
    shape = sama_shape(64, 32, num_blocks=4, block_cols=4)
    a, b = sama_init(shape)
    with pytest.raises(ValueError, match="x must end in in_features=64"):
        sama_apply(torch.randn(2, 63), a, b, shape)
    with pytest.raises(ValueError, match="b must have shape"):
        sama_apply(torch.randn(2, 64), a, b[:, :1], shape)


# ------------------------------------------------------------------ the PEFT layer


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(67, 31), nn.ReLU(), nn.Linear(31, 10))


def _randomise_adapters(model: nn.Module) -> None:
    gen = torch.Generator().manual_seed(3)
    for name, p in model.named_parameters():
        if "lora_sama" in name:
            p.data = torch.randn(p.shape, generator=gen) * 0.1


def test_layer_output_unchanged_at_injection_and_only_adapters_train():
    from lit_lowrank.adapters import inject_adapters
    from lit_lowrank.adapters.sama import SaMALinear

    model, x = _mlp(), torch.randn(8, 67)
    before = model(x)
    inject_adapters(model, method="sama", target_modules=["0", "2"], rank=4, alpha=8)
    assert isinstance(model[0], SaMALinear) and isinstance(model[2], SaMALinear)
    torch.testing.assert_close(model(x), before)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{i}.lora_sama_{f}.default" for i in (0, 2) for f in "AB"}
    shape = model[0].sama_shape["default"]
    assert shape == sama_matched_to_lora(67, 31, 4)
    assert sum(p.numel() for n, p in model[0].named_parameters() if p.requires_grad) == shape.num_parameters
    model(x).sum().backward()
    assert model[0].lora_sama_B["default"].grad.abs().sum() > 0  # B moves on the first step


def test_layer_forward_merge_and_delta_weight():
    from lit_lowrank.adapters.sama import SaMALinear

    torch.manual_seed(0)
    layer = SaMALinear(nn.Linear(67, 31), "default", r=4, lora_alpha=8, budget=600)
    assert layer.sama_shape["default"].num_parameters <= 600
    _randomise_adapters(layer)
    x = torch.randn(5, 67)
    a, b, shape = layer.sama_factors("default")
    expected = layer.base_layer(x) + x @ (2.0 * sama_delta_weight(a, b, shape)).T  # scaling α/r = 2
    unmerged = layer(x)
    torch.testing.assert_close(unmerged, expected)
    w0 = layer.base_layer.weight.detach().clone()
    layer.merge()
    torch.testing.assert_close(layer(x), unmerged, rtol=1e-5, atol=1e-5)
    layer.unmerge()
    torch.testing.assert_close(layer.base_layer.weight, w0, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="adapter_names"):
        layer(x, adapter_names=["default"] * 5)


def test_layer_errors_name_the_parameter():
    from lit_lowrank.adapters.sama import SaMALinear

    with pytest.raises(ValueError, match="`r`=40"):
        SaMALinear(nn.Linear(64, 32), "default", r=40)
    with pytest.raises(ValueError, match="budget=5 is below"):
        SaMALinear(nn.Linear(64, 32), "default", r=2, budget=5)
    with pytest.raises(ValueError, match="`lora_alpha`"):
        SaMALinear(nn.Linear(64, 32), "default", r=2, lora_alpha=0)
    layer = SaMALinear(nn.Linear(64, 32), "default", r=2, num_blocks=4, block_cols=8)
    assert layer.sama_shape["default"].a_shape == (4, 8)


def test_save_load_round_trip_through_peft(tmp_path):
    from lit_lowrank.adapters import inject_adapters, load_adapters, load_peft_model, save_adapters

    model, x = _mlp(), torch.randn(8, 67)
    inject_adapters(model, method="sama", target_modules=["0", "2"], rank=4, alpha=8, budget=700)
    _randomise_adapters(model)
    expected = model(x)
    save_adapters(model, tmp_path / "sama")
    torch.testing.assert_close(load_adapters(_mlp(), tmp_path / "sama")(x), expected)
    peft_model = load_peft_model(_mlp(), tmp_path / "sama")
    torch.testing.assert_close(peft_model(x), expected)
    merged = peft_model.merge_and_unload()
    assert isinstance(merged[0], nn.Linear)
    torch.testing.assert_close(merged(x), expected, rtol=1e-5, atol=1e-5)


def test_diagnostics_logged_under_method_sama(tmp_path):
    import lightning.pytorch as pl

    from lit_lowrank.adapters import AdapterInjector
    from lit_lowrank.adapters.diagnostics import AdapterDiagnostics
    from lit_lowrank.datamodules import DigitsDataModule
    from lit_lowrank.tasks import ClassificationModule

    module = ClassificationModule("mlp", num_classes=10, in_chans=1,
                                  backbone_kwargs={"in_features": 64, "hidden_sizes": [32]})
    logged: dict[str, float] = {}

    class Spy(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            logged.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("method/sama/")})

    trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, accelerator="cpu", default_root_dir=tmp_path,
                         callbacks=[AdapterInjector(method="sama", target_modules=["backbone.layers.0"], rank=2),
                                    AdapterDiagnostics(every_n_steps=1), Spy()])
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=32))
    shape = sama_matched_to_lora(64, 32, 2)
    assert logged["method/sama/generic_rank"] == shape.generic_rank
    assert logged["method/sama/parameters"] == shape.num_parameters
    assert logged["method/sama/block_energy_cv"] > 0  # B moved away from zero, unevenly across blocks
