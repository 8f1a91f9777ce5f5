"""The semantic-statistical prior bank and its retrieval (METHODS.md §5, step 3).

The server keeps one entry per base class: the label-phrase embedding ``e_c`` (unit norm),
the class mean ``μ_c``, covariance ``Σ_c`` and count ``n_c`` formed from securely summed
moments. A novel class with phrase embedding ``q`` retrieves the top-``k`` entries by cosine
similarity ``s_c = qᵀe_c`` and forms its prior as the similarity-softmax mixture

    w = softmax(s_topk / τ),   μ₀ = Σ w_c μ_c,   Σ₀ = Σ w_c Σ_c

(the covariance mixes within-class covariances only: the spread between the retrieved
means is not a within-class shape, decided). :func:`global_prior` is the prior without
semantics (count-weighted over all entries), the baseline that tests whether the phrases
matter.

:func:`gated_prior` trusts the retrieval only as far as the phrases match: with the top
cosine ``s₁`` and a threshold ``t`` (chosen on validation clients),

    w = σ((s₁ − t) / width),   μ₀ = w μ_retrieved + (1 − w) μ_global,   Σ₀ = w Σ_retrieved + (1 − w) Σ_global

so a novel label with no semantically close base label (``s₁ ≪ t``) falls back to the global
prior, and one with a close family-mate (``s₁ ≫ t``) uses its retrieved prior.

.. code-block:: python

    from lit_lowrank.ops.fed_lowshot.prior_bank import PriorBank, retrieve_prior

    bank = PriorBank(keys=phrase_emb, means=means, covs=covs, counts=counts, labels=base_labels)
    mu0, sigma0, weights, index = retrieve_prior(bank, query_emb, k=3, temperature=0.1)
    mu0, sigma0, gate = gated_prior(bank, query_emb, k=2, temperature=0.1, threshold=0.55)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PriorBank:
    """Base-class statistics keyed by label-phrase embeddings.

    Attributes:
        keys: ``(C, E)`` unit-norm label-phrase embeddings.
        means: ``(C, d)`` class means.
        covs: ``(C, d, d)`` class covariances.
        counts: ``(C,)`` samples behind each entry.
        labels: the ``C`` label names (for diagnostics).

    .. code-block:: python

        bank = PriorBank(keys, means, covs, counts, ["DoS Hulk", "PortScan"])
    """

    keys: Tensor
    means: Tensor
    covs: Tensor
    counts: Tensor
    labels: list[str]

    def __post_init__(self) -> None:
        c = self.keys.shape[0]
        if not (self.means.shape[0] == self.covs.shape[0] == self.counts.shape[0] == len(self.labels) == c):
            raise ValueError(f"PriorBank: keys {tuple(self.keys.shape)}, means {tuple(self.means.shape)}, covs "
                             f"{tuple(self.covs.shape)}, counts {tuple(self.counts.shape)} and {len(self.labels)} "
                             "labels must all have the same number of entries")
        if c == 0:
            raise ValueError("PriorBank: needs at least one entry")


def retrieve_prior(
    bank: PriorBank, query: Tensor, k: int = 3, temperature: float = 0.1
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Prior ``(μ₀, Σ₀)`` for one novel class from its ``(E,)`` phrase embedding.

    Args:
        bank: the prior bank.
        query: ``(E,)`` phrase embedding (normalised here).
        k: entries retrieved (clipped to the bank size).
        temperature: softmax temperature on the cosine similarities (``> 0``).

    Returns:
        ``mu0 (d,)``, ``sigma0 (d, d)``, the ``(k,)`` weights and the ``(k,)`` bank indices.

    .. code-block:: python

        mu0, sigma0, w, idx = retrieve_prior(bank, encode_sentences(["ssh brute force"])[0], k=2)
    """
    if k < 1:
        raise ValueError(f"retrieve_prior: `k`={k!r}, expected >= 1")
    if temperature <= 0:
        raise ValueError(f"retrieve_prior: `temperature`={temperature!r}, expected > 0")
    if query.shape != bank.keys.shape[1:]:
        raise ValueError(f"retrieve_prior: query {tuple(query.shape)} must match key width {bank.keys.shape[1]}")
    keys = torch.nn.functional.normalize(bank.keys.to(torch.float64), dim=1)
    q = torch.nn.functional.normalize(query.to(torch.float64), dim=0)
    sims = keys @ q
    top = torch.topk(sims, min(k, keys.shape[0]))
    weights = torch.softmax(top.values / temperature, dim=0)
    means = bank.means[top.indices].to(torch.float64)
    covs = bank.covs[top.indices].to(torch.float64)
    return weights @ means, torch.einsum("k,kij->ij", weights, covs), weights, top.indices


def global_prior(bank: PriorBank) -> tuple[Tensor, Tensor]:
    """The prior without semantics: count-weighted mean of all entries' means and covariances.

    .. code-block:: python

        mu0, sigma0 = global_prior(bank)
    """
    w = bank.counts.to(torch.float64)
    w = w / w.sum().clamp(min=1e-12)
    return w @ bank.means.to(torch.float64), torch.einsum("c,cij->ij", w, bank.covs.to(torch.float64))


def similarity_gate(top_similarity: float, threshold: float, width: float = 0.05) -> float:
    """Weight ``w = σ((s₁ − t) / width)`` of the retrieved prior for a top cosine ``s₁`` (``width > 0``).

    .. code-block:: python

        similarity_gate(0.75, threshold=0.55)    # 0.982: a family-mate's prior is trusted
        similarity_gate(0.30, threshold=0.55)    # 0.007: falls back to the global prior
    """
    if width <= 0:
        raise ValueError(f"similarity_gate: `width`={width!r}, expected > 0")
    z = (float(top_similarity) - float(threshold)) / width
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def gated_prior(
    bank: PriorBank, query: Tensor, k: int = 3, temperature: float = 0.1, threshold: float = 0.5,
    width: float = 0.05,
) -> tuple[Tensor, Tensor, float]:
    """The similarity-gated prior: the retrieved prior blended with the global one by the top cosine.

    Args:
        bank, query, k, temperature: as in :func:`retrieve_prior`.
        threshold: top cosine at which the retrieved and global priors weigh equally (``-1``:
            always retrieve, ``> 1``: always global); chosen on validation clients.
        width: softness of the gate (:func:`similarity_gate`).

    Returns:
        ``mu0 (d,)``, ``sigma0 (d, d)`` and the gate ``w`` in ``[0, 1]``.

    .. code-block:: python

        mu0, sigma0, w = gated_prior(bank, phrase_embeddings(["DoS GoldenEye"])[0], k=2, threshold=0.55)
    """
    mu_r, sigma_r, _, index = retrieve_prior(bank, query, k=k, temperature=temperature)
    keys = torch.nn.functional.normalize(bank.keys[index[:1]].to(torch.float64), dim=1)
    top = float(keys[0] @ torch.nn.functional.normalize(query.to(torch.float64), dim=0))
    w = similarity_gate(top, threshold, width)
    mu_g, sigma_g = global_prior(bank)
    return w * mu_r + (1 - w) * mu_g, w * sigma_r + (1 - w) * sigma_g, w
