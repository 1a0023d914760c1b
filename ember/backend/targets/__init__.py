"""Code generation targets, and which one serves each device.

A :class:`Target` turns the scheduler's fused kernels into callables: it makes one
``codegen.common.Kernel`` per kernel (whose ``generate()`` gives the source and whose
``call_lines()`` give the wrapper's launch), builds them together, and says which dtypes
its kernels compute (others run their ATen kernels).

- ``cpp/``: C++/OpenMP, compiled by g++ and called through ctypes (CPU tensors);
- ``triton/``: Triton kernels for CUDA tensors; for CPU tensors, with
  ``options={"cpu_backend": "triton"}``, the same kernels run under Triton's interpreter
  (how CI checks the generated Triton without a GPU).
"""
from __future__ import annotations

import torch

from ember.backend.codegen.common import Kernel

COMMON_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32,
                            torch.int16, torch.int8, torch.uint8, torch.bool})


class Target:
    name = ""
    dtypes: frozenset = COMMON_DTYPES
    source_suffix = ".txt"
    def splits(self, column: bool) -> bool:
        """Whether a reduction to few results runs as two (lowering/reductions.py);
        ``column``: its input is read contiguously along a kept dim (a sum over rows of
        columns)."""
        return False

    # under max_autotune, a matmul and the pointwise kernel after it may run as one kernel
    # (templates.py)
    fuses_matmul_epilogues = False

    def make_kernel(self, step, name: str, dtypes: dict) -> Kernel:
        raise NotImplementedError

    def build(self, kernels: list[Kernel]) -> dict[str, object]:
        """Compile ``kernels`` (sources generated); the wrapper's namespace entries."""
        raise NotImplementedError

    def full_source(self, kernels: list[Kernel]) -> str:
        raise NotImplementedError


def target_for(device: torch.device, cpu_backend: str = "cpp", debug: bool = False,
               autotune: bool = False) -> Target:
    """The target that generates kernels for tensors on ``device``."""
    from ember.backend.targets.cpp.target import CppTarget
    from ember.backend.targets.triton.target import TritonTarget
    if device.type == "cpu":
        if cpu_backend == "cpp":
            return CppTarget()
        if cpu_backend == "triton":
            return TritonTarget(interpret=True, debug=debug, autotune=autotune)
        raise ValueError(f"cpu_backend must be 'cpp' or 'triton', not {cpu_backend!r}")
    if device.type == "cuda":
        return TritonTarget(interpret=False, debug=debug, device=device, autotune=autotune)
    raise NotImplementedError(f"no code generation target for device {device.type!r}")


def variance_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype eager's var, std, var_mean and std_mean keep their statistics in, for
    inputs of ``dtype`` on ``device``: on the CPU float64 (ATen's CPU Welford reduction holds
    double state for float32: the variance of float32 values up to ~1e19 is finite, where
    float32 sums of squared deviations overflow), on CUDA float32 (half precision too)."""
    if device.type == "cpu" and dtype in (torch.float32, torch.float64):
        return torch.float64
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
