"""Post-training weight quantization glue shared by the quantizers: layer selection,
calibration Hessians, and the callback base that quantizes before test / predict.

.. code-block:: python

    linears = select_linears(model, target=None, exclude=("lm_head",))
    hessians = collect_hessians(model, list(linears), batches, forward=default_forward)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lit_lowrank.core.logging import log_method
from lit_lowrank.core.surgery import find_modules, is_replaced
from lit_lowrank.quant.linear import model_bits, quantized_layers

ForwardFn = Callable[[nn.Module, Any], Any]


def select_linears(model: nn.Module, target: str | Sequence[str] | None = None,
                   exclude: Sequence[str] = ("lm_head",)) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers to quantize: matching ``target`` (regex, names or ``None`` = all),
    minus names ending in one of ``exclude``, minus layers already quantized.

    Returns an empty dict when every matching layer is already quantized (so quantizing twice
    equals quantizing once); raises when ``target`` matches nothing at all.

    .. code-block:: python

        select_linears(model, target=["q_proj", "v_proj"])       # name -> nn.Linear
    """
    already = quantized_layers(model)
    if target is not None and not already:
        find_modules(model, target, nn.Linear, param="target")  # the clear "matches nothing" error
    found = {}
    for name, module in model.named_modules():
        if not name or not isinstance(module, nn.Linear) or is_replaced(module):
            continue
        if any(name == e or name.endswith("." + e) for e in exclude):
            continue
        if target is not None and not _name_matches(name, target):
            continue
        found[name] = module
    return found


def _name_matches(name: str, target: str | Sequence[str]) -> bool:
    import re

    if isinstance(target, str):
        return re.search(target, name) is not None
    return any(name == t or name.endswith("." + t) for t in target)


def default_forward(module: nn.Module, batch: Any) -> Any:
    """Run one calibration batch: ``module.step(batch)`` for our task modules, else
    ``module(batch["input_ids"])`` / ``module(batch["x"])`` for dict batches, else ``module(batch)``."""
    if hasattr(module, "step") and callable(module.step):
        return module.step(batch)
    if isinstance(batch, dict):
        for key in ("input_ids", "x"):
            if key in batch:
                return module(batch[key])
        raise ValueError(f"default_forward: dict batch without 'input_ids' or 'x' (keys {sorted(batch)}); "
                         "pass `forward=`.")
    if isinstance(batch, (tuple, list)):
        return module(batch[0])
    return module(batch)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


@torch.no_grad()
def collect_hessians(model: nn.Module, layers: dict[str, nn.Module], batches: Iterable[Any],
                     forward: ForwardFn = default_forward, max_batches: int | None = None) -> dict[str, Tensor]:
    """``H = X^T X / n`` (float32 ``(in, in)``) of each layer's inputs over calibration batches.

    Forward pre-hooks are registered on ``layers`` and removed afterwards; the model's
    training mode is restored.

    Args:
        model: the model to run.
        layers: name -> layer whose inputs are recorded.
        batches: calibration batches (moved to the model's device).
        forward: how to run a batch (:func:`default_forward`).
        max_batches: stop after this many batches.

    .. code-block:: python

        layers = select_linears(model, target=r"mlp\\.")
        hessians = collect_hessians(model, layers, [batch_a, batch_b])   # name -> (in, in)
    """
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    # layers reading the same, unmodified input tensor in a row (q/k/v, gate/up) share one X^T X product;
    # the cached input is held, so its id cannot be reused by another tensor while it is compared, and its
    # version counter catches an in-place change between the two reads
    last: list[Any] = [None, -1, None]

    def hook_for(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            inp = args[0]
            x = inp.detach().reshape(-1, inp.shape[-1])
            if last[0] is not inp or last[1] != inp._version:
                xf = x.float()
                last[:] = [inp, inp._version, xf.T @ xf]
            if name not in sums:
                sums[name] = torch.zeros(x.shape[1], x.shape[1], device=x.device)
                counts[name] = 0
            sums[name] += last[2]
            counts[name] += x.shape[0]
        return hook

    handles = [layer.register_forward_pre_hook(hook_for(name)) for name, layer in layers.items()]
    was_training = model.training
    model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        for i, batch in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            forward(model, _to_device(batch, device))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
        last[:] = [None, -1, None]
    missing = [n for n in layers if n not in sums]
    if missing:
        raise RuntimeError(f"collect_hessians: layers {missing[:4]} saw no input during calibration; check that the "
                           "forward function runs them.")
    return {name: sums[name] / max(counts[name], 1) for name in layers}


class PostTrainingQuantizer(pl.Callback):
    """Callback base: quantize the module's Linear layers before test / predict (and optionally
    right after ``fit``), through the subclass's functional form :meth:`quantize`.

    Stages: ``on_test_start`` and ``on_predict_start`` always; ``on_validation_start`` only
    for ``trainer.validate`` (never inside ``fit``, where quantized layers would stop
    training); ``on_fit_end`` when ``after_fit=True``. Quantizing is idempotent, so later
    stages reuse the quantized layers. Calibration batches (when the method needs them) come
    from the datamodule's ``train_dataloader`` (a documented requirement: the test split is
    never used for calibration).

    Logs ``method/<name>/bits_per_weight``, ``.../bits_per_weight_with_shared`` and
    ``.../quantized_layers`` once, at the first evaluation stage after quantizing.

    .. code-block:: python

        class MyQuantizer(PostTrainingQuantizer):
            method_name = "my_quant"

            def quantize(self, module, batches):
                return my_quantize_fn(module, calibration=batches)   # {"quantized_layers": n, ...}
    """

    method_name = "ptq"

    def __init__(self, after_fit: bool = False, calibration_batches: int = 0) -> None:
        if calibration_batches < 0:
            raise ValueError(f"`calibration_batches`={calibration_batches}: expected >= 0.")
        self.after_fit = after_fit
        self.calibration_batches = calibration_batches
        self.report: dict[str, Any] = {}
        self._logged = False

    def quantize(self, module: nn.Module, batches: Iterable[Any] | None) -> dict[str, Any]:
        """Quantize ``module`` in place; return a report (subclasses)."""
        raise NotImplementedError

    def _calibration(self, trainer: "pl.Trainer") -> Iterable[Any] | None:
        if self.calibration_batches == 0:
            return None
        datamodule = trainer.datamodule
        if datamodule is None or not hasattr(datamodule, "train_dataloader"):
            raise RuntimeError(f"{type(self).__name__}(calibration_batches={self.calibration_batches}) reads "
                               "calibration batches from the datamodule's train_dataloader(); run with a datamodule "
                               "or set calibration_batches=0.")
        try:
            loader = datamodule.train_dataloader()
        except Exception as err:  # a datamodule set up for test only
            datamodule.setup("fit")
            loader = datamodule.train_dataloader()
            if loader is None:
                raise RuntimeError("the datamodule has no train_dataloader for calibration") from err
        batches = []
        for i, batch in enumerate(loader):
            if i >= self.calibration_batches:
                break
            batches.append(batch)
        return batches

    def _apply(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # test / predict hooks run in inference mode; buffers created there would be inference
        # tensors that a later load_state_dict could not update in place
        with torch.inference_mode(False):
            report = self.quantize(pl_module, self._calibration(trainer))
        if report.get("quantized_layers"):
            self.report = report
            self._logged = False
            rank_zero_info(f"{type(self).__name__}: quantized {report['quantized_layers']} layers, "
                           f"{report['bits_per_weight']:.4f} bits/weight")

    def _log(self, pl_module: "pl.LightningModule") -> None:
        if self._logged or not quantized_layers(pl_module):
            return
        bits = model_bits(pl_module)
        for name, value in (("bits_per_weight", bits.bits_per_weight),
                            ("bits_per_weight_with_shared", bits.bits_per_weight_with_shared),
                            ("quantized_layers", float(len(quantized_layers(pl_module))))):
            log_method(pl_module, self.method_name, name, value, on_step=False, on_epoch=True)
        self._logged = True

    def on_test_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._apply(trainer, pl_module)

    def on_predict_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._apply(trainer, pl_module)

    def on_validation_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.state.fn == "validate":
            self._apply(trainer, pl_module)

    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.after_fit:
            self._apply(trainer, pl_module)

    def on_test_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", *args: Any) -> None:
        self._log(pl_module)

    def on_validation_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", *args: Any) -> None:
        if trainer.state.fn == "validate":
            self._log(pl_module)
