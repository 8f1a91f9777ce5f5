"""Small backbones for the embedded data: MLP, SmallCNN, TokenBagEncoder."""

from __future__ import annotations

import pytest
import torch

from lit_lowrank.models.small import MLP, SmallCNN, TokenBagEncoder, cnn_small, mlp, token_bag


def test_mlp_flattens_and_reports_last_hidden():
    net = mlp(in_features=64, hidden_sizes=(32, 16), dropout=0.1)
    assert isinstance(net, MLP) and net.num_features == 16
    assert net(torch.randn(5, 1, 8, 8)).shape == (5, 16)
    assert net(torch.randn(5, 64)).shape == (5, 16)


def test_mlp_wrong_input_size_names_in_features():
    with pytest.raises(ValueError, match="in_features=784"):
        mlp(in_features=64)(torch.randn(2, 1, 28, 28))
    with pytest.raises(ValueError, match="hidden_sizes"):
        MLP(64, hidden_sizes=())


@pytest.mark.parametrize(("in_chans", "size"), [(1, 8), (1, 28), (3, 32)])
def test_cnn_small_shapes(in_chans, size):
    net = cnn_small(in_chans=in_chans)
    assert isinstance(net, SmallCNN) and net.num_features == 128
    assert net(torch.randn(4, in_chans, size, size)).shape == (4, 128)


def test_cnn_small_configurable_channels_and_gradients():
    torch.manual_seed(0)
    net = cnn_small(in_chans=1, channels=(8, 16))
    out = net(torch.randn(4, 1, 8, 8))
    assert out.shape == (4, 16)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


def test_token_bag_padding_does_not_change_output():
    torch.manual_seed(0)
    net = token_bag(vocab_size=50, dim=16, pad_token_id=1)
    assert isinstance(net, TokenBagEncoder) and net.num_features == 16
    short = torch.tensor([[5, 7, 9], [3, 4, 2]])
    padded = torch.tensor([[5, 7, 9, 1, 1, 1], [3, 1, 4, 1, 2, 1]])  # trailing and interleaved padding
    torch.testing.assert_close(net(short), net(padded))
    # A row padded for a longer neighbour encodes like the row alone.
    batch = torch.tensor([[5, 7, 1, 1], [3, 4, 2, 8]])
    torch.testing.assert_close(net(batch)[0], net(torch.tensor([[5, 7]]))[0])


def test_token_bag_all_padding_row_is_finite():
    net = TokenBagEncoder(vocab_size=10, dim=8, pad_token_id=0, num_layers=0)
    out = net(torch.zeros(2, 5, dtype=torch.long))
    assert torch.equal(out, torch.zeros(2, 8))


def test_token_bag_gradients_skip_padding_row():
    torch.manual_seed(0)
    net = TokenBagEncoder(vocab_size=10, dim=8, pad_token_id=0)
    net(torch.tensor([[3, 4, 0]])).sum().backward()
    grad = net.embedding.weight.grad
    assert grad[3].abs().sum() > 0 and grad[0].abs().sum() == 0


def test_token_bag_rejects_bad_input():
    net = TokenBagEncoder(vocab_size=10, dim=8)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        net(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        net(torch.ones(5, dtype=torch.long))
    with pytest.raises(ValueError, match="pad_token_id=10"):
        TokenBagEncoder(vocab_size=10, pad_token_id=10)
