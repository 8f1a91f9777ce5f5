"""decoding: inference engines for causal LMs — stable-rank Best-of-N and scoring (speculative decoding lands here too)."""

from lit_lowrank.decoding.stable_rank import (
    BestOfNResult,
    ResponseScorer,
    StableRankReward,
    best_of_n,
    evaluate_pairs,
    pairwise_accuracy,
)

__all__ = ["BestOfNResult", "ResponseScorer", "StableRankReward", "best_of_n", "evaluate_pairs", "pairwise_accuracy"]
