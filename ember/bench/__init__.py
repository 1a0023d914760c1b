"""Benchmark harness, model zoo and the ``ember`` command (``ember bench``).

``models`` builds seeded models and inputs by name (the built-in models; ``zoo_timm``,
``zoo_hf`` and ``zoo_torchvision`` register the library suites; a user's ``module:callable``),
``kernels`` the kernel rows (measured in GB/s against ``copy_``), ``harness`` measures one row
in one process (eager, ember.compile's modes and torch.compile side by side; correctness
against a float64 reference from ``accuracy``), ``runner`` runs each row in its own process
under a timeout and measures warm compiles, ``report`` draws the tables, JSON, CSV, chart and
comparisons, ``cli`` is the command line. ``compat`` imports the optional model libraries.
DESIGN.md §4: this package is the one place in ``ember/`` that may call torch.compile, as a
peer to measure against. Submodules are not imported here, so ``import ember`` stays cheap.
"""
