"""collect_hessians: X^T X / n per layer, with one product shared by layers reading the same input."""

import torch
from torch import nn

from lit_lowrank.quant.ptq import collect_hessians


class _SharedInput(nn.Module):
    """q/k/v-style: three layers read one tensor; then ``o`` reads another; then an in-place change
    between two reads of one tensor (``a`` then ``b``) that must not share a product."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(8, 8) for _ in range(4))
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.q(x) + self.k(x) + self.v(x)
        y = self.o(h)
        z = y.clone()
        out = self.a(z)
        z.mul_(2.0)  # same object, new contents: b's input is 2z
        return out + self.b(z)


def _direct(xs: list[torch.Tensor]) -> torch.Tensor:
    x = torch.cat([t.reshape(-1, t.shape[-1]) for t in xs])
    return x.T @ x / x.shape[0]


def test_shared_inputs_give_each_layer_its_own_exact_hessian():
    torch.manual_seed(0)
    model = _SharedInput()
    batches = [torch.randn(3, 5, 8), torch.randn(2, 5, 8)]
    hessians = collect_hessians(model, dict(model.named_children()), batches, forward=lambda m, b: m(b))
    with torch.no_grad():
        h_in = [model.q(b) + model.k(b) + model.v(b) for b in batches]
        o_out = [model.o(h) for h in h_in]
    for name in ("q", "k", "v"):
        torch.testing.assert_close(hessians[name], _direct(batches))
    torch.testing.assert_close(hessians["o"], _direct(h_in))
    torch.testing.assert_close(hessians["a"], _direct(o_out))
    torch.testing.assert_close(hessians["b"], _direct([2 * y for y in o_out]))  # the in-place change is seen
    assert hessians["q"] is not hessians["k"]  # equal values, separate tensors (callers may modify one)
