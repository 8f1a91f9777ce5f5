"""fed_lowshot data: the CICIDS CSV loader on a shipped fixture with bad rows, the simulated flows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lit_lowrank.datamodules.flows import FLOW_FEATURES, FlowsDataModule, load_flow_csv, normalize_label

FIXTURE = Path(__file__).parent / "data" / "cicids2017_tiny.csv"


def test_fixture_loader_cleans_inf_nan_and_unknown_labels():
    # fixture: 16 clean rows, 5 rows with inf / empty / 'Infinity' / 'NaN' / 'abc' cells, 2 unknown labels
    x, y, report = load_flow_csv(FIXTURE)
    assert report == {"rows": 23, "kept": 16, "dropped_nonfinite": 5, "dropped_unknown": 2}
    assert x.shape == (16, 78) and np.isfinite(x).all()
    assert sorted(set(y)) == sorted({"BENIGN", "DoS Hulk", "PortScan", "FTP-Patator", "Web Attack Brute Force",
                                     "DoS slowloris", "Bot", "SSH-Patator"})
    x_o, y_o, rep_o = load_flow_csv(FIXTURE, unknown_labels="other")
    assert rep_o["kept"] == 18 and list(y_o).count("Other") == 2 and rep_o["dropped_unknown"] == 0
    with pytest.raises(ValueError, match="Mystery Attack"):
        load_flow_csv(FIXTURE, unknown_labels="error")


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_flow_csv(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no \\*.csv"):
        load_flow_csv(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("Flow Duration, Label\n1, BENIGN\n")
    with pytest.raises(ValueError, match="lacks 77 expected columns"):
        load_flow_csv(bad)
    with pytest.raises(ValueError, match="root"):
        FlowsDataModule(source="cicids2017")


def test_label_normalisation():
    assert normalize_label(" Web Attack \x96 Sql Injection") == "Web Attack Sql Injection"
    assert normalize_label("DoS Slowhttptest ") == "DoS Slowhttptest"
    assert normalize_label("ssh_patator") == "SSH-Patator"
    assert normalize_label("DrDoS_DNS") == "DrDoS_DNS" and normalize_label("UDPLag") == "UDP-lag"
    assert normalize_label("Mystery Attack") is None
    assert len(FLOW_FEATURES) == 78


def test_datamodule_on_the_fixture_and_simulated_default():
    dm = FlowsDataModule(source="cicids2017", root=str(FIXTURE), novel_classes=["SSH-Patator", "Bot"],
                         num_clients=2, alpha=1.0, val_fraction=0.0)
    dm.setup()
    assert dm.novel_x.shape == (4, 78) and len(dm.train_y) == 12
    sim = FlowsDataModule(num_clients=5, alpha=0.1, samples_per_class=60, seed=1)
    sim.setup()
    assert len(sim.base_names) == 10 and len(sim.novel_names) == 5
    assert sim.novel_x.shape == (300, 78) and abs(float(sim.train_x.mean())) < 0.05
    sizes = [len(sim.client_data(k)[1]) for k in range(5)]
    assert sum(sizes) == len(sim.train_y) and sim.partition_stats["mean_tv"] > 0.3
    batch = next(iter(FlowsDataModule(rounds=3, samples_per_class=30, num_clients=2).train_dataloader()))
    assert set(batch) == {"round"}
