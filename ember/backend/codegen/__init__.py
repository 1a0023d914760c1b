"""Code generation: C++/OpenMP kernels (cpp.py) and the Python wrapper (wrapper.py)."""
