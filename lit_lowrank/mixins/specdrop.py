"""SpecDrop as a mixin: K parallel branches of a chosen submodule, merged by a fixed rule.

:class:`SpecDropBranches` replaces one submodule (a ResNet stage, a ViT block's MLP,
a transformer layer's MLP, or a Linear for LoRA branches) by ``K`` branches and a
merge rule. The merge rule is SpecDrop or one of its baselines, all on the same
code path so that they differ only in how the branch weights are chosen:

=================  ==============================================================
``merge``          branch weights
=================  ==============================================================
``specdrop``       ``p_a`` on the sample's category branch, ``p_i`` elsewhere, over
                   the fixed ``D = p_a + (K-1) p_i`` (no parameters, no aux loss)
``no_routing``     ``1/K`` each (SpecDrop with ``p_a == p_i``)
``shared_expert``  branch 0 is a shared expert with weight 1/2, the other ``K-1``
                   share the other 1/2 equally (No-Routing with a shared expert)
``router``         learned softmax router, top-k (``router_top_k``), Switch
                   load-balancing loss (``aux_loss_weight``); ``top_k = K``: dense
                   softmax gating. Over LoRA branches: LoRAMoE-style routing; with
                   ``lora_shared_A``: HydraLoRA (one shared ``A``, ``K`` ``B`` heads).
                   ``router_categories=C``: a *tag-aware* router (a learned
                   ``(C, K)`` logit bias by the sample's category); with
                   ``mi_loss_weight > 0``: Mod-Squad's task-expert mutual-information loss
``soft_moe``       Soft MoE (one slot per branch) over the tokens of each sample
``demix``          DeMix-style hard routing by tag: weight 1 on the category's
                   branch, 0 elsewhere (SpecDrop's ``p_i -> 0`` limit)
=================  ==============================================================

Every branch is always computed (SpecDrop's ``p_i > 0`` needs them all), which also
keeps every parameter in the graph under DDP.

How the category reaches the branches: the datamodule puts ``category`` in the
batch; the task module runs its forward inside ``with method_context(self, batch):``
(:mod:`lit_lowrank.core.module_methods`; SpecDrop's part is :func:`specdrop_category`), a
small context that sets the tag on every block and clears it afterwards. Nothing reads the trainer. Missing tags raise in training; in eval
mode ``missing_category="uniform"`` is the documented tag-free inference mode (the
mean of the branches, consistent because every branch carries ``1/K`` on average).

The learned routers' load-balancing loss is added by the *task's loss*: each block
keeps ``aux_loss`` from its last training forward and the task module adds
:func:`~lit_lowrank.core.method_aux_loss` (here :func:`specdrop_aux_loss`) to its loss.

.. code-block:: python

    model = ClassificationModule("resnet110_cifar", num_classes=100,
                                 branches={"target": r"backbone\\.stages\\.2$", "num_branches": 20})

    # or, in your own LightningModule
    apply_specdrop(self.net, target=r"blocks\\.11\\.mlp$", num_branches=4, merge="specdrop")

    def training_step(self, batch, batch_idx):
        with method_context(self, batch):        # from lit_lowrank.core: the batch's tags reach the branches
            logits = self.net(batch["x"])
        loss = F.cross_entropy(logits, batch["y"])
        aux = method_aux_loss(self)              # learned-router baselines only
        return loss if aux is None else loss + aux
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.module_methods import register_module_method
from lit_lowrank.core.surgery import (
    find_modules,
    is_replaced,
    mark_replaced,
    record_surgery,
    replace_module,
)
from lit_lowrank.core.temporary import temporarily_set
from lit_lowrank.mixins.branch_copies import LoRABranch, _infer_in_features, _permute_entries, _reinitialise
from lit_lowrank.ops.specdrop import (
    branch_of_category,
    hard_routing_weights,
    load_balancing_loss,
    mutual_information_loss,
    renormalise_without,
    router_entropy,
    soft_moe_weights,
    specdrop_dropout_weights,
    specdrop_weights,
    topk_routing,
    uniform_weights,
    weighted_branch_sum,
)

METHOD = "specdrop"
_CACHE_ATTR = "_lit_lowrank_specdrop_blocks"
# Bumped whenever a block is built, which invalidates every cached block list.
_BLOCK_GENERATION = [0]
Merge = Literal["specdrop", "no_routing", "shared_expert", "router", "soft_moe", "demix"]
MERGES: tuple[str, ...] = ("specdrop", "no_routing", "shared_expert", "router", "soft_moe", "demix")


class SpecDropBranches(nn.Module):
    """``K`` branches of ``module`` merged by SpecDrop or one of its baselines.

    Args:
        module: the submodule to branch. Branch 0 keeps its weights; branches 1..K-1
            are copies whose weights are drawn afresh (see ``init``), so that branches
            are not identical (under No-Routing identical copies would stay identical).
            With ``branch_type="lora"`` it must be an ``nn.Linear``: it stays (frozen) as
            ``base`` and the branches are rank-``lora_rank`` deltas around it.
        num_branches: ``K >= 2``.
        merge: ``"specdrop"``, ``"no_routing"``, ``"shared_expert"``, ``"router"``, ``"soft_moe"``
            or ``"demix"``.
        p_active: SpecDrop weight of the category's own branch.
        p_inactive: SpecDrop leakage weight of the other branches (``0 < p_i <= p_a``).
        category_to_branch: ``C`` branch indices when the ``C`` categories are not the
            ``K`` branches (several categories may share a branch).
        stochastic: SpecDrop's dropout form in training: keep branch ``k`` with
            probability ``p_k`` (needs ``p <= 1``), divide by the same fixed ``D``; eval
            uses the expectation (the deterministic merge).
        missing_category: ``"error"`` (default) or ``"uniform"``: in eval mode, a forward
            without a category tag merges uniformly (tag-free inference). Training
            without tags always raises.
        init: ``"permute"`` (default: each copy's parameter entries are shuffled, an
            independent draw from the module's own i.i.d. initialisation), ``"reset"``
            (``reset_parameters()`` of every submodule: PyTorch's default init, which
            may differ from the architecture's), or ``"copy"`` (all branches start from
            ``module``'s weights: a pretrained block; SpecDrop's category weights then
            break the symmetry, No-Routing does not).
        router_top_k: experts per position for ``merge="router"``.
        aux_loss_weight: weight of the router's load-balancing loss.
        router_categories: ``C``: make the router tag-aware, adding a learned ``(C, K)``
            logit bias (zero at init) by the sample's category (``merge="router"``; the
            category is then required as for SpecDrop).
        mi_loss_weight: weight of Mod-Squad's loss, minus the mutual information between
            category and expert (needs ``router_categories``).
        in_features: input width for the router / Soft MoE slots; inferred from the
            first ``in_features``/``in_channels`` attribute in ``module`` when ``None``.
        branch_type: ``"copy"`` (copies of ``module``) or ``"lora"``.
        lora_rank, lora_alpha: LoRA branch rank and scale ``alpha / rank``.
        lora_shared_A: HydraLoRA's asymmetric form: all LoRA branches share one ``lora_A``
            (the same module, stored once), each keeps its own ``lora_B`` head.

    Shapes:
        ``x: (B, ...)``; the output is ``module``'s ``(B, ...)``. SpecDrop tags are
        ``(B,)`` (or ``(B, T)`` per token). The router routes per sample for ``(B, d)``
        and ``(B, C, H, W)`` inputs (channels pooled) and per token for ``(B, T, d)``.
        Soft MoE needs a token-wise module on ``(B, T, d)`` or ``(B, d)`` inputs.

    .. code-block:: python

        block = SpecDropBranches(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)), num_branches=4)
        block.category = torch.tensor([0, 3, 1])       # normally set by specdrop_category(...)
        y = block(torch.randn(3, 32))                  # (3, 32)
    """

    def __init__(
        self,
        module: nn.Module,
        num_branches: int,
        merge: Merge = "specdrop",
        p_active: float = 1.0,
        p_inactive: float = 0.1,
        category_to_branch: Sequence[int] | None = None,
        stochastic: bool = False,
        missing_category: Literal["error", "uniform"] = "error",
        init: Literal["permute", "reset", "copy"] = "permute",
        router_top_k: int = 1,
        aux_loss_weight: float = 0.01,
        in_features: int | None = None,
        branch_type: Literal["copy", "lora"] = "copy",
        lora_rank: int = 8,
        lora_alpha: float = 16.0,
        router_categories: int | None = None,
        mi_loss_weight: float = 0.0,
        lora_shared_A: bool = False,
    ) -> None:
        super().__init__()
        _BLOCK_GENERATION[0] += 1
        if not isinstance(num_branches, int) or num_branches < 2:
            raise ValueError(f"`num_branches`={num_branches!r}: expected an integer >= 2.")
        checks = {"merge": (merge, MERGES), "missing_category": (missing_category, ("error", "uniform")),
                  "init": (init, ("permute", "reset", "copy")), "branch_type": (branch_type, ("copy", "lora"))}
        for param, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"`{param}`={value!r}, expected one of {allowed}.")
        if router_categories is not None and (merge != "router" or router_categories < 1):
            raise ValueError(f"`router_categories`={router_categories!r} needs merge='router' and an integer >= 1 "
                             f"(got merge={merge!r}).")
        if mi_loss_weight and router_categories is None:
            raise ValueError(f"`mi_loss_weight`={mi_loss_weight!r} (Mod-Squad) needs `router_categories` "
                             "(the categories whose mutual information with the experts it maximises).")
        if lora_shared_A and branch_type != "lora":
            raise ValueError("`lora_shared_A`=True (HydraLoRA) needs branch_type='lora'.")
        if merge == "demix" and category_to_branch is not None:
            branch_of_category(torch.arange(len(category_to_branch)), num_branches, category_to_branch)
        if merge == "specdrop":  # validate weights and map now, not at the first forward
            specdrop_weights(torch.zeros(1, dtype=torch.long), num_branches, p_active, p_inactive)
            if category_to_branch is not None:
                branch_of_category(torch.arange(len(category_to_branch)), num_branches, category_to_branch)
            if stochastic and max(p_active, p_inactive) > 1:
                raise ValueError(f"`stochastic`=True needs p_active, p_inactive <= 1, got {p_active}, {p_inactive}.")
        given = locals()
        self.config: dict[str, Any] = _normalised_config(num_branches, merge, {k: given[k] for k in _DEFAULTS})
        self.num_branches, self.merge = num_branches, merge
        self.target_name = type(module).__name__
        self.base: nn.Module | None = None
        if branch_type == "lora":
            if not isinstance(module, nn.Linear):
                raise ValueError(f"`branch_type`='lora' wraps nn.Linear layers, got {type(module).__name__}.")
            module.requires_grad_(False)  # LoRA: the pretrained weight stays fixed
            self.base = module
            w = module.weight
            self.branches = nn.ModuleList(
                LoRABranch(module.in_features, module.out_features, lora_rank, lora_alpha, w.dtype, w.device)
                for _ in range(num_branches)
            )
            if lora_shared_A:  # one A for every head: the same module object, one set of parameters
                for branch in self.branches[1:]:
                    branch.lora_A = self.branches[0].lora_A
        else:
            copies = [module]
            for _ in range(num_branches - 1):
                twin = copy.deepcopy(module)
                if init == "permute":
                    _permute_entries(twin)
                elif init == "reset":
                    _reinitialise(twin)
                copies.append(twin)
            self.branches = nn.ModuleList(copies)
        if merge in ("router", "soft_moe"):
            width = in_features if in_features is not None else _infer_in_features(module)
            if width is None:
                raise ValueError(
                    f"merge={merge!r} needs the input width of {type(module).__name__}: pass `in_features`."
                )
            self.in_features = width
            if merge == "router":
                if not 1 <= router_top_k <= num_branches:
                    raise ValueError(f"`router_top_k`={router_top_k!r}: expected an integer in [1, {num_branches}].")
                self.router = nn.Linear(width, num_branches)
                if router_categories is not None:
                    self.router_category_bias = nn.Parameter(torch.zeros(router_categories, num_branches))
            else:
                self.soft_moe_slots = nn.Parameter(torch.randn(width, num_branches) / math.sqrt(width))
                self.soft_moe_scale = nn.Parameter(torch.ones(()))
        # Per-forward context and diagnostics: plain attributes, never in the state dict.
        self.category: Tensor | None = None
        self.ablated_branch: int | None = None
        self.ablation_renormalise = True
        self.aux_loss: Tensor | None = None
        self.last_stats: dict[str, Tensor] = {}

    def extra_repr(self) -> str:
        c = self.config
        text = f"num_branches={c['num_branches']}, merge={c['merge']!r}, branch_type={c['branch_type']!r}"
        if c["merge"] == "specdrop":
            text += f", p_active={c['p_active']}, p_inactive={c['p_inactive']}"
        if c["router_categories"] is not None:
            text += f", router_categories={c['router_categories']}, mi_loss_weight={c['mi_loss_weight']}"
        if c["lora_shared_A"]:
            text += ", lora_shared_A=True"
        return text

    # ----------------------------------------------------------------- weights per merge rule

    def _specdrop_weights(self, lead: tuple[int, ...], device: torch.device) -> Tensor:
        c = self.config
        category = self.category
        if category is None:
            if self.training or c["missing_category"] == "error":
                raise ValueError(
                    f"SpecDrop ({self.target_name}): no category tag for this forward. Batches need a 'category' "
                    "entry (dataset metadata; the lit_lowrank datamodules provide it) and the forward must run "
                    "inside `specdrop_category(model, batch['category'])`. For untagged inference set "
                    "missing_category='uniform' (eval mode only)."
                )
            return uniform_weights(self.num_branches, lead[:1], device)
        category = torch.as_tensor(category, device=device)
        if tuple(category.shape) != lead[: category.dim()]:
            raise ValueError(
                f"SpecDrop ({self.target_name}): category tags of shape {tuple(category.shape)} do not match the "
                f"branch outputs' leading shape {lead}; expected one tag per sample ({lead[:1]})."
            )
        if c["merge"] == "demix":
            return hard_routing_weights(category, self.num_branches, c["category_to_branch"])
        if c["stochastic"] and self.training:
            return specdrop_dropout_weights(category, self.num_branches, c["p_active"], c["p_inactive"],
                                            c["category_to_branch"])
        return specdrop_weights(category, self.num_branches, c["p_active"], c["p_inactive"], c["category_to_branch"])

    def _router_weights(self, x: Tensor, lead: tuple[int, ...]) -> Tensor:
        if x.dim() == 4:
            feats = x.mean(dim=(2, 3))  # per sample, from pooled channels
        elif x.dim() in (2, 3):
            feats = x  # per sample (B, d) or per token (B, T, d)
        else:
            raise ValueError(f"merge='router' routes (B, d), (B, T, d) or (B, C, H, W) inputs, got {tuple(x.shape)}.")
        if feats.shape[-1] != self.in_features:
            raise ValueError(f"router: input width {feats.shape[-1]} != in_features={self.in_features}.")
        logits = self.router(feats)
        category = None
        if self.config["router_categories"] is not None:
            category = self._category_tags(lead, logits.device)
            if category is not None:
                bias = self.router_category_bias[category]  # (B, K)
                logits = logits + (bias if logits.dim() == 2 else bias.unsqueeze(1))
        if self.ablated_branch is not None and self.ablation_renormalise:
            # pruning an expert re-routes its positions to the remaining experts
            logits = logits.clone()
            logits[..., self.ablated_branch] = float("-inf")
        weights, probs, mask = topk_routing(logits, self.config["router_top_k"])
        self.last_stats["router_entropy"] = router_entropy(probs).detach()
        self.aux_loss = None
        if self.training:
            self.aux_loss = self.config["aux_loss_weight"] * load_balancing_loss(probs, mask)
            if self.config["mi_loss_weight"] and category is not None:
                self.aux_loss = self.aux_loss + self.config["mi_loss_weight"] * mutual_information_loss(
                    probs, category, self.config["router_categories"])
        return weights.movedim(-1, 0)

    def _category_tags(self, lead: tuple[int, ...], device: torch.device) -> Tensor | None:
        """The forward's tags for the tag-aware router (``None`` only in tag-free eval)."""
        if self.category is None:
            if self.training or self.config["missing_category"] == "error":
                raise ValueError(f"tag-aware router ({self.target_name}): no category tag for this forward; run it "
                                 "inside `specdrop_category(model, batch['category'])`.")
            return None
        category = torch.as_tensor(self.category, device=device).long()
        if category.dim() != 1 or category.shape[0] != lead[0]:
            raise ValueError(f"tag-aware router ({self.target_name}): expected one tag per sample ({lead[0]},), "
                             f"got shape {tuple(category.shape)}.")
        if int(category.min()) < 0 or int(category.max()) >= self.config["router_categories"]:
            raise ValueError(f"tag-aware router ({self.target_name}): tags must lie in "
                             f"[0, {self.config['router_categories']}), got {category.min()}..{category.max()}.")
        return category

    def _branch_weights(self, x: Tensor, out: Tensor) -> Tensor:
        merge, k = self.merge, self.num_branches
        lead = tuple(out.shape)
        if merge in ("specdrop", "demix"):
            return self._specdrop_weights(lead, out.device)
        if merge == "no_routing":
            return uniform_weights(k, lead[:1], out.device)
        if merge == "shared_expert":
            weights = torch.full((k, lead[0]), 0.5 / (k - 1), device=out.device)
            weights[0] = 0.5
            return weights
        return self._router_weights(x, lead)

    # ----------------------------------------------------------------- forward

    def _soft_moe(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if x.dim() not in (2, 3) or x.shape[-1] != self.in_features:
            raise ValueError(
                f"merge='soft_moe' mixes the tokens of each sample: expected (B, d) or (B, T, d) with "
                f"d={self.in_features}, got {tuple(x.shape)}."
            )
        tokens = x if x.dim() == 3 else x.unsqueeze(1)
        slots_phi = self.soft_moe_scale * F.normalize(self.soft_moe_slots, dim=0)
        dispatch, combine = soft_moe_weights(F.normalize(tokens, dim=-1) @ slots_phi.to(tokens.dtype))
        slot_inputs = torch.einsum("bts,btd->bsd", dispatch, tokens)
        outs = []
        for k, branch in enumerate(self.branches):
            slot = slot_inputs[:, k] if x.dim() == 2 else slot_inputs[:, k : k + 1]
            out = self._call_branch(branch, slot, args, kwargs)
            outs.append(out if x.dim() == 3 else out.unsqueeze(1))
        slot_outputs = torch.cat(outs, dim=1)  # (B, K, d')
        if self.ablated_branch is not None:
            slot_outputs = slot_outputs.clone()
            slot_outputs[:, self.ablated_branch] = 0
            if self.ablation_renormalise:  # combine over the remaining slots
                combine = renormalise_without(combine.movedim(-1, 0), self.ablated_branch).movedim(0, -1)
        self.last_stats["router_entropy"] = router_entropy(combine).detach()
        self.last_stats["branch_weight"] = combine.detach().float().mean(dim=(0, 1))
        y = torch.einsum("bts,bsd->btd", combine.to(slot_outputs.dtype), slot_outputs)
        return y if x.dim() == 3 else y.squeeze(1)

    def _call_branch(self, branch: nn.Module, x: Tensor, args: tuple, kwargs: dict) -> Tensor:
        out = branch(x, *args, **kwargs)
        if not isinstance(out, Tensor):
            raise TypeError(
                f"SpecDrop ({self.target_name}): a branch returned {type(out).__name__}; wrap a submodule that "
                "returns one Tensor (e.g. a transformer block's MLP rather than the whole block)."
            )
        return out

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """Run every branch on ``x`` and merge; ``base(x)`` is added in LoRA mode."""
        self.aux_loss = None
        if self.merge == "soft_moe":
            out = self._soft_moe(x, *args, **kwargs)
        else:
            outs = [self._call_branch(branch, x, args, kwargs) for branch in self.branches]
            weights = self._branch_weights(x, outs[0])
            self.last_stats["branch_weight"] = weights.detach().float().reshape(self.num_branches, -1).mean(1)
            if self.ablated_branch is not None and not (self.merge == "router" and self.ablation_renormalise):
                if self.ablation_renormalise:
                    weights = renormalise_without(weights, self.ablated_branch)
                else:
                    weights = weights.clone()
                    weights[self.ablated_branch] = 0
            out = weighted_branch_sum(outs, weights)
        if self.base is not None:
            out = self.base(x) + out
        return out


# --------------------------------------------------------------------------- functional form and context


def specdrop_blocks(model: nn.Module) -> list[SpecDropBranches]:
    """Every :class:`SpecDropBranches` inside ``model`` (cached: task modules call this each step).

    Walking a large module tree costs ~1 ms (ResNet-110 with 20 branches), so the result
    is cached on ``model`` and reused until any new block is built anywhere.
    """
    cached = model.__dict__.get(_CACHE_ATTR)
    if cached is not None and cached[0] == _BLOCK_GENERATION[0]:
        return cached[1]
    blocks = [m for m in model.modules() if isinstance(m, SpecDropBranches)]
    model.__dict__[_CACHE_ATTR] = (_BLOCK_GENERATION[0], blocks)
    return blocks


def apply_specdrop(
    model: nn.Module,
    target: str | Sequence[str],
    num_branches: int,
    merge: Merge = "specdrop",
    freeze_others: bool = False,
    **options: Any,
) -> nn.Module:
    """Wrap each submodule of ``model`` matching ``target`` in :class:`SpecDropBranches` (in place).

    Idempotent (a second call with the same settings changes nothing) and recorded with
    :func:`~lit_lowrank.core.record_surgery`, so ``load_from_checkpoint`` rebuilds it.

    Args:
        model: any ``nn.Module``.
        target: a regex on qualified module names (anchor it: ``r"backbone\\.stages\\.2$"``)
            or a list of names / name suffixes (see :func:`~lit_lowrank.core.find_modules`).
        num_branches: ``K``.
        merge: the merge rule (see :class:`SpecDropBranches`).
        freeze_others: freeze every parameter outside the SpecDrop branches and routers
            (LoRA fine-tuning of a pretrained model).
        **options: the other :class:`SpecDropBranches` arguments (``p_active``,
            ``p_inactive``, ``category_to_branch``, ``stochastic``, ``missing_category``,
            ``init``, ``router_top_k``, ``aux_loss_weight``, ``in_features``,
            ``branch_type``, ``lora_rank``, ``lora_alpha``, ``router_categories``,
            ``mi_loss_weight``, ``lora_shared_A``).

    Returns:
        ``model``.

    Raises:
        ValueError: ``target`` matches nothing, matches nested modules, or names a module
            already wrapped with different settings.

    .. code-block:: python

        apply_specdrop(vit, target=r"blocks\\.(10|11)\\.mlp$", num_branches=4, p_inactive=0.05)
        apply_specdrop(llm, target=["q_proj", "v_proj"], num_branches=8, branch_type="lora",
                       merge="router", router_top_k=2, freeze_others=True)   # LoRAMoE-style baseline
    """
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise TypeError(f"apply_specdrop: unknown options {unknown}; expected among {sorted(_OPTION_NAMES)}.")
    lora = options.get("branch_type", "copy") == "lora"
    matches = find_modules(model, target, (nn.Linear, SpecDropBranches) if lora else None, param="target")
    names = [name for name, _ in matches]
    nested = [(a, b) for a in names for b in names if b.startswith(a + ".")]
    if nested:
        raise ValueError(
            f"`target`={target!r} matches nested modules {nested[0][0]!r} and {nested[0][1]!r}; branch one level "
            "only (anchor the regex with '$')."
        )
    for name, module in matches:
        if is_replaced(module, METHOD):
            wanted = _normalised_config(num_branches, merge, options)
            if module.config != wanted:
                raise ValueError(
                    f"`target` module {name!r} is already wrapped by SpecDrop with {module.config}; "
                    f"cannot re-wrap it with {wanted}."
                )
            continue
        if is_replaced(module):  # another method's layer (an adapter, STAC-R): branching it would copy that state
            raise ValueError(
                f"`target` module {name!r} is a {type(module).__name__} made by {getattr(module, '_lit_lowrank_method')!r}; "
                "SpecDrop cannot branch another method's layer (see the composition matrix in the README): "
                "apply SpecDrop to other modules, or use SpecDrop's own LoRA branches (branch_type='lora')."
            )
        block = SpecDropBranches(module, num_branches, merge, **options)
        block.target_name = name
        replace_module(model, name, mark_replaced(block, METHOD))
    if freeze_others:
        own = {id(p) for block in specdrop_blocks(model) for n, p in block.named_parameters()
               if not n.startswith("base.")}
        for p in model.parameters():
            if id(p) not in own:
                p.requires_grad_(False)
    target_data = target if isinstance(target, str) else list(target)
    record_surgery(model, METHOD, apply_specdrop,
                   {"target": target_data, "num_branches": num_branches, "merge": merge,
                    "freeze_others": freeze_others, **options})
    return model


def _signature_defaults() -> dict[str, Any]:
    params = inspect.signature(SpecDropBranches.__init__).parameters
    return {name: p.default for name, p in params.items() if name not in ("self", "module", "num_branches", "merge")}


#: The options of :class:`SpecDropBranches` with their defaults: read from its signature, the one place they live.
_DEFAULTS: dict[str, Any] = _signature_defaults()
_OPTION_NAMES = tuple(_DEFAULTS)


def _normalised_config(num_branches: int, merge: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every option with its default filled in and plain types (compared on re-application)."""
    c = {**_DEFAULTS, **options}
    mapping = c["category_to_branch"]
    return {
        "num_branches": num_branches, "merge": merge, "p_active": float(c["p_active"]),
        "p_inactive": float(c["p_inactive"]), "category_to_branch": None if mapping is None else [int(b) for b in mapping],
        "stochastic": bool(c["stochastic"]), "missing_category": c["missing_category"], "init": c["init"],
        "router_top_k": int(c["router_top_k"]), "aux_loss_weight": float(c["aux_loss_weight"]),
        "in_features": c["in_features"], "branch_type": c["branch_type"], "lora_rank": int(c["lora_rank"]),
        "lora_alpha": float(c["lora_alpha"]),
        "router_categories": None if c["router_categories"] is None else int(c["router_categories"]),
        "mi_loss_weight": float(c["mi_loss_weight"]), "lora_shared_A": bool(c["lora_shared_A"]),
    }


@contextmanager
def specdrop_category(model: nn.Module, category: Tensor | None) -> Iterator[None]:
    """Set the category tags ``(B,)`` of the coming forward on every SpecDrop block of ``model``.

    The previous tags are restored on exit, so a tag never leaks into a later forward.
    A no-op for a model without SpecDrop blocks.

    .. code-block:: python

        with specdrop_category(self, batch.get("category")):
            logits = self.net(batch["x"])
    """
    with temporarily_set(specdrop_blocks(model), "category", category):
        yield


def specdrop_aux_loss(model: nn.Module) -> Tensor | None:
    """Sum of the blocks' auxiliary losses from the last training forward (learned routers), else ``None``."""
    losses = [block.aux_loss for block in specdrop_blocks(model) if block.aux_loss is not None]
    return torch.stack(losses).sum() if losses else None


def log_specdrop_diagnostics(pl_module: pl.LightningModule) -> None:
    """Log ``method/specdrop/branch_weight/<k>`` (mean merge weight per branch, over blocks),
    ``method/specdrop/router_entropy`` and ``method/specdrop/aux_loss`` where they exist."""
    blocks = [b for b in specdrop_blocks(pl_module) if b.last_stats]
    if not blocks or getattr(pl_module, "_trainer", None) is None:
        return
    weights = torch.stack([b.last_stats["branch_weight"] for b in blocks]).mean(0)
    for k, value in enumerate(weights):
        log_method(pl_module, METHOD, f"branch_weight/{k}", value)
    entropies = [b.last_stats["router_entropy"] for b in blocks if "router_entropy" in b.last_stats]
    if entropies:
        log_method(pl_module, METHOD, "router_entropy", torch.stack(entropies).mean())
    aux = specdrop_aux_loss(pl_module)
    if aux is not None:
        log_method(pl_module, METHOD, "aux_loss", aux.detach())


class _SpecDropInModule:
    """SpecDrop's part of :func:`~lit_lowrank.core.method_context` and its siblings: tags in, aux loss and
    diagnostics out, for any module holding SpecDrop blocks (a no-op for one without)."""

    name = METHOD

    def batch_context(self, module: nn.Module, batch: Any) -> Any:
        return specdrop_category(module, batch.get("category") if hasattr(batch, "get") else None)

    def aux_loss(self, module: nn.Module) -> Tensor | None:
        return specdrop_aux_loss(module)

    def log_diagnostics(self, pl_module: Any) -> None:
        log_specdrop_diagnostics(pl_module)


register_module_method(_SpecDropInModule())
