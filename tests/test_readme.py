"""README stays true: its two commands, and a method table equal to the registry."""

from __future__ import annotations

from pathlib import Path

from lit_lowrank.core.registry import methods_markdown

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_shows_the_two_commands():
    assert "make demo" in README and "make test" in README


def test_readme_method_table_matches_registry():
    table = README.split("<!-- methods-table:start -->\n", 1)[1].split("\n<!-- methods-table:end -->", 1)[0]
    assert table == methods_markdown(), "regenerate with `lit-lowrank methods --markdown`"


def test_readme_configs_exist():
    root = Path(__file__).resolve().parents[1]
    for line in README.splitlines():
        if line.startswith("| `configs/"):
            path = line.split("`")[1]
            assert (root / path).is_file(), path
