"""Federated low-shot detection's math: SecAgg-style masked sums, NIW moments, the prior bank and episode evaluation.

One module per concept; ``lit_lowrank.ops.fed_lowshot`` re-exports their public names."""

from __future__ import annotations

from lit_lowrank.ops.fed_lowshot.episodes import (  # noqa: F401
    finetuned_head_classify,
    gaussian_classify,
    macro_f1,
    mean_ci,
    prototype_classify,
    sample_episode,
    sampled_logistic_classify,
)
from lit_lowrank.ops.fed_lowshot.niw import (  # noqa: F401
    class_moments,
    moments_to_gaussian,
    niw_map,
)
from lit_lowrank.ops.fed_lowshot.prior_bank import (  # noqa: F401
    PriorBank,
    gated_prior,
    global_prior,
    retrieve_prior,
    similarity_gate,
)
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
    "DH_EXPONENT_BITS",
    "FRAC_BITS",
    "MODP_GENERATOR",
    "MODP_PRIME",
    "PriorBank",
    "class_moments",
    "decode_fixed_point",
    "dh_keypair",
    "encode_fixed_point",
    "finetuned_head_classify",
    "gated_prior",
    "gaussian_classify",
    "global_prior",
    "macro_f1",
    "mask_vector",
    "mean_ci",
    "moments_to_gaussian",
    "niw_map",
    "pair_mask",
    "prototype_classify",
    "retrieve_prior",
    "sample_episode",
    "sampled_logistic_classify",
    "shared_seed",
    "similarity_gate",
    "sum_masked",
]
