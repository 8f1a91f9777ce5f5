"""Prepacked oneDNN linears: same outputs as ``F.linear``, decoding unchanged, training untouched, reversible."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lit_lowrank.decoding import SpeculativeDecoder, TargetLM, plain_decode
from lit_lowrank.decoding.packed_linear import (
    default_linears,
    packed_linear_count,
    prepack_linears,
    unpack_linears,
)
from lit_lowrank.decoding.reference_drafters import OracleDrafter
from tests.decoding.test_engine import tiny_target

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this build")


@pytest.mark.parametrize("shape", [(1, 16), (3, 16), (2, 5, 16), (7, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_forward_equals_linear(shape, bias):
    torch.manual_seed(0)
    lin = nn.Linear(16, 24, bias=bias)
    x = torch.randn(*shape)
    ref = F.linear(x, lin.weight, lin.bias)
    assert prepack_linears(lin) == 1 and packed_linear_count(lin) == 1
    with torch.no_grad():
        out = lin(x)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert "_lit_packed" not in str(lin.state_dict().keys()) and set(lin.state_dict()) == ({"weight", "bias"} if bias
                                                                                        else {"weight"})


def test_weight_change_repacks_and_gradients_use_the_dense_path():
    torch.manual_seed(1)
    lin = nn.Linear(8, 4)
    prepack_linears(lin)
    x = torch.randn(3, 8)
    with torch.no_grad():
        lin.weight.mul_(2.0)  # in place: version counter moves, the packed copy must follow
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        lin.weight.data = torch.randn(4, 8)  # new storage
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    y = lin(x)  # grad enabled and the weight requires it: the ordinary autograd path
    y.sum().backward()
    torch.testing.assert_close(lin.weight.grad, torch.ones(3, 4).t() @ x)


def test_prepack_is_idempotent_reversible_and_default_linears_restores_mkl():
    model = tiny_target(seed=6).float()
    n = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert prepack_linears(model) == n
    assert prepack_linears(model) == n and packed_linear_count(model) == n
    calls = []
    orig = torch.ops.mkldnn._linear_pointwise
    lin = model.model.layers[0].mlp.down_proj
    x = torch.randn(2, lin.in_features)
    with torch.no_grad(), default_linears(model):
        calls.append(torch.equal(lin(x), F.linear(x, lin.weight)))  # bit-equal: the default kernel
    assert calls == [True] and torch.ops.mkldnn._linear_pointwise is orig
    assert unpack_linears(model) == n and packed_linear_count(model) == 0
    assert "forward" not in lin.__dict__ and type(lin) is nn.Linear


def test_greedy_decoding_is_unchanged_on_a_prepacked_target():
    model = tiny_target(seed=8).float()
    prompt = torch.tensor([1, 5, 7, 3, 9])
    ref, _ = plain_decode(TargetLM(model), prompt, 12, None)
    prepack_linears(model)
    target = TargetLM(model)
    out, _ = plain_decode(target, prompt, 12, None)
    assert torch.equal(out, ref)
    spec, stats = SpeculativeDecoder(target, OracleDrafter(ref, 4), 4).generate(prompt, 12, None)
    assert torch.equal(spec, ref) and stats.mean_acceptance_length > 2
    hf = model.generate(prompt[None], max_new_tokens=12, do_sample=False, min_new_tokens=12)[0]
    assert torch.equal(hf, ref)


def test_prepack_refuses_non_float32_weights_and_names_the_linear():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2).to(torch.float64))
    with pytest.raises(ValueError, match=r"linear '1' has a torch.float64 weight"):
        prepack_linears(model)
    assert packed_linear_count(model) == 0  # nothing half-packed


def test_prepack_leaves_subclasses_with_their_own_forward_alone():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.Sequential(nn.Linear(4, 4), Scaled(4, 4))
    assert prepack_linears(model) == 1
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(model[1](x), 2 * F.linear(x, model[1].weight, model[1].bias))


def test_a_packed_model_deep_copies_and_pickles_and_the_copy_packs_itself():
    import copy
    import io

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    prepack_linears(model)
    x = torch.randn(4, 6)
    with torch.no_grad():
        ref = model(x)
        clone = copy.deepcopy(model)
        assert packed_linear_count(clone) == 2 and clone[0].forward.linear is clone[0]
        torch.testing.assert_close(clone(x), ref)
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        torch.testing.assert_close(loaded(x), ref)
        clone[0].weight.add_(1.0)  # the copy's weights are its own: the original's output is unchanged
        torch.testing.assert_close(model(x), ref)
        assert not torch.allclose(clone(x), ref)
