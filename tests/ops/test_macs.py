import torch
from torch import nn

from lit_lowrank.ops.macs import conv_macs, count_macs, linear_macs


def test_count_macs_sums_linear_and_conv_from_shapes():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, groups=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 5 * 5, 4))
    total, per = count_macs(model, torch.randn(2, 3, 5, 5))
    assert per["0"] == 2 * 8 * 25 * 3 * 9 == conv_macs((2, 8, 5, 5), 3, (3, 3))
    assert per["3"] == linear_macs(2, 200, 4) == 1600
    assert total == per["0"] + per["3"]
    # the counter leaves no hooks behind
    assert all(not m._forward_hooks for m in model.modules())


def test_grouped_conv_and_repeated_module():
    conv = nn.Conv1d(4, 4, 3, groups=4)
    _, per = count_macs(conv, torch.randn(1, 4, 10))
    assert per[""] == 4 * 8 * 1 * 3
    lin = nn.Linear(3, 3)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return self.lin(self.lin(x))

    total, per = count_macs(Twice(), torch.randn(5, 3))
    assert per["lin"] == 2 * 5 * 9 and total == 90
