"""Benchmark harness, built-in model zoo and the ``ember bench`` command.

``models`` builds seeded eval-mode models and inputs by name, ``kernels`` the kernel rows
(measured in GB/s against ``copy_``), ``harness.benchmark_model`` / ``benchmark_kernel`` time
one row eagerly and under each compiler variant (ember.compile and torch.compile, default and
reduce-overhead) side by side, ``cli`` prints the tables. ``compat`` imports the optional
model libraries (timm, transformers). DESIGN.md §4: this package is the one place in
``ember/`` that may call torch.compile, as a peer to measure against. Submodules are not
imported here, so ``import ember`` stays cheap.
"""
