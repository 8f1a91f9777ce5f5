"""One module per method: ``lit-lowrank bench NAME`` (see :mod:`lit_lowrank.benchmarks.harness`)."""
