"""Moved to :mod:`lit_lowrank.ops.fed_lowshot.secure_sum`; this import path keeps working (it is that module)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("lit_lowrank.ops.fed_lowshot.secure_sum")
