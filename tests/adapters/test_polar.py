"""PoLAR: the landing field (ops/polar.py), the PEFT layer (adapters/polar.py) and the landing step."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from lit_lowrank.adapters.polar import PoLARLinear, polar_delta_stable_rank, polar_layers
from lit_lowrank.adapters.polar_landing import PoLARLanding, apply_landing_, polar_diagnostics, stiefel_factors
from lit_lowrank.ops.lowrank import stable_rank_of
from lit_lowrank.ops.polar import (
    landing_direction,
    orthogonality_error,
    polar_delta_weight,
    polar_stable_rank,
    shorten_to_safe_region,
)

# tiny matrices: one thread avoids thread spin-waits on the shared CI cores
pytestmark = pytest.mark.usefixtures("one_thread")


def _layer(in_features: int = 32, out_features: int = 16, r: int = 4, alpha: float = 4.0, seed: int = 0):
    torch.manual_seed(seed)
    base = nn.Linear(in_features, out_features)
    base.requires_grad_(False)
    return PoLARLinear(base, "default", r=r, lora_alpha=alpha)


# ---------------------------------------------------------------- the landing field (pure math)

def test_landing_direction_matches_hand_computation_on_the_manifold():
    # X = [e1 e2] in R^3, G = [[0,1],[0,0],[1,0]]: by hand GXᵀ = [[0,1,0],[0,0,0],[1,0,0]],
    # ψ = GXᵀ − XGᵀ = [[0,1,-1],[-1,0,0],[1,0,0]], ψX = first two columns of ψ; XᵀX = I so no normal term.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    g = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    expected = torch.tensor([[0.0, 1.0], [-1.0, 0.0], [1.0, 0.0]])
    torch.testing.assert_close(landing_direction(x, g, lam=0.7), expected)


def test_landing_direction_matches_hand_computation_off_the_manifold():
    # X = 2 [e1 e2], G = 0: XᵀX − I = 3 I, so Λ = λ X (3 I) = 3 λ X; with λ = 0.5, diag entries 3.
    x = 2.0 * torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    expected = torch.tensor([[3.0, 0.0], [0.0, 3.0], [0.0, 0.0]])
    torch.testing.assert_close(landing_direction(x, torch.zeros_like(x), lam=0.5), expected)


def test_landing_direction_is_tangent_plus_normal():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(12, 3, generator=gen, dtype=torch.float64)  # deliberately off the manifold
    g = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    lam = 0.3
    # explicit n×n formula
    psi = g @ x.T - x @ g.T
    explicit = psi @ x + lam * x @ (x.T @ x - torch.eye(3, dtype=torch.float64))
    field = landing_direction(x, g, lam)
    torch.testing.assert_close(field, explicit)
    # tangent part: ψ is skew, so it leaves XᵀX unchanged to first order (sym(Xᵀ ψ X) = 0)
    tangent = landing_direction(x, g, 0.0)
    sym = x.T @ tangent + tangent.T @ x
    assert sym.abs().max() < 1e-10
    # normal part: λ ∇ ‖XᵀX − I‖²/4 by autograd
    xr = x.clone().requires_grad_(True)
    (torch.linalg.matrix_norm(xr.T @ xr - torch.eye(3, dtype=torch.float64)) ** 2 / 4).backward()
    torch.testing.assert_close(field - tangent, lam * xr.grad)


def test_landing_direction_errors_name_the_parameter():
    x = torch.randn(8, 2)
    with pytest.raises(ValueError, match="lam"):
        landing_direction(x, torch.zeros_like(x), lam=-1.0)
    with pytest.raises(ValueError, match="grad"):
        landing_direction(x, torch.zeros(8, 3), lam=1.0)
    with pytest.raises(ValueError, match="columns"):
        orthogonality_error(torch.randn(2, 8))


def test_polar_stable_rank_equals_dense_stable_rank_even_off_the_manifold():
    gen = torch.Generator().manual_seed(2)
    x, theta, y = torch.randn(20, 5, generator=gen), torch.randn(5, 5, generator=gen), torch.randn(30, 5, generator=gen)
    dense = stable_rank_of(polar_delta_weight(x, theta, y))
    torch.testing.assert_close(polar_stable_rank(x, theta, y), dense, rtol=1e-4, atol=1e-5)
    assert float(polar_stable_rank(x, torch.zeros(5, 5), y)) == 0.0


def test_shorten_to_safe_region_keeps_the_largest_safe_fraction():
    x_old = torch.linalg.qr(torch.randn(10, 3, generator=torch.Generator().manual_seed(3))).Q
    x_new = 3.0 * x_old  # error 8·√3 ≈ 13.9, far outside
    kept, t = shorten_to_safe_region(x_old, x_new, eps=0.5)
    assert 0.0 < t < 1.0 and float(orthogonality_error(kept)) <= 0.5
    # doubling t would have left the region (it is the largest power-of-two fraction)
    assert float(orthogonality_error(x_old + 2 * t * (x_new - x_old))) > 0.5
    same, t1 = shorten_to_safe_region(x_old, x_old * 1.01, eps=0.5)
    assert t1 == 1.0 and torch.equal(same, x_old * 1.01)


# ---------------------------------------------------------------- the layer

def test_delta_weight_is_zero_at_init_and_factors_orthonormal():
    layer = _layer()
    x = torch.randn(7, 32)
    torch.testing.assert_close(layer(x), layer.get_base_layer()(x), rtol=0, atol=0)
    fx, theta, fy = layer.polar_factors()
    assert float(orthogonality_error(fx)) < 1e-5 and float(orthogonality_error(fy)) < 1e-5
    assert theta.abs().max() == 0 and layer.get_delta_weight("default").abs().max() == 0
    assert polar_delta_stable_rank(layer) == 0.0


def test_forward_gradients_pass_gradcheck():
    layer = _layer(9, 7, r=3).double()
    with torch.no_grad():
        layer.lora_theta["default"].normal_()
    fx, theta, fy = layer.polar_factors()
    inp = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)

    def fn(inp, fx_, theta_, fy_):
        # the layer's own forward, with its factors replaced by the tensors gradcheck perturbs
        return torch.func.functional_call(layer, {"lora_X.default": fx_, "lora_theta.default": theta_,
                                                  "lora_Y.default": fy_}, (inp,))

    args = (inp, fx.detach().clone().requires_grad_(True), theta.detach().clone().requires_grad_(True),
            fy.detach().clone().requires_grad_(True))
    assert torch.autograd.gradcheck(fn, args)


def test_theta_gradient_is_the_closed_form_and_theta_is_free():
    layer = _layer()
    with torch.no_grad():
        layer.lora_theta["default"].normal_()
    x = torch.randn(11, 32)
    out = layer(x)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    fx, theta, fy = layer.polar_factors()
    scaling = layer.scaling["default"]
    # ∂L/∂ΔW = upstreamᵀ x, ∂L/∂Θ = s Xᵀ (∂L/∂ΔW) Y
    expected = scaling * fx.detach().T @ (upstream.T @ x) @ fy.detach()
    torch.testing.assert_close(theta.grad, expected, rtol=1e-4, atol=1e-5)
    # landing replaces only the X/Y gradients; Θ keeps its Euclidean gradient (it is unconstrained)
    before = theta.grad.clone()
    assert apply_landing_(layer, lam=1.0) == 2
    torch.testing.assert_close(theta.grad, before, rtol=0, atol=0)
    assert [name.split(".")[0] for name, _ in stiefel_factors(layer)] == ["lora_X", "lora_Y"]


def test_merge_equals_unmerged_forward_and_unmerge_restores():
    layer = _layer()
    with torch.no_grad():
        layer.lora_theta["default"].normal_()
    base_weight = layer.get_base_layer().weight.detach().clone()
    x = torch.randn(5, 32)
    unmerged = layer(x)
    assert (unmerged - layer.get_base_layer()(x)).abs().max() > 1e-3  # the adapter does something
    layer.merge()
    torch.testing.assert_close(layer(x), unmerged, rtol=1e-5, atol=1e-5)
    layer.unmerge()
    torch.testing.assert_close(layer.get_base_layer().weight, base_weight, rtol=1e-6, atol=1e-6)


def test_peft_injection_save_load_and_merge_and_unload(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["0", "2"])
    config._register_custom_module({nn.Linear: PoLARLinear})
    peft_model = get_peft_model(model, config)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all(any(k in n for k in ("lora_X", "lora_theta", "lora_Y")) for n in trainable)
    for _, layer in polar_layers(peft_model):
        with torch.no_grad():
            layer.lora_theta["default"].normal_()
    x = torch.randn(6, 16)
    out = peft_model(x)
    peft_model.save_pretrained(tmp_path)

    torch.manual_seed(123)  # different fresh factors: the load must overwrite them
    fresh = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    fresh.load_state_dict(base_state)
    loaded_config = LoraConfig.from_pretrained(tmp_path)
    loaded_config._register_custom_module({nn.Linear: PoLARLinear})
    loaded = PeftModel.from_pretrained(fresh, tmp_path, config=loaded_config)
    torch.testing.assert_close(loaded(x), out, rtol=1e-6, atol=1e-6)

    merged = peft_model.merge_and_unload()
    assert isinstance(merged[0], nn.Linear) and not isinstance(merged[0], PoLARLinear)
    torch.testing.assert_close(merged(x), out, rtol=1e-5, atol=1e-5)


def test_layer_errors_name_the_parameter():
    with pytest.raises(ValueError, match="`r`=17"):
        PoLARLinear(nn.Linear(32, 16), "default", r=17)
    with pytest.raises(ValueError, match="`r`=0"):
        PoLARLinear(nn.Linear(32, 16), "default", r=0)
    with pytest.raises(ValueError, match="`lora_alpha`"):
        PoLARLinear(nn.Linear(32, 16), "default", r=2, lora_alpha=0)
    with pytest.raises(ValueError, match="`lora_bias`"):
        PoLARLinear(nn.Linear(32, 16), "default", config=LoraConfig(r=2, lora_bias=True), r=2)
    with pytest.raises(KeyError, match="`adapter`"):
        _layer().polar_factors("other")
    with pytest.raises(ValueError, match="adapter_names"):
        _layer()(torch.randn(2, 32), adapter_names=["default", "default"])
    with pytest.raises(ValueError, match="`lam`"):
        PoLARLanding(lam=-1.0)
    with pytest.raises(ValueError, match="`safe_radius`"):
        PoLARLanding(safe_radius=0.0)


# ---------------------------------------------------------------- staying near the manifold while training

def _fit_regression(optimizer: str, landing: bool, steps: int = 200, lam: float = 1.0) -> tuple[float, float, float]:
    """Fit a rank-4 ΔW* with a rank-4 PoLAR layer; return (final loss / initial loss, err X, err Y)."""
    gen = torch.Generator().manual_seed(0)
    layer = _layer()
    u = torch.linalg.qr(torch.randn(16, 4, generator=gen)).Q
    v = torch.linalg.qr(torch.randn(32, 4, generator=gen)).Q
    target = u @ torch.diag(torch.tensor([2.0, 1.5, 1.0, 0.5])) @ v.T
    params = [p for n, p in layer.named_parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2) if optimizer == "adam" else torch.optim.SGD(params, lr=0.3)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 32, generator=gen)
        loss = (layer(x) - layer.get_base_layer()(x) - x @ target.T).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if landing:
            apply_landing_(layer, lam)
        opt.step()
        losses.append(float(loss.detach()))
    fx, _, fy = layer.polar_factors()
    return losses[-1] / losses[0], float(orthogonality_error(fx)), float(orthogonality_error(fy))


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_landing_keeps_factors_near_orthonormal_and_plain_gradients_drift(optimizer):
    ratio, err_x, err_y = _fit_regression(optimizer, landing=True)
    assert ratio < 0.2, f"PoLAR with landing did not fit the rank-4 target: loss ratio {ratio:.3f}"
    assert err_x < 0.05 and err_y < 0.05, (err_x, err_y)
    plain_ratio, drift_x, drift_y = _fit_regression(optimizer, landing=False)
    assert max(drift_x, drift_y) > 0.5, (drift_x, drift_y)
    # staying near the manifold costs (almost) nothing in fit
    assert ratio < 1.25 * plain_ratio + 0.01, (ratio, plain_ratio)


# ---------------------------------------------------------------- the Lightning callback

class _Regression(pl.LightningModule):
    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
        self.net.requires_grad_(False)
        self.net[0] = PoLARLinear(self.net[0], "default", r=3, lora_alpha=3)
        self.net[2] = PoLARLinear(self.net[2], "default", r=3, lora_alpha=3)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=self.lr)


def _loader():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=gen)
    y = torch.sin(x[:, :4] * 2.0) + x[:, 4:8]
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)


def _trainer(callbacks, steps=64):
    return pl.Trainer(max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", log_every_n_steps=1)


def test_callback_keeps_orthogonality_logs_diagnostics_and_safeguard_bounds_the_error():
    with_landing = _Regression(lr=3e-2)
    trainer = _trainer([PoLARLanding(lam=1.0, log_every_n_steps=8)])
    trainer.fit(with_landing, _loader())
    diag = polar_diagnostics(with_landing)
    assert diag["layers"] == 2 and diag["stable_rank_mean"] > 1.0
    keys = set(trainer.callback_metrics)
    assert {"method/polar/orthogonality_error_x_max", "method/polar/stable_rank_mean"} <= keys

    without = _Regression(lr=3e-2)
    _trainer([]).fit(without, _loader())
    drift = polar_diagnostics(without)
    assert max(diag["orthogonality_error_x_max"], diag["orthogonality_error_y_max"]) < 0.5 * max(
        drift["orthogonality_error_x_max"], drift["orthogonality_error_y_max"])

    # λ = 0 (tangent part only) with a large step drifts; the safeguard keeps every factor inside ε
    guarded = _Regression(lr=0.3)
    guard = PoLARLanding(lam=0.0, safe_radius=0.05, log_every_n_steps=8)
    trainer = _trainer([guard])
    trainer.fit(guarded, _loader())
    g = polar_diagnostics(guarded)
    assert max(g["orthogonality_error_x_max"], g["orthogonality_error_y_max"]) <= 0.05 + 1e-6
    assert trainer.callback_metrics["method/polar/safe_step_fraction"] < 1.0
    unguarded = _Regression(lr=0.3)
    _trainer([PoLARLanding(lam=0.0)]).fit(unguarded, _loader())
    u = polar_diagnostics(unguarded)
    assert max(u["orthogonality_error_x_max"], u["orthogonality_error_y_max"]) > 0.05


def test_callback_refuses_a_model_without_polar_layers():
    class _Plain(_Regression):
        def __init__(self):
            pl.LightningModule.__init__(self)
            self.net = nn.Linear(16, 4)
            self.lr = 1e-2

    with pytest.raises(ValueError, match="no trainable PoLAR factors"):
        _trainer([PoLARLanding()], steps=2).fit(_Plain(), _loader())


def test_stable_rank_script_runs_one_tiny_fine_tune():
    from lit_lowrank.benchmarks.lora_variants.polar_rank import finetune_once

    row = finetune_once("polar", seed=0, steps=12, pretrain_steps=10, early=6)
    assert row["method"] == "polar" and 0.0 <= row["acc_after"] <= 1.0
    assert 1.0 <= row["stable_rank_dW"] <= 8.0 and row["orth_err_max"] < 0.5
