"""What SARA reads from a denoiser call: its timestep, its output tensor, the samples a sampling run
returned, and SARA-Online's clean-sample signal.

Pure PyTorch (no Lightning, no layers): :class:`~lit_lowrank.callbacks.sara_controller.SARAController`
calls these from its forward hooks and its calibration; the math of the rank policies is in
:mod:`lit_lowrank.ops.sara`.

.. code-block:: python

    from lit_lowrank.ops.sara.signal import clean_sample_signal, read_timestep

    read_timestep((x_t, torch.tensor([999])), {})                          # 999.0
    signal = clean_sample_signal(scheduler.alphas_cumprod, "epsilon")       # x̂₀ from ε̂
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["TIMESTEP_KEYS", "clean_sample_signal", "denoiser_output", "read_timestep", "returned_samples"]

#: keyword names under which a denoiser takes its timestep (when it is not ``args[1]``).
TIMESTEP_KEYS = ("timestep", "timesteps", "t")


def read_timestep(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float | None:
    """The timestep of a denoiser call: ``args[1]`` or ``timestep``/``timesteps``/``t`` (its first element
    when a tensor); ``None`` when the call has none."""
    t = args[1] if len(args) > 1 else next((kwargs[k] for k in TIMESTEP_KEYS if k in kwargs), None)
    if t is None:
        return None
    return float(t.flatten()[0]) if isinstance(t, Tensor) else float(t)


def denoiser_output(output: Any) -> Tensor:
    """The tensor a denoiser (or a pipeline with ``output_type="pt"``) returned: the tensor itself,
    ``.sample``, ``.images`` or the first element of a tuple."""
    if isinstance(output, Tensor):
        return output
    if hasattr(output, "sample"):
        return output.sample
    if isinstance(getattr(output, "images", None), Tensor):  # a diffusers pipeline with output_type="pt"
        return output.images
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    raise TypeError(f"SARA cannot read a tensor from the denoiser output of type {type(output).__name__}.")


def clean_sample_signal(alphas_cumprod: Tensor, prediction_type: str = "epsilon",
                        ) -> Callable[[Tensor, tuple[Any, ...], dict[str, Any]], Tensor]:
    """A SARA-Online ``signal``: the clean sample x̂₀ that a denoiser output implies at its timestep.

    An ε-prediction output is noise-like at every step (its effective rank barely moves), while the
    x̂₀ it implies goes from a coarse mean to a detailed image: the quantity whose rank the abstract's
    premise is about. ``x̂₀ = (x_t − √(1−ᾱ_t) ε̂)/√ᾱ_t`` (ε), ``√ᾱ_t x_t − √(1−ᾱ_t) v̂`` (v), the output
    itself (``"sample"``). The timestep and ``x_t`` are read from the denoiser call (``args[0]``,
    ``args[1]`` or ``timestep=``). Learned-variance outputs (twice the input channels) use their
    first half.

    .. code-block:: python

        s = clean_sample_signal(module.noise_scheduler.alphas_cumprod, module.prediction_type)
        with apply_sara(module.model, mode="online", threshold=0.3, signal=s): ...
    """
    if prediction_type not in ("epsilon", "v_prediction", "sample"):
        raise ValueError(f"`prediction_type`={prediction_type!r}, expected 'epsilon', 'v_prediction' or 'sample'.")
    table = alphas_cumprod.detach().double().cpu()

    def signal(output: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        x = args[0] if args else kwargs.get("hidden_states", kwargs.get("sample"))
        t = read_timestep(args, kwargs)
        if not isinstance(x, Tensor) or t is None:
            raise ValueError("clean_sample_signal needs the denoiser's input x_t (args[0]) and timestep.")
        out = output[:, : x.shape[1]] if output.shape[1] == 2 * x.shape[1] else output
        if prediction_type == "sample":
            return out
        a = float(table[int(round(t))])
        if prediction_type == "epsilon":
            return (x - math.sqrt(1 - a) * out) / math.sqrt(a)
        return math.sqrt(a) * x - math.sqrt(1 - a) * out
    return signal


def returned_samples(output: Any, where: str) -> Tensor:
    """The samples a sampling call returned, as a float64 tensor: a tensor, ``.sample``, a pipeline's
    ``.images`` (tensor, numpy array or list of PIL images) or the first element of a tuple."""
    images = getattr(output, "images", output)
    if isinstance(images, (list, tuple)) and images and not isinstance(images[0], Tensor):
        images = np.stack([np.asarray(im) for im in images])  # PIL images (a pipeline's default output)
    if isinstance(images, np.ndarray):
        return torch.from_numpy(images.astype(np.float64))
    try:
        return denoiser_output(images).double()
    except TypeError:
        raise ValueError(f"SARA {where} needs `run()` to return the samples (a tensor, a numpy array, PIL images or a "
                         f"pipeline output with `.images`); got {type(output).__name__}.") from None
