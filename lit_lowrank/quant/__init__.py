"""Post-training / QAT weight quantizers: SPHQuant and its uniform baselines (RTN, GPTQ,
Hadamard + RTN), on a shared quantized-linear wrapper and bits accounting."""

from lit_lowrank.quant.linear import QuantizedLinear, buffer_bytes, model_bits, quantized_layers
from lit_lowrank.quant.moe import MXFP4Experts, apply_moe_quant, fp_reference
from lit_lowrank.quant.moe_routing import RouteController
from lit_lowrank.quant.mxfp4 import MXFP4Linear
from lit_lowrank.quant.ptq import PostTrainingQuantizer, collect_hessians, default_forward, select_linears
from lit_lowrank.quant.sphquant import SPHLinear, SPHQuantizer, learn_codebook, quantize_sph, rebuild_sph_layers
from lit_lowrank.quant.uniform import UniformQuantizer, UniformQuantLinear, quantize_uniform, rebuild_uniform_layers

__all__ = [
    "QuantizedLinear", "buffer_bytes", "model_bits", "quantized_layers",
    "MXFP4Experts", "MXFP4Linear", "RouteController", "apply_moe_quant", "fp_reference",
    "PostTrainingQuantizer", "collect_hessians", "default_forward", "select_linears",
    "SPHLinear", "SPHQuantizer", "learn_codebook", "quantize_sph", "rebuild_sph_layers",
    "UniformQuantizer", "UniformQuantLinear", "quantize_uniform", "rebuild_uniform_layers",
]
