"""Last-layer Laplace baseline (laplace-torch): a MAP linear head under a Gaussian prior, its Laplace posterior,
and the prior precision that maximises laplace-torch's marginal likelihood — the head trained under the *same*
prior it is judged by.

``fit_last_layer_laplace(features, labels, num_classes)`` alternates (MacKay's evidence iterations; laplace-torch's
online ``marglik_training`` of Immer et al. 2021 does the same per epoch, here on a fixed feature set):

1. the MAP head for prior precision ``δ``: ``argmin_w Σᵢ CE(w φᵢ, yᵢ) + δ/2 ‖w‖²`` (full batch, L-BFGS);
2. the Laplace posterior at the MAP (laplace-torch, full GGN ``H`` of the head) and ``δ ←`` the maximiser of its
   ``log_marginal_likelihood`` in ``δ``. With ``w`` and ``H`` fixed that maximiser solves the stationarity
   condition ``δ‖w‖² = γ(δ) = Σᵢ λᵢ/(λᵢ + δ)`` (``λᵢ`` the eigenvalues of ``H``), solved here by the fixed-point
   iteration (**decision**: the same optimum as laplace-torch's ``optimize_prior_precision(method="marglik")``,
   checked in the tests, at a fraction of its 100 Adam steps);

until ``δ`` moves by less than 1% (at most ``rounds`` rounds). Prediction: the linearised (GLM) predictive with the
probit approximation — one backbone forward per prediction. A head trained without the prior and a precision
fitted afterwards (the usual post-hoc recipe) is not consistent: the curvature is taken at a point that is not the
MAP of the prior it is combined with.

.. code-block:: python

    predict, info = fit_last_layer_laplace(train_features, train_labels, num_classes=5)
    probs = predict(test_features)     # (B, C)
    info["prior_precision"], info["rounds"]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


def _map_head(features: Tensor, labels: Tensor, num_classes: int, precision: float, init: nn.Linear | None,
              max_iter: int = 200) -> nn.Linear:
    head = nn.Linear(features.shape[1], num_classes)
    if init is not None:
        head.load_state_dict(init.state_dict())
    params = list(head.parameters())
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        # the log joint of laplace-torch's model: summed likelihood + δ/2‖w‖² over weight and bias
        loss = nn.functional.cross_entropy(head(features), labels, reduction="sum") + 0.5 * precision * sum(
            p.pow(2).sum() for p in params)
        loss.backward()
        return loss

    opt.step(closure)
    return head


def marglik_precision(la, weights: Tensor, start: float, iterations: int = 200, tol: float = 1e-6) -> float:
    """The ``δ`` maximising laplace-torch's ``log_marginal_likelihood`` of ``la`` (full Hessian) at fixed ``weights``.

    Stationarity: ``δ‖w‖² = Σᵢ λᵢ/(λᵢ + δ)`` with ``λᵢ`` the eigenvalues of ``la.H`` (the GGN without the prior).
    """
    evals = torch.linalg.eigvalsh(la.H.detach().double()).clamp_min(0.0)
    norm2 = float(weights.detach().double().pow(2).sum())
    delta = float(start)
    for _ in range(iterations):
        new = float((evals / (evals + delta)).sum()) / max(norm2, 1e-12)
        if abs(new - delta) <= tol * delta:
            return new
        delta = new
    return delta


def fit_last_layer_laplace(features: Tensor, labels: Tensor, num_classes: int, prior_precision: float = 1.0,
                           rounds: int = 50, tol: float = 0.01,
                           optimize: bool = True) -> tuple[Callable[[Tensor], Tensor], dict[str, Any]]:
    """MAP head + Laplace with the marginal-likelihood prior precision (module docstring); ``features -> probs``.

    Args:
        features: ``(N, d)`` training features (the backbone's output, detached).
        labels: ``(N,)`` training labels in ``[0, num_classes)``.
        num_classes: ``C``.
        prior_precision: the starting ``δ``.
        rounds: at most this many MAP / marginal-likelihood alternations.
        tol: stop when ``δ`` moves by less than this fraction.
        optimize: ``False`` keeps ``δ = prior_precision`` (the MAP head under it, one round): for choosing
            ``δ`` on validation data instead of by the marginal likelihood.

    Returns:
        ``(predict, info)``: ``predict(features) -> (B, C)`` probabilities; ``info`` with the final
        ``prior_precision``, the ``rounds`` run, whether it ``converged``, the ``log_marglik`` and the MAP ``head``.
    """
    try:
        from laplace import Laplace
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("fit_last_layer_laplace needs laplace-torch: pip install -c constraints.txt "
                          "'lit_lowrank[bayes]'") from err
    if features.dim() != 2 or labels.shape != features.shape[:1]:
        raise ValueError(f"fit_last_layer_laplace: features {tuple(features.shape)} must be (N, d) and labels "
                         f"{tuple(labels.shape)} (N,).")
    if not prior_precision > 0 or rounds < 1:
        raise ValueError(f"`prior_precision`={prior_precision!r} must be positive and `rounds`={rounds!r} >= 1.")
    features, labels = features.detach().float(), labels.long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, labels), batch_size=len(labels))
    precision, head, la, converged, done = float(prior_precision), None, None, False, 0
    for done in range(1, rounds + 1):
        head = _map_head(features, labels, num_classes, precision, head)
        la = Laplace(head, "classification", subset_of_weights="all", hessian_structure="full",
                     prior_precision=precision)
        la.fit(loader)
        if not optimize:
            converged = True
            break
        new = marglik_precision(la, torch.cat([p.detach().flatten() for p in head.parameters()]), precision)
        converged = abs(new - precision) <= tol * precision
        precision = new
        if converged:
            break
    la.prior_precision = precision

    def predict(x: Tensor) -> Tensor:
        return la(x.detach().float(), pred_type="glm", link_approx="probit")

    return predict, {"prior_precision": precision, "rounds": done, "converged": converged,
                     "log_marglik": float(la.log_marginal_likelihood()), "head": head}
