import pytest
import torch
from torch import nn

from lit_lowrank.ops.lowrank import low_rank_approx
from lit_lowrank.ops.sara.svd_linear import SVDLinear


def test_full_rank_is_the_original_layer_bit_for_bit():
    torch.manual_seed(0)
    lin = nn.Linear(24, 16)
    x = torch.randn(5, 7, 24)
    layer = SVDLinear(lin)
    assert torch.equal(layer(x), lin(x))
    layer.set_rank(16)  # above the break-even rank 16*24/40 = 9.6: the dense weight runs
    assert torch.equal(layer(x), lin(x))


def test_truncated_rank_is_the_best_rank_r_map_and_counts_macs():
    torch.manual_seed(1)
    lin = nn.Linear(32, 20)
    x = torch.randn(6, 32)
    layer = SVDLinear(lin)
    layer.set_rank(4)
    expected = x @ low_rank_approx(lin.weight.detach(), 4).T + lin.bias.detach()
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert layer.macs_used == 6 * 4 * (32 + 20) and layer.macs_dense == 6 * 32 * 20
    layer.reset_macs()
    assert layer.macs_used == 0
    with pytest.raises(ValueError, match="rank"):
        layer.set_rank(21)


def test_pointwise_conv():
    torch.manual_seed(2)
    conv = nn.Conv2d(8, 12, 1)
    x = torch.randn(2, 8, 5, 5)
    layer = SVDLinear(conv)
    assert torch.equal(layer(x), conv(x))
    assert layer.macs_used == layer.macs_dense == 2 * 25 * 8 * 12
    layer.reset_macs()
    layer.set_rank(2)
    w = low_rank_approx(conv.weight.detach().reshape(12, 8), 2).reshape(12, 8, 1, 1)
    torch.testing.assert_close(layer(x), nn.functional.conv2d(x, w, conv.bias), atol=1e-5, rtol=1e-5)
    assert layer.macs_used == 2 * 25 * 2 * (8 + 12)
    with pytest.raises(ValueError, match="ungrouped"):
        SVDLinear(nn.Conv2d(8, 8, 3, groups=2))


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 1, 1), (1, 2, 2)])
def test_kxk_conv_is_factored_as_cout_by_cin_k_k(stride, padding, dilation):
    torch.manual_seed(3)
    conv = nn.Conv2d(6, 10, 3, stride=stride, padding=padding, dilation=dilation)
    x = torch.randn(2, 6, 9, 9)
    layer = SVDLinear(conv)
    assert (layer.out_features, layer.in_features, layer.full_rank) == (10, 54, 10)
    reference = conv(x)
    # full rank (and any rank above the break-even 10*54/64 = 8.4) runs the original conv bit for bit
    assert torch.equal(layer(x), reference)
    layer.set_rank(9)
    assert torch.equal(layer(x), reference)
    pixels = reference.shape[0] * reference.shape[2] * reference.shape[3]
    assert layer.rows_seen == pixels  # output pixels, not input numel / n (stride and padding change it)
    layer.reset_macs()
    layer.set_rank(3)
    w = low_rank_approx(conv.weight.detach().reshape(10, 54), 3).reshape(10, 6, 3, 3)
    expected = nn.functional.conv2d(x, w, conv.bias, stride, padding, dilation)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert layer.macs_used == pixels * 3 * (54 + 10) and layer.macs_dense == pixels * 54 * 10
    # the unfolded rows the data-aware LRAE sees reproduce the conv as a matrix product
    layer.captured_inputs = []
    layer.set_rank(None)
    layer(x)
    rows = layer.captured_inputs[0]
    flat = rows @ conv.weight.detach().reshape(10, 54).T + conv.bias.detach()
    torch.testing.assert_close(flat.transpose(1, 2).reshape_as(reference), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(16, 24), (64, 64), (10, 54), (1, 7)])
def test_factors_are_cached_only_below_the_break_even_rank(shape):
    torch.manual_seed(4)
    out_f, in_f = shape
    lin = nn.Linear(in_f, out_f)
    layer = SVDLinear(lin)
    break_even = out_f * in_f / (out_f + in_f)
    c = layer.cached_rank
    assert c < break_even <= c + 1  # every rank that runs factored is cached, none that runs dense
    assert layer.us.shape == (out_f, c) and layer.vh.shape == (c, in_f)
    assert layer.singular.shape == (min(shape),)  # the whole spectrum stays for the LRAE
    # the cache costs less than the weight it sits beside (full-rank U S, V^T cost (m + n) min(m, n))
    assert layer.us.numel() + layer.vh.numel() < lin.weight.numel()
    x = torch.randn(3, in_f)
    if c >= 1:  # the largest cached rank is the best rank-c map
        layer.set_rank(c)
        expected = x @ low_rank_approx(lin.weight.detach(), c).T + lin.bias.detach()
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    if c + 1 <= min(shape):  # the first uncached rank runs the dense layer
        layer.set_rank(c + 1)
        assert torch.equal(layer(x), lin(x))
