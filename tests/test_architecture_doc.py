"""docs/architecture.md shows the tree as it is: every path it names exists."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "architecture.md"


def _named_paths() -> list[str]:
    spans = re.findall(r"`([^`]+)`", DOC.read_text())
    return [s for s in spans if s.startswith(("lit_lowrank/", "configs/", "docs/", "tests/")) and "<" not in s
            and "*" not in s]


def test_every_path_in_the_layout_doc_exists():
    paths = _named_paths()
    assert len(paths) > 20, paths  # the doc names the tree, not just a few files
    missing = [p for p in paths if not (REPO_ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_folder_is_described():
    packages = sorted(p.name for p in (REPO_ROOT / "lit_lowrank").iterdir() if (p / "__init__.py").is_file())
    text = DOC.read_text()
    undescribed = [name for name in packages if f"`lit_lowrank/{name}/`" not in text]
    assert not undescribed, f"docs/architecture.md does not describe {undescribed}"
