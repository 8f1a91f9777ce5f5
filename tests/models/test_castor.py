"""Castor the model: reductions to known filters, equivariance, input forms, edge cases, task wiring."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import to_dense_adj

from lit_lowrank.models import GRAPH_MODELS, Castor


def _random_graph(n: int = 12, p: float = 0.3, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    upper = torch.triu(torch.rand(n, n, generator=gen) < p, diagonal=1)
    edges = upper.nonzero().T
    return torch.cat([edges, edges.flip(0)], dim=1)


def _hand_a_hat(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    """D̃^(-1/2)(A + I)D̃^(-1/2) built densely, independently of the sparse code path."""
    a = torch.zeros(n, n)
    a[edge_index[1], edge_index[0]] = 1.0
    a = a + torch.eye(n)
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


def _randomise_routers(model: Castor, seed: int = 0) -> Castor:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (model.router_weight, model.router_bias, model.beta_raw):
            if p is not None:
                p.copy_(torch.randn(p.shape, generator=gen))
    return model.eval()


def test_fixed_low_pass_without_momentum_is_k_step_propagation():
    edge_index, n, k = _random_graph(), 12, 4
    x = torch.randn(n, 5)
    model = Castor(5, 3, hidden_channels=8, K=k, router="low", momentum="none", readout="last", dropout=0.0).eval()
    expected = torch.linalg.matrix_power(_hand_a_hat(edge_index, n), k) @ model.encode(x)
    torch.testing.assert_close(model(x, edge_index), expected, atol=1e-5, rtol=1e-5)


def test_zero_beta_heavy_ball_equals_no_momentum():
    """β = 0 (the initial value) is first-order propagation: the same as momentum='none'."""
    edge_index, x = _random_graph(), torch.randn(12, 5)
    torch.manual_seed(0)
    a = Castor(5, 3, K=3, momentum="heavy_ball").eval()
    torch.manual_seed(0)
    b = Castor(5, 3, K=3, momentum="none").eval()
    with torch.no_grad():
        a.router_weight.normal_()
        b.router_weight.copy_(a.router_weight)
    assert torch.equal(a.betas(), torch.zeros(3))
    torch.testing.assert_close(a(x, edge_index), b(x, edge_index))


def test_momentum_matches_the_recursion_by_hand():
    edge_index, n = _random_graph(), 12
    x = torch.randn(n, 4)
    model = Castor(4, 2, K=2, router="high", readout="last", dropout=0.0).eval()
    with torch.no_grad():
        model.beta_raw.copy_(torch.tensor([0.3, -0.7]))
    beta = 0.9 * torch.tanh(torch.tensor([0.3, -0.7]))
    high = torch.eye(n) - _hand_a_hat(edge_index, n)
    h0 = model.encode(x)
    h1 = high @ h0 + beta[0] * (h0 - h0)
    h2 = high @ h1 + beta[1] * (h1 - h0)
    torch.testing.assert_close(model(x, edge_index), h2, atol=1e-5, rtol=1e-5)
    # Nesterov: the primitive acts on the look-ahead point
    nesterov = Castor(4, 2, K=2, router="high", readout="last", momentum="nesterov", dropout=0.0).eval()
    nesterov.load_state_dict(model.state_dict())
    y1 = h1 + beta[1] * (h1 - h0)
    torch.testing.assert_close(nesterov(x, edge_index), high @ y1, atol=1e-5, rtol=1e-5)


def test_identity_router_returns_the_mlp_output():
    edge_index, x = _random_graph(), torch.randn(12, 5)
    model = Castor(5, 3, K=5, router="identity", momentum="none", readout="last").eval()
    torch.testing.assert_close(model(x, edge_index), model.encode(x))


@pytest.mark.parametrize("momentum", ["heavy_ball", "nesterov"])
@pytest.mark.parametrize("sharing", ["per_hop", "shared"])
def test_permutation_equivariance(momentum, sharing):
    edge_index, n = _random_graph(n=15), 15
    x = torch.randn(n, 6)
    model = _randomise_routers(Castor(6, 3, K=4, momentum=momentum, router_sharing=sharing), seed=1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(2))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n)
    out = model(x, edge_index)
    out_perm = model(x[perm], inverse[edge_index])
    torch.testing.assert_close(out_perm, out[perm], atol=1e-5, rtol=1e-5)


def test_sparse_and_dense_edge_inputs_agree():
    edge_index, n = _random_graph(), 12
    x = torch.randn(n, 5)
    model = _randomise_routers(Castor(5, 3, K=3))
    dense = to_dense_adj(edge_index, max_num_nodes=n)[0]
    reference = model(x, edge_index)
    torch.testing.assert_close(model(x, dense), reference)
    torch.testing.assert_close(model(x, dense.to_sparse()), reference)
    torch.testing.assert_close(model(x, edge_index, torch.ones(edge_index.shape[1])), reference)


def test_isolated_nodes_and_self_loops():
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # nodes 3 and 4 isolated
    x = torch.randn(5, 4)
    model = Castor(4, 2, K=3, router="low", momentum="none", readout="last").eval()
    out = model(x, edge_index)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[3:], model.encode(x)[3:])  # Â leaves an isolated node alone
    loops = torch.arange(5).repeat(2, 1)
    torch.testing.assert_close(model(x, torch.cat([edge_index, loops], 1)), out)
    empty = model(x, torch.zeros(2, 0, dtype=torch.long))
    torch.testing.assert_close(empty, model.encode(x))


def test_routes_and_betas_are_recorded_and_trainable():
    edge_index, x = _random_graph(), torch.randn(12, 5)
    model = Castor(5, 3, K=4)
    model(x, edge_index).square().sum().backward()
    assert model.last_routes.shape == (4, 12, 3)
    torch.testing.assert_close(model.last_routes.sum(-1), torch.ones(4, 12))
    # initial mix is router_init, whatever tau
    zeros = torch.zeros(1, 3)
    torch.testing.assert_close(Castor(5, 3, K=2, tau=0.1).routes(0, zeros, zeros)[0], torch.tensor([0.8, 0.1, 0.1]))
    for p in (model.router_weight, model.router_bias, model.beta_raw, model.gamma):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("kwargs, match", [
    ({"router": "mlp"}, "`router`='mlp'"), ({"readout": "mean"}, "`readout`='mean'"),
    ({"momentum": "adam"}, "`momentum`='adam'"), ({"beta_max": 1.5}, "`beta_max`=1.5"),
    ({"tau": 0.0}, "`tau`=0.0"), ({"K": -1}, "`K`=-1"), ({"router_init": (0.5, 0.5, 0.0)}, "router_init"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Castor(4, 2, **kwargs)


def test_bad_inputs_are_named():
    model = Castor(4, 2, K=1)
    with pytest.raises(ValueError, match="out of range"):
        model(torch.randn(3, 4), torch.tensor([[0, 5], [5, 0]]))
    with pytest.raises(ValueError, match=r"x: expected node features"):
        model(torch.randn(3, 4, 1), torch.tensor([[0, 1], [1, 0]]))


def test_node_classification_module_builds_castor_by_name():
    from lit_lowrank.tasks import NodeClassificationModule

    module = NodeClassificationModule("castor", in_channels=5, num_classes=3, model_kwargs={"K": 3})
    assert isinstance(module.model, Castor) and module.model.K == 3
    assert set(GRAPH_MODELS) >= {"castor", "gprgnn", "bernnet", "chebnetii", "acmgcn"}


def test_checkpoint_round_trip_through_the_task_module(tmp_path):
    import lightning.pytorch as pl

    from lit_lowrank.datamodules import GraphDataModule
    from lit_lowrank.tasks import NodeClassificationModule

    pl.seed_everything(0)
    data = GraphDataModule("karate", num_splits=1)
    module = NodeClassificationModule("castor", in_channels=34, num_classes=4, model_kwargs={"K": 3})
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    trainer.save_checkpoint(tmp_path / "castor.ckpt")
    reloaded = NodeClassificationModule.load_from_checkpoint(tmp_path / "castor.ckpt").eval()
    graph = data.data
    torch.testing.assert_close(reloaded(graph.x, graph.edge_index), module.eval()(graph.x, graph.edge_index))


def _graph(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, n, (2, 40), generator=g)
    return torch.randn(n, 5, generator=g), torch.cat([edges, edges.flip(0)], 1)


def test_oracle_with_one_group_is_the_global_router():
    x, edge_index = _graph()
    torch.manual_seed(0)
    glob = Castor(5, 3, K=4, router="global").eval()
    oracle = Castor(5, 3, K=4, router="oracle", groups=torch.zeros(12, dtype=torch.long)).eval()
    oracle.load_state_dict({**glob.state_dict(), "router_bias": glob.router_bias.data[:, None, :].clone(),
                            "groups": oracle.groups}, strict=True)
    torch.testing.assert_close(oracle(x, edge_index), glob(x, edge_index))


def test_oracle_routes_each_group_with_its_own_mix():
    x, edge_index = _graph()
    groups = torch.tensor([0, 1] * 6)
    model = Castor(5, 3, K=2, router="oracle", groups=groups, tau=1.0).eval()
    with torch.no_grad():
        model.router_bias[:, 1] = torch.tensor([-20.0, 20.0, -20.0])   # group 1: all high-pass
    model(x, edge_index)
    routes = model.last_routes                                          # (K, N, 3)
    torch.testing.assert_close(routes[:, groups == 0], torch.tensor([0.8, 0.1, 0.1]).expand(2, 6, 3))
    assert (routes[:, groups == 1, 1] > 0.999).all()
    assert model.router_bias.requires_grad


def test_oracle_errors_name_groups():
    with pytest.raises(ValueError, match="groups"):
        Castor(5, 3, router="oracle")
    with pytest.raises(ValueError, match="groups"):
        Castor(5, 3, router="node", groups=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="groups"):
        Castor(5, 3, router="oracle", groups=torch.zeros(4))
    x, edge_index = _graph()
    with pytest.raises(ValueError, match="groups.*4 nodes.*12"):
        Castor(5, 3, router="oracle", groups=torch.zeros(4, dtype=torch.long))(x, edge_index)
