"""Which methods stack: the composition matrix that ``tests/methods/test_composition.py`` runs and the README shows.

Every row is a pair of methods applied to one model, in that order (the first one's callback first). A row that
``stacks`` is trained, checkpointed, resumed (``fit(ckpt_path=...)``) and reloaded (``load_from_checkpoint``) with
identical outputs by the test; a row that does not stack must refuse with a clear error, which the test checks too.
Pairs absent from the table are untested. :func:`composition_markdown` renders the README table and
:func:`stacks_with` feeds the "stacks with" column of the capability table.

.. code-block:: python

    from lit_lowrank.core.composition import stacks_with
    stacks_with("stac_r")   # ['dora', 'lokr', 'lora', 'polar', 'sama', 'sds_lora', 'specdrop']
"""

from __future__ import annotations

from dataclasses import dataclass

#: Adapter methods of the injector (PEFT built-ins and the project's variants) the matrix covers.
ADAPTER_VARIANTS: tuple[str, ...] = ("lora", "dora", "lokr", "sds_lora", "sama", "polar")


@dataclass(frozen=True)
class Composition:
    """One row of the matrix.

    Attributes:
        first, second: method names, applied in this order.
        layer: ``"same"`` (both on one Linear) or ``"other"`` (on different layers of one model).
        stacks: ``True``: trains, resumes and reloads identically; ``False``: refused with an error.
        note: what happens, in one line (the refusal's reason when ``stacks`` is false).
    """

    first: str
    second: str
    layer: str
    stacks: bool
    note: str


def _stac_r_adapter(adapter: str, reverse: bool = False) -> Composition:
    first, second = (adapter, "stac_r") if reverse else ("stac_r", adapter)
    return Composition(first, second, "same", True,
                       "STAC-R wraps the adapter's frozen base Linear (`.base_layer`; exact, saves nothing there); "
                       "the adapter branch's own saved input is not coded")


COMPOSITIONS: tuple[Composition, ...] = (
    *(_stac_r_adapter(a) for a in ADAPTER_VARIANTS),
    _stac_r_adapter("lora", reverse=True),
    _stac_r_adapter("polar", reverse=True),
    Composition("specdrop", "stac_r", "other", True, "SpecDrop branches one Linear, STAC-R codes another"),
    Composition("specdrop", "lora", "other", True, "SpecDrop branches one Linear, LoRA adapts another"),
    Composition("specdrop", "stac_r", "same", False,
                "refused: STAC-R cannot reach inside SpecDrop's branches (SpecDrop's own code path)"),
    Composition("specdrop", "lora", "same", False,
                "refused: use SpecDrop's own LoRA branches (`branch_type='lora'`) instead"),
    Composition("lora", "specdrop", "same", False, "refused: SpecDrop does not branch another method's layer"),
    Composition("stac_r", "specdrop", "same", False, "refused: SpecDrop does not branch another method's layer"),
)


def stacks_with(name: str) -> list[str]:
    """Methods that stack with ``name`` (on the same or on other layers) per :data:`COMPOSITIONS`, sorted."""
    return sorted({c.second if c.first == name else c.first for c in COMPOSITIONS
                   if c.stacks and name in (c.first, c.second)})


def composition_markdown() -> str:
    """The README's composition matrix (one row per tested pair)."""
    lines = ["| first | then | layer | stacks | what happens |", "|---|---|---|---|---|"]
    for c in COMPOSITIONS:
        lines.append(f"| {c.first} | {c.second} | {c.layer} | {'yes' if c.stacks else 'no (error)'} | {c.note} |")
    return "\n".join(lines)


def _resume(kind: str, stateful: bool, structural: bool) -> str:
    """How a checkpoint brings the method back (what the contract suite checks)."""
    if kind not in ("callback", "mixin", "adapter"):
        return "n/a (not a fit-time method)"
    parts = (["state round-trip"] if stateful else []) + (["structure rebuilt"] if structural else [])
    return ", ".join(parts) + " (tested)" if parts else "stateless"


def _distributed(spec: object, family: str) -> str:
    """The DDP / FSDP cell: what ``tests/methods/test_distributed.py`` checks for this method (from the registry)."""
    refuses, refuses_if = getattr(spec, "refuses"), getattr(spec, "refuses_if")
    if family in refuses:
        return "refused (tested)"
    if family in refuses_if:
        return f"refused {refuses_if[family].split(':')[0]} (tested)"
    return "yes (tested)" if getattr(spec, family) else "untested"


def capabilities_markdown() -> str:
    """The README's methods × (DDP, FSDP, checkpoint resume, stacks with) table, from the registry.

    DDP / FSDP: "yes (tested)" for a method that declares it (``MethodSpec.ddp`` / ``fsdp``): the contract suite
    runs a 2-process CPU fit (gloo DDP; FSDP2 = ``ModelParallelStrategy`` with ``fully_shard``) and checks it ends
    with the single-process run's weights; "refused (tested)" for a declared refusal (``refuses`` /
    ``refuses_if``; the suite checks the error at ``setup`` names the strategy), listed with its reason under the
    table; "untested" otherwise. Stacks with: the rows of :data:`COMPOSITIONS` that stack.
    """
    from lit_lowrank.core.registry import implemented_methods

    lines = ["| method | kind | DDP | FSDP | checkpoint resume | stacks with (tested) |", "|---|---|---|---|---|---|"]
    reasons = []
    for m in implemented_methods():
        stacks = ", ".join(stacks_with(m.name)) or "–"
        lines.append(f"| {m.name} | {m.kind} | {_distributed(m, 'ddp')} | {_distributed(m, 'fsdp')} "
                     f"| {_resume(m.kind, m.stateful, m.structural)} | {stacks} |")
        for family, why in {**m.refuses_if, **m.refuses}.items():
            reasons.append(f"- {m.name} refuses {family.upper()}: {why}.")
    return "\n".join(lines + ([""] + reasons if reasons else []))
