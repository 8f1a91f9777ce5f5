"""SARA's math: step-adaptive rank selection (LRAE, the rank DP) and the factored SVD linear layer.

One module per concept; ``lit_lowrank.ops.sara`` re-exports their public names."""

from __future__ import annotations

from lit_lowrank.ops.sara.rank import (  # noqa: F401
    break_even_rank,
    brute_force_rank_choice,
    factored_macs,
    fraction_rank,
    lrae_data,
    lrae_spectrum,
    online_rank_fraction,
    output_effective_rank,
    output_lrae,
    output_matrices,
    rank_levels,
    solve_rank_dp,
)
from lit_lowrank.ops.sara.svd_linear import (  # noqa: F401
    SVDLinear,
    is_factorable_conv,
    is_pointwise_conv,
)

__all__ = [
    "SVDLinear",
    "break_even_rank",
    "brute_force_rank_choice",
    "factored_macs",
    "fraction_rank",
    "is_factorable_conv",
    "is_pointwise_conv",
    "lrae_data",
    "lrae_spectrum",
    "online_rank_fraction",
    "output_effective_rank",
    "output_lrae",
    "output_matrices",
    "rank_levels",
    "solve_rank_dp",
]
