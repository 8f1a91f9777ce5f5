"""FockWavefunction: an overparameterised MLP from Fock indices to complex amplitudes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class FockWavefunction(nn.Module):
    """``ψ(n₁[, n₂]) = MLP(onehot(n₁) ⊕ onehot(n₂)) → (Re, Im)``, normalised over the basis.

    The network has far more parameters than the ``2 ∏ N_m`` real numbers of the state
    (overparameterised), and the state it represents is pure (rank-1, ``ρ = ψψ†``): the
    factored (Burer–Monteiro) parameterisation of METHODS.md §4.

    Args:
        cutoffs: per-mode Fock cutoffs ``(N₁[, N₂])``.
        hidden_size: width of the hidden layers.
        num_layers: number of hidden layers (``>= 1``).
        init_state: ``(N₁[, N₂])`` amplitudes to start from (a warm start, e.g. iMLE's leading
            eigenvector): the output becomes ``init + MLP(...)`` with the last layer scaled by
            ``init_scale``, so the first state is ``init`` up to that perturbation (restarts differ).
        init_scale: the warm start's initial perturbation of the last layer.

    .. code-block:: python

        psi = FockWavefunction((8, 8))()  # (8, 8) complex, unit norm
        warm = FockWavefunction((8, 8), init_state=psi.detach())  # starts next to psi
    """

    def __init__(self, cutoffs: Sequence[int], hidden_size: int = 128, num_layers: int = 2,
                 init_state: Tensor | None = None, init_scale: float = 0.01) -> None:
        super().__init__()
        if not 1 <= len(cutoffs) <= 2 or min(cutoffs) < 1:
            raise ValueError(f"`cutoffs`={tuple(cutoffs)}, expected one or two positive cutoffs.")
        if num_layers < 1:
            raise ValueError(f"`num_layers`={num_layers}, expected >= 1.")
        self.cutoffs = tuple(int(n) for n in cutoffs)
        grids = torch.meshgrid(*[torch.arange(n) for n in self.cutoffs], indexing="ij")
        onehots = [nn.functional.one_hot(g.reshape(-1), n).float() for g, n in zip(grids, self.cutoffs)]
        self.register_buffer("inputs", torch.cat(onehots, dim=-1), persistent=False)  # (D, ΣN)
        layers: list[nn.Module] = []
        width = self.inputs.shape[1]
        for _ in range(num_layers):
            layers += [nn.Linear(width, hidden_size), nn.Tanh()]
            width = hidden_size
        layers.append(nn.Linear(width, 2))
        self.net = nn.Sequential(*layers)
        # the warm start is a buffer (zeros without one), so a checkpoint restores it without the argument
        self.register_buffer("start", torch.zeros(self.inputs.shape[0], 2))
        if init_state is not None:
            if tuple(init_state.shape) != self.cutoffs:
                raise ValueError(f"`init_state` has shape {tuple(init_state.shape)}, expected the cutoffs {self.cutoffs}.")
            start = init_state.detach().to(torch.complex64).reshape(-1)
            start = start / torch.linalg.vector_norm(start)
            self.start.copy_(torch.stack([start.real, start.imag], -1))
            with torch.no_grad():  # the MLP starts as a small perturbation of the given state
                layers[-1].weight.mul_(init_scale / max(1e-12, float(layers[-1].weight.abs().max())))
                layers[-1].bias.zero_()

    def forward(self) -> Tensor:
        """The normalised amplitudes ``(N₁[, N₂])`` complex64."""
        out = self.net(self.inputs) + self.start
        psi = torch.complex(out[:, 0], out[:, 1])
        return (psi / torch.linalg.vector_norm(psi)).reshape(self.cutoffs)
