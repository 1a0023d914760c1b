"""The C++/OpenMP target: one C++ function per fused kernel, compiled by g++ (``build.py``)
and called through ctypes (CPU tensors). Its kernels compute every dtype of
``COMMON_DTYPES`` and float16 and bfloat16, which they hold in float (``prelude.h``)."""
from __future__ import annotations

import ctypes

from ember.backend.codegen.common import HALF
from ember.backend.targets import COMMON_DTYPES, CpuPolicy, Target, register_target


class CppTarget(CpuPolicy, Target):
    name = "cpp"
    source_suffix = ".cpp"
    takes_size_arguments = True
    dtypes = COMMON_DTYPES | frozenset(HALF)
    # the generated gather checks up to four windows per input element with clamped,
    # gathered loads that g++ leaves scalar; ATen's scatter visits each output once.
    # 3x3/2 over 16x32x32x32 float32, training step (1 thread): 0.69x eager generated,
    # 1.00x with ATen's backward (channels-last 0.76x -> 0.95x)
    generates_max_pool_backward = False
    # layer norm's training step, 2048 x 256 float32, 1 thread: the backward's row kernel
    # and split weight-gradient sums read the input and gradient twice (183 + 131 us)
    sums_across_rows = True

    def splits(self, column: bool) -> bool:
        """Column reductions: a column kernel parallelises over blocks of columns, few
        when the columns are few, and each block reads a slice of every row; split, the
        first kernel's threads take chunks of rows. 2 cores, ``(x * x).sum(0)`` ms, one
        kernel / split: [4096, 96] 0.027 / 0.014, [36864, 128] 0.73 / 0.39, [100000, 16]
        0.24 / 0.12, [2048, 512] 0.12 / 0.05; Wav2Vec2's weight norm (a [768, 48, 128]
        weight) 2.3 / 1.1 (eager 1.2). A row reduction's threads already split its rows."""
        return column

    @classmethod
    def ops_handler(cls):
        from ember.backend.targets.cpp.ops import CppOpsHandler
        return CppOpsHandler

    @classmethod
    def op_templates(cls, arity):
        from ember.backend.targets.cpp.ops import BINARY_CPP, UNARY_CPP
        return UNARY_CPP if arity == 1 else BINARY_CPP

    def make_kernel(self, step, name, dtypes):
        from ember.backend.targets.cpp.kernel import CppKernel
        return CppKernel(step, name, dtypes)

    def full_source(self, kernels):
        from ember.backend.targets.cpp.prelude import PRELUDE
        return PRELUDE + "\n" + "\n".join(k.source for k in kernels)

    def build(self, kernels):
        from ember.backend.targets.cpp import build
        from ember.backend.targets.cpp.prelude import PRELUDE
        libs = build.compile_many([PRELUDE + "\n" + k.source for k in kernels]) \
            if kernels else []
        namespace = {}
        for kernel, lib in zip(kernels, libs):
            namespace[kernel.name] = build.kernel_function(
                lib, kernel.name, len(kernel.args) + len(kernel.size_args))
            if kernel.exports_flags:     # it checks indices or divisors (targets/cpp/kernel.py)
                flags = getattr(lib, f"{kernel.name}_flags")
                flags.restype, flags.argtypes = ctypes.c_int, []
                namespace[f"{kernel.name}_flags"] = flags
        return namespace


register_target("cpu", "cpp", CppTarget)
