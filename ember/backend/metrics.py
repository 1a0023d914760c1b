"""Counters about what the backend generated; tests assert on them, ``ember.reset()`` clears.

``generated_kernel_count``: fused kernels generated (one per C++ function or Triton kernel);
``fallback_ops``: ATen ops that ran through their eager kernel instead of a generated one,
by op name (``"aten.sort.default": 2``); ``extern_calls``: library kernels chosen on purpose
(mm, convolution, sdpa) by op name.
"""
from __future__ import annotations

import collections

generated_kernel_count = 0
fallback_ops: collections.Counter = collections.Counter()
extern_calls: collections.Counter = collections.Counter()


def reset() -> None:
    global generated_kernel_count
    generated_kernel_count = 0
    fallback_ops.clear()
    extern_calls.clear()
