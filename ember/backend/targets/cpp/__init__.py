"""The C++/OpenMP target: ``target.py`` (the Target), ``kernel.py`` (a fused kernel's C++
function), ``strategies/`` (the loop strategies the kernel chooses among), ``ops.py`` (ops as
C++ expressions), ``prelude.h`` (helpers every kernel file starts with; ``prelude.py`` reads
it), ``build.py`` (g++ and the on-disk library cache)."""
