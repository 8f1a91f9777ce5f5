"""CAMEL math: differentiable DDIM, the Appraiser's functional inner loop, the reward, basin distance.

CAMEL (Creator–Appraiser Meta-Learning, arXiv 2605.16477) scores a created concept z by
how much a briefly adapted observer improves on it:

    φ_K = K SGD steps of the Appraiser's loss on X_z          (inner loop, from φ₀ each time)
    R(z) = L(φ₀; X'_z) − L(φ_K; X'_z)                          (X'_z: held-out seeds)

Both sample sets come from a deterministic DDIM sampler with fixed noise, so R is a
differentiable function of z through the sampler and, in the second-order mode, through
the inner loop itself (``torch.func.grad`` composed with ordinary autograd). Nothing here
imports Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad

#: ``denoise(x, t) -> model output`` for a batch ``x`` at integer timestep ``t``.
Denoiser = Callable[[Tensor, int], Tensor]
Params = dict[str, Tensor]
#: ``loss_fn(appraiser, params, x) -> scalar``: the Appraiser's inner-loop loss with functional ``params``.
LossFn = Callable[[nn.Module, Params, Tensor], Tensor]


def ddim_sample(
    denoise: Denoiser,
    noise: Tensor,
    timesteps: Sequence[int],
    alphas_cumprod: Tensor,
    final_alpha_cumprod: float = 1.0,
    prediction_type: Literal["epsilon", "v_prediction", "sample"] = "epsilon",
) -> Tensor:
    """Deterministic DDIM (η = 0) from ``noise``, differentiable in everything ``denoise`` uses.

    Matches ``diffusers.DDIMScheduler.step(eta=0)`` without clipping or thresholding: the
    step from ``t`` goes to the next entry of ``timesteps`` (to ``final_alpha_cumprod`` after
    the last one).

    Args:
        denoise: the denoiser, called once per step.
        noise: ``(N, C, H, W)`` initial noise (fix it to fix the samples).
        timesteps: decreasing training timesteps (e.g. ``DDIMScheduler.timesteps``).
        alphas_cumprod: ``(T,)`` cumulative products ᾱ_t of the training schedule.
        final_alpha_cumprod: ᾱ after the last step (diffusers' ``set_alpha_to_one`` → 1).
        prediction_type: what ``denoise`` predicts.

    Returns:
        ``(N, C, H, W)`` samples x₀.

    .. code-block:: python

        x0 = ddim_sample(lambda x, t: unet(x, t).sample, torch.randn(8, 1, 8, 8),
                         [800, 600, 400, 200, 0], scheduler.alphas_cumprod)
    """
    if prediction_type not in ("epsilon", "v_prediction", "sample"):
        raise ValueError(f"`prediction_type`={prediction_type!r}, expected 'epsilon', 'v_prediction' or 'sample'.")
    steps = [int(t) for t in timesteps]
    if not steps:
        raise ValueError("`timesteps` is empty: DDIM needs at least one step.")
    if any(b >= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"`timesteps`={steps} must be strictly decreasing.")
    ac = alphas_cumprod.to(device=noise.device, dtype=noise.dtype)
    x = noise
    for i, t in enumerate(steps):
        a_t = ac[t]
        a_prev = ac[steps[i + 1]] if i + 1 < len(steps) else torch.as_tensor(final_alpha_cumprod, dtype=ac.dtype,
                                                                             device=ac.device)
        out = denoise(x, t)
        if prediction_type == "epsilon":
            eps = out
            x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt()
        elif prediction_type == "v_prediction":
            x0 = a_t.sqrt() * x - (1 - a_t).sqrt() * out
            eps = a_t.sqrt() * out + (1 - a_t).sqrt() * x
        else:
            x0 = out
            eps = (x - a_t.sqrt() * x0) / (1 - a_t).sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
    return x


def reconstruction_loss(appraiser: nn.Module, params: Params, x: Tensor) -> Tensor:
    """Mean squared reconstruction error of ``appraiser`` with functional ``params`` on ``x``."""
    recon = functional_call(appraiser, params, (x,))
    return (recon - x).pow(2).mean()


def classification_loss(target: int) -> LossFn:
    """A ``loss_fn`` for classifying Appraisers: cross-entropy of ``appraiser(x)`` logits against class ``target``.

    With :class:`~lit_lowrank.models.clip_appraiser.CLIPAppraiser` this is CLIP's zero-shot
    classification loss — the image→text half of its contrastive loss, with the class prompts
    as the candidate texts — of a concept's samples against its prompt class: L₀ is high when
    CLIP does not recognise the samples as the class (unfamiliar), L_K low when a few steps of
    its text-projection adapter make it recognise held-out samples (learnable).

    Args:
        target: the class index every sample of ``x`` is scored against.

    Returns:
        ``loss_fn(appraiser, params, x) -> mean cross-entropy`` for :func:`adapt_appraiser` / :func:`camel_reward`.

    .. code-block:: python

        loss_fn = classification_loss(target=3)
        out = camel_reward(clip_appraiser, clip_appraiser.adapter_params(), feats_train, feats_heldout,
                           steps=3, lr=1.0, loss_fn=loss_fn)
    """
    if target < 0:
        raise ValueError(f"`target`={target}, expected a class index >= 0.")

    def loss(appraiser: nn.Module, params: Params, x: Tensor) -> Tensor:
        logits = functional_call(appraiser, params, (x,))
        if target >= logits.shape[-1]:
            raise ValueError(f"`target`={target} but the appraiser scores {logits.shape[-1]} classes.")
        return F.cross_entropy(logits, torch.full((logits.shape[0],), target, dtype=torch.long, device=logits.device))

    return loss


def alignment_loss(target: int) -> LossFn:
    """A ``loss_fn`` for CLIP-like Appraisers: ``1 − mean cos(image, text_target)`` under the adapted text side.

    Unlike :func:`classification_loss` it does not score the class *against the other classes*: L₀
    is high when the samples lie far from the prompt's text embedding (unfamiliar), L_K low when a
    few adapter steps move that embedding onto the held-out samples (learnable, i.e. the samples
    are consistent) — and neither rewards the samples for being classified as another class, so
    a concept can be unfamiliar while CLIP still recognises its class (keep that with
    :func:`recognition_hinge` in the Creator's objective). The appraiser must accept
    ``scaled=False`` and return cosines (:class:`~lit_lowrank.models.clip_appraiser.CLIPAppraiser`).

    .. code-block:: python

        out = camel_reward(clip_appraiser, clip_appraiser.adapter_params(), feats_train, feats_heldout,
                           steps=3, lr=1.0, loss_fn=alignment_loss(target=3))
    """
    if target < 0:
        raise ValueError(f"`target`={target}, expected a class index >= 0.")

    def loss(appraiser: nn.Module, params: Params, x: Tensor) -> Tensor:
        cosines = functional_call(appraiser, params, (x,), {"scaled": False})
        if target >= cosines.shape[-1]:
            raise ValueError(f"`target`={target} but the appraiser scores {cosines.shape[-1]} classes.")
        return 1.0 - cosines[:, target].mean()

    return loss


def recognition_hinge(logits: Tensor, target: Tensor | int, margin: float = 1.0) -> Tensor:
    """Per-sample hinge ``max(0, margin − (logit_c − max_{k≠c} logit_k))`` of an off-the-shelf recogniser.

    Zero once a sample is classified as its class ``c`` with ``margin`` to spare, so adding it to the
    Creator's loss keeps the concept recognisable without pulling it back towards the familiar
    class mode (what the Appraiser's L₀ rewards leaving).

    Args:
        logits: ``(N, K)`` class scores.
        target: the class ``c`` of every sample (int) or ``(N,)`` classes.
        margin: the logit margin required, ``>= 0``.

    Returns:
        ``(N,)`` hinge values.
    """
    if logits.dim() != 2:
        raise ValueError(f"`logits` must be (N, K), got shape {tuple(logits.shape)}.")
    if margin < 0:
        raise ValueError(f"`margin`={margin}, expected >= 0.")
    target = torch.as_tensor(target, device=logits.device).expand(logits.shape[0]).long()
    own = logits.gather(1, target[:, None]).squeeze(1)
    others = logits.scatter(1, target[:, None], float("-inf")).amax(1)
    return F.relu(margin - (own - others))


def adapt_appraiser(
    appraiser: nn.Module,
    params: Params,
    x_train: Tensor,
    steps: int,
    lr: float,
    first_order: bool = False,
    loss_fn: LossFn = reconstruction_loss,
) -> Params:
    """The inner loop: ``steps`` SGD steps of ``loss_fn`` on ``x_train`` from ``params`` (φ₀ → φ_K).

    Second order (default): each step's gradient stays a differentiable function of
    ``x_train`` (``torch.func.grad`` under the caller's autograd), so ∂φ_K/∂x_train exists.
    First order: the inner gradients are detached, so φ_K depends on ``x_train`` only as a
    constant shift (the first-order MAML approximation; the outer gradient then flows only
    through the held-out evaluation).

    ``params`` may be any subset of the appraiser's parameters (``functional_call`` is not
    strict): only those are adapted, the rest stay the module's own tensors — e.g. a CLIP
    Appraiser adapts only its text-projection adapter (``CLIPAppraiser.adapter_params()``).

    .. code-block:: python

        phi0 = {k: v.detach() for k, v in ae.named_parameters()}
        phiK = adapt_appraiser(ae, phi0, samples, steps=3, lr=0.5)
    """
    if steps < 0:
        raise ValueError(f"`steps`={steps}, expected >= 0.")
    if lr <= 0:
        raise ValueError(f"`lr`={lr}, expected > 0.")
    step_grad = grad(lambda p, x: loss_fn(appraiser, p, x))
    for _ in range(steps):
        g = step_grad(params, x_train)
        params = {k: v - lr * (g[k].detach() if first_order else g[k]) for k, v in params.items()}
    return params


def camel_reward(
    appraiser: nn.Module,
    params: Params,
    x_train: Tensor,
    x_heldout: Tensor,
    steps: int,
    lr: float,
    first_order: bool = False,
    loss_fn: LossFn = reconstruction_loss,
) -> dict[str, Tensor]:
    """CAMEL's reward R = L(φ₀; X') − L(φ_K; X') with φ_K adapted on ``x_train``.

    Returns ``{"reward", "l0", "lk"}`` scalars: ``l0`` = L(φ₀; X') (unfamiliarity),
    ``lk`` = L(φ_K; X') (what stays unlearned after K steps; low = learnable).

    .. code-block:: python

        out = camel_reward(ae, phi0, x_train, x_heldout, steps=3, lr=0.5)
        (-out["reward"]).backward()   # the Creator ascends R
    """
    l0 = loss_fn(appraiser, params, x_heldout)
    adapted = adapt_appraiser(appraiser, params, x_train, steps, lr, first_order, loss_fn)
    lk = loss_fn(appraiser, adapted, x_heldout)
    return {"reward": l0 - lk, "l0": l0, "lk": lk}


def basin_distance(samples: Tensor, bank: Tensor) -> Tensor:
    """Distance of each sample to its nearest neighbour in ``bank`` (e.g. vanilla samples over many seeds).

    Args:
        samples: ``(N, ...)``; bank: ``(M, ...)`` with the same trailing shape.

    Returns:
        ``(N,)`` Euclidean distances ``min_m ‖samples_n − bank_m‖``.

    .. code-block:: python

        d = basin_distance(concept_images, vanilla_images).mean()
    """
    if samples.shape[1:] != bank.shape[1:] or bank.shape[0] == 0:
        raise ValueError(f"`samples` {tuple(samples.shape)} and `bank` {tuple(bank.shape)}: expected (N, ...) and "
                         "(M, ...) with M > 0 and the same trailing shape.")
    return torch.cdist(samples.flatten(1).float(), bank.flatten(1).float()).min(dim=1).values


def sample_diversity(samples: Tensor) -> Tensor:
    """Mean pairwise Euclidean distance between the samples of one concept (within-concept diversity).

    A concept whose samples collapse onto one image scores 0; the vanilla class's own samples set the
    scale (a created concept should not buy learnability by losing its variety).

    Args:
        samples: ``(N, ...)`` with N >= 2.

    .. code-block:: python

        ratio = sample_diversity(concept_images) / sample_diversity(vanilla_images)
    """
    if samples.dim() < 2 or samples.shape[0] < 2:
        raise ValueError(f"`samples` has shape {tuple(samples.shape)}, expected (N, ...) with N >= 2.")
    return torch.pdist(samples.flatten(1).float()).mean()
