"""Cost-aware update bandit (arm choice on a synthetic reward model, no update when it cannot pay),
the bandit-adapted drafter and Medusa-style heads (both lossless), the feature-cache key."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.decoding import MedusaDrafter, SpecBlockDrafter, SpeculativeDecoder, TargetLM, plain_decode
from lit_lowrank.decoding.adaptive import BanditAdaptiveDrafter, update_scopes
from lit_lowrank.decoding.training import target_feature_cache
from lit_lowrank.models.spec_drafter import BlockDrafterNet, MedusaHeads
from lit_lowrank.ops.update_bandit import UPDATE_ARMS, CostAwareUpdateBandit
from tests.decoding.test_engine import tiny_target


def _play(bandit: CostAwareUpdateBandit, gains: list[float], costs: list[float], rounds: int,
          noise: float = 0.2, seed: int = 0) -> list[int]:
    """A synthetic reward model: pulling arm a shows Δτ ~ N(gains[a], noise²)."""
    g = torch.Generator().manual_seed(seed)
    arms = []
    for _ in range(rounds):
        arm = bandit.select(costs)
        bandit.update(arm, gains[arm] + noise * float(torch.randn((), generator=g)))
        arms.append(arm)
    return arms


@pytest.mark.parametrize("seed", range(3))
def test_bandit_finds_the_known_best_arm(seed):
    # horizon 16: rewards = 16 * gain - cost = 0, 3.8, 10.8, 4.0 -> last_layer is best, full has the largest gain
    gains, costs = [0.0, 0.3, 0.8, 1.0], [0.0, 1.0, 2.0, 12.0]
    bandit = CostAwareUpdateBandit(horizon=16, gain_cap=2.0)
    arms = _play(bandit, gains, costs, rounds=300, seed=seed)
    late = arms[-100:]
    assert late.count(2) >= 80, [late.count(a) for a in range(4)]
    rewards = bandit.expected_rewards(costs)
    assert max(range(4), key=rewards.__getitem__) == 2
    assert abs(bandit.mean_gain(2) - 0.8) < 0.1


def test_bandit_never_updates_when_no_gain_can_pay_its_cost():
    # every cost >= horizon * gain_cap: even the optimistic reward of an unexplored arm is <= 0
    bandit = CostAwareUpdateBandit(horizon=8, gain_cap=1.5)
    arms = _play(bandit, [0.0, 1.5, 1.5, 1.5], [0.0, 12.0, 13.0, 40.0], rounds=50)
    assert arms == [0] * 50


def test_bandit_stops_updating_when_every_gain_is_below_its_cost():
    # possible (cap) but not actual pay-off: explores, then (almost) never updates again
    gains, costs = [0.0, 0.1, 0.2, 0.3], [0.0, 4.0, 6.0, 9.0]  # horizon 16: 1.6 < 4, 3.2 < 6, 4.8 < 9
    bandit = CostAwareUpdateBandit(horizon=16, gain_cap=2.0)
    arms = _play(bandit, gains, costs, rounds=400, noise=0.05)
    updates = [sum(a != 0 for a in arms[i: i + 100]) for i in range(0, 400, 100)]
    assert updates[0] >= 20, "the bandit should try updates while their reward is uncertain"
    # UCB's exploration decays like log(t) / t: updates become rare, never the rule
    assert updates[-1] <= 8 and updates[-1] < updates[0] / 4, updates
    assert all(r <= 0 for r in bandit.expected_rewards(costs)[1:])


def test_bandit_argument_errors():
    with pytest.raises(ValueError, match="costs"):
        CostAwareUpdateBandit().select([0.0, 1.0])
    with pytest.raises(ValueError, match="horizon"):
        CostAwareUpdateBandit(horizon=0)
    with pytest.raises(ValueError, match="arm"):
        CostAwareUpdateBandit().update(7, 0.0)


class _FixedArm(CostAwareUpdateBandit):
    def __init__(self, arm: int) -> None:
        super().__init__(horizon=8, gain_cap=1.0)
        self.arm = arm

    def select(self, costs):
        super().select(costs)
        return self.arm


def _specblock(vocab: int = 23) -> SpecBlockDrafter:
    torch.manual_seed(1)
    return SpecBlockDrafter(BlockDrafterNet(32, vocab, block_size=2, num_heads=4).double(), blocks=2, expand=2)


@pytest.mark.parametrize("arm", [1, 2, 3])
def test_adaptive_drafter_is_lossless_and_updates_only_its_scope(arm):
    target = TargetLM(tiny_target(seed=arm))
    drafter = BanditAdaptiveDrafter(_specblock(), bandit=_FixedArm(arm), interval=2, window=16, steps=1, lr=1e-2)
    before = {n: p.detach().clone() for n, p in drafter.net.named_parameters()}
    engine = SpeculativeDecoder(target, drafter, budget=6)
    for prompt in ([1, 2, 3], [5, 9, 4, 4, 7]):
        prompt = torch.tensor(prompt)
        want, _ = plain_decode(target, prompt, max_new_tokens=20)
        got, _ = engine.generate(prompt, max_new_tokens=20)
        assert torch.equal(got, want)
    assert drafter.arm_counts()[UPDATE_ARMS[arm]] >= 2
    scope = {id(p) for p in update_scopes(drafter.net)[UPDATE_ARMS[arm]]}
    for name, p in drafter.net.named_parameters():
        changed = not torch.equal(p, before[name])
        if id(p) not in scope:
            assert not changed, name
    assert any(not torch.equal(p, before[n]) for n, p in drafter.net.named_parameters() if id(p) in scope)
    drafter.restart()  # a new stream: the deployed weights again
    assert all(torch.equal(p, before[n]) for n, p in drafter.net.named_parameters())


def test_paired_gain_is_zero_for_a_no_op_update():
    target = TargetLM(tiny_target(seed=5))
    drafter = BanditAdaptiveDrafter(_specblock(), bandit=_FixedArm(3), interval=2, window=16, steps=1, lr=1e-300)
    SpeculativeDecoder(target, drafter, budget=6).generate(torch.tensor([1, 2, 3]), max_new_tokens=24)
    assert drafter.gains and all(gain == 0.0 for _, gain in drafter.gains)


def test_paired_gain_compares_the_updated_and_the_previous_weights_on_fresh_labels():
    target = TargetLM(tiny_target(seed=6))
    drafter = BanditAdaptiveDrafter(_specblock(), bandit=_FixedArm(0), interval=100)
    SpeculativeDecoder(target, drafter, budget=6).generate(torch.tensor([2, 7, 1]), max_new_tokens=24)
    params = update_scopes(drafter.net)["full"]
    drafter._before = [p.detach().clone() for p in params]
    torch.manual_seed(0)
    with torch.no_grad():
        for p in params:
            p.add_(0.3 * torch.randn_like(p))
    updated = [p.detach().clone() for p in params]
    fresh = 6
    gain = drafter._paired_gain("full", fresh)
    assert all(torch.equal(p, u) for p, u in zip(params, updated)), "scoring must leave the updated weights"
    embeds, feats, labels = drafter._batch(fresh + drafter.net.context_window)
    labels[:, : labels.shape[1] - fresh] = -100
    after = drafter._chain_tau((embeds, feats, labels))
    with torch.no_grad():
        for p, old in zip(params, drafter._before):
            p.copy_(old)
    assert gain == pytest.approx(after - drafter._chain_tau((embeds, feats, labels)))
    assert drafter._paired_gain("full", 2) is None  # too few fresh labels to score


def test_adaptive_drafter_with_no_update_arm_never_changes_the_drafter():
    target = TargetLM(tiny_target(seed=4))
    drafter = BanditAdaptiveDrafter(_specblock(), bandit=_FixedArm(0), interval=1)
    before = {n: p.detach().clone() for n, p in drafter.net.named_parameters()}
    SpeculativeDecoder(target, drafter, budget=6).generate(torch.tensor([3, 1, 4]), max_new_tokens=16)
    assert drafter.arm_counts()["none"] >= 3
    assert all(torch.equal(p, before[n]) for n, p in drafter.net.named_parameters())


def _medusa(vocab: int = 23, seed: int = 0, depth: int = 3) -> MedusaHeads:
    torch.manual_seed(seed)
    heads = MedusaHeads(32, vocab, num_heads=depth).double()
    with torch.no_grad():
        for lin in heads.res:
            lin.weight.normal_(0, 0.3)  # random heads: wrong guesses exercise the rejection path
    return heads


@pytest.mark.parametrize("seed", range(4))
def test_medusa_greedy_output_equals_plain_greedy(seed):
    target = TargetLM(tiny_target(seed=seed))
    g = torch.Generator().manual_seed(50 + seed)
    prompt = torch.randint(0, 23, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g)
    ref, _ = plain_decode(target, prompt, max_new_tokens=16)
    eos = ref.tolist()[prompt.numel() + 4]
    engine = SpeculativeDecoder(target, MedusaDrafter(_medusa(seed=seed), topk=3), budget=(1, 5, 12, 20)[seed])
    for max_new, eos_id in [(16, None), (16, eos), (1, None), (7, None)]:
        want, _ = plain_decode(target, prompt, max_new_tokens=max_new, eos_token_id=eos_id)
        got, stats = engine.generate(prompt, max_new_tokens=max_new, eos_token_id=eos_id)
        assert torch.equal(got, want), (max_new, eos_id)
        assert stats.drafter_forwards == stats.rounds  # one forward per round, every depth at once


def test_medusa_tree_is_best_first_by_head_probabilities():
    heads = _medusa(depth=2)
    feature = torch.randn(32, dtype=torch.float64)

    class _Req:
        tokens = torch.tensor([1, 2])
        features = feature[None]
        budget = 4

    tree = MedusaDrafter(heads, topk=2).draft(_Req())
    with torch.no_grad():
        probs = torch.softmax(heads(feature), -1)
    top0, top1 = probs[0].topk(2), probs[1].topk(2)
    values = sorted([float(v) for v in top0.values] + [float(a * b) for a in top0.values for b in top1.values],
                    reverse=True)[:4]
    got = []
    for i, (tok, par) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist())):
        got.append(float(probs[0, tok]) if par < 0 else float(probs[0, tree.tokens[par]] * probs[1, tok]))
        assert par < i
    assert sorted(got, reverse=True) == pytest.approx(values)


def test_medusa_training_loss_targets_are_shifted_by_head():
    heads = _medusa(depth=2)
    feats = torch.randn(2, 6, 32, dtype=torch.float64)
    logits = heads(feats)
    # labels = each head's own argmax at the right offset -> accuracy 1 for head 0
    ids = torch.zeros(2, 6, dtype=torch.long)
    ids[:, 1:] = logits[:, :-1, 0].argmax(-1)
    _, parts = heads.training_loss(feats, ids)
    assert parts["acc1"] == 1.0


def test_feature_cache_key_depends_on_window_shape(tmp_path):
    model = tiny_target(seed=0).float()
    stream = torch.randint(0, 23, (48,))
    a = target_feature_cache(model, stream.view(4, 12), tmp_path)
    b = target_feature_cache(model, stream.view(2, 24), tmp_path)  # the same bytes, another shape
    assert a["input_ids"].shape == (4, 12) and b["input_ids"].shape == (2, 24)
    assert b["features"].shape[:2] == (2, 24)
