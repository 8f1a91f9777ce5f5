"""SD-LoRA math (METHODS.md §16): the heterogeneous graph, relation distillation, PPA and the cache classifier.

Pure tensor code, no Lightning. SD-LoRA trains a CLIP-LoRA student with a training-only
graph teacher; the pieces here are

- :func:`build_hetero_graph`: per image, nodes of four types — ``patch`` (frozen ViT patch
  tokens), ``global`` (the frozen image embedding), ``local`` (embeddings of crops) and
  ``text`` (class-prompt embeddings) — and typed edges ``self``, ``patch-patch`` (k nearest
  patches by cosine), ``global-patch``, ``local-patch`` (a crop and the patches it covers),
  ``global-local`` and ``visual-text`` (every visual node with every class text). Edges are
  stored densely as ``(B, N, N)`` adjacency/type tensors (N is tens of nodes), which is what a
  masked graph transformer consumes.
- :func:`relation_matrices` / :func:`relation_distillation_loss`: row-softmaxed patch–patch and
  patch–text affinities, teacher → student KL.
- :func:`prototype_predictive_alignment`: ``KL(softmax(f_s Pᵀ/τ) ‖ softmax(z_t/τ))``.
- :func:`tip_adapter_logits`: Tip-Adapter's cache classifier
  ``s·f Wcᵀ + α·exp(−β(1 − f Kᵀ)) V``, plus its hyper-parameter search and the ``-F`` variant.

.. code-block:: python

    from lit_lowrank.ops.sd_lora import build_hetero_graph, tip_adapter_logits

    graph = build_hetero_graph(patches, global_emb, local_emb, text_emb, crop_patch_mask, patch_k=4)
    graph.edge_counts()          # {"self": ..., "patch-patch": B*P*k, ...}
    logits = tip_adapter_logits(f, text_weights, keys, values, alpha=1.0, beta=5.5, logit_scale=100.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "EDGE_TYPES", "NODE_TYPES", "HeteroGraph", "build_hetero_graph", "class_prototypes", "fit_tip_adapter_f",
    "prototype_predictive_alignment", "quadrant_crop_mask", "relation_agreement", "relation_distillation_loss",
    "relation_matrices", "search_tip_hparams", "tip_adapter_logits",
]

NODE_TYPES: tuple[str, ...] = ("patch", "global", "local", "text")
EDGE_TYPES: tuple[str, ...] = ("self", "patch-patch", "global-patch", "local-patch", "global-local", "visual-text")


@dataclass
class HeteroGraph:
    """A batch of same-shaped heterogeneous graphs in dense form.

    Attributes:
        x: ``(B, N, D)`` node features, nodes ordered patch, global, local, text.
        node_type: ``(N,)`` index into :data:`NODE_TYPES`.
        adjacency: ``(B, N, N)`` bool; ``adjacency[b, i, j]`` means node ``i`` receives a message from ``j``.
        edge_type: ``(B, N, N)`` index into :data:`EDGE_TYPES`, ``-1`` where there is no edge.
        slices: node range of each node type.
    """

    x: Tensor
    node_type: Tensor
    adjacency: Tensor
    edge_type: Tensor
    slices: dict[str, slice]

    def node_counts(self) -> dict[str, int]:
        """Nodes per type in one graph."""
        return {t: int((self.node_type == i).sum()) for i, t in enumerate(NODE_TYPES)}

    def edge_counts(self) -> dict[str, int]:
        """Directed edges per type, summed over the batch."""
        return {t: int((self.edge_type == i).sum()) for i, t in enumerate(EDGE_TYPES)}

    def edge_index(self, b: int = 0) -> tuple[Tensor, Tensor]:
        """PyG-style ``(2, E)`` ``[source, target]`` indices and ``(E,)`` edge types of graph ``b``."""
        target, source = self.adjacency[b].nonzero(as_tuple=True)
        return torch.stack([source, target]), self.edge_type[b, target, source]


def quadrant_crop_mask(grid: int, crops: int = 4) -> Tensor:
    """``(K, P)`` bool: which of the ``grid × grid`` patches each crop covers.

    ``crops=4`` are the four quadrants (a patch on the middle line of an odd grid belongs to
    both halves); ``crops=1`` is the centre half; ``crops=5`` is the four quadrants and the centre.

    .. code-block:: python

        quadrant_crop_mask(4).sum(1)   # tensor([4, 4, 4, 4])
    """
    if crops not in (1, 4, 5):
        raise ValueError(f"`crops`={crops}, expected 1 (centre), 4 (quadrants) or 5 (quadrants + centre).")
    if grid < 2:
        raise ValueError(f"`grid`={grid}, expected >= 2 patches per side.")
    half = grid / 2
    r = torch.arange(grid, dtype=torch.float32) + 0.5
    lo, hi = r <= math.ceil(half), r >= math.floor(half)
    centre = (r >= grid / 4) & (r <= 3 * grid / 4)
    regions = []
    if crops in (4, 5):
        regions += [(lo, lo), (lo, hi), (hi, lo), (hi, hi)]
    if crops in (1, 5):
        regions.append((centre, centre))
    return torch.stack([(rows[:, None] & cols[None, :]).flatten() for rows, cols in regions])


def build_hetero_graph(
    patches: Tensor,
    global_emb: Tensor,
    local_emb: Tensor,
    text_emb: Tensor,
    crop_patch_mask: Tensor,
    patch_k: int = 4,
    structure: str = "knn",
    generator: torch.Generator | None = None,
) -> HeteroGraph:
    """The SD-LoRA teacher graph of each image.

    Args:
        patches: ``(B, P, D)`` frozen patch tokens in the joint embedding space.
        global_emb: ``(B, D)`` frozen image embeddings (the global node).
        local_emb: ``(B, K, D)`` frozen embeddings of ``K`` crops (the local nodes).
        text_emb: ``(C, D)`` class-prompt embeddings (shared by every image's graph).
        crop_patch_mask: ``(K, P)`` bool, the patches each crop covers (:func:`quadrant_crop_mask`).
        patch_k: each patch receives edges from its ``patch_k`` most cosine-similar other patches.
        structure: ``"knn"`` (the graph above) or ``"shuffled"`` (the control: each patch's ``patch_k``
            neighbours drawn uniformly among the other patches, and each image's patch order permuted
            before the crop mask is applied — the same node and edge counts per type, no spatial or
            similarity structure).
        generator: random source of ``"shuffled"`` (default: the global generator).

    Returns:
        A :class:`HeteroGraph` with ``N = P + 1 + K + C`` nodes per image. Edge counts for the
        batch: ``self`` B·N, ``patch-patch`` B·P·k, ``global-patch`` 2·B·P, ``local-patch``
        2·B·|mask|, ``global-local`` 2·B·K, ``visual-text`` 2·B·(P+1+K)·C.
    """
    if patches.dim() != 3:
        raise ValueError(f"`patches` has shape {tuple(patches.shape)}, expected (B, P, D).")
    b, p, d = patches.shape
    k = local_emb.shape[1]
    c = text_emb.shape[0]
    if global_emb.shape != (b, d) or local_emb.shape != (b, k, d) or text_emb.shape != (c, d):
        raise ValueError(f"shapes disagree: patches {tuple(patches.shape)}, global_emb {tuple(global_emb.shape)}, "
                         f"local_emb {tuple(local_emb.shape)}, text_emb {tuple(text_emb.shape)}; expected (B, P, D), "
                         "(B, D), (B, K, D), (C, D).")
    if crop_patch_mask.shape != (k, p):
        raise ValueError(f"`crop_patch_mask` has shape {tuple(crop_patch_mask.shape)}, expected (K, P) = ({k}, {p}).")
    if not 1 <= patch_k < p:
        raise ValueError(f"`patch_k`={patch_k}, expected 1 <= patch_k < P = {p}.")
    if structure not in ("knn", "shuffled"):
        raise ValueError(f"`structure`={structure!r}, expected 'knn' or 'shuffled'.")
    n = p + 1 + k + c
    sl = {"patch": slice(0, p), "global": slice(p, p + 1), "local": slice(p + 1, p + 1 + k),
          "text": slice(p + 1 + k, n)}
    x = torch.cat([patches, global_emb[:, None], local_emb, text_emb.expand(b, c, d)], dim=1)
    node_type = torch.cat([torch.full((m,), i, dtype=torch.long) for i, m in enumerate((p, 1, k, c))])
    et = torch.full((b, n, n), -1, dtype=torch.long, device=patches.device)

    def put(rows: slice, cols: slice, name: str, mask: Tensor | None = None) -> None:
        block = et[:, rows, cols]
        value = EDGE_TYPES.index(name)
        if mask is None:
            block.fill_(value)
        else:
            block[mask.expand_as(block)] = value

    # patch-patch: k nearest neighbours by cosine, self excluded (self loops are their own type)
    if structure == "knn":
        unit = F.normalize(patches.detach(), dim=-1)
        sim = unit @ unit.transpose(1, 2)
    else:  # random scores: k uniformly drawn other patches
        sim = torch.rand(b, p, p, generator=generator).to(patches.device)
    sim.diagonal(dim1=1, dim2=2).fill_(-math.inf)
    nearest = sim.topk(patch_k, dim=-1).indices
    pp = torch.zeros(b, p, p, dtype=torch.bool, device=patches.device).scatter_(2, nearest, True)
    put(sl["patch"], sl["patch"], "patch-patch", pp)
    put(sl["global"], sl["patch"], "global-patch")
    put(sl["patch"], sl["global"], "global-patch")
    cover = crop_patch_mask.to(device=patches.device, dtype=torch.bool)[None].expand(b, k, p)
    if structure == "shuffled":  # each image's crops cover a random set of patches of the same size
        perm = torch.argsort(torch.rand(b, p, generator=generator), dim=-1).to(patches.device)
        cover = cover.gather(2, perm[:, None, :].expand(b, k, p))
    put(sl["local"], sl["patch"], "local-patch", cover)
    put(sl["patch"], sl["local"], "local-patch", cover.transpose(1, 2))
    put(sl["global"], sl["local"], "global-local")
    put(sl["local"], sl["global"], "global-local")
    visual = slice(0, p + 1 + k)
    put(visual, sl["text"], "visual-text")
    put(sl["text"], visual, "visual-text")
    et.diagonal(dim1=1, dim2=2).fill_(EDGE_TYPES.index("self"))
    return HeteroGraph(x=x, node_type=node_type.to(patches.device), adjacency=et >= 0, edge_type=et, slices=sl)


def relation_matrices(patches: Tensor, text: Tensor, tau: float = 0.1) -> tuple[Tensor, Tensor]:
    """Row-softmaxed cosine affinities ``(B, P, P)`` patch–patch and ``(B, P, C)`` patch–text.

    Args:
        patches: ``(B, P, D)`` patch embeddings.
        text: ``(C, D)`` shared or ``(B, C, D)`` per-image class-text embeddings.
        tau: softmax temperature on cosine similarities.
    """
    if tau <= 0:
        raise ValueError(f"`tau`={tau}, expected > 0.")
    p = F.normalize(patches, dim=-1)
    t = F.normalize(text, dim=-1)
    pt = p @ (t.T if t.dim() == 2 else t.transpose(1, 2))
    return (p @ p.transpose(1, 2) / tau).softmax(-1), (pt / tau).softmax(-1)


def _row_kl(target: Tensor, pred: Tensor, eps: float = 1e-8) -> Tensor:
    """Mean over rows of KL(target ‖ pred) for row-stochastic matrices."""
    return (target * ((target + eps).log() - (pred + eps).log())).sum(-1).mean()


def relation_distillation_loss(teacher: tuple[Tensor, Tensor], student: tuple[Tensor, Tensor]) -> Tensor:
    """Mean of the row-wise KL(teacher ‖ student) over the patch–patch and patch–text relations.

    The teacher relations are detached here: the loss moves only the student.
    """
    return 0.5 * sum(_row_kl(t.detach(), s) for t, s in zip(teacher, student))


def relation_agreement(teacher: Tensor, student: Tensor) -> Tensor:
    """Mean histogram intersection ``Σ_j min(t_ij, s_ij)`` of matching rows (1 = identical, 0 = disjoint)."""
    return torch.minimum(teacher, student).sum(-1).mean()


def class_prototypes(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """L2-normalised class means ``(C, D)`` and a ``(C,)`` bool of classes present in ``labels``."""
    onehot = F.one_hot(labels, num_classes).to(features.dtype)
    counts = onehot.sum(0)
    means = onehot.T @ features / counts.clamp(min=1)[:, None]
    return F.normalize(means, dim=-1), counts > 0


def prototype_predictive_alignment(features: Tensor, prototypes: Tensor, teacher_logits: Tensor,
                                   tau: float = 1.0) -> Tensor:
    """PPA: ``mean_b KL(softmax(f_b Pᵀ/τ) ‖ softmax(z_b/τ))`` with the teacher logits ``z`` detached.

    Args:
        features: ``(B, D)`` student image embeddings (L2-normalised by the caller).
        prototypes: ``(C, D)`` support-set class prototypes.
        teacher_logits: ``(B, C)`` graph-teacher logits.
        tau: temperature of both softmaxes.

    .. code-block:: python

        loss = prototype_predictive_alignment(f, protos, z_teacher, tau=0.1)
    """
    if tau <= 0:
        raise ValueError(f"`tau`={tau}, expected > 0.")
    if features.shape[0] != teacher_logits.shape[0] or prototypes.shape[0] != teacher_logits.shape[1]:
        raise ValueError(f"shapes disagree: features {tuple(features.shape)}, prototypes {tuple(prototypes.shape)}, "
                         f"teacher_logits {tuple(teacher_logits.shape)}; expected (B, D), (C, D), (B, C).")
    log_p = (features @ prototypes.T / tau).log_softmax(-1)
    log_q = (teacher_logits.detach() / tau).log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def logit_distillation_loss(student_logits: Tensor, teacher_logits: Tensor, tau: float = 2.0) -> Tensor:
    """Hinton's KD into the deployed logits: ``τ² · mean_b KL(softmax(z_t/τ) ‖ softmax(z_s/τ))``, teacher detached.

    ``student_logits`` ``(B, C)`` are the path the exported classifier runs (``s·f·Wcᵀ``), so the
    teacher's predictions reach what is deployed, not only the shared LoRA weights through its graph.

    .. code-block:: python

        loss = logit_distillation_loss(outputs["logits"], teacher.logits(cosines), tau=2.0)
    """
    if tau <= 0:
        raise ValueError(f"`tau`={tau}, expected > 0.")
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 2:
        raise ValueError(f"`student_logits` {tuple(student_logits.shape)} and `teacher_logits` "
                         f"{tuple(teacher_logits.shape)}: expected the same (B, C).")
    log_q = (teacher_logits.detach() / tau).log_softmax(-1)
    log_p = (student_logits / tau).log_softmax(-1)
    return tau * tau * (log_q.exp() * (log_q - log_p)).sum(-1).mean()


def tip_adapter_logits(features: Tensor, text_weights: Tensor, cache_keys: Tensor, cache_values: Tensor,
                       alpha: float, beta: float, logit_scale: float = 100.0) -> Tensor:
    """Tip-Adapter: ``s·f Wcᵀ + α·exp(−β(1 − f Kᵀ)) V``.

    Args:
        features: ``(B, D)`` L2-normalised test image embeddings ``f``.
        text_weights: ``(C, D)`` L2-normalised class-prompt embeddings ``Wc``.
        cache_keys: ``(M, D)`` L2-normalised support embeddings ``K`` (``F_train``).
        cache_values: ``(M, C)`` one-hot support labels ``V`` (``L_train``).
        alpha: residual weight of the cache term.
        beta: sharpness of the affinity ``exp(−β(1 − cos))``.
        logit_scale: ``s``, CLIP's ``exp(logit_scale)`` (100 for OpenAI CLIP).
    """
    affinity = features @ cache_keys.T
    return logit_scale * features @ text_weights.T + alpha * torch.exp(-beta * (1.0 - affinity)) @ cache_values


def search_tip_hparams(features: Tensor, labels: Tensor, text_weights: Tensor, cache_keys: Tensor,
                       cache_values: Tensor, logit_scale: float,
                       alphas: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
                       betas: Sequence[float] = (1.0, 2.0, 3.5, 5.5, 8.0)) -> tuple[float, float, float]:
    """Grid search of ``(α, β)`` on held-out ``features``/``labels`` (Tip-Adapter searches on the val split).

    ``α`` is relative to the zero-shot logits' spread (``α·s·std``), so one grid fits models with any
    logit scale. Returns ``(alpha, beta, accuracy)``; ties go to the first (smallest) setting.
    """
    zs = logit_scale * features @ text_weights.T
    spread = float(zs.std().clamp(min=1e-6))
    best = (0.0, 1.0, -1.0)
    for a in alphas:
        for b in betas:
            acc = float((tip_adapter_logits(features, text_weights, cache_keys, cache_values, a * spread, b,
                                            logit_scale).argmax(-1) == labels).float().mean())
            if acc > best[2]:
                best = (a * spread, b, acc)
    return best


def fit_tip_adapter_f(features: Tensor, labels: Tensor, text_weights: Tensor, cache_keys: Tensor,
                      cache_values: Tensor, alpha: float, beta: float, logit_scale: float,
                      steps: int = 100, lr: float = 1e-3) -> Tensor:
    """Tip-Adapter-F: fine-tune the cache keys (init ``K``) with cross-entropy on the support features.

    Returns the trained, L2-normalised keys ``(M, D)``; everything else stays fixed.
    """
    keys = cache_keys.detach().clone().requires_grad_(True)
    opt = torch.optim.AdamW([keys], lr=lr, eps=1e-4)
    for _ in range(steps):
        logits = tip_adapter_logits(features, text_weights, F.normalize(keys, dim=-1), cache_values, alpha, beta,
                                    logit_scale)
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return F.normalize(keys.detach(), dim=-1)
