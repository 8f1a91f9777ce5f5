"""decoding: inference engines for causal LMs — lossless speculative decoding (draft trees verified in one
target forward) with SpecBlock, EAGLE-style and Medusa-style drafters, and stable-rank scoring / Best-of-N."""

from lit_lowrank.decoding.adaptive import BanditAdaptiveDrafter
from lit_lowrank.decoding.drafters import EagleDrafter, MedusaDrafter, SpecBlockDrafter
from lit_lowrank.decoding.engine import (
    DecodeStats,
    Drafter,
    DraftRequest,
    DraftTree,
    RoundFeedback,
    SpeculativeDecoder,
    TargetLM,
    plain_decode,
    skip_decoder_layers,
)
from lit_lowrank.decoding.reference_drafters import OracleDrafter, RandomDrafter
from lit_lowrank.decoding.spirit import (
    AgreementSearchDrafter,
    LayerSkipDrafter,
    OfflineBayesDrafter,
    SpiritDrafter,
    calibrate_length_profile,
    pattern_matchness,
    sequence_matchness,
    skip_sublayers,
)
from lit_lowrank.decoding.stable_rank import (
    BestOfNResult,
    ResponseScorer,
    StableRankReward,
    best_of_n,
    evaluate_pairs,
    pairwise_accuracy,
)

__all__ = [
    "BanditAdaptiveDrafter", "DecodeStats", "DraftRequest", "DraftTree", "Drafter", "EagleDrafter", "MedusaDrafter",
    "RoundFeedback", "SpecBlockDrafter", "SpeculativeDecoder", "TargetLM", "plain_decode", "skip_decoder_layers",
    "OracleDrafter", "RandomDrafter",
]
__all__ += ["BestOfNResult", "ResponseScorer", "StableRankReward", "best_of_n", "evaluate_pairs", "pairwise_accuracy"]
__all__ += ["AgreementSearchDrafter", "LayerSkipDrafter", "OfflineBayesDrafter", "SpiritDrafter",
            "calibrate_length_profile", "pattern_matchness", "sequence_matchness", "skip_sublayers"]
