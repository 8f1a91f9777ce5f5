"""The method registry: one line per method, read by the CLI, the README and the tests.

Every method issue turns its ``planned`` line into an implemented one by filling in
``component`` (the dotted path of the callback / mixin / adapter / op / engine) and
the paths of its config and benchmark; a method that acts inside ``fit`` also adds
a ``ContractCase`` to ``tests/methods/cases.py``. The contract suite in ``tests/methods/``
parametrises over :func:`implemented_methods`; ``lit-lowrank methods`` prints
:func:`methods_table`. Deleting a method means deleting its files and its line here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

InjectionKind = Literal["callback", "mixin", "adapter", "op", "engine"]
KINDS: tuple[str, ...] = ("callback", "mixin", "adapter", "op", "engine")
TASKS: tuple[str, ...] = (
    "classification", "language_model", "graph", "rl", "diffusion", "tomography", "fewshot",
)


@dataclass(frozen=True)
class MethodSpec:
    """What the project knows about one method.

    Attributes:
        name: registry key, also the ``method/<name>/...`` logging prefix and the
            benchmark / card / config file stem.
        title: one-line description for the README table.
        kind: injection kind (DESIGN.md): callback, mixin, adapter, op or engine.
        tasks: task families the method runs on.
        issue: the tracking issue number.
        component: dotted path of the public class/function; ``None`` while planned.
        config: the CPU config on the embedded default (relative to the repo root).
        baseline_config: the config of its main baseline.
        benchmark: name for ``lit-lowrank bench`` (``lit_lowrank/benchmarks/<name>.py``).
        stateful: a callback whose ``state_dict`` must survive save/resume.
        structural: changes the module's structure (idempotent, rebuilt on reload).
        ddp: declared to run under a 2-process CPU DDP fit.
        fsdp: declared to run under a 2-process CPU FSDP2 fit (``ModelParallelStrategy``, ``fully_shard``).
        refuses: strategy family (``"ddp"``, ``"fsdp"``, ``"deepspeed"``) -> why the method cannot run under it;
            :func:`lit_lowrank.core.strategy.check_strategy` raises that reason at ``setup``.
        refuses_if: refusals the method's own ``setup`` raises under a condition of its settings (family -> when
            and why); documented in the capability table, checked by the contract suite, not enforced here.
    """

    name: str
    title: str
    kind: InjectionKind
    tasks: tuple[str, ...]
    issue: int
    component: str | None = None
    config: str | None = None
    baseline_config: str | None = None
    benchmark: str | None = None
    stateful: bool = False
    structural: bool = False
    ddp: bool = False
    fsdp: bool = False
    refuses: dict[str, str] = field(default_factory=dict)
    refuses_if: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"MethodSpec {self.name!r}: kind={self.kind!r}, expected one of {KINDS}.")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"MethodSpec {self.name!r}: unknown tasks {unknown}, expected among {TASKS}.")

    @property
    def status(self) -> str:
        return "implemented" if self.component else "planned"


_REGISTRY: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add ``spec`` to the registry (``replace=True`` to overwrite an entry)."""
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"Method {spec.name!r} is already registered; pass replace=True to overwrite it.")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_method(name: str) -> None:
    """Remove ``name`` from the registry (used by tests that register temporary methods)."""
    _REGISTRY.pop(name, None)


def get_method(name: str) -> MethodSpec:
    """The spec registered under ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"Unknown method {name!r}; registered: {sorted(_REGISTRY)}.") from None


def all_methods() -> list[MethodSpec]:
    """Every registered method, in registration order."""
    return list(_REGISTRY.values())


def implemented_methods() -> list[MethodSpec]:
    """Registered methods whose component exists (the contract suite's parameters)."""
    return [m for m in _REGISTRY.values() if m.status == "implemented"]


def methods_table() -> list[dict[str, str]]:
    """Rows for ``lit-lowrank methods`` and the README method table."""
    return [
        {
            "method": m.name,
            "what": m.title,
            "kind": m.kind,
            "tasks": ", ".join(m.tasks),
            "status": m.status,
            "issue": f"#{m.issue}",
        }
        for m in _REGISTRY.values()
    ]


def methods_markdown() -> str:
    """The README method table (``lit-lowrank methods --markdown``)."""
    rows = methods_table()
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    for row in rows:
        cells = dict(row)
        if _REGISTRY[row["method"]].status == "implemented":
            cells["method"] = f"[{row['method']}](docs/methods/{row['method']}.md)"
        lines.append("| " + " | ".join(cells.values()) + " |")
    return "\n".join(lines)


def _planned(name: str, title: str, kind: InjectionKind, tasks: tuple[str, ...], issue: int) -> None:
    register_method(MethodSpec(name=name, title=title, kind=kind, tasks=tasks, issue=issue))


# One line per method. A method issue replaces its line with a full MethodSpec.
register_method(MethodSpec(
    "fb_temporal", "Forward-backward representations with temporal abstraction", "engine", ("rl",), 17,
    component="lit_lowrank.tasks.FBModule", config="configs/rl/fb_temporal_gridworld.yaml",
    baseline_config="configs/rl/fb_gridworld_k1.yaml", benchmark="fb_temporal",
))
register_method(MethodSpec(
    "specdrop", "SpecDrop fixed parameter-free branch routing", "mixin", ("classification", "language_model"), 4,
    component="lit_lowrank.mixins.SpecDropBranches", config="configs/classification/specdrop_digits.yaml",
    baseline_config="configs/classification/specdrop_no_routing_digits.yaml", benchmark="specdrop",
    structural=True, ddp=True, fsdp=True,
))
register_method(MethodSpec(
    "specblock", "SpecBlock block-iterative speculative-decoding drafter", "engine", ("language_model",), 9,
    component="lit_lowrank.decoding.SpecBlockDrafter", config="configs/language_model/real/specblock_smollm2.yaml",
    baseline_config="configs/language_model/real/eagle_smollm2.yaml", benchmark="specblock",
))
register_method(MethodSpec(
    "nn_qst", "Neural-network quantum state tomography, max-sliced W1", "engine", ("tomography",), 19,
    component="lit_lowrank.tasks.TomographyModule", config="configs/tomography/nn_qst_two_mode_cat.yaml",
    baseline_config="configs/tomography/nn_nll_two_mode_cat.yaml", benchmark="tomography",
))
register_method(MethodSpec(
    "fed_lowshot", "Federated low-shot intrusion detection with a prior bank", "engine", ("fewshot",), 20,
    component="lit_lowrank.federated.FedLowShotModule", config="configs/fewshot/fed_lowshot_flows.yaml",
    baseline_config="configs/fewshot/fedavg_protonet_flows.yaml", benchmark="federated_ids",
))
register_method(MethodSpec(
    "castor", "Castor self-tuning graph filter with routing and momentum", "op", ("graph",), 16,
    component="lit_lowrank.models.Castor", config="configs/graph/castor_csbm.yaml",
    baseline_config="configs/graph/gprgnn_csbm.yaml", benchmark="castor",
))
register_method(MethodSpec(
    "camel", "CAMEL Creator-Appraiser meta-learning of new concepts", "engine", ("diffusion",), 15,
    component="lit_lowrank.tasks.CAMELModule", config="configs/diffusion/camel_digits.yaml",
    baseline_config="configs/diffusion/camel_novelty_digits.yaml", benchmark="camel",
))
register_method(MethodSpec(
    "polar_vbll", "PoLAR adapters with a variational Bayesian last layer", "adapter", ("classification", "language_model"),
    6, component="lit_lowrank.adapters.polar_vbll.PoLARVBLL", config="configs/classification/polar_vbll_digits.yaml",
    baseline_config="configs/classification/polar_vbll_lora_mle_digits.yaml", benchmark="polar_vbll", structural=True,
    refuses={"ddp": "its alternating phases freeze the adapters or the head, which DDP's reducer reports as unused "
                    "parameters; use strategy='ddp_find_unused_parameters_true'",
             "fsdp": "its alternating phases switch requires_grad on parameters FSDP2 has already replaced by "
                     "sharded DTensors, so the next phase's loss has no gradient path"},
))
register_method(MethodSpec(
    "safecut", "SafeCut cut-statistic gated mutual correction (SFDA)", "callback", ("classification",), 8,
    component="lit_lowrank.callbacks.SafeCut", config="configs/classification/safecut_digits.yaml",
    baseline_config="configs/classification/shot_digits.yaml", benchmark="safecut", stateful=True,
    refuses_if={"ddp": "with adapt_second=True (the default): the second model is adapted on one process",
                "fsdp": "with adapt_second=True (the default): the second model is adapted on one process"},
))
register_method(MethodSpec(
    "sama", "SaMA relaxed-Kronecker adapter", "adapter", ("classification", "language_model"), 5,
    component="lit_lowrank.adapters.SaMALinear", config="configs/classification/sama_minilm_tweets.yaml",
    baseline_config="configs/classification/lora_minilm_tweets.yaml", benchmark="lora_variants", structural=True,
    ddp=True, fsdp=True, extra={"injector": "lit_lowrank.adapters.AdapterInjector", "ops": "lit_lowrank.ops.sama"},
))
register_method(MethodSpec(
    "stac_r", "STAC-R saved-activation compression with SSP", "callback", ("classification", "language_model"), 3,
    component="lit_lowrank.callbacks.STACR", config="configs/language_model/stac_r_gpt.yaml",
    baseline_config="configs/language_model/stac_r_exact_gpt.yaml", benchmark="stac_r", stateful=True, structural=True,
    ddp=True, fsdp=True,
))
register_method(MethodSpec(
    "stable_rank", "Stable rank reward, Best-of-N and SR-GRPO", "op", ("language_model",), 11,
    component="lit_lowrank.ops.stable_rank.stable_rank", config="configs/language_model/sr_grpo_arithmetic.yaml",
    baseline_config="configs/language_model/grpo_verifiable_arithmetic.yaml", benchmark="stable_rank",
))
register_method(MethodSpec(
    "spirit", "SPIRIT online layer-skipping self-speculative decoding", "engine", ("language_model",), 10,
    component="lit_lowrank.decoding.SpiritDrafter", config="configs/language_model/spirit_layerdrop_lee.yaml",
    baseline_config="configs/language_model/spirit_plain_lee.yaml", benchmark="spirit",
))
register_method(MethodSpec(
    "sphquant", "SPHQuant spherical weight-only quantization", "engine", ("language_model",), 12,
    component="lit_lowrank.quant.SPHQuantizer", config="configs/language_model/sphquant_tiny_llama.yaml",
    baseline_config="configs/language_model/sphquant_rtn_tiny_llama.yaml", benchmark="sphquant", structural=True, ddp=True,
    refuses={"fsdp": "it quantizes the trained weights in place at the end of fit with boolean masks and index ops "
                     "that FSDP2's sharded DTensor weights do not support (aten.nonzero); quantize the gathered "
                     "model after training (quantize_sph) instead"},
))
register_method(MethodSpec(
    "sds_lora", "SDS-LoRA singular-direction-scaled LoRA gradients", "adapter", ("classification", "language_model"), 5,
    component="lit_lowrank.adapters.SDSLoraLinear", config="configs/classification/sds_lora_minilm_tweets.yaml",
    baseline_config="configs/classification/lora_minilm_tweets.yaml", benchmark="lora_variants", structural=True,
    ddp=True, fsdp=True, extra={"injector": "lit_lowrank.adapters.AdapterInjector"},
))
register_method(MethodSpec(
    "sd_lora", "SD-LoRA structural distillation for few-shot CLIP", "adapter", ("fewshot",), 7,
    component="lit_lowrank.adapters.SDLoRA", config="configs/fewshot/sd_lora_digits.yaml",
    baseline_config="configs/fewshot/clip_lora_digits.yaml", benchmark="sd_lora", stateful=True, ddp=True,
    refuses={"fsdp": "the few-shot CLIP module it trains keeps logit_scale as a 0-d parameter, which FSDP2's "
                     "fully_shard refuses to shard"},
))
register_method(MethodSpec(
    "sara", "SARA step-adaptive SVD rank for diffusion inference", "callback", ("diffusion",), 14,
    component="lit_lowrank.callbacks.SARA", config="configs/diffusion/sara_dp_digits.yaml",
    baseline_config="configs/diffusion/sara_uniform_digits.yaml", benchmark="sara", ddp=True, fsdp=True,
))
register_method(MethodSpec(
    "rubiconv", "RubiConv exact boundary-respecting packed FFT convolution", "op", ("language_model",), 18,
    component="lit_lowrank.ops.rubiconv.packed_long_conv", config="configs/language_model/rubiconv_hyena.yaml",
    baseline_config="configs/language_model/rubiconv_hyena_leaky.yaml", benchmark="rubiconv",
))
register_method(MethodSpec(
    "moe_quant", "MoE MXFP4 QAT with routing replay and load-aware compensation", "callback", ("language_model",), 13,
    component="lit_lowrank.callbacks.MoEQuantQAT", config="configs/language_model/moe_quant_qwen3_moe.yaml",
    baseline_config="configs/language_model/moe_quant_noreplay_uniform_qwen3_moe.yaml", benchmark="moe_quant",
    structural=True, ddp=True, fsdp=True,
    extra={"components": ["lit_lowrank.callbacks.MoEQuantQAT", "lit_lowrank.callbacks.RoutingReplay"]},
))
