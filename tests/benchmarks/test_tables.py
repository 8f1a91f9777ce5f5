"""Results as data: README and cards are generated from docs/results/*.json and kept equal to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_lowrank.benchmarks._claims import claim
from lit_lowrank.benchmarks._tables import card_block, load_results, readme_table, referenced_blocks, sync_tables

ROOT = Path(__file__).resolve().parents[2]
P = {"paper": "+1.2 points", "quantity": "acc difference"}


def _payload(valid=True):
    c = claim("ours above base", **P, values=[0.8, 0.82, 0.81], baseline=[0.7, 0.71, 0.7], target=0.0, op=">")
    ctl = claim("null above base", **P, values=[0.6, 0.61, 0.6], baseline=[0.7, 0.71, 0.7], target=0.0, op=">")
    return {"benchmark": "toy", "quick": True, "seed": 0, "device": "cpu", "seconds": 1.5, "date": "2026-12-01",
            "machine": {"cpus": 2}, "valid": valid, "claims": [c], "controls": [ctl],
            "rows": [{"method": "ours", "seed": 0, "acc": 0.8}]}


def _toy_repo(tmp_path, payload):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "methods").mkdir()
    (tmp_path / "docs" / "results" / "toy.json").write_text(json.dumps(payload))
    (tmp_path / "README.md").write_text("# x\n<!-- benchmarks-table:start -->\nold\n<!-- benchmarks-table:end -->\n")
    (tmp_path / "docs" / "methods" / "toy.md").write_text(
        "# toy\n\n## Benchmark\n<!-- results:toy:start -->\nstale\n<!-- results:toy:end -->\ntail\n")
    return tmp_path


def test_card_block_shows_claims_controls_and_verdicts():
    block = card_block("toy", _payload())
    assert "ours above base" in block and "null above base" in block and "+1.2 points" in block
    assert "**holds**" in block and "**fails**" in block and "docs/results/toy.json" in block
    assert "Invalid run" in card_block("toy", {**_payload(valid=False), "invalid_reasons": ["control holds: x"]})


def test_sync_rewrites_then_is_idempotent_and_check_reports(tmp_path):
    root = _toy_repo(tmp_path, _payload())
    expected = ["docs/results/toy.png", "README.md", "docs/methods/toy.md"]
    assert sync_tables(root, check=True) == expected
    assert sync_tables(root) == expected
    assert sync_tables(root, check=True) == []
    card = (root / "docs" / "methods" / "toy.md").read_text()
    assert card.endswith("<!-- results:toy:end -->\ntail\n") and "stale" not in card
    assert "[`toy`](docs/methods/toy.md)" in (root / "README.md").read_text()


def test_a_block_without_results_is_an_error(tmp_path):
    root = _toy_repo(tmp_path, _payload())
    (root / "docs" / "methods" / "other.md").write_text("<!-- results:nope:start -->\n<!-- results:nope:end -->\n")
    with pytest.raises(FileNotFoundError, match="nope"):
        sync_tables(root, check=True)


def test_readme_and_cards_equal_the_committed_results():
    """The numbers in README.md and the cards are the numbers of docs/results/*.json."""
    assert sync_tables(ROOT, check=True) == [], "run `lit-lowrank bench --table` and commit"


def test_every_committed_result_is_valid_and_shown_on_its_card():
    results = load_results(ROOT)
    shown = referenced_blocks(ROOT)
    for name, payload in results.items():
        assert payload.get("valid") is True, f"docs/results/{name}.json: {payload.get('invalid_reasons')}"
        assert payload.get("controls"), f"docs/results/{name}.json has no control"
        for c in payload["claims"] + payload["controls"]:
            assert {"paper", "quantity", "n", "ci", "verdict"} <= set(c), (name, c.get("claim"))
        assert name in shown, f"docs/results/{name}.json is shown on no card (add a results:{name} block)"
    from lit_lowrank.benchmarks.harness import available_benchmarks

    missing = sorted(set(available_benchmarks()) - set(results))
    assert not missing, f"benchmarks without a committed quick run in docs/results: {missing}"
    sources = (ROOT / "lit_lowrank" / "benchmarks").glob("*.py")
    assert not [p.name for p in sources if "legacy_claim" in p.read_text()], "point-estimate claims are gone"
    assert readme_table(results).count("\n") >= 2


def test_figures_are_drawn_from_the_json_and_their_staleness_is_seen(tmp_path):
    from lit_lowrank.benchmarks._figures import figure_paths, figures_current, recorded_digest

    payload = _payload()
    root = _toy_repo(tmp_path, payload)
    assert "docs/results/toy.png" in sync_tables(root, check=True)
    sync_tables(root)
    png, detail = figure_paths(root, "toy")
    assert png.is_file() and not detail.exists() and recorded_digest(png)
    assert figures_current(root, "toy", payload) and sync_tables(root, check=True) == []
    card = (root / "docs" / "methods" / "toy.md").read_text()
    assert "![toy: claims](../results/toy.png)" in card
    changed = {**payload, "seconds": 2.0}
    (root / "docs" / "results" / "toy.json").write_text(json.dumps(changed))
    assert not figures_current(root, "toy", changed)
    assert "docs/results/toy.png" in sync_tables(root, check=True)


def test_card_block_shows_premises_competitors_and_the_commit():
    from lit_lowrank.benchmarks._claims import competitor, premise, resolve

    pre = premise("room", "oracle above base", needs="headroom", quantity="q", values=[1.0, 1.1, 1.2],
                  baseline=[1.5, 1.6, 1.7], target=0.0, op=">")
    c = claim("ours above base", **P, values=[0.8, 0.82, 0.81], baseline=[0.7, 0.71, 0.7], target=0.0, op=">",
              name="gain", requires="room")
    comp = competitor("gain", "random above base", competitor="random move", quantity="q", values=[0.8, 0.81, 0.8],
                      baseline=[0.7, 0.71, 0.7], target=0.0, op=">")
    payload = {**_payload(), "claims": resolve([c], [pre], [comp]), "premises": [pre], "competitors": [comp],
               "provenance": {"commit": "0123456789abcdef", "dirty": False, "sources": {"a.py": "x"}}}
    block = card_block("toy", payload)
    assert "**Premises**" in block and "**Competitors**" in block and "measured at `0123456789`" in block
    assert "**no_headroom** (CI alone: holds; premise not held: room)" in block
    assert "vs random move: holds" in block
    table = readme_table({"toy": payload})
    assert "| 0 / 0 / 0 / 1 | 0 / 1 |" in table


def test_readme_links_a_benchmark_to_the_card_that_shows_its_block(tmp_path):
    payload = _payload()
    root = _toy_repo(tmp_path, payload)
    (root / "docs" / "results" / "toy_extra.json").write_text(json.dumps(payload))
    card = root / "docs" / "methods" / "toy.md"
    card.write_text(card.read_text() + "\n<!-- results:toy_extra:start -->\n<!-- results:toy_extra:end -->\n")
    table = readme_table(load_results(root), root)
    assert "[`toy_extra`](docs/methods/toy.md)" in table and "[`toy`](docs/methods/toy.md)" in table
