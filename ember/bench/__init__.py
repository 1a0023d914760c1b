"""Benchmark harness, built-in model zoo and the ``ember bench`` command.

``models`` builds seeded eval-mode models and inputs by name, ``harness.benchmark_model``
times one model eagerly, under ember.compile and under torch.compile side by side, ``cli``
prints the table. ``compat`` imports the optional model libraries (timm, transformers).
DESIGN.md §4: this package is the one place in ``ember/`` that may call torch.compile, as a
peer to measure against. Submodules are not imported here, so ``import ember`` stays cheap.
"""
