"""fed_lowshot data: the CICIDS CSV loader on a shipped fixture with bad rows, the simulated flows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lit_lowrank.datamodules.flows import (
    FLOW_FEATURES,
    LABEL_MECHANISMS,
    UNSW_FEATURES,
    FlowsDataModule,
    load_flow_csv,
    load_unsw_csv,
    normalize_label,
    simulate_flows,
)

FIXTURE = Path(__file__).parent / "data" / "cicids2017_tiny.csv"
UNSW_FIXTURE = Path(__file__).parent / "data" / "unsw_nb15_tiny.csv"


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


def test_unsw_loader_on_a_fixture_in_the_partitioned_set_layout():
    # fixture: 15 rows in UNSW_NB15_training-set.csv's 45 columns; ' Fuzzers ' padded, 'Backdoors' spelled
    # as in the raw files, an empty attack_cat (normal), one blank numeric cell, one unknown category
    x, y, report = load_unsw_csv(UNSW_FIXTURE)
    assert report == {"rows": 15, "kept": 13, "dropped_nonfinite": 1, "dropped_unknown": 1}
    assert x.shape == (13, 39) and np.isfinite(x).all() and len(UNSW_FEATURES) == 39
    assert list(y).count("Normal") == 3 and "Fuzzers" in y and "Backdoor" in y and "Generic" in y
    assert set(y) <= {"Normal", "Generic", "Exploits", "Fuzzers", "DoS", "Reconnaissance", "Analysis", "Backdoor",
                      "Shellcode", "Worms"}
    with pytest.raises(ValueError, match="Mystery"):
        load_unsw_csv(UNSW_FIXTURE, unknown_labels="error")
    assert load_unsw_csv(UNSW_FIXTURE, unknown_labels="other")[2]["kept"] == 14
    bad = UNSW_FIXTURE.parent / "cicids2017_tiny.csv"
    with pytest.raises(ValueError, match="attack_cat"):
        load_unsw_csv(bad)
    dm = FlowsDataModule(source="unsw-nb15", root=str(UNSW_FIXTURE), novel_classes=["Worms", "Shellcode"],
                         num_clients=2, alpha=1.0, val_fraction=0.0)
    dm.setup()
    assert dm.num_features == 39 and dm.novel_x.shape == (2, 39) and "Normal" in dm.base_names


def test_simulated_worlds_relate_statistics_to_labels_as_documented():
    def class_means(world):
        x, y = simulate_flows(samples_per_class=150, seed=0, world=world)
        z = np.sign(x) * np.log1p(np.abs(x))
        return {c: z[y == c].mean(0) for c in sorted(set(y))}

    def dist(m, a, b):
        return float(np.linalg.norm(m[a] - m[b]))

    leaky, mech, null = class_means("leaky"), class_means("mechanisms"), class_means("decoupled")
    # leaky: a family-mate is a near-copy (closer than any class of another family)
    assert dist(leaky, "DoS slowloris", "DoS Slowhttptest") < 0.5 * dist(leaky, "DoS slowloris", "PortScan")
    # mechanisms: shared mechanisms make classes closer than unrelated ones, but no class is a copy
    assert LABEL_MECHANISMS["DoS slowloris"] == LABEL_MECHANISMS["DoS Slowhttptest"]
    shared = dist(mech, "DoS slowloris", "DoS Slowhttptest")
    assert shared < dist(mech, "DoS slowloris", "PortScan")
    assert shared > dist(leaky, "DoS slowloris", "DoS Slowhttptest")
    # decoupled: the same label pair no longer shares mechanisms
    assert dist(null, "DoS slowloris", "DoS Slowhttptest") > shared
    with pytest.raises(ValueError, match="world"):
        simulate_flows(10, world="magic")


def test_families_world_makes_family_mates_close_by_their_shared_share():
    def class_means(share):
        x, y = simulate_flows(samples_per_class=150, seed=0, world="families", class_share=share)
        z = np.sign(x) * np.log1p(np.abs(x))
        return {c: z[y == c].mean(0) for c in sorted(set(y))}

    def mate_vs_other(m):
        mates = [("DoS slowloris", "DoS Slowhttptest"), ("FTP-Patator", "SSH-Patator"),
                 ("Web Attack XSS", "Web Attack Sql Injection"), ("DoS Hulk", "DoS GoldenEye")]
        others = [("DoS slowloris", "PortScan"), ("FTP-Patator", "Bot"), ("Web Attack XSS", "Heartbleed"),
                  ("DoS Hulk", "Infiltration")]
        d = lambda a, b: float(np.linalg.norm(m[a] - m[b]))  # noqa: E731
        return np.mean([d(*p) for p in mates]), np.mean([d(*p) for p in others])

    close_mates, close_others = mate_vs_other(class_means(0.3))
    assert close_mates < 0.75 * close_others          # family-mates are statistically close
    own_mates, own_others = mate_vs_other(class_means(1.0))
    assert own_mates > close_mates                    # ... because they share the family signature
    with pytest.raises(ValueError, match="class_share"):
        FlowsDataModule(class_share=1.5)


def test_novel_rows_are_partitioned_over_clients():
    dm = FlowsDataModule(num_clients=4, alpha=0.1, samples_per_class=60, seed=2)
    dm.setup()
    held = [dm.client_novel(k) for k in range(4)]
    assert sum(len(y) for _, y in held) == len(dm.novel_y)
    assert all(x.shape[1] == 78 for x, _ in held)
    with pytest.raises(ValueError, match="client"):
        dm.client_novel(4)
