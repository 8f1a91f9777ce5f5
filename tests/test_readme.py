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


def _block(name: str) -> str:
    return README.split(f"<!-- {name}:start -->\n", 1)[1].split(f"\n<!-- {name}:end -->", 1)[0]


def test_readme_capability_and_composition_tables_match_the_code():
    """Issue #29: methods × (DDP, FSDP, resume, stacks with) and the composition matrix are generated."""
    from lit_lowrank.core.composition import capabilities_markdown, composition_markdown

    hint = "regenerate with lit_lowrank.core.composition.{}() and paste it between the README's markers"
    assert _block("capabilities-table") == capabilities_markdown(), hint.format("capabilities_markdown")
    assert _block("composition-table") == composition_markdown(), hint.format("composition_markdown")


def test_readme_says_how_flower_runs():
    assert "flwr run lit_lowrank/federated/flower_app" in README and "run_flower_inprocess" in README
