"""STAC-R's layer: :class:`STACRLinear` and the functional surgery :func:`apply_stac_r`.

:func:`apply_stac_r` swaps the selected ``nn.Linear`` layers (and transformers' GPT-2 style
``Conv1D``, whose weight is stored ``(in, out)``) for :class:`STACRLinear`: the same parameters
(same ``state_dict`` keys, so checkpoints load into the plain model too), a forward that saves
the activation code of its input (:mod:`lit_lowrank.ops.stac_r.compress`) and a backward that contracts
the weight gradient from it. The callback that drives it is :class:`~lit_lowrank.callbacks.stac_r.STACR`.

.. code-block:: python

    from lit_lowrank.callbacks.stac_r_layer import apply_stac_r

    layers = apply_stac_r(gpt2, target=r"attn\.c_attn|mlp\.c_fc", rank=64)   # GPT-2 Conv1D layers
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_lowrank.core.surgery import find_modules, mark_replaced, record_surgery, replace_module
from lit_lowrank.ops.stac_r.compress import (
    compressed_nbytes,
    init_basis,
    iso_byte_rank,
    oja_update,
    random_projection,
    random_projection_rank,
    stac_r_linear,
    subspace_iteration,
)

__all__ = ["BasisMode", "STACRLinear", "apply_stac_r", "conv1d_types"]

BasisMode = Literal["tracked", "untracked", "svd", "random"]
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"`coef_dtype`={name!r}, expected one of {sorted(_DTYPES)}.")
    return _DTYPES[name]


def conv1d_types() -> tuple[type, ...]:
    """transformers' ``Conv1D`` (GPT-2, GPT, Pythia-era models): a Linear whose weight is stored ``(in, out)``."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency
        return ()
    return (Conv1D,)


def _is_conv1d(module: nn.Module) -> bool:
    return isinstance(module, conv1d_types())


class STACRLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters) whose saved input is a tracked low-rank code plus a sparse residual.

    It also takes transformers' ``Conv1D`` (GPT-2): the weight Parameter is kept as it is,
    ``(in, out)`` (``weight_transposed``), so keys, tying and optimizer groups are unchanged, and
    the layer computes with its transpose view (autograd maps the gradient back).

    ``mode``: ``"off"`` (plain Linear), ``"calibrate"`` (exact, saves the input; initialises
    the basis), ``"compress"``. ``basis_mode``: ``"tracked"`` (one subspace-iteration / Oja
    update per step), ``"untracked"`` (frozen after the first step) or ``"svd"`` (a fresh
    per-step SVD basis, stored with the coefficients at the iso-byte rank) or ``"random"``
    (CompAct-style: a fresh Gaussian projection every step, regenerable from a seed so
    nothing but the coefficients is stored, no residual, its width chosen so the code's
    bytes match the tracked code's, :func:`~lit_lowrank.ops.stac_r.random_projection_rank`).
    Outside training or without grad it is exactly ``F.linear``.

    .. code-block:: python

        layer = STACRLinear(nn.Linear(256, 256), rank=16, residual_density=0.01)
        layer.mode = "compress"
    """

    def __init__(self, base: nn.Linear | nn.Module, rank: int = 16, residual_density: float = 0.01, residual_bits: int = 8,
                 basis_mode: BasisMode = "tracked", update: Literal["subspace", "oja"] = "subspace",
                 oja_lr: float = 0.5, coef_dtype: str = "bfloat16", update_every: int = 1) -> None:
        nn.Module.__init__(self)
        self.weight_transposed = _is_conv1d(base)
        if self.weight_transposed:  # Conv1D: weight (in, out)
            self.in_features, self.out_features = base.weight.shape
        elif isinstance(base, nn.Linear):
            self.in_features, self.out_features = base.in_features, base.out_features
        else:
            raise TypeError(f"STACRLinear wraps an nn.Linear or a transformers Conv1D, got {type(base).__name__}.")
        self.weight = base.weight  # shared Parameters: keys, optimizer groups and tying stay as they were
        self.bias = base.bias
        if not 1 <= rank <= self.in_features:  # rank = in_features is the no-compression control
            raise ValueError(f"`rank`={rank} must be in [1, in_features={self.in_features}].")
        if not isinstance(update_every, int) or update_every < 1:
            raise ValueError(f"`update_every`={update_every!r}, expected a positive integer (steps per basis update).")
        if basis_mode not in ("tracked", "untracked", "svd", "random"):
            raise ValueError(f"`basis`={basis_mode!r}, expected 'tracked', 'untracked', 'svd' or 'random'.")
        if update not in ("subspace", "oja"):
            raise ValueError(f"`update`={update!r}, expected 'subspace' or 'oja'.")
        self.rank, self.residual_density, self.residual_bits = rank, residual_density, residual_bits
        self.basis_mode, self.update, self.oja_lr, self.coef_dtype = basis_mode, update, oja_lr, _dtype(coef_dtype)
        self.update_every = update_every
        self.compress_calls = 0  # compressed forwards so far: the tracked basis moves every `update_every`-th
        self.register_buffer("stac_r_basis", None, persistent=False)  # in the callback's state, not the model's
        self.mode = "compress"
        self.diagnose = False
        self.diagnostics: dict[str, Any] = {}
        #: ``select_rank`` arguments for the calibration step (set by the callback for a fidelity target)
        self.rank_select: dict[str, Any] | None = None
        # the random control's seed: drawn once from the global RNG (reproducible under manual_seed), then
        # one fresh projection per compressed step from (seed, step) without touching the global stream
        self.projection_seed = int(torch.randint(0, 2**31 - 1, ()).item()) if basis_mode == "random" else 0
        self.projection_step = 0

    def _rank_for(self, n: int) -> int:
        if self.basis_mode == "svd":
            return iso_byte_rank(n, self.in_features, self.rank, self.coef_dtype)
        if self.basis_mode == "random":
            return random_projection_rank(n, self.in_features, self.rank, self.residual_density, self.coef_dtype)
        return self.rank

    def _density(self) -> float:
        return 0.0 if self.basis_mode == "random" else self.residual_density

    def code_nbytes(self, n: int) -> int:
        """Bytes saved for an input of ``n`` rows."""
        return compressed_nbytes(n, self.in_features, self._rank_for(n), self._density(), self.coef_dtype,
                                 basis_stored=self.basis_mode == "svd")

    def linear_weight(self) -> Tensor:
        """The weight as ``(out, in)`` (a transpose view for a Conv1D)."""
        return self.weight.t() if self.weight_transposed else self.weight

    def forward(self, x: Tensor) -> Tensor:
        weight = self.linear_weight()
        # a frozen weight (e.g. an adapter's base layer) needs no saved input at all: F.linear saves none
        if self.mode == "off" or not self.training or not torch.is_grad_enabled() or not self.weight.requires_grad:
            return F.linear(x, weight, self.bias)
        x2d = x.detach().reshape(-1, self.in_features)
        basis = self.stac_r_basis
        if self.mode == "calibrate" and self.rank_select is not None:  # the rank is chosen in this step's backward
            self.diagnostics["select"] = self.rank_select  # backward writes its RankChoice under "choice"
            return stac_r_linear(x, weight, self.bias, x2d[:0, :1], self._density(), self.residual_bits,
                                 self.coef_dtype, exact=True, diagnostics=self.diagnostics)
        if self.basis_mode == "random":
            self.projection_step += 1
            basis = random_projection(self.in_features, self._rank_for(x2d.shape[0]),
                                      self.projection_seed + 7919 * self.projection_step, x2d.device)
        elif self.basis_mode == "svd":
            basis = init_basis(x2d, self._rank_for(x2d.shape[0]), exact=True)
        elif basis is None:
            basis = init_basis(x2d, self.rank)
        elif self.basis_mode == "tracked" and self.mode == "compress":
            if self.compress_calls % self.update_every == 0:
                basis = subspace_iteration(basis, x2d) if self.update == "subspace" else \
                    oja_update(basis, x2d, self.oja_lr)
            self.compress_calls += 1
        if self.basis_mode not in ("svd", "random"):
            self.stac_r_basis = basis  # a new tensor each update: graphs of earlier steps keep theirs
        return stac_r_linear(x, weight, self.bias, basis, self._density(), self.residual_bits,
                             self.coef_dtype, store_basis=self.basis_mode == "svd", exact=self.mode == "calibrate",
                             diagnostics=self.diagnostics if self.diagnose else None)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, rank={self.rank}, residual_density={self.residual_density}, "
                f"basis={self.basis_mode}, update_every={self.update_every}")


def _linear_targets(model: nn.Module, target: str | Sequence[str] | None) -> list[tuple[str, str, nn.Module]]:
    """``(name, where to replace, Linear or Conv1D)`` for the layers ``target`` selects.

    A PEFT adapter layer (LoRA, DoRA, LoKr, SDS-LoRA, SaMA, PoLAR: a wrapper with ``base_layer``) counts as its
    Linear: STAC-R goes on its ``base_layer``, under the wrapper's name, so adapter-then-STAC-R and
    STAC-R-then-adapter build the same model and a checkpoint rebuilds either (issue #29).
    """
    linear = (nn.Linear, *conv1d_types())
    if target is None:
        matches = [(n, m) for n, m in find_modules(model, None) if isinstance(m, linear) or _adapter_base(m)]
    else:
        matches = find_modules(model, target, (*linear, *_adapter_wrapper_types()))
    found = []
    for name, module in matches:
        base = _adapter_base(module)
        if base is not None:
            found.append((name, f"{name}.base_layer", base))
        elif isinstance(module, linear):
            found.append((name, name, module))
    return found


def _in_features(module: nn.Module) -> int:
    return int(module.weight.shape[0]) if _is_conv1d(module) else int(module.in_features)


def _adapter_wrapper_types() -> tuple[type, ...]:
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return ()
    return (BaseTunerLayer,)


def _adapter_base(module: nn.Module) -> nn.Module | None:
    """The Linear (or Conv1D) a PEFT adapter layer wraps directly (``None`` for anything else)."""
    base = getattr(module, "base_layer", None) if isinstance(module, _adapter_wrapper_types()) else None
    return base if isinstance(base, (nn.Linear, *conv1d_types())) else None


def apply_stac_r(model: nn.Module, target: str | Sequence[str] | None = None, rank: int = 16,
                 residual_density: float = 0.01, residual_bits: int = 8, basis: BasisMode = "tracked",
                 update: Literal["subspace", "oja"] = "subspace", oja_lr: float = 0.5,
                 coef_dtype: str = "bfloat16", update_every: int = 1) -> dict[str, STACRLinear]:
    """Functional form: replace the selected Linear (or GPT-2 ``Conv1D``) layers by :class:`STACRLinear` (idempotent).

    ``target``: regex / list of names / ``None`` (every Linear / Conv1D with more than ``rank``
    input features; an explicitly targeted layer that is too narrow is an error).
    ``update_every``: steps between two updates of a tracked basis (1 = every step).
    Returns the STAC-R layers by name.

    .. code-block:: python

        layers = apply_stac_r(model, target=r"mlp|attn", rank=16, residual_density=0.01)
    """
    kwargs = dict(rank=rank, residual_density=residual_density, residual_bits=residual_bits, basis_mode=basis,
                  update=update, oja_lr=oja_lr, coef_dtype=coef_dtype, update_every=update_every)
    layers: dict[str, STACRLinear] = {}
    for name, where, module in _linear_targets(model, target):
        if isinstance(module, STACRLinear):
            layers[name] = module
            continue
        width = _in_features(module)
        if width < rank or (target is None and width == rank):
            if target is None:
                continue  # "every Linear": layers no wider than the code are left alone
            raise ValueError(f"`rank`={rank} exceeds in_features={width} of target layer {name!r}.")
        layer = mark_replaced(STACRLinear(module, **kwargs), "stac_r")
        replace_module(model, where, layer)
        layers[name] = layer
    if not layers:
        raise ValueError(f"`target`={target!r} leaves no Linear layer with in_features >= rank={rank}.")
    record_surgery(model, "stac_r", apply_stac_r, {"target": target if target is None or isinstance(target, str)
                                                   else list(target), **{k: v for k, v in kwargs.items()
                                                                         if k != "basis_mode"}, "basis": basis})
    return layers
