"""Post-training / QAT weight quantizers: SPHQuant and its uniform baselines (RTN, GPTQ,
Hadamard + RTN), on a shared quantized-linear wrapper and bits accounting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.quant.linear import QuantizedLinear, buffer_bytes, model_bits, quantized_layers, set_decode_cache  # noqa: F401
    from lit_lowrank.quant.moe import MXFP4Experts, apply_moe_quant, fp_reference  # noqa: F401
    from lit_lowrank.quant.moe_routing import RouteController  # noqa: F401
    from lit_lowrank.quant.mxfp4 import MXFP4Linear  # noqa: F401
    from lit_lowrank.quant.pretrained import load_quantized  # noqa: F401
    from lit_lowrank.quant.ptq import PostTrainingQuantizer, collect_hessians, default_forward, select_linears  # noqa: F401
    from lit_lowrank.quant.sphquant import SPHLinear, SPHQuantizer, learn_codebook, quantize_sph, rebuild_sph_layers  # noqa: F401
    from lit_lowrank.quant.uniform import UniformQuantizer, UniformQuantLinear, quantize_uniform, rebuild_uniform_layers  # noqa: F401

_EXPORTS = {
    'QuantizedLinear': 'lit_lowrank.quant.linear',
    'buffer_bytes': 'lit_lowrank.quant.linear',
    'model_bits': 'lit_lowrank.quant.linear',
    'quantized_layers': 'lit_lowrank.quant.linear',
    'set_decode_cache': 'lit_lowrank.quant.linear',
    'load_quantized': 'lit_lowrank.quant.pretrained',
    'MXFP4Experts': 'lit_lowrank.quant.moe',
    'apply_moe_quant': 'lit_lowrank.quant.moe',
    'fp_reference': 'lit_lowrank.quant.moe',
    'RouteController': 'lit_lowrank.quant.moe_routing',
    'MXFP4Linear': 'lit_lowrank.quant.mxfp4',
    'PostTrainingQuantizer': 'lit_lowrank.quant.ptq',
    'collect_hessians': 'lit_lowrank.quant.ptq',
    'default_forward': 'lit_lowrank.quant.ptq',
    'select_linears': 'lit_lowrank.quant.ptq',
    'SPHLinear': 'lit_lowrank.quant.sphquant',
    'SPHQuantizer': 'lit_lowrank.quant.sphquant',
    'learn_codebook': 'lit_lowrank.quant.sphquant',
    'quantize_sph': 'lit_lowrank.quant.sphquant',
    'rebuild_sph_layers': 'lit_lowrank.quant.sphquant',
    'UniformQuantizer': 'lit_lowrank.quant.uniform',
    'UniformQuantLinear': 'lit_lowrank.quant.uniform',
    'quantize_uniform': 'lit_lowrank.quant.uniform',
    'rebuild_uniform_layers': 'lit_lowrank.quant.uniform',
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
