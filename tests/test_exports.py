"""Package exports: each ``lit_lowrank/<package>/__init__.py`` names its public names in one list.

Lazy packages: ``_EXPORTS`` (name -> module) is that list; ``__all__`` is derived from it and the
``if TYPE_CHECKING:`` imports (for IDEs) must name the same names from the same modules. Eager
packages (``ops``, ``models``): the literal ``__all__`` is every name imported from the package's own
modules plus its public module-level definitions, once.
"""

from __future__ import annotations

import ast
import importlib
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lit_lowrank"


def _tree(package: str) -> ast.Module:
    return ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))


def _assigns(tree: ast.Module, name: str) -> list[ast.stmt]:
    """Module-level statements assigning (or augmenting) ``name``."""
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found.append(node)
    return found


def _exporting_packages() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if _assigns(_tree(p.parent.name), "__all__"))


PACKAGES = _exporting_packages()
LAZY = [p for p in PACKAGES if _assigns(_tree(p), "_EXPORTS")]
EAGER = [p for p in PACKAGES if p not in LAZY]


def _duplicates(names: list[str]) -> list[str]:
    return sorted(name for name, count in Counter(names).items() if count > 1)


def _exports_source(package: str) -> dict[str, str]:
    """``_EXPORTS`` as written (a dict literal), name -> full module path; asserts no key is written twice."""
    (node,) = _assigns(_tree(package), "_EXPORTS")
    assert isinstance(node.value, ast.Dict), f"{package}: _EXPORTS is not a dict literal"
    keys = [k.value for k in node.value.keys]
    assert not _duplicates(keys), f"{package}: _EXPORTS names {_duplicates(keys)} twice (the later one wins)"
    values = [v.value for v in node.value.values]
    return {k: v if v.startswith("lit_lowrank.") else f"lit_lowrank.{package}.{v}" for k, v in zip(keys, values)}


def _type_checking_imports(package: str) -> list[tuple[str, str]]:
    """``(name, module)`` for every name imported under ``if TYPE_CHECKING:``."""
    imported = []
    for node in _tree(package).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom):
                    imported += [(alias.asname or alias.name, stmt.module) for alias in stmt.names]
    return imported


def _eager_public_names(package: str) -> list[str]:
    """Names bound by ``from lit_lowrank.<package>.<module> import ...`` and public module-level definitions."""
    names = []
    for node in _tree(package).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"lit_lowrank.{package}."):
            names += [alias.asname or alias.name for alias in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return [name for name in names if not name.startswith("_")]


def test_every_exporting_package_is_checked():
    assert {"adapters", "callbacks", "core", "datamodules", "decoding", "federated", "mixins", "quant",
            "tasks"} <= set(LAZY)
    assert {"ops", "models"} <= set(EAGER)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_sorted_and_lists_each_name_once(package):
    module = importlib.import_module(f"lit_lowrank.{package}")
    assert not _duplicates(module.__all__), f"lit_lowrank.{package}.__all__ repeats {_duplicates(module.__all__)}"
    assert module.__all__ == sorted(module.__all__)


@pytest.mark.parametrize("package", LAZY)
def test_all_is_the_exports_keys(package):
    module = importlib.import_module(f"lit_lowrank.{package}")
    assert module.__all__ == sorted(module._EXPORTS)
    assert set(_exports_source(package)) == set(module._EXPORTS)


@pytest.mark.parametrize("package", LAZY)
def test_type_checking_block_imports_exactly_the_exports(package):
    imported = _type_checking_imports(package)
    names = [name for name, _ in imported]
    assert not _duplicates(names), f"{package}: the TYPE_CHECKING block imports {_duplicates(names)} twice"
    assert dict(imported) == _exports_source(package), (
        f"{package}: TYPE_CHECKING imports and _EXPORTS differ: "
        f"only imported {sorted(set(names) - set(_exports_source(package)))}, "
        f"only in _EXPORTS {sorted(set(_exports_source(package)) - set(names))} (or a name's module differs)"
    )


@pytest.mark.parametrize("package", EAGER)
def test_eager_all_is_every_imported_and_defined_name(package):
    module = importlib.import_module(f"lit_lowrank.{package}")
    names = _eager_public_names(package)
    assert not _duplicates(names), f"{package}: {_duplicates(names)} bound twice"
    assert sorted(names) == module.__all__, (
        f"{package}: missing from __all__ {sorted(set(names) - set(module.__all__))}, "
        f"not imported or defined {sorted(set(module.__all__) - set(names))}"
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_resolves(package):
    module = importlib.import_module(f"lit_lowrank.{package}")
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"lit_lowrank.{package} lists {missing} in __all__ but they do not resolve"
    for name in getattr(module, "_EXPORTS", {}):
        target = _exports_source(package)[name]
        assert getattr(module, name) is getattr(importlib.import_module(target), name)
    assert set(module.__all__) <= set(dir(module))
