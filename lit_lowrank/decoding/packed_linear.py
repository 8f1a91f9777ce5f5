"""Prepacked oneDNN linears for CPU decoding: one kernel whose cost hardly depends on the rows.

Decoding a small LM on a CPU is memory-bound: every step streams every weight once. With
PyTorch's default CPU path (MKL ``sgemm``) the cost of a linear depends on its row count in
ways that have nothing to do with the arithmetic: on the 2-core AMD EPYC the benchmarks run
on, one row (MKL's GEMV) streams SmolLM2's weights at about half the bandwidth a packed
kernel reaches, and 2-3 rows (GEMM, the weight repacked on every call) cost 1.5-1.7 times one
row. A speculative verifier runs exactly those small row counts (root + a few draft nodes),
so the verify-cost curve ``v(n)`` of :mod:`lit_lowrank.decoding.cost` jumps at ``n = 1``
for a kernel reason, not an algorithmic one.

:func:`prepack_linears` gives every ``nn.Linear`` of a model (in place, float32 on a CPU) a
weight reordered once into oneDNN's blocked layout and runs its forward through
``torch.ops.mkldnn._linear_pointwise`` -- the op (and the reorder) that PyTorch's own
Inductor CPU backend emits for a frozen linear. Measured here (30 SmolLM2-shaped layers, 2
threads, relative to one-row MKL): 1 row 0.69, 2-9 rows 0.59-0.73, 16 rows 0.82; MKL: 1.00,
1.50, 1.68, 1.36, 1.11, 1.19, 1.31, 1.43 for 1, 2, 3, 4, 5, 8, 9, 16 rows. Written by hand
because ``torch.compile`` (which would emit the same op) recompiles for every draft size and
needs a C++ toolchain, and ``torch.utils.mkldnn.to_mkldnn`` converts activations to and from
oneDNN tensors around every linear (~50 us each, ~10 ms per SmolLM2 step).

Both sides of a speed comparison should run on the same kernels: prepack the model once and
give it to ``generate`` and the speculative engine alike (the ``specblock`` benchmark does).
The dense ``weight`` parameter stays in place (``state_dict``, tied embeddings, drafters that
read the target's head rows are unchanged); the packed copy lives outside the module (a weak
map), so the model deep-copies and pickles as before (a copy packs its own on first use), and
it is repacked when the weight changes (its version counter or storage moves). With
gradients enabled and a weight or input that requires them, the forward is the ordinary
``F.linear`` (training is untouched). Outputs equal ``F.linear``'s up to float32 rounding.

.. code-block:: python

    from lit_lowrank.decoding.packed_linear import default_linears, prepack_linears

    model, tok = load_smollm2()
    prepack_linears(model)                       # 211 linears of SmolLM2-135M (+ the tied head, ~0.5 GB)
    out = model.generate(ids, max_new_tokens=64)            # faster on this machine
    out = speculative_generate(model, ids, max_new_tokens=64, drafter=specblock_hybrid(model))
    with default_linears(model):                 # MKL's path again, for a comparison
        ref = model.generate(ids, max_new_tokens=64)
    unpack_linears(model)                        # back to plain nn.Linear
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["default_linears", "packed_linear_count", "prepack_linears", "unpack_linears"]

_ENABLED = "_lit_packed_enabled"
# linear -> (packed weight, weight version, weight data_ptr); kept outside the module because oneDNN's opaque
# tensors cannot be deep-copied or pickled: a copy of a packed model packs its own weights on first use
_PACKED: weakref.WeakKeyDictionary[nn.Linear, tuple[Tensor, int, int]] = weakref.WeakKeyDictionary()


def _available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _pack(weight: Tensor) -> tuple[Tensor, int, int]:
    w = weight.detach()
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None), w._version, w.data_ptr()


def _packed_forward(self: nn.Linear, x: Tensor) -> Tensor:
    w = self.weight
    if (not getattr(self, _ENABLED, True) or x.device.type != "cpu" or w.device.type != "cpu" or x.dtype != w.dtype
            or x.numel() == 0
            or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
        return F.linear(x, w, self.bias)
    state = _PACKED.get(self)
    if state is None or w._version != state[1] or w.data_ptr() != state[2]:
        if w.dtype != torch.float32:
            return F.linear(x, w, self.bias)
        state = _PACKED[self] = _pack(w)
    packed = state[0]
    bias = None if self.bias is None else self.bias.detach()
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _PackedForward:
    """A prepacked linear's ``forward`` (an object holding its module, not a bound method: it deep-copies and
    pickles with the module)."""

    __slots__ = ("linear",)

    def __init__(self, linear: nn.Linear) -> None:
        self.linear = linear

    def __call__(self, x: Tensor) -> Tensor:
        return _packed_forward(self.linear, x)


def prepack_linears(model: nn.Module) -> int:
    """Run every ``nn.Linear`` of ``model`` through a prepacked oneDNN kernel (in place); returns how many.

    Idempotent: linears already packed are skipped (and counted). Subclasses of ``nn.Linear`` that
    override ``forward`` (LoRA layers, quantised linears) are left alone.

    Raises:
        RuntimeError: this PyTorch build has no oneDNN (``torch.backends.mkldnn.is_available()`` is False).
        ValueError: a linear's weight is not a float32 CPU tensor (the packed kernel is float32 on a CPU).
    """
    if not _available():
        raise RuntimeError("prepack_linears: this PyTorch build has no oneDNN linear "
                           "(torch.backends.mkldnn.is_available() is False); use the model as it is.")
    linears = [(name, m) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward]
    for name, m in linears:
        if m.weight.device.type != "cpu" or m.weight.dtype != torch.float32:
            raise ValueError(f"prepack_linears: linear {name!r} has a {m.weight.dtype} weight on "
                             f"{m.weight.device}; expected float32 on the CPU (a GPU needs no prepacking).")
    for _, m in linears:
        if not _is_packed(m):
            _PACKED[m] = _pack(m.weight)
            m.forward = _PackedForward(m)  # instance attribute: the class stays nn.Linear
        m.__dict__[_ENABLED] = True
    return len(linears)


def _is_packed(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) and isinstance(m.__dict__.get("forward"), _PackedForward)


def unpack_linears(model: nn.Module) -> int:
    """Undo :func:`prepack_linears`: drop the packed copies, restore ``nn.Linear.forward``; returns how many."""
    count = 0
    for m in model.modules():
        if _is_packed(m):
            _PACKED.pop(m, None)
            m.__dict__.pop(_ENABLED, None)
            m.__dict__.pop("forward")
            count += 1
    return count


def packed_linear_count(model: nn.Module) -> int:
    """How many linears of ``model`` carry a packed weight (0: not prepacked)."""
    return sum(1 for m in model.modules() if _is_packed(m))


@contextlib.contextmanager
def default_linears(model: nn.Module) -> Iterator[None]:
    """Run a prepacked ``model`` on PyTorch's default linear kernels inside the block (packed copies kept)."""
    packed = [m for m in model.modules() if _is_packed(m)]
    for m in packed:
        m.__dict__[_ENABLED] = False
    try:
        yield
    finally:
        for m in packed:
            m.__dict__[_ENABLED] = True
