"""Variational Bayesian last layer (VBLL) for classification, built on the ``vbll`` package.

The head is ``vbll.DiscClassification`` (Harrison et al. 2024, discriminative VBLL):
a Gaussian posterior ``q(W) = N(M, S)`` over the last-layer weights and a diagonal
Gaussian logit noise ``eps ~ N(0, diag(s^2))``. Logits ``z = W phi + eps`` are Gaussian
given the features ``phi`` with mean ``mu = M phi`` and (diagonal parameterisation)
variance ``var_c = sum_j S_cj phi_j^2 + s_c^2``. The training loss is the negative
ELBO with the Jensen bound on the softmax, the KL to the prior ``N(0, sigma_p^2 I)``
(``sigma_p^2 = prior_scale * 2 / d``) and the Wishart term on the noise precision
scaled by ``regularization_weight = kl_scale / N_train``:

``L = -mean_i [mu_{y_i} - logsumexp(mu + var / 2)] - (1/N)(dof' logdet P - wishart/2 tr P - KL(q || p))``

with ``P = diag(1/s^2)``, ``dof' = (dof + C + 1)/2`` and
``KL = 1/2 sum_c [ |M_c|^2/sigma_p^2 + tr S_c/sigma_p^2 + d log sigma_p^2 - logdet S_c ]``
(constants dropped, as in ``vbll``).

Why the package and not an own implementation: ``vbll`` is the authors' maintained
code, pure torch (no pins beyond ``torch``), and its ``DiscClassification`` is exactly
the discriminative classification VBLL the method needs. What it lacks is added here:
a bias (a constant feature appended to ``phi``, so a trained ``nn.Linear`` head can be
the posterior mean at start), a closed-form predictive (probit approximation of the
expected softmax), a seeded MC predictive, and the logit moments for diagnostics.

.. code-block:: python

    head = VBLLHead(in_features=64, num_classes=10, num_train=500)
    loss = head.elbo_loss(features, y)          # train with this
    probs = head.predictive(features)           # (B, C), MC or closed form
    mean, var = head.logit_moments(features)    # Gaussian logits
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch
from torch import Tensor, nn

Predictive = Literal["mc", "probit", "mean"]
PREDICTIVES: tuple[str, ...] = ("mc", "probit", "mean")


def _import_vbll():
    try:
        import vbll
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "VBLLHead needs the `vbll` package: pip install -c constraints.txt 'lit_lowrank[bayes]'"
        ) from err
    return vbll


def probit_softmax(mean: Tensor, var: Tensor) -> Tensor:
    """Closed-form approximation of ``E[softmax(z)]`` for ``z ~ N(mean, diag(var))``.

    The multiclass probit approximation (MacKay 1992; Gibbs 1997): each logit is
    shrunk by ``1 / sqrt(1 + pi var / 8)`` before the softmax.

    .. code-block:: python

        probs = probit_softmax(mean, var)   # (B, C) -> (B, C), rows sum to 1
    """
    if mean.shape != var.shape:
        raise ValueError(f"probit_softmax: `mean` {tuple(mean.shape)} and `var` {tuple(var.shape)} must match.")
    return torch.softmax(mean / torch.sqrt(1.0 + math.pi / 8.0 * var), dim=-1)


class VBLLHead(nn.Module):
    """A variational Bayesian last layer for classification (``vbll.DiscClassification``).

    ``forward`` returns the *log predictive probabilities* ``log p(y | x, D)``, so code
    that treats the head's output as logits (``softmax``, ``cross_entropy``, ECE on
    ``softmax(out)``) reads the Bayesian predictive unchanged; ``cross_entropy(out, y)``
    is then the predictive NLL. Training uses :meth:`elbo_loss`.

    Args:
        in_features: feature width ``d``.
        num_classes: number of classes ``C``.
        num_train: size of the training set ``N``; the KL and Wishart terms are scaled
            by ``kl_scale / N`` (the ELBO per sample).
        kl_scale: multiplies ``1 / N`` (1 = the ELBO; < 1 tempers the prior).
        parameterization: covariance of ``q(W)``: ``"diagonal"``, ``"dense"`` or ``"lowrank"``.
        prior_scale: prior variance multiplier (``vbll`` uses ``prior_scale * 2 / d``).
        wishart_scale / dof: Wishart prior on the logit-noise precision (``vbll``).
        bias: append a constant 1 to the features (a bias row in ``W``).
        predictive: ``"mc"`` (average ``num_samples`` softmax samples of the Gaussian
            logits), ``"probit"`` (closed form, :func:`probit_softmax`) or ``"mean"``
            (softmax of the mean logits: the MAP-like point prediction).
        num_samples: MC samples of the logits (head only: one backbone forward).
        sample_seed: seed of the MC samples in eval mode, so evaluation is
            deterministic; ``None`` = the global RNG.

    .. code-block:: python

        head = VBLLHead(128, 4, num_train=2000, predictive="probit")
        out = head(features)             # log predictive probabilities (B, 4)
        loss = head.elbo_loss(features, y)
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        num_train: int,
        kl_scale: float = 1.0,
        parameterization: str = "diagonal",
        prior_scale: float = 1.0,
        wishart_scale: float = 1.0,
        dof: float = 1.0,
        bias: bool = True,
        predictive: Predictive = "mc",
        num_samples: int = 32,
        sample_seed: int | None = 0,
    ) -> None:
        super().__init__()
        for name, value in (("in_features", in_features), ("num_train", num_train), ("num_samples", num_samples)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"VBLLHead: `{name}`={value!r}, expected a positive integer.")
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"VBLLHead: `num_classes`={num_classes!r}, expected an integer >= 2.")
        if kl_scale < 0:
            raise ValueError(f"VBLLHead: `kl_scale`={kl_scale}, expected >= 0.")
        if predictive not in PREDICTIVES:
            raise ValueError(f"VBLLHead: `predictive`={predictive!r}, expected one of {PREDICTIVES}.")
        if parameterization not in ("diagonal", "dense", "lowrank"):
            raise ValueError(f"VBLLHead: `parameterization`={parameterization!r}, expected 'diagonal', 'dense' or "
                             "'lowrank'.")
        vbll = _import_vbll()
        self.in_features, self.num_classes, self.bias = in_features, num_classes, bias
        self.num_train, self.kl_scale = num_train, kl_scale
        self.predictive_mode, self.num_samples, self.sample_seed = predictive, num_samples, sample_seed
        self.layer = vbll.DiscClassification(
            in_features + int(bias), num_classes, regularization_weight=kl_scale / num_train,
            parameterization=parameterization, prior_scale=prior_scale, wishart_scale=wishart_scale, dof=dof,
        )

    # ----- features and moments
    def _phi(self, features: Tensor) -> Tensor:
        if features.dim() != 2 or features.shape[-1] != self.in_features:
            raise ValueError(f"VBLLHead: features must be (B, {self.in_features}), got {tuple(features.shape)}.")
        if self.bias:
            features = torch.cat([features, features.new_ones(features.shape[0], 1)], dim=-1)
        return features

    def logit_moments(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and variance ``(B, C)`` of the Gaussian logits ``z = W phi + eps``."""
        dist = self.layer.logit_predictive(self._phi(features))
        return dist.mean, dist.covariance_diagonal

    def weight_variance(self, features: Tensor) -> Tensor:
        """Variance ``(B, C)`` of ``W phi`` alone (the epistemic part, without the logit noise)."""
        phi = self._phi(features)
        return (self.layer.W() @ phi[..., None]).squeeze(-1).covariance_diagonal

    # ----- loss and predictive
    def elbo_loss(self, features: Tensor, y: Tensor) -> Tensor:
        """Negative ELBO per training sample (the module docstring's ``L``)."""
        if y.shape != features.shape[:1]:
            raise ValueError(f"VBLLHead.elbo_loss: `y` {tuple(y.shape)} must be (B,) for features "
                             f"{tuple(features.shape)}.")
        return self.layer._get_train_loss_fn(self._phi(features))(y)

    def predictive(self, features: Tensor, mode: Predictive | None = None) -> Tensor:
        """Predictive class probabilities ``(B, C)``; ``mode`` overrides the head's ``predictive``."""
        mode = mode or self.predictive_mode
        if mode not in PREDICTIVES:
            raise ValueError(f"VBLLHead.predictive: `mode`={mode!r}, expected one of {PREDICTIVES}.")
        mean, var = self.logit_moments(features)
        if mode == "mean":
            return mean.softmax(-1)
        if mode == "probit":
            return probit_softmax(mean, var)
        shape = (self.num_samples, *mean.shape)
        if self.training or self.sample_seed is None:
            noise = torch.randn(shape, device=mean.device, dtype=mean.dtype)
        else:  # evaluation: the same samples every call, so metrics are reproducible
            gen = torch.Generator(device=mean.device).manual_seed(self.sample_seed)
            noise = torch.randn(shape, generator=gen, device=mean.device, dtype=mean.dtype)
        return (mean + var.sqrt() * noise).softmax(-1).mean(0)

    def forward(self, features: Tensor) -> Tensor:
        """Log predictive probabilities ``(B, C)`` (usable wherever logits are expected)."""
        return self.predictive(features).clamp_min(1e-12).log()

    @torch.no_grad()
    def init_from_linear(self, linear: nn.Linear) -> "VBLLHead":
        """Take a trained ``nn.Linear`` head as the posterior mean (weight and, with ``bias``, its bias)."""
        if linear.in_features != self.in_features or linear.out_features != self.num_classes:
            raise ValueError(f"init_from_linear: Linear({linear.in_features}, {linear.out_features}) does not fit "
                             f"VBLLHead({self.in_features}, {self.num_classes}).")
        self.layer.W_mean[:, : self.in_features].copy_(linear.weight)
        if self.bias:
            self.layer.W_mean[:, -1].copy_(linear.bias if linear.bias is not None else 0.0)
        return self

    @torch.no_grad()
    def fit_covariance_(self, features: Tensor, max_iter: int = 200, tol: float | None = None) -> "VBLLHead":
        """Set ``q(W)``'s diagonal covariance and the logit noise to the ELBO's optimum at the current mean.

        ``vbll`` starts every weight at std ``1 / d`` whatever the feature scale, so the logit variance
        ``sum_j S_cj phi_j^2`` starts at ``|phi|^2 / d^2``; at a small learning rate the log-std barely moves
        in a short fine-tune (on SmolLM2's option scores: a weight variance 0.78 per logit after 48 steps, the
        initial value). The negative ELBO is convex in ``(S, 1/s^2)`` for a fixed mean, and its stationary point is
        ``1/S_cj = 1/sigma_p^2 + (N / kl_scale) mean_i[p_ic phi_ij^2]`` and
        ``s_c^2 = (sqrt(dof'^2 + k_c w) - dof') / k_c`` with ``k_c = (N / kl_scale) mean_i p_ic``, where
        ``p = softmax(mu + var / 2)`` is the Jensen bound's softmax (the labels do not enter). ``p`` depends
        on the variances, so the two equations are iterated to a fixed point on ``features``.

        Needs the ``"diagonal"`` parameterisation and ``kl_scale > 0`` (without the KL the optimum is ``S = 0``).
        ``tol`` bounds the last step's change in every log-variance (default: 100 × the dtype's machine epsilon);
        a run that ends at ``max_iter`` above it warns.

        .. code-block:: python

            head.init_from_linear(trained_linear).fit_covariance_(train_features)
        """
        if self.layer.W_dist.__name__ != "Normal":
            raise ValueError("VBLLHead.fit_covariance_: needs `parameterization`='diagonal' (the closed form is for "
                             f"a diagonal q(W)), got {self.layer.W_dist.__name__}.")
        reg = float(self.layer.regularization_weight)
        if reg <= 0:
            raise ValueError(f"VBLLHead.fit_covariance_: `kl_scale`={self.kl_scale} gives no KL term, so the "
                             "optimal weight variance is 0; expected kl_scale > 0.")
        phi = self._phi(features.detach())
        if phi.shape[0] == 0:
            raise ValueError("VBLLHead.fit_covariance_: `features` has no rows.")
        phi2, mu = phi.square(), phi @ self.layer.W_mean.T
        tol = 100 * torch.finfo(phi.dtype).eps if tol is None else tol
        prior_precision = 1.0 / float(self.layer.prior_scale)
        dof, wishart = float(self.layer.dof), float(self.layer.wishart_scale)
        w_var, noise_var = self.layer.W_logdiag.mul(2).exp(), self.layer.noise_logdiag.mul(2).exp()
        for _ in range(max_iter):
            p = torch.softmax(mu + 0.5 * (phi2 @ w_var.T + noise_var), dim=-1)
            new_w = 1.0 / (prior_precision + (p.T @ phi2) / phi.shape[0] / reg)
            k = p.mean(0) / reg
            new_noise = (torch.sqrt(dof * dof + k * wishart) - dof) / k
            change = max((new_w.log() - w_var.log()).abs().max().item(),
                         (new_noise.log() - noise_var.log()).abs().max().item())
            w_var, noise_var = new_w, new_noise
            if change < tol:
                break
        else:
            warnings.warn(f"VBLLHead.fit_covariance_: no fixed point within `max_iter`={max_iter} (last change "
                          f"{change:.2e} in log-variance, `tol`={tol}); the covariance is the last iterate.",
                          RuntimeWarning, stacklevel=2)
        self.layer.W_logdiag.copy_(0.5 * w_var.log())
        self.layer.noise_logdiag.copy_(0.5 * noise_var.log())
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_classes={self.num_classes}, num_train={self.num_train}, "
                f"predictive={self.predictive_mode!r}")


def vbll_parameter_groups(head: VBLLHead) -> dict[str, list[nn.Parameter]]:
    """The head's parameters split into the posterior ``mean`` and its ``covariance`` (incl. logit noise)."""
    mean = [head.layer.W_mean]
    ids = {id(p) for p in mean}
    return {"mean": mean, "covariance": [p for p in head.parameters() if id(p) not in ids and p.requires_grad]}
