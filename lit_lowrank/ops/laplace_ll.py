"""Last-layer Laplace baseline (laplace-torch): a Gaussian posterior over a trained linear head.

Post-hoc: the head is trained by MLE; ``laplace-torch`` fits the full GGN Hessian of the head's
weights on the training features, tunes the prior precision by the marginal likelihood and
predicts with the linearised (GLM) probit approximation, so prediction costs one backbone
forward. Used by the PoLAR-VBLL benchmark as the "LoRA + last-layer Laplace" baseline.

.. code-block:: python

    predict = fit_last_layer_laplace(model.head, train_features, train_labels)
    probs = predict(test_features)     # (B, C)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def fit_last_layer_laplace(head: nn.Linear, features: Tensor, labels: Tensor, batch_size: int = 256,
                           hessian_structure: str = "full", marglik_steps: int = 50) -> Callable[[Tensor], Tensor]:
    """Fit a Laplace posterior over ``head`` on ``(features, labels)``; return ``features -> probs``.

    Args:
        head: the trained ``nn.Linear`` (not modified).
        features: ``(N, d)`` training features (the backbone's output, detached).
        labels: ``(N,)`` training labels.
        batch_size: batch size of the Hessian pass.
        hessian_structure: ``"full"``, ``"kron"`` or ``"diag"`` (laplace-torch).
        marglik_steps: Adam steps of the marginal-likelihood prior-precision tuning.
    """
    try:
        from laplace import Laplace
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("fit_last_layer_laplace needs laplace-torch: pip install -c constraints.txt "
                          "'lit_lowrank[bayes]'") from err
    if features.dim() != 2 or labels.shape != features.shape[:1]:
        raise ValueError(f"fit_last_layer_laplace: features {tuple(features.shape)} must be (N, d) and labels "
                         f"{tuple(labels.shape)} (N,).")
    head = _copy_linear(head)  # laplace-torch reads the MAP weights; the caller's head stays untouched
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features.detach(), labels), batch_size)
    la = Laplace(head, "classification", subset_of_weights="all", hessian_structure=hessian_structure)
    la.fit(loader)
    la.optimize_prior_precision(method="marglik", n_steps=marglik_steps)

    def predict(x: Tensor) -> Tensor:
        return la(x.detach(), pred_type="glm", link_approx="probit")

    return predict


def _copy_linear(head: nn.Linear) -> nn.Linear:
    copy = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None).to(head.weight.device)
    copy.load_state_dict(head.state_dict())
    return copy.requires_grad_(True)
