"""Target-neutral code generation: the ``Kernel`` base and index printing (``common.py``)
and the Python wrapper that calls the kernels (``wrapper.py``); each target's kernel
generators live in ``ember/backend/targets/``."""
