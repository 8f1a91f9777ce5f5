"""Tree masks / positions on hand-built trees, the acceptance rules, the valid-prefix mask, rank buckets."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from lit_lowrank.ops.speculative import (
    greedy_tree_accept,
    rank_bucket_targets,
    rank_probabilities,
    recursive_rejection_sample,
    sampling_tree_accept,
    tree_attention_mask,
    tree_depths,
    tree_position_ids,
    valid_prefix_mask,
)

#        root
#       /    \
#      0      1
#     / \      \
#    2   3      4
#    |
#    5
PARENTS = torch.tensor([-1, -1, 0, 0, 1, 2])


def test_tree_depths_positions_and_mask_hand_built():
    assert tree_depths(PARENTS).tolist() == [1, 1, 2, 2, 2, 3]
    assert tree_position_ids(PARENTS, prefix_len=7).tolist() == [7, 7, 8, 8, 8, 9]
    mask = tree_attention_mask(PARENTS, prefix_len=2)
    expected_tree = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert mask.shape == (6, 8)
    assert mask[:, :2].all()
    assert torch.equal(mask[:, 2:], expected_tree)


def test_tree_with_root_as_node_zero():
    parents = torch.tensor([-1, 0, 0, 1])
    assert tree_position_ids(parents, prefix_len=5).tolist() == [5, 6, 6, 7]


@pytest.mark.parametrize("bad", [torch.tensor([0]), torch.tensor([-1, 1]), torch.tensor([-2]), torch.tensor([[-1]])])
def test_bad_parents_are_refused(bad):
    with pytest.raises(ValueError, match="parents"):
        tree_attention_mask(bad)


def test_greedy_tree_accept_follows_argmax():
    #  node 0 = root; root -> 1 (tok 5), 2 (tok 6); 1 -> 3 (tok 7); 2 -> 4 (tok 8)
    tokens = torch.tensor([9, 5, 6, 7, 8])
    parents = torch.tensor([-1, 0, 0, 1, 2])
    argmax = torch.tensor([6, 7, 8, 1, 4])  # root wants 6 -> node 2; node 2 wants 8 -> node 4; node 4 wants 4
    path, bonus = greedy_tree_accept(tokens, parents, argmax)
    assert path == [0, 2, 4] and bonus == 4
    path, bonus = greedy_tree_accept(tokens, parents, torch.tensor([3, 7, 8, 1, 4]))
    assert path == [0] and bonus == 3
    with pytest.raises(ValueError, match="repeated child"):
        greedy_tree_accept(torch.tensor([9, 5, 5]), torch.tensor([-1, 0, 0]), argmax[:3])


P = torch.tensor([0.1, 0.45, 0.3, 0.15], dtype=torch.float64)


def _empirical(draw, n: int) -> torch.Tensor:
    counts = torch.zeros(4)
    for _ in range(n):
        counts[draw()] += 1
    return counts


def _pvalue(counts: torch.Tensor) -> float:
    return chisquare(counts.numpy(), (P * counts.sum()).numpy()).pvalue


def test_rejection_rule_deterministic_candidates_preserves_p():
    g = torch.Generator().manual_seed(0)
    counts = _empirical(lambda: recursive_rejection_sample(P, [1, 3], None, g)[1], 6000)
    assert _pvalue(counts) > 1e-3


def test_rejection_rule_sampled_candidates_preserves_p():
    g = torch.Generator().manual_seed(1)
    q = torch.tensor([0.6, 0.1, 0.1, 0.2], dtype=torch.float64)

    def draw():
        cands = torch.multinomial(q, 2, replacement=True, generator=g).tolist()
        return recursive_rejection_sample(P, cands, q.expand(2, -1), g)[1]

    assert _pvalue(_empirical(draw, 6000)) > 1e-3


def test_statistical_test_detects_a_biased_rule():
    """The same test rejects a rule that is not lossless (accept the first candidate w.p. min(1, p/q))."""
    g = torch.Generator().manual_seed(2)
    q = torch.tensor([0.6, 0.1, 0.1, 0.2], dtype=torch.float64)

    def biased():
        x = int(torch.multinomial(q, 1, generator=g))
        if torch.rand((), generator=g, dtype=torch.float64) < min(1.0, float(P[x] / q[x])):
            return x
        return int(torch.multinomial(P, 1, generator=g))  # wrong: should sample the residual

    assert _pvalue(_empirical(biased, 6000)) < 1e-6


def test_sampling_tree_accept_emits_target_distribution_at_the_root():
    g = torch.Generator().manual_seed(3)
    tokens, parents = torch.tensor([0, 2, 1, 3]), torch.tensor([-1, 0, 0, 1])
    probs = torch.stack([P, P.flip(0), P, P])

    def first():
        path, bonus = sampling_tree_accept(tokens, parents, probs, g)
        return tokens[path[1]].item() if len(path) > 1 else bonus

    assert _pvalue(_empirical(first, 6000)) > 1e-3


def test_valid_prefix_mask_hand_example():
    v = 5
    targets = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    guesses = torch.tensor([[1, 0, 3, 4], [1, 2, 3, 0]])  # row 0 wrong at j=1, row 1 wrong at j=3
    logits = torch.nn.functional.one_hot(guesses, v).float()
    mask = valid_prefix_mask(logits, targets)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    valid = torch.tensor([[True, True, True, True], [True, False, True, True]])
    assert valid_prefix_mask(logits, targets, valid).tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    ignored = torch.tensor([[1, -100, 3, 4]] * 2)
    assert valid_prefix_mask(logits, ignored)[0].tolist() == [1, 0, 0, 0]


def test_rank_bucket_targets_hand_example():
    logits = torch.tensor([[9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]]).expand(7, -1)
    targets = torch.tensor([0, 1, 2, 3, 7, 8, -1])  # ranks 1, 2, 3, 4, 8, 9, miss
    assert rank_bucket_targets(logits, targets).tolist() == [0, 1, 2, 2, 3, 4, 4]
    # ties count in the target's favour: equal logits share the better rank
    tied = torch.tensor([[1.0, 1.0, 0.0]])
    assert rank_bucket_targets(tied, torch.tensor([1])).tolist() == [0]


def test_rank_probabilities_spread_bucket_mass():
    probs = torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1])
    per_rank = rank_probabilities(probs)
    assert per_rank.shape == (8,)
    torch.testing.assert_close(per_rank, torch.tensor([0.4, 0.2, 0.1, 0.1, 0.025, 0.025, 0.025, 0.025]))
    torch.testing.assert_close(per_rank.sum(), torch.tensor(0.9))


def _naive_ancestors(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        while p >= 0:
            anc[i, p] = True
            p = parents[p]
    return anc


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_layout_and_greedy_accept_match_a_naive_walk(seed):
    """Pointer-doubling ancestors, depths and the vectorised greedy rule against loops, on random trees."""
    from lit_lowrank.ops.speculative import accept_greedy, tree_ancestor_matrix, tree_layout

    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 40, (1,), generator=g))
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    assert torch.equal(tree_ancestor_matrix(torch.tensor(parents)), _naive_ancestors(parents))
    # distinct siblings: a child's token is its index among its parent's children
    tokens, count = [0] * n, {}
    for i, p in enumerate(parents[1:], start=1):
        tokens[i] = count.get(p, 0)
        count[p] = tokens[i] + 1
    layout = tree_layout(torch.tensor(tokens), torch.tensor(parents))
    assert torch.equal(layout.depths, _naive_ancestors(parents).sum(-1) - 1)
    for _ in range(5):
        argmax = torch.randint(0, 3, (n,), generator=g)
        path = [0]
        while True:  # the naive walk
            kids = [c for c in range(n) if parents[c] == path[-1] and tokens[c] == int(argmax[path[-1]])]
            if not kids:
                break
            path.append(kids[0])
        assert accept_greedy(layout, argmax) == (path, int(argmax[path[-1]]))


def test_chain_layout_needs_no_mask():
    from lit_lowrank.ops.speculative import accept_greedy, tree_layout

    layout = tree_layout(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, 1, 2]))
    assert layout.chain and layout.attention_mask(10) is None
    assert layout.position_ids(10).tolist() == [10, 11, 12, 13]
    assert accept_greedy(layout, torch.tensor([6, 7, 1, 3])) == ([0, 1, 2], 1)
    assert accept_greedy(layout, torch.tensor([6, 7, 8, 3])) == ([0, 1, 2, 3], 3)
