"""SPHQuant's math: the spherical codec, GPTQ-style error feedback and the Triton GEMV for a GPU.

One module per concept; ``lit_lowrank.ops.sphquant`` re-exports their public names."""

from __future__ import annotations

from lit_lowrank.ops.sphquant.codec import (  # noqa: F401
    SIGN_BITS,
    SPH_DIM,
    FinetuneLoss,
    SPHCodes,
    angles_from_codebook,
    assign_codewords,
    check_sph_format,
    codebook_from_angles,
    finetune_codebook,
    hessian_error,
    positive_orthant_kmeans,
    quantize_radius,
    sph_bits,
    sph_decode,
    sph_dequantize,
    sph_directions,
    sph_field_widths,
    sph_objective,
    sph_pack,
    sph_quantize,
    sph_unpack_rows,
)
from lit_lowrank.ops.sphquant.feedback import (  # noqa: F401
    FEEDBACK_BLOCK,
    inverse_hessian_factor,
    sph_feedback_sweep,
    sph_quantize_feedback,
)
from lit_lowrank.ops.sphquant.triton_gemv import (  # noqa: F401
    MAX_ROWS,
    sph_matmul_triton,
    triton_available,
)

__all__ = [
    "FEEDBACK_BLOCK",
    "FinetuneLoss",
    "MAX_ROWS",
    "SIGN_BITS",
    "SPHCodes",
    "SPH_DIM",
    "angles_from_codebook",
    "assign_codewords",
    "check_sph_format",
    "codebook_from_angles",
    "finetune_codebook",
    "hessian_error",
    "inverse_hessian_factor",
    "positive_orthant_kmeans",
    "quantize_radius",
    "sph_bits",
    "sph_decode",
    "sph_dequantize",
    "sph_directions",
    "sph_feedback_sweep",
    "sph_field_widths",
    "sph_matmul_triton",
    "sph_objective",
    "sph_pack",
    "sph_quantize",
    "sph_quantize_feedback",
    "sph_unpack_rows",
    "triton_available",
]
