"""Moved to :mod:`lit_lowrank.ops.fed_lowshot.secure_sum`; this path keeps working."""

from __future__ import annotations

from lit_lowrank.ops.fed_lowshot.secure_sum import (  # noqa: F401
    DH_EXPONENT_BITS,
    FRAC_BITS,
    MODP_GENERATOR,
    MODP_PRIME,
    decode_fixed_point,
    dh_keypair,
    encode_fixed_point,
    mask_vector,
    pair_mask,
    shared_seed,
    sum_masked,
)

__all__ = [
    "MODP_PRIME",
    "MODP_GENERATOR",
    "DH_EXPONENT_BITS",
    "FRAC_BITS",
    "dh_keypair",
    "shared_seed",
    "encode_fixed_point",
    "decode_fixed_point",
    "pair_mask",
    "mask_vector",
    "sum_masked",
]
