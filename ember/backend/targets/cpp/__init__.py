"""The C++/OpenMP target: ``target.py`` (the Target), ``kernel.py`` (a fused kernel's C++
function), ``ops.py`` (ops as C++ expressions), ``prelude.py`` (helpers every kernel file
includes), ``build.py`` (g++ and the on-disk library cache)."""
