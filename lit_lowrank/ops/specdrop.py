"""SpecDrop branch merging and the routing math of its baselines (pure torch, no Lightning).

SpecDrop (METHODS.md §2) merges ``K`` parallel branches ``f_k`` with weights fixed by
the sample's category ``c`` (from dataset metadata): branch ``b(c)`` gets ``p_a``,
every other branch the leakage ``p_i > 0``, and the sum is divided by the fixed,
category-independent denominator ``D = p_a + (K - 1) p_i``:

    y = sum_k w_k f_k(x) / D,   w_k = p_a if k == b(c) else p_i.

No router parameters, no auxiliary loss. Averaged over uniformly distributed
categories every branch carries exactly ``1/K``, which is why the tag-free merge
(the plain mean of the branches) is the consistent inference mode without tags;
``p_a == p_i`` *is* the multi-branch No-Routing baseline.

The baselines' routers live here too: top-k softmax routing with the Switch
Transformer load-balancing loss, Soft MoE dispatch/combine weights, and the
per-branch pruning-sensitivity statistics used to measure specialisation.

.. code-block:: python

    from lit_lowrank.ops import specdrop_merge

    outs = [branch(x) for branch in branches]                   # K tensors (B, H)
    y = specdrop_merge(outs, category, p_active=1.0, p_inactive=0.1)   # (B, H)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _check_probabilities(p_active: float, p_inactive: float) -> None:
    if not p_active > 0:
        raise ValueError(f"`p_active`={p_active!r}: expected a weight > 0 for the category's own branch.")
    if not p_inactive > 0:
        raise ValueError(
            f"`p_inactive`={p_inactive!r}: expected a leakage weight > 0 (p_inactive = 0 is hard routing, "
            "not SpecDrop)."
        )
    if p_inactive > p_active:
        raise ValueError(
            f"`p_inactive`={p_inactive!r} exceeds `p_active`={p_active!r}: the category's own branch must "
            "carry at least the leakage weight (p_active == p_inactive is No-Routing)."
        )


def specdrop_denominator(num_branches: int, p_active: float, p_inactive: float) -> float:
    """The fixed denominator ``D = p_a + (K - 1) p_i`` (the same for every category)."""
    _check_probabilities(p_active, p_inactive)
    if num_branches < 1:
        raise ValueError(f"`num_branches`={num_branches!r}: expected an integer >= 1.")
    return p_active + (num_branches - 1) * p_inactive


def branch_of_category(
    category: Tensor, num_branches: int, category_to_branch: Sequence[int] | Tensor | None = None
) -> Tensor:
    """The branch index ``b(c)`` of each category tag, with the checks every caller needs.

    Args:
        category: integer tags, any shape (``(B,)`` per sample, ``(B, T)`` per token).
        num_branches: ``K``.
        category_to_branch: ``C`` branch indices, one per category, when the number of
            categories ``C`` differs from ``K`` (several categories may share a branch).
            ``None``: the identity, categories must lie in ``[0, K)``.

    Returns:
        Long tensor shaped like ``category`` with values in ``[0, K)``.

    Raises:
        ValueError: a float tag, a missing tag (negative, e.g. ``-1`` padding) or a tag
            outside the range, naming the value and the expected range.
    """
    if not isinstance(category, Tensor):
        raise TypeError(f"`category` must be an integer Tensor of category tags, got {type(category).__name__}.")
    if category.is_floating_point() or category.is_complex() or category.dtype == torch.bool:
        raise ValueError(f"`category` must hold integer tags, got dtype {category.dtype}.")
    category = category.long()
    if category.numel() == 0:
        return category
    low, high = int(category.min()), int(category.max())
    if low < 0:
        raise ValueError(
            f"`category` contains {low}: a missing category tag. SpecDrop needs every sample's category "
            "(from dataset metadata); use the tag-free uniform merge for untagged inference."
        )
    if category_to_branch is None:
        if high >= num_branches:
            raise ValueError(
                f"`category` contains {high}, expected tags in [0, {num_branches}) (num_branches={num_branches}); "
                "pass `category_to_branch` to map C categories onto K branches."
            )
        return category
    table = torch.as_tensor(category_to_branch, dtype=torch.long, device=category.device)
    if table.dim() != 1 or table.numel() == 0:
        raise ValueError(f"`category_to_branch` must be a non-empty list of branch indices, got {category_to_branch!r}.")
    if int(table.min()) < 0 or int(table.max()) >= num_branches:
        raise ValueError(
            f"`category_to_branch`={table.tolist()} names a branch outside [0, {num_branches}) "
            f"(num_branches={num_branches})."
        )
    if high >= table.numel():
        raise ValueError(
            f"`category` contains {high}, but `category_to_branch` maps only {table.numel()} categories "
            f"(expected tags in [0, {table.numel()}))."
        )
    return table[category]


def specdrop_weights(
    category: Tensor,
    num_branches: int,
    p_active: float,
    p_inactive: float,
    category_to_branch: Sequence[int] | Tensor | None = None,
) -> Tensor:
    """Normalised SpecDrop weights ``w_k / D``: ``(K, *category.shape)``, summing to 1 over ``K``.

    Computed through the ratio ``r = p_i / p_a`` (active ``1 / (1 + (K-1) r)``, inactive
    ``r / (1 + (K-1) r)``), which equals ``p / D`` and makes ``p_a == p_i`` give exactly
    ``1/K``: the No-Routing weights, bit for bit.
    """
    _check_probabilities(p_active, p_inactive)
    branch = branch_of_category(category, num_branches, category_to_branch)
    ratio = p_inactive / p_active
    denominator = 1.0 + (num_branches - 1) * ratio
    active, inactive = 1.0 / denominator, ratio / denominator
    ks = torch.arange(num_branches, device=branch.device).view(-1, *([1] * branch.dim()))
    weights = torch.full((num_branches, *branch.shape), inactive, device=branch.device)
    return weights.masked_fill(ks == branch.unsqueeze(0), active)


def specdrop_dropout_weights(
    category: Tensor,
    num_branches: int,
    p_active: float,
    p_inactive: float,
    category_to_branch: Sequence[int] | Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The stochastic variant: branch masks ``m_k ~ Bernoulli(p_k)`` over the same fixed ``D``.

    Returns ``m_k / D``, shape ``(K, *category.shape)``; its expectation is
    :func:`specdrop_weights`. Needs ``p_a, p_i <= 1`` (they are probabilities here).
    """
    if p_active > 1 or p_inactive > 1:
        raise ValueError(
            f"stochastic SpecDrop keeps branch k with probability p: `p_active`={p_active!r} and "
            f"`p_inactive`={p_inactive!r} must be <= 1."
        )
    denominator = specdrop_denominator(num_branches, p_active, p_inactive)
    branch = branch_of_category(category, num_branches, category_to_branch)
    ks = torch.arange(num_branches, device=branch.device).view(-1, *([1] * branch.dim()))
    keep = torch.where(ks == branch.unsqueeze(0), p_active, p_inactive).float()
    return torch.bernoulli(keep, generator=generator) / denominator


def uniform_weights(num_branches: int, lead_shape: Sequence[int], device: torch.device | None = None) -> Tensor:
    """The tag-free (and No-Routing) merge weights: ``1/K`` everywhere, ``(K, *lead_shape)``."""
    return torch.full((num_branches, *lead_shape), 1.0 / num_branches, device=device)


def weighted_branch_sum(branch_outputs: Sequence[Tensor] | Tensor, weights: Tensor) -> Tensor:
    """``sum_k weights[k] * branch_outputs[k]``, the weights broadcast over trailing dims.

    Args:
        branch_outputs: ``K`` tensors of equal shape ``(*lead, *rest)``, or one stacked
            ``(K, *lead, *rest)`` tensor.
        weights: ``(K, *lead)``, e.g. ``(K, B)`` per sample or ``(K, B, T)`` per token.

    Returns:
        ``(*lead, *rest)``.
    """
    stacked = branch_outputs if isinstance(branch_outputs, Tensor) else torch.stack(list(branch_outputs))
    num, lead = weights.shape[0], tuple(weights.shape[1:])
    if stacked.shape[0] != num:
        raise ValueError(f"{stacked.shape[0]} branch outputs but weights for {num} branches (weights {tuple(weights.shape)}).")
    if tuple(stacked.shape[1 : 1 + len(lead)]) != lead:
        raise ValueError(
            f"branch outputs of shape {tuple(stacked.shape[1:])} do not start with the weights' leading shape "
            f"{lead}: a category (or routing decision) is needed for each of the leading positions."
        )
    w = weights.to(stacked.dtype).reshape(num, *lead, *([1] * (stacked.dim() - 1 - len(lead))))
    return (w * stacked).sum(0)


def specdrop_merge(
    branch_outputs: Sequence[Tensor] | Tensor,
    category: Tensor,
    p_active: float,
    p_inactive: float,
    category_to_branch: Sequence[int] | Tensor | None = None,
) -> Tensor:
    """SpecDrop: ``y = sum_k w_k f_k / (p_a + (K-1) p_i)`` with ``w_k = p_a`` on the category's branch.

    Args:
        branch_outputs: ``K`` branch outputs of shape ``(B, ...)`` (or stacked ``(K, B, ...)``).
        category: ``(B,)`` integer tags (or ``(B, T)`` for per-token tags on ``(B, T, ...)``).
        p_active: weight of the category's own branch.
        p_inactive: leakage weight of every other branch, ``0 < p_i <= p_a``.
        category_to_branch: ``C`` branch indices when there are ``C != K`` categories.

    Returns:
        The merged output ``(B, ...)`` at single-branch scale.

    Raises:
        ValueError: missing/out-of-range tags, bad weights, mismatched shapes.

    .. code-block:: python

        y = specdrop_merge([f(x) for f in branches], batch["category"], 1.0, 0.1)
    """
    if category is None:
        raise ValueError(
            "specdrop_merge: `category` is None. SpecDrop needs each sample's category tag; for tag-free "
            "inference merge with uniform_weights (the mean of the branches)."
        )
    num = branch_outputs.shape[0] if isinstance(branch_outputs, Tensor) else len(branch_outputs)
    return weighted_branch_sum(branch_outputs, specdrop_weights(category, num, p_active, p_inactive, category_to_branch))


# --------------------------------------------------------------------------- baselines' routers


def topk_routing(router_logits: Tensor, top_k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Softmax router with top-k selection (renormalised over the selected experts, as in Mixtral).

    Args:
        router_logits: ``(..., K)``.
        top_k: experts kept per position, ``1 <= top_k <= K`` (``K``: dense softmax gating).

    Returns:
        ``(weights, probs, mask)``, each ``(..., K)``: merge weights (zero off the top-k,
        summing to 1), the full softmax probabilities, and the 0/1 dispatch mask.
    """
    num = router_logits.shape[-1]
    if not 1 <= top_k <= num:
        raise ValueError(f"`router_top_k`={top_k!r}: expected an integer in [1, {num}] (the number of branches).")
    probs = router_logits.float().softmax(-1)
    index = probs.topk(top_k, dim=-1).indices
    mask = torch.zeros_like(probs).scatter_(-1, index, 1.0)
    kept = probs * mask
    return kept / kept.sum(-1, keepdim=True), probs, mask


def load_balancing_loss(router_probs: Tensor, dispatch_mask: Tensor) -> Tensor:
    """Switch Transformer auxiliary loss ``K * sum_k f_k P_k`` (Fedus et al. 2022, eq. 4).

    ``f_k``: fraction of routing assignments that went to expert ``k`` (top-k counts
    normalised to sum to 1); ``P_k``: mean router probability of ``k``. Equals 1 for a
    perfectly uniform router and ``K`` when one expert takes everything.

    Args:
        router_probs: ``(..., K)`` softmax probabilities.
        dispatch_mask: ``(..., K)`` 0/1 assignments.
    """
    if router_probs.shape != dispatch_mask.shape:
        raise ValueError(f"router_probs {tuple(router_probs.shape)} and dispatch_mask {tuple(dispatch_mask.shape)} differ.")
    num = router_probs.shape[-1]
    probs, mask = router_probs.reshape(-1, num), dispatch_mask.reshape(-1, num).float()
    fraction = mask.sum(0) / mask.sum().clamp_min(1.0)
    return num * (fraction * probs.mean(0)).sum()


def router_entropy(router_probs: Tensor) -> Tensor:
    """Mean entropy (nats) of the routing distributions ``(..., K)``; ``log K`` is uniform."""
    p = router_probs.float().clamp_min(1e-12)
    return -(p * p.log()).sum(-1).mean()


def soft_moe_weights(slot_logits: Tensor) -> tuple[Tensor, Tensor]:
    """Soft MoE (Puigcerver et al. 2024) dispatch and combine weights from ``(B, T, S)`` logits.

    Dispatch normalises over the ``T`` tokens (each slot is a convex combination of
    tokens); combine normalises over the ``S`` slots (each output token is a convex
    combination of slot outputs).
    """
    if slot_logits.dim() != 3:
        raise ValueError(f"slot_logits: expected (B, T, S), got shape {tuple(slot_logits.shape)}.")
    return slot_logits.softmax(dim=1), slot_logits.softmax(dim=2)


# --------------------------------------------------------------------------- specialisation analysis


def per_category_mean(values: Tensor, category: Tensor, num_categories: int) -> tuple[Tensor, Tensor]:
    """Sum and count of ``values (N,)`` per category ``(N,)``: ``(C,)`` sums and ``(C,)`` counts."""
    if values.shape != category.shape:
        raise ValueError(f"values {tuple(values.shape)} and category {tuple(category.shape)} must have the same shape.")
    category = category.long()
    sums = torch.zeros(num_categories, dtype=torch.float64, device=values.device).index_add_(0, category, values.double())
    counts = torch.bincount(category, minlength=num_categories).to(torch.float64)
    return sums, counts


def sensitivity_matrix(base_score: Tensor, ablated_score: Tensor) -> Tensor:
    """Per-branch pruning sensitivity ``S[c, k] = score_c - score_c(branch k zeroed)``.

    Args:
        base_score: ``(C,)`` per-category score (accuracy, or negative loss) of the full model.
        ablated_score: ``(K, C)`` the same with branch ``k`` zeroed.

    Returns:
        ``(C, K)``: how much category ``c`` loses without branch ``k``.
    """
    if ablated_score.dim() != 2 or ablated_score.shape[1] != base_score.shape[0]:
        raise ValueError(f"ablated_score must be (K, C={base_score.shape[0]}), got {tuple(ablated_score.shape)}.")
    return base_score.unsqueeze(1) - ablated_score.t()


def _assigned(num_categories: int, num_branches: int, category_to_branch: Sequence[int] | Tensor | None) -> Tensor:
    return branch_of_category(torch.arange(num_categories), num_branches, category_to_branch)


def grouped_sensitivity(sensitivity: Tensor, category_to_branch: Sequence[int] | Tensor | None = None) -> Tensor:
    """Average the rows of ``S (C, K)`` by assigned branch: the square ``(K, K)`` matrix whose
    row ``b`` is the mean sensitivity of the categories routed to branch ``b``.

    With ``category_to_branch=None`` (``C == K``, identity map) ``S`` is returned as is.
    Branches with no category get a row of zeros.
    """
    num_categories, num_branches = sensitivity.shape
    if category_to_branch is None:
        if num_categories != num_branches:
            raise ValueError(
                f"sensitivity is {num_categories}x{num_branches}: pass `category_to_branch` when categories != branches."
            )
        return sensitivity
    own = _assigned(num_categories, num_branches, category_to_branch)
    sums = torch.zeros(num_branches, num_branches, dtype=sensitivity.dtype).index_add_(0, own, sensitivity)
    counts = torch.bincount(own, minlength=num_branches).clamp_min(1).to(sensitivity.dtype)
    return sums / counts[:, None]


def diagonal_dominance(
    sensitivity: Tensor, category_to_branch: Sequence[int] | Tensor | None = None, per_category: bool = False
) -> float:
    """Fraction of strictly diagonally dominant rows of the sensitivity matrix.

    Row ``b`` of the square matrix is dominant when zeroing branch ``b`` costs more than
    zeroing every other branch together, ``S[b, b] > sum_{k != b} |S[b, k]|`` (the
    textbook definition). A diagonal needs a square matrix: with ``C != K`` categories
    the rows are first averaged per assigned branch (:func:`grouped_sensitivity`);
    ``per_category=True`` instead tests each category's row against its own branch
    ``S[c, b(c)] > sum_{k != b(c)} |S[c, k]|`` (stricter, noisier). 1.0: fully specialised.
    """
    num_categories, num_branches = sensitivity.shape
    if per_category:
        own = _assigned(num_categories, num_branches, category_to_branch)
        matrix = sensitivity
    else:
        matrix = grouped_sensitivity(sensitivity, category_to_branch)
        present = torch.ones(num_branches, dtype=torch.bool)
        if category_to_branch is not None:
            present = torch.bincount(_assigned(num_categories, num_branches, category_to_branch),
                                     minlength=num_branches) > 0
        matrix, own = matrix[present], torch.arange(num_branches)[present]
    rows = torch.arange(len(own))
    diag = matrix[rows, own]
    off = matrix.abs().sum(1) - diag.abs()
    return float((diag > off).double().mean())


def specialization_gap(sensitivity: Tensor, category_to_branch: Sequence[int] | Tensor | None = None) -> float:
    """Mean drop from zeroing a category's own branch minus the mean drop from zeroing another one."""
    num_categories, num_branches = sensitivity.shape
    if num_branches < 2:
        raise ValueError("specialization_gap needs at least two branches.")
    own = _assigned(num_categories, num_branches, category_to_branch)
    rows = torch.arange(num_categories)
    diag = sensitivity[rows, own]
    off = (sensitivity.sum(1) - diag) / (num_branches - 1)
    return float((diag - off).mean())


# --------------------------------------------------------------------------- more baselines' routing


def hard_routing_weights(
    category: Tensor, num_branches: int, category_to_branch: Sequence[int] | Tensor | None = None
) -> Tensor:
    """DeMix-style hard routing by tag: weight 1 on the category's branch, 0 elsewhere, ``(K, *category.shape)``.

    This is SpecDrop's limit ``p_i -> 0`` (which SpecDrop itself refuses: without leakage
    the other branches never see a category's data).
    """
    branch = branch_of_category(category, num_branches, category_to_branch)
    ks = torch.arange(num_branches, device=branch.device).view(-1, *([1] * branch.dim()))
    return (ks == branch.unsqueeze(0)).float()


def renormalise_without(weights: Tensor, branch: int) -> Tensor:
    """Branch weights ``(K, ...)`` with ``branch`` removed and the rest rescaled to their old total.

    The ablation of the pruning-sensitivity analysis: removing a branch must not also
    shrink the merged output (zeroing alone scales it by ``1 - w_branch``, which makes
    the branch with the largest fixed weight look important even when every branch
    computes the same function). Positions whose whole weight sat on ``branch`` get 0.
    """
    if not 0 <= branch < weights.shape[0]:
        raise ValueError(f"`branch`={branch!r}: expected an index in [0, {weights.shape[0]}).")
    total = weights.sum(0, keepdim=True)
    kept = weights.clone()
    kept[branch] = 0
    rest = kept.sum(0, keepdim=True)
    return torch.where(rest > 0, kept * total / rest.where(rest > 0, torch.ones_like(rest)), torch.zeros_like(kept))


def mutual_information_loss(router_probs: Tensor, category: Tensor, num_categories: int) -> Tensor:
    """Mod-Squad's loss (Chen et al., CVPR 2023): minus the mutual information between the
    category (task) and the expert, ``-sum_{t,e} P(t,e) log(P(t,e) / (P(t) P(e)))``.

    ``P(e|t)`` is the mean router probability over the positions of category ``t`` in
    the batch and ``P(t)`` their share. Minimising it makes each category use a few
    experts and different categories use different ones.

    Args:
        router_probs: ``(N, K)`` (or ``(B, T, K)``) softmax probabilities.
        category: ``(N,)`` tags (or ``(B,)``, broadcast over the ``T`` tokens).
        num_categories: ``C``.
    """
    num = router_probs.shape[-1]
    if router_probs.dim() == 3 and category.dim() == 1:
        category = category[:, None].expand(router_probs.shape[:2])
    probs, cat = router_probs.reshape(-1, num).float(), category.reshape(-1).long()
    if probs.shape[0] != cat.shape[0]:
        raise ValueError(f"router_probs has {probs.shape[0]} positions but category {cat.shape[0]}.")
    joint = torch.zeros(num_categories, num, device=probs.device).index_add_(0, cat, probs) / probs.shape[0]
    p_t, p_e = joint.sum(1, keepdim=True), joint.sum(0, keepdim=True)
    ratio = joint / (p_t * p_e).clamp_min(1e-12)
    return -(joint * ratio.clamp_min(1e-12).log()).sum()
