"""The Triton target: ``target.py`` (the Target), ``kernel.py`` (a fused kernel's
``@triton.jit`` function), ``ops.py`` (ops as Triton expressions), ``templates.py`` and
``matmul.py`` (matmuls with their epilogue, under ``max_autotune``), ``modules.py``
(generated modules in the kernel cache), ``launch.py`` (launchers, autotuning, parallel
compiles) and ``compile_workers.py`` (the worker processes, run as a script)."""
