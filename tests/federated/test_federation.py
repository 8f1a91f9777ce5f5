"""fed_lowshot end to end: an in-process federation round, the Lightning engine, the Flower apps."""

from __future__ import annotations

import importlib.util

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lit_lowrank.datamodules.flows import FlowsDataModule
from lit_lowrank.federated.client import flatten_moments
from lit_lowrank.federated.server import (
    METHODS,
    evaluate_episodes,
    fedavg,
    make_clients,
    run_federation,
    secure_sum_round,
)

SMALL = dict(num_clients=3, alpha=0.5, samples_per_class=40, seed=0)


def _plain_total(dm, result, clip=None):
    """What the secure sum must equal: the sum of every client's unmasked moments (test-only view)."""
    clients = make_clients(dm, result.model_kwargs)
    return np.sum([flatten_moments(*c.moments(result.state, clip=clip)) for c in clients], axis=0)


def test_fedavg_weights_and_buffers():
    a = {"w": torch.ones(2), "n": torch.tensor(3)}
    b = {"w": torch.zeros(2), "n": torch.tensor(5)}
    out = fedavg([a, b], [3, 1])
    torch.testing.assert_close(out["w"], torch.full((2,), 0.75))
    assert out["n"].dtype == torch.int64
    with pytest.raises(ValueError, match="weights"):
        fedavg([a], [1, 2])


def test_inprocess_federation_round_end_to_end():
    dm = FlowsDataModule(**SMALL)
    result = run_federation(dm, rounds=1, local_epochs=1, feature_dim=8, phrase_encoder="tfidf")
    assert len(result.history) == 1 and 0.0 <= result.history[0]["val_acc"] <= 1.0
    # the secure sum equals the plain sum of the clients' moments (masks cancel) ...
    np.testing.assert_allclose(result.total_moments, _plain_total(dm, result), rtol=1e-6, atol=1e-4)
    # ... so the bank counts are the per-class row counts across all clients
    expected = np.bincount(dm.train_y.numpy(), minlength=len(dm.base_names))
    np.testing.assert_array_equal(result.bank.counts.numpy().round(), expected)
    z = result.features(dm.novel_x)
    from lit_lowrank.federated.phrases import phrase_embeddings

    scores = evaluate_episodes(z, dm.novel_y, dm.novel_names, result.bank, phrase_embeddings(dm.novel_names, "tfidf"),
                               episodes=3, queries=5)
    assert set(scores) == {(m, s) for m in METHODS for s in (1, 5)}
    assert all(len(v) == 3 and all(0.0 <= f <= 1.0 for f in v) for v in scores.values())


def test_fed_lowshot_module_one_round(tmp_path):
    from lit_lowrank.federated import FedLowShotModule

    module = FedLowShotModule(feature_dim=8, episodes=3, queries=5, phrase_encoder="tfidf",
                              methods=["prior_bank", "prototype"])
    dm = FlowsDataModule(rounds=2, **SMALL)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         num_sanity_val_steps=0, default_root_dir=tmp_path, accelerator="cpu", devices=1)
    assert module.encoder is None  # built in setup(), once the datamodule's classes are known
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 2  # one server-optimizer step per round
    metrics = trainer.callback_metrics
    for key in ("method/fed_lowshot/f1_1shot/prior_bank", "method/fed_lowshot/f1_5shot/prototype",
                "method/fed_lowshot/bank_entries"):
        assert key in metrics, key
    assert float(metrics["method/fed_lowshot/bank_entries"]) == 10
    assert len(module.last_scores[("prior_bank", 1)]) == 3


@pytest.mark.skipif(importlib.util.find_spec("flwr") is None, reason="Flower not installed (extra 'federated')")
def test_flower_server_and_client_apps_with_secaggplus():
    from lit_lowrank.federated.flower_apps import run_flower_inprocess

    cfg = {"num-rounds": 1, "num-clients": 3, "alpha": 0.5, "samples-per-class": 40, "feature-dim": 8,
           "phrase-encoder": "tfidf", "max-client-rows": 500, "feature-bound": 30.0}
    result = run_flower_inprocess(num_supernodes=3, run_config=cfg, timeout=300)
    dm = FlowsDataModule(**SMALL)
    dm.setup()
    plain = _plain_total(dm, result, clip=30.0)
    # SecAgg+ quantises to 2^22 levels of ±8 per client: the total is exact up to that resolution
    counts = result.total_moments[: len(dm.base_names)]
    np.testing.assert_allclose(counts, plain[: len(dm.base_names)], atol=0.01)
    np.testing.assert_allclose(result.total_moments, plain, rtol=1e-3, atol=1.0)
    assert result.bank.labels == dm.base_names
    # the benchmark's in-process pairwise-masked sum gives Flower SecAgg+'s total on the same encoder
    # (features stay inside SecAgg+'s ±30 clipping here, so the clip changes nothing)
    inprocess = secure_sum_round(make_clients(dm, result.model_kwargs), result.state)
    np.testing.assert_allclose(inprocess, plain, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(inprocess[: len(dm.base_names)], counts, atol=0.01)
    np.testing.assert_allclose(inprocess, result.total_moments, rtol=1e-3, atol=1.0)
