"""`lit_lowrank.ops` is pure torch (DESIGN.md): importing every ops module imports no Lightning."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_importing_every_ops_module_imports_no_lightning():
    code = (
        "import importlib, pkgutil, sys\n"
        "import lit_lowrank.ops as ops\n"
        "for m in pkgutil.walk_packages(ops.__path__, 'lit_lowrank.ops.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted({k.split('.')[0] for k in sys.modules} & {'lightning', 'pytorch_lightning'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
