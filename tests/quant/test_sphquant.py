"""SPHLinear, the functional form, baselines on the same layers, save/load and the callback."""

from __future__ import annotations

import copy
import math

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_lowrank.quant import (
    SPHLinear,
    SPHQuantizer,
    UniformQuantizer,
    UniformQuantLinear,
    buffer_bytes,
    model_bits,
    quantize_sph,
    quantize_uniform,
)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 48), nn.GELU(), nn.Linear(48, 10))


def test_sphlinear_matches_dequantized_dense_matmul():
    model = _mlp()
    quantize_sph(model, codebook_size=32, radius_bits=3, group_size=32, kmeans_iterations=3, finetune_steps=10)
    layer = model[2]
    assert isinstance(layer, SPHLinear)
    layer.tile_rows = 7  # several tiles, the last one ragged
    x = torch.randn(3, 5, 96)
    expected = x @ layer.dequantize().T + layer.bias
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    # the packed buffers are all the layer holds: no float weight
    assert not any(name.endswith("weight") for name, _ in layer.named_buffers())


def test_quantize_is_idempotent_and_shares_one_codebook():
    model = _mlp()
    report = quantize_sph(model, codebook_size=32, radius_bits=3, group_size=32, kmeans_iterations=3,
                          finetune_steps=10)
    assert report["quantized_layers"] == 3
    state = copy.deepcopy(model.state_dict())
    assert quantize_sph(model, codebook_size=32, radius_bits=3, group_size=32) == {"quantized_layers": 0}
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    codebooks = {m.codebook.data_ptr() for m in model.modules() if isinstance(m, SPHLinear)}
    assert len(codebooks) == 1
    bits = model_bits(model)
    weights = 64 * 96 + 96 * 48 + 48 * 10
    assert bits.num_weights == weights
    assert bits.shared_bits == 32 * 8 * 16  # counted once, not per layer
    held = sum(buffer_bytes(m) for m in model.modules() if isinstance(m, SPHLinear)) + 32 * 8 * 2
    padding = 3 * 8  # each packed stream keeps 8 zero bytes for the 8-byte read window
    assert held - padding == pytest.approx(bits.bytes, abs=3)  # payload rounded up to whole bytes per layer


def test_quantize_save_load_same_outputs(tmp_path):
    model = _mlp()
    quantize_sph(model, codebook_size=16, radius_bits=4, group_size=32, kmeans_iterations=3, finetune_steps=5)
    x = torch.randn(4, 64)
    expected = model(x)
    path = tmp_path / "q.pt"
    torch.save(model.state_dict(), path)

    from lit_lowrank.core.surgery import surgery_records
    from lit_lowrank.quant import rebuild_sph_layers

    fresh = _mlp(seed=1)  # different dense weights: everything must come from the checkpoint
    for record in surgery_records(model):
        rebuild_sph_layers(fresh, **record["kwargs"])
    fresh.load_state_dict(torch.load(path))
    torch.testing.assert_close(fresh(x), expected)
    assert len({m.codebook.data_ptr() for m in fresh.modules() if isinstance(m, SPHLinear)}) == 1


def test_sph_beats_rtn_on_heavy_tailed_weights_at_fewer_bits():
    torch.manual_seed(0)
    linear = nn.Linear(512, 128, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.distributions.StudentT(3.0).sample((128, 512)))
    sph, rtn = nn.Sequential(copy.deepcopy(linear)), nn.Sequential(copy.deepcopy(linear))
    r_sph = quantize_sph(sph, codebook_size=64, radius_bits=2, group_size=256, kmeans_iterations=5,
                         finetune_steps=10)
    r_rtn = quantize_uniform(rtn, "rtn", bits=2, group_size=128)
    assert r_sph["bits_per_weight"] < r_rtn["bits_per_weight"]
    assert r_sph["relative_error"] < r_rtn["relative_error"]


@pytest.mark.parametrize("method", ["rtn", "gptq", "hadamard_rtn", "hadamard_gptq"])
def test_uniform_baselines_match_their_dequantized_weight(method):
    model = _mlp()
    dense = copy.deepcopy(model)
    batches = [torch.randn(32, 64) for _ in range(2)]
    report = quantize_uniform(model, method, bits=3, group_size=32, calibration=batches, clip_grid=20)
    shapes = [(96, 64), (48, 96), (10, 48)]  # 48 inputs = one full and one ragged group of 32
    expected = sum(o * (3 * i + 32 * math.ceil(i / 32)) for o, i in shapes) / sum(o * i for o, i in shapes)
    assert report["quantized_layers"] == 3 and report["bits_per_weight"] == pytest.approx(expected)
    layer = model[0]
    assert isinstance(layer, UniformQuantLinear) and layer.rotate == method.startswith("hadamard")
    x = torch.randn(6, 64)
    torch.testing.assert_close(layer(x), x @ layer.dequantize_unrotated().T + layer.bias, atol=1e-4, rtol=1e-4)
    assert report["relative_error"] < 0.1
    # the quantized model stays close to the dense one
    with torch.no_grad():
        y, y_dense = model(x), dense(x)
    assert float((y - y_dense).norm() / y_dense.norm()) < 0.3


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="codebook_size"):
        SPHQuantizer(codebook_size=100)
    with pytest.raises(ValueError, match="calibration_batches"):
        SPHQuantizer(loss="hessian")
    with pytest.raises(ValueError, match="target"):
        quantize_sph(_mlp(), target="nothing_matches")
    bad = nn.Sequential(nn.Linear(12, 8))
    with pytest.raises(ValueError, match="divisible by 8"):
        quantize_sph(bad, codebook_size=4)
    with pytest.raises(ValueError, match="calibration_batches"):
        UniformQuantizer(method="gptq")
    with pytest.raises(ValueError, match="calibration_batches"):
        UniformQuantizer(method="hadamard_gptq")


def test_layers_reading_one_input_share_one_gptq_sweep():
    """q/k/v-like siblings (equal Hessians) are quantized on their stacked rows: the same weights as one by one."""
    from lit_lowrank.ops.quantization import uniform_dequantize
    from lit_lowrank.quant.uniform import quantize_weight, shared_input_groups

    torch.manual_seed(0)
    siblings = nn.ModuleDict({"q": nn.Linear(64, 32), "k": nn.Linear(64, 16), "o": nn.Linear(64, 64)})
    weights = {n: m.weight.detach().clone() for n, m in siblings.items()}
    x = torch.randn(256, 64)
    h_in, h_other = x.T @ x / 256, (2 * x).T @ (2 * x) / 256
    hessians = {"q": h_in, "k": h_in.clone(), "o": h_other}
    assert shared_input_groups(["q", "k", "o"], hessians) == [["q", "k"], ["o"]]
    assert shared_input_groups(["q", "k"], None) == [["q"], ["k"]]
    quantize_uniform(siblings, "gptq", bits=3, group_size=32, hessians=hessians, clip_grid=10)
    for name, h in (("q", h_in), ("k", h_in), ("o", h_other)):
        alone, _ = quantize_weight(weights[name], 3, 32, "gptq", h, clip_grid=10)
        torch.testing.assert_close(siblings[name].dequantize(), uniform_dequantize(alone))


class _Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, x):
        return self.net(x)

    def test_step(self, batch, batch_idx):
        self.log("test/out", self(batch[0]).abs().mean())

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(48, 64)), batch_size=16)

    def test_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 64)), batch_size=8)

    def predict_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 64)), batch_size=2)


@pytest.mark.parametrize("stage", ["test", "predict"])
def test_callback_quantizes_before_test_and_predict(stage, tmp_path):
    module = _Regressor()
    dense_out = module(torch.ones(2, 64))
    callback = SPHQuantizer(codebook_size=16, radius_bits=3, group_size=32, finetune_steps=5)
    trainer = pl.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, accelerator="cpu")
    if stage == "test":
        trainer.test(module)
        assert trainer.callback_metrics["method/sphquant/bits_per_weight"] == pytest.approx(
            model_bits(module).bits_per_weight)
    else:
        out = trainer.predict(module)[0]
        assert out.shape == dense_out.shape and not torch.equal(out, dense_out)
    assert all(isinstance(module.net[i], SPHLinear) for i in (0, 2, 4))
    assert callback.report["quantized_layers"] == 3


_TRITON_SCRIPT = """
import torch
from lit_lowrank.ops.sphquant.codec import positive_orthant_kmeans, sph_dequantize, sph_directions, sph_pack, sph_quantize
from lit_lowrank.ops.sphquant.triton_gemv import sph_matmul_triton
torch.manual_seed(0)
w = torch.randn(40, 96)
codebook = positive_orthant_kmeans(sph_directions([w]), 16, iterations=2).half()
codes = sph_quantize(w, codebook.float(), 3, 32)
x = torch.randn(3, 96)
y = sph_matmul_triton(x, sph_pack(codes), codebook, codes.radius_min, codes.radius_step, 40, 16, 3, 32,
                      block_o=16, block_v=4)
print(float((y - x @ sph_dequantize(codes, codebook.float()).T).abs().max()))
"""


def test_triton_kernel_matches_reference_in_the_interpreter():
    """The GPU kernel, run on the CPU by Triton's interpreter (ragged row and vector blocks)."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-4


def test_layers_quantized_during_test_accept_a_later_load_state_dict(tmp_path):
    module = _Regressor()
    trainer = pl.Trainer(callbacks=[UniformQuantizer(method="rtn", bits=3, group_size=32)], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         accelerator="cpu")
    trainer.test(module)
    state = copy.deepcopy(module.state_dict())
    module.load_state_dict(state)  # in-place copies into the quantized buffers, outside inference mode
    assert isinstance(module.net[0], UniformQuantLinear)
