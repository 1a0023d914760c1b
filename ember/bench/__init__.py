"""Benchmark harness, model zoo and the ``ember`` command (``ember bench``).

``zoo`` builds seeded models and inputs by name (its ``catalog``; ``builtin``, ``timm``,
``hf`` and ``torchvision`` register the suites; a user's ``module:callable``), ``kernels``
the kernel rows (measured in GB/s against ``copy_``), ``harness`` measures one row in one
process (eager, ember.compile's modes and torch.compile side by side; correctness
against a float64 reference from ``accuracy``), ``runner`` runs each row in its own process
under a timeout and measures warm compiles, ``report`` draws the tables, JSON, CSV, chart and
comparisons, ``cli`` is the command line. ``compat`` imports the optional model libraries.
``dynamic_programs`` is the table of issue 31's dynamic-shapes programs (run by
``benchmarks/dynamic_shapes.py``).
DESIGN.md §4: this package is the one place in ``ember/`` that may call torch.compile, as a
peer to measure against. Submodules are not imported here, so ``import ember`` stays cheap.
"""
