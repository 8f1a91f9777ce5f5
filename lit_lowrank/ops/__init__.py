"""Pure torch functions (no Lightning) that methods and task modules call."""

from lit_lowrank.ops.camel import adapt_appraiser, basin_distance, camel_reward, classification_loss, ddim_sample
from lit_lowrank.ops.castor import (
    bounded_beta,
    castor_hop,
    castor_mix,
    router_mass_by_homophily,
    router_probabilities,
)
from lit_lowrank.ops.fb import (
    fb_loss,
    orthonormality_loss,
    sr_effective_rank,
    successor_measure,
    value_error_bound,
    zero_shot_z,
)
from lit_lowrank.ops.grad_cosine import GradientCosine, gradient_cosine
from lit_lowrank.ops.graph_propagation import as_edge_index, local_homophily, normalized_adjacency
from lit_lowrank.ops.grpo import group_advantages, grpo_loss
from lit_lowrank.ops.homodyne import fidelity_pure, hermite_functions, purity, sample_homodyne
from lit_lowrank.ops.imle import bin_homodyne, imle_reconstruct
from lit_lowrank.ops.lowrank import (
    effective_rank_of,
    low_rank_approx,
    low_rank_factors,
    rank_for_energy,
    singular_values,
    stable_rank_of,
    truncated_svd,
)
from lit_lowrank.ops.macs import conv_macs, count_macs, linear_macs
from lit_lowrank.ops.mxfp4 import mxfp4_bits, mxfp4_decode, mxfp4_encode, mxfp4_fake_quant, mxfp4_quantize
from lit_lowrank.ops.packing import block_causal_mask, cu_seqlens_from_doc_ids, position_ids_from_doc_ids
from lit_lowrank.ops.polar import (
    landing_direction,
    orthogonality_error,
    polar_delta_weight,
    polar_init_,
    polar_stable_rank,
    shorten_to_safe_region,
)
from lit_lowrank.ops.quantization import (
    BitsBreakdown,
    gptq_quantize,
    hadamard_rotate,
    pack_fields,
    rtn_quantize,
    uniform_dequantize,
    unpack_fields,
)
from lit_lowrank.ops.rank_allocation import allocate_ranks, uniform_ranks, weighted_residual_energy
from lit_lowrank.ops.rubiconv import (
    RubiConvPlan,
    cu_seqlens_for_rows,
    packed_long_conv,
    packed_long_conv_reference,
    packed_short_conv,
    plan_packed_conv,
)
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
from lit_lowrank.ops.sara.rank import (
    break_even_rank,
    factored_macs,
    fraction_rank,
    lrae_data,
    lrae_spectrum,
    online_rank_fraction,
    output_effective_rank,
    output_lrae,
    rank_levels,
    solve_rank_dp,
)
from lit_lowrank.ops.sds_lora import (
    SDSLoRAFunction,
    lora_factor_grads,
    orthonormal_basis,
    sds_factor_grads,
    sds_lora_delta,
    sign_canonical_qr,
)
from lit_lowrank.ops.sequence_signals import mean_log_prob, negative_entropy, self_certainty
from lit_lowrank.ops.sliced_wasserstein import sliced_wasserstein_1, wasserstein_1d
from lit_lowrank.ops.specdrop import (
    diagonal_dominance,
    grouped_sensitivity,
    load_balancing_loss,
    sensitivity_matrix,
    soft_moe_weights,
    specdrop_merge,
    specdrop_weights,
    topk_routing,
)
from lit_lowrank.ops.speculative import (
    greedy_tree_accept,
    rank_bucket_targets,
    rank_probabilities,
    recursive_rejection_sample,
    sampling_tree_accept,
    tree_attention_mask,
    tree_position_ids,
    valid_prefix_mask,
)
from lit_lowrank.ops.sphquant.codec import (
    angles_from_codebook,
    codebook_from_angles,
    finetune_codebook,
    positive_orthant_kmeans,
    sph_dequantize,
    sph_quantize,
)
from lit_lowrank.ops.stable_rank import stable_rank
from lit_lowrank.ops.stac_r.compress import compress_activation, decompress_activation, gradient_bridge, stac_r_linear
from lit_lowrank.ops.stac_r.saved_surface import SurfaceReport, saved_surface
from lit_lowrank.ops.stac_r.saved_tensors import SavedTensorCounter, measure_saved_bytes
from lit_lowrank.ops.update_bandit import UPDATE_ARMS, CostAwareUpdateBandit

# The names imported above, once, sorted; a literal so that ruff and IDEs read it (tests/test_exports.py checks).
__all__ = [
    "BitsBreakdown", "CostAwareUpdateBandit", "GradientCosine", "RubiConvPlan", "SDSLoRAFunction", "SaMAShape",
    "SavedTensorCounter", "SurfaceReport", "UPDATE_ARMS", "adapt_appraiser", "allocate_ranks", "angles_from_codebook",
    "as_edge_index", "basin_distance", "bin_homodyne", "block_causal_mask", "bounded_beta", "break_even_rank",
    "camel_reward", "castor_hop", "castor_mix", "classification_loss", "codebook_from_angles", "compress_activation",
    "conv_macs", "count_macs", "cu_seqlens_for_rows", "cu_seqlens_from_doc_ids", "ddim_sample", "decompress_activation",
    "diagonal_dominance", "effective_rank_of", "factored_macs", "fb_loss", "fidelity_pure", "finetune_codebook",
    "fraction_rank", "gptq_quantize", "gradient_bridge", "gradient_cosine", "greedy_tree_accept", "group_advantages",
    "grouped_sensitivity", "grpo_loss", "hadamard_rotate", "hermite_functions", "imle_reconstruct", "landing_direction",
    "linear_macs", "load_balancing_loss", "local_homophily", "lora_budget", "lora_factor_grads", "low_rank_approx",
    "low_rank_factors", "lrae_data", "lrae_spectrum", "mean_log_prob", "measure_saved_bytes", "mxfp4_bits",
    "mxfp4_decode", "mxfp4_encode", "mxfp4_fake_quant", "mxfp4_quantize", "negative_entropy", "normalized_adjacency",
    "online_rank_fraction", "orthogonality_error", "orthonormal_basis", "orthonormality_loss", "output_effective_rank",
    "output_lrae", "pack_fields", "packed_long_conv", "packed_long_conv_reference", "packed_short_conv",
    "plan_packed_conv", "polar_delta_weight", "polar_init_", "polar_stable_rank", "position_ids_from_doc_ids",
    "positive_orthant_kmeans", "purity", "rank_bucket_targets", "rank_for_energy", "rank_levels", "rank_probabilities",
    "recursive_rejection_sample", "router_mass_by_homophily", "router_probabilities", "rtn_quantize", "sama_apply",
    "sama_delta_weight", "sama_init", "sama_matched_to_lora", "sama_min_parameters", "sama_rank_report", "sama_shape",
    "sample_homodyne", "sampling_tree_accept", "saved_surface", "sds_factor_grads", "sds_lora_delta", "self_certainty",
    "sensitivity_matrix", "shorten_to_safe_region", "sign_canonical_qr", "singular_values", "sliced_wasserstein_1",
    "soft_moe_weights", "solve_rank_dp", "specdrop_merge", "specdrop_weights", "sph_dequantize", "sph_quantize",
    "sr_effective_rank", "stable_rank", "stable_rank_of", "stac_r_linear", "successor_measure", "topk_routing",
    "tree_attention_mask", "tree_position_ids", "truncated_svd", "uniform_dequantize", "uniform_ranks", "unpack_fields",
    "valid_prefix_mask", "value_error_bound", "wasserstein_1d", "weighted_residual_energy", "zero_shot_z",
]
