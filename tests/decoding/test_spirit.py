"""SPIRIT's self-drafting is lossless under every skip pattern; sublayer skipping is exact; the
adaptive drafters stay lossless while they change patterns mid-generation."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_lowrank.decoding import (
    AgreementSearchDrafter,
    LayerSkipDrafter,
    SpeculativeDecoder,
    SpiritDrafter,
    TargetLM,
    calibrate_length_profile,
    pattern_matchness,
    plain_decode,
    skip_sublayers,
)
from lit_lowrank.decoding.engine import DraftRequest
from lit_lowrank.ops.spirit import LengthProfile, SkipPattern, skippable_sublayers

PROMPT = torch.tensor([1, 5, 7, 2, 9, 4])


class FakeClock:
    """Deterministic windows: every draft round takes ``step`` seconds."""

    def __init__(self, step: float = 1.0) -> None:
        self.t, self.step, self.calls = 0.0, step, 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2:  # draft() reads the clock twice: round end, then round start
            self.t += self.step
        return self.t


def tiny_target(layers: int = 4, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=23, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    # float64: no near-ties between differently shaped forwards, so argmax comparisons are exact
    return LlamaForCausalLM(cfg).double().eval()


def all_patterns(layers: int) -> list[SkipPattern]:
    cands = skippable_sublayers(layers)
    return [SkipPattern.from_sublayers([c for c, keep in zip(cands, bits) if keep])
            for bits in itertools.product([0, 1], repeat=len(cands))]


def test_sublayer_skip_equals_zeroed_output_projections_and_is_restored():
    model = tiny_target()
    x = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    full = model(x).logits
    pattern = SkipPattern(attn=frozenset({1, 2}), mlp=frozenset({2}))
    # skipping a pre-norm sublayer == its output projection set to zero (layer 2 also dropped whole)
    zeroed = copy.deepcopy(model)
    for i in pattern.attn:
        zeroed.model.layers[i].self_attn.o_proj.weight.data.zero_()
    for i in pattern.mlp:
        zeroed.model.layers[i].mlp.down_proj.weight.data.zero_()
    with torch.no_grad(), skip_sublayers(model, pattern):
        skipped = model(x).logits
    assert torch.allclose(skipped, zeroed(x).logits, atol=1e-12)
    assert not torch.allclose(skipped, full)
    assert torch.equal(model(x).logits, full)  # restored
    assert type(model.model.layers[1].self_attn).__name__ == "LlamaAttention" and len(model.model.layers) == 4
    with pytest.raises(ValueError, match="outside"):
        with skip_sublayers(model, SkipPattern(attn=frozenset({7}))):
            pass


def test_lossless_under_every_skip_pattern():
    """All 2^4 patterns of a 4-layer model (attn/MLP of layers 1..2): greedy output == plain decoding."""
    target = TargetLM(tiny_target(layers=4))
    ref, _ = plain_decode(target, PROMPT, 16)
    accepted = []
    for pattern in all_patterns(4):
        out, stats = SpeculativeDecoder(target, LayerSkipDrafter(pattern, draft_length=4, stop_confidence=0.0),
                                        budget=6).generate(PROMPT, 16)
        assert torch.equal(out, ref), pattern.describe()
        accepted.append(stats.mean_acceptance_length)
    assert accepted[0] == pytest.approx(5.0)  # no skip: the draft is the target, every token accepted
    assert min(accepted) < 5.0  # skipping changes the draft, and losslessness still holds


def test_sampling_with_a_layer_skip_draft_keeps_the_targets_tokens():
    """The sampling path (the engine's speculative sampling rule) with the self-draft: at top-k 1 the target's
    law is a point mass, so the sampled output must be the greedy one, with drafts accepted on the way."""
    target = TargetLM(tiny_target())
    ref, _ = plain_decode(target, PROMPT, 12)
    g = torch.Generator().manual_seed(0)
    out, stats = SpeculativeDecoder(target, LayerSkipDrafter(SkipPattern(attn=frozenset({1})), stop_confidence=0.0),
                                    budget=6).generate(PROMPT, 12, do_sample=True, temperature=0.8, top_k=1,
                                                       generator=g)
    assert torch.equal(out, ref)
    assert sum(stats.accepted) > 0


def test_drafting_leaves_the_verifier_cache_exactly_as_it_was():
    target = TargetLM(tiny_target())
    ref, _ = plain_decode(target, PROMPT, 10)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in target.cache.layers]
    tree = LayerSkipDrafter(SkipPattern(attn=frozenset({1}), mlp=frozenset({1, 2})), draft_length=5,
                            stop_confidence=0.0).draft(DraftRequest(ref, torch.zeros(0), 8, target))
    assert tree.tokens.numel() == 5 and tree.parents.tolist() == [-1, 0, 1, 2, 3]
    for (k, v), layer in zip(before, target.cache.layers):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)


def test_matchness_of_the_full_model_on_its_own_greedy_output_is_one():
    target = TargetLM(tiny_target())
    ref, _ = plain_decode(target, PROMPT, 24)
    assert pattern_matchness(target, ref, SkipPattern(), window=16) == 1.0  # generated tokens only
    skipped = pattern_matchness(target, ref, SkipPattern(attn=frozenset({1, 2}), mlp=frozenset({1, 2})), window=16)
    assert 0.0 <= skipped < 1.0
    with pytest.raises(ValueError, match="committed"):
        pattern_matchness(target, ref[:-1], SkipPattern())


@pytest.mark.parametrize("kind", ["spirit", "agreement"])
def test_adaptive_drafters_are_lossless_while_adapting(kind):
    model = tiny_target(layers=6)
    target = TargetLM(model)
    profile = LengthProfile(1e-3, 1e-6)
    if kind == "spirit":
        drafter = SpiritDrafter(6, grid=(0.25, 0.5, 0.75), window_tokens=6, profile=profile, stop_confidence=0.0,
                                draft_length=3, clock=FakeClock())
    else:
        drafter = AgreementSearchDrafter(6, ratio=0.5, window_tokens=6, profile=profile, search_windows=4,
                                         draft_length=3, clock=FakeClock())
    engine = SpeculativeDecoder(target, drafter, budget=4)
    for prompt in (PROMPT, PROMPT.flip(0), PROMPT + 3):
        ref, _ = plain_decode(target, prompt, 30)
        out, _ = engine.generate(prompt, 30)
        assert torch.equal(out, ref)
    assert len(drafter.history) >= 6
    assert len({h["pattern"] for h in drafter.history}) > 1  # it did change patterns
    if kind == "spirit":
        assert drafter.events and drafter.events[0]["event"] == "adapted"
        assert {h["phase"] for h in drafter.history} >= {"ratio", "monitor"}


def test_spirit_detects_a_slowdown_and_reenters_the_search_warm_started():
    target = TargetLM(tiny_target(layers=6))
    clock = FakeClock(step=1.0)
    drafter = SpiritDrafter(6, grid=(0.25, 0.5, 0.75), window_tokens=4, profile=LengthProfile(1.0),
                            reference_windows=1, stop_confidence=0.0, clock=clock)
    engine = SpeculativeDecoder(target, drafter, budget=4)
    for _ in range(6):
        engine.generate(PROMPT, 30)
        if drafter.detector.armed:
            break
    assert drafter.phase == "monitor" and drafter.detector.armed
    assert not [e for e in drafter.events if e["event"] == "shift"]  # stationary: no false alarm
    adapted_ratio = drafter.events[0]["ratio"]
    clock.step = 3.0  # the stream shifts: every round now takes 3x as long
    engine.generate(PROMPT, 40)
    shifts = [e for e in drafter.events if e["event"] == "shift"]
    assert len(shifts) >= 1 and shifts[0]["warm_start_ratio"] == pytest.approx(adapted_ratio, abs=0.1)


def test_calibrated_profile_and_errors():
    target = TargetLM(tiny_target())
    prof = calibrate_length_profile(target, lengths=(4, 16), repeats=1)
    assert prof.intercept > 0 and target.cache is None  # its own cache
    with pytest.raises(ValueError, match="draft_length"):
        LayerSkipDrafter(draft_length=0)
    with pytest.raises(ValueError, match="num_layers"):
        SpiritDrafter(2)


def test_spirit_logs_window_metrics_to_a_lightning_logger(tmp_path):
    import csv

    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="spirit")
    target = TargetLM(tiny_target(layers=6))
    drafter = SpiritDrafter(6, grid=(0.25, 0.5, 0.75), window_tokens=4, profile=LengthProfile(1.0),
                            reference_windows=1, stop_confidence=0.0, clock=FakeClock(), logger=logger)
    SpeculativeDecoder(target, drafter, budget=4).generate(PROMPT, 40)
    with open(logger.experiment.metrics_file_path) as f:
        rows = list(csv.DictReader(f))
    keys = {f"method/spirit/{k}" for k in ("ratio", "window_tokens_per_s", "normalised_speed", "acceptance_length",
                                           "search_stage", "adaptation_event")}
    assert keys <= set(rows[0]) and len(rows) == len(drafter.history) >= 4
    assert [int(r["step"]) for r in rows] == [h["window"] for h in drafter.history]
    assert [float(r["method/spirit/ratio"]) for r in rows] == pytest.approx([h["ratio"] for h in drafter.history])
    assert float(rows[-1]["method/spirit/adaptation_event"]) == len(drafter.events) >= 1
    assert {float(r["method/spirit/search_stage"]) for r in rows} == {0.0, 1.0}  # ratio search, then monitor
    assert "method/spirit/pattern" in logger.experiment.hparams
    assert "method/spirit/pattern" in (tmp_path / "spirit" / "version_0" / "hparams.yaml").read_text()
    with pytest.raises(ValueError, match="logger"):
        SpiritDrafter(6, logger=object())


def test_offline_bayes_drafter_calibrates_then_decodes_losslessly_with_the_searched_pattern():
    from lit_lowrank.decoding import OfflineBayesDrafter, sequence_matchness

    target = TargetLM(tiny_target(layers=6))
    drafter = OfflineBayesDrafter(6, ratio=0.5, budget=6, n_init=3, window_tokens=4, profile=LengthProfile(1.0),
                                  stop_confidence=0.0, clock=FakeClock())
    engine = SpeculativeDecoder(target, drafter, budget=4)
    with pytest.raises(RuntimeError, match="calibrate"):
        engine.generate(PROMPT, 4)
    prompts = [PROMPT, PROMPT.flip(0)]
    pattern = drafter.calibrate(target, prompts, max_new_tokens=12)
    assert len(drafter.result.trace) == 6 and pattern == drafter.result.best
    assert pattern.size == 4  # ratio 0.5 of the 8 skippable sublayers
    # the objective it maximised is the matchness of the full model's greedy continuations
    seqs = [plain_decode(target, p, 12)[0] for p in prompts]
    assert drafter.result.best_score == pytest.approx(sequence_matchness(target.model, seqs, [6, 6], pattern))
    assert sequence_matchness(target.model, seqs, [6, 6], SkipPattern()) == 1.0
    for prompt in prompts:
        ref, _ = plain_decode(target, prompt, 20)
        out, _ = engine.generate(prompt, 20)
        assert torch.equal(out, ref)
    assert drafter.pattern == pattern and {h["phase"] for h in drafter.history} == {"fixed"}


def test_pattern_goes_to_log_text_where_the_logger_has_it():
    """W&B-like loggers (with ``log_text``) get the pattern as a table row each time it changes."""

    class TableLogger:
        def __init__(self) -> None:
            self.metrics, self.tables = [], []

        def log_metrics(self, metrics, step=None):
            self.metrics.append((step, metrics))

        def log_text(self, key, columns=None, data=None, step=None):
            self.tables.append((key, columns, data, step))

        def save(self):
            pass

    logger = TableLogger()
    target = TargetLM(tiny_target(layers=6))
    drafter = AgreementSearchDrafter(6, ratio=0.5, window_tokens=4, profile=LengthProfile(1.0), search_windows=3,
                                     stop_confidence=0.0, clock=FakeClock(), logger=logger)
    SpeculativeDecoder(target, drafter, budget=4).generate(PROMPT, 30)
    assert [s for s, _ in logger.metrics] == list(range(len(drafter.history)))
    assert logger.tables and all(t[0] == "method/spirit/pattern" and t[1] == ["window", "ratio", "pattern"]
                                 for t in logger.tables)
    patterns = [t[2][0][2] for t in logger.tables]
    assert all(a != b for a, b in zip(patterns, patterns[1:])) and patterns[-1] == drafter.pattern.describe()
    assert all(t[2][0][1] == pytest.approx(0.5) for t in logger.tables)


def test_reduced_draft_vocabulary_is_lossless_and_drafts_only_its_ids():
    model = tiny_target(seed=3)
    target = TargetLM(model)
    ref, _ = plain_decode(target, PROMPT, max_new_tokens=20)
    vocab = torch.tensor([0, 2, 3, 5, 7, 11, 13, 17, 19])
    drafter = LayerSkipDrafter(SkipPattern(mlp=frozenset({1})), draft_length=4, stop_confidence=0.0, draft_vocab=vocab)
    seen: list[int] = []
    original = drafter.draft

    def spy(request):
        tree = original(request)
        seen.extend(tree.tokens.tolist())
        return tree

    drafter.draft = spy
    out, _ = SpeculativeDecoder(target, drafter, budget=4).generate(PROMPT, max_new_tokens=20)
    assert torch.equal(out, ref)
    assert seen and set(seen) <= set(vocab.tolist())
    # the reduced head is the full head's rows: with every id it drafts what the full head drafts
    request = DraftRequest(PROMPT, None, 4, target)
    target.start(PROMPT[:-1])
    full = LayerSkipDrafter(SkipPattern(mlp=frozenset({1})), draft_length=4, stop_confidence=0.0).draft(request)
    every = LayerSkipDrafter(SkipPattern(mlp=frozenset({1})), draft_length=4, stop_confidence=0.0,
                             draft_vocab=23).draft(request)
    assert torch.equal(full.tokens, every.tokens)
    with pytest.raises(ValueError, match="draft_vocab"):
        LayerSkipDrafter(draft_vocab=0)


def test_priced_oracle_pays_the_skip_drafts_forwards_and_accepts_everything():
    """The ceiling of a layer-skip drafter: its drafting cost, every chain accepted, output unchanged."""
    from lit_lowrank.decoding.reference_drafters import OracleDrafter

    model = tiny_target(seed=4)
    target = TargetLM(model)
    ref, _ = plain_decode(target, PROMPT, max_new_tokens=20)
    skip = LayerSkipDrafter(SkipPattern(attn=frozenset({1})), draft_length=4, stop_confidence=0.0)
    calls: list[int] = []
    original = skip.draft
    skip.draft = lambda request: calls.append(target.length) or original(request)
    out, stats = SpeculativeDecoder(target, OracleDrafter(ref, 4, cost=skip), budget=4).generate(PROMPT, 20)
    assert torch.equal(out, ref)
    assert stats.accepted[:-1] == [4] * (len(stats.accepted) - 1)
    assert len(calls) == stats.rounds and stats.drafter_forwards == 4 * stats.rounds
    short = LayerSkipDrafter(SkipPattern(attn=frozenset({1})), draft_length=2, stop_confidence=0.0)
    with pytest.raises(ValueError, match="cost"):
        SpeculativeDecoder(target, OracleDrafter(ref, 4, cost=short), budget=4).generate(PROMPT, 20)
