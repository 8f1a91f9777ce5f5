"""decoding: inference engines for causal LMs — lossless speculative decoding (draft trees verified in one
target forward) with SpecBlock, EAGLE-style, Medusa-style, prompt-lookup and hybrid drafters sized by a fitted
verification-cost model, a ``generate``-shaped entry point (:func:`speculative_generate`), the drafters shipped
for SmolLM2, and stable-rank scoring / Best-of-N."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_lowrank._lazy import lazy_exports

if TYPE_CHECKING:  # IDEs see the real names (F401: unused at run time; tests/test_exports.py checks them)
    from lit_lowrank.decoding.adaptive import BanditAdaptiveDrafter  # noqa: F401
    from lit_lowrank.decoding.cost import VerifyCost, fit_verify_cost  # noqa: F401
    from lit_lowrank.decoding.drafters import EagleDrafter, MedusaDrafter, SpecBlockDrafter  # noqa: F401
    from lit_lowrank.decoding.engine import (  # noqa: F401
        DecodeStats,
        Drafter,
        DraftRequest,
        DraftTree,
        RoundFeedback,
        SpeculativeDecoder,
        TargetLM,
        plain_decode,
        sampling_probs,
        skip_decoder_layers,
    )
    from lit_lowrank.decoding.generate import speculative_generate  # noqa: F401
    from lit_lowrank.decoding.hybrid import HybridDrafter, NgramDrafter  # noqa: F401
    from lit_lowrank.decoding.reference_drafters import OracleDrafter, RandomDrafter  # noqa: F401
    from lit_lowrank.decoding.shipped import load_drafter, specblock_hybrid  # noqa: F401
    from lit_lowrank.decoding.spirit import AgreementSearchDrafter, OfflineBayesDrafter, SpiritDrafter  # noqa: F401
    from lit_lowrank.decoding.spirit_skip import (  # noqa: F401
        LayerSkipDrafter,
        calibrate_length_profile,
        pattern_matchness,
        sequence_matchness,
        skip_sublayers,
    )
    from lit_lowrank.decoding.stable_rank import (  # noqa: F401
        BestOfNResult,
        ResponseScorer,
        StableRankReward,
        best_of_n,
        evaluate_pairs,
        pairwise_accuracy,
        score_pairs,
    )

_EXPORTS = {
    'VerifyCost': 'lit_lowrank.decoding.cost',
    'fit_verify_cost': 'lit_lowrank.decoding.cost',
    'speculative_generate': 'lit_lowrank.decoding.generate',
    'HybridDrafter': 'lit_lowrank.decoding.hybrid',
    'NgramDrafter': 'lit_lowrank.decoding.hybrid',
    'load_drafter': 'lit_lowrank.decoding.shipped',
    'specblock_hybrid': 'lit_lowrank.decoding.shipped',
    'sampling_probs': 'lit_lowrank.decoding.engine',
    'OracleDrafter': 'lit_lowrank.decoding.reference_drafters',
    'RandomDrafter': 'lit_lowrank.decoding.reference_drafters',
    'BanditAdaptiveDrafter': 'lit_lowrank.decoding.adaptive',
    'EagleDrafter': 'lit_lowrank.decoding.drafters',
    'MedusaDrafter': 'lit_lowrank.decoding.drafters',
    'SpecBlockDrafter': 'lit_lowrank.decoding.drafters',
    'DecodeStats': 'lit_lowrank.decoding.engine',
    'Drafter': 'lit_lowrank.decoding.engine',
    'DraftRequest': 'lit_lowrank.decoding.engine',
    'DraftTree': 'lit_lowrank.decoding.engine',
    'RoundFeedback': 'lit_lowrank.decoding.engine',
    'SpeculativeDecoder': 'lit_lowrank.decoding.engine',
    'TargetLM': 'lit_lowrank.decoding.engine',
    'plain_decode': 'lit_lowrank.decoding.engine',
    'skip_decoder_layers': 'lit_lowrank.decoding.engine',
    'AgreementSearchDrafter': 'lit_lowrank.decoding.spirit',
    'LayerSkipDrafter': 'lit_lowrank.decoding.spirit_skip',
    'OfflineBayesDrafter': 'lit_lowrank.decoding.spirit',
    'SpiritDrafter': 'lit_lowrank.decoding.spirit',
    'calibrate_length_profile': 'lit_lowrank.decoding.spirit_skip',
    'pattern_matchness': 'lit_lowrank.decoding.spirit_skip',
    'sequence_matchness': 'lit_lowrank.decoding.spirit_skip',
    'skip_sublayers': 'lit_lowrank.decoding.spirit_skip',
    'BestOfNResult': 'lit_lowrank.decoding.stable_rank',
    'ResponseScorer': 'lit_lowrank.decoding.stable_rank',
    'StableRankReward': 'lit_lowrank.decoding.stable_rank',
    'best_of_n': 'lit_lowrank.decoding.stable_rank',
    'evaluate_pairs': 'lit_lowrank.decoding.stable_rank',
    'pairwise_accuracy': 'lit_lowrank.decoding.stable_rank',
    'score_pairs': 'lit_lowrank.decoding.stable_rank',
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
