"""Counters about what the backend generated; tests assert on them, ``ember.reset()`` clears.

(Not ``metrics.py``: ``ember/metrics.py`` is the frontend's counters.)

``generated_kernel_count``: fused kernels generated (one per C++ function or Triton kernel);
``fallback_ops``: ATen ops that ran through their eager kernel instead of a generated one,
by op name (``"aten.sort.default": 2``); ``extern_calls``: library kernels chosen on purpose
(mm, convolution, sdpa) by op name; ``compile_seconds``: time spent in each backend stage,
summed over graphs (``timed``), logged per graph under ``EMBER_LOGS=compile_time``.
Graphs with symbolic sizes (``dynamic.py``): ``symbolic_compiles``, compiled once for every
size; ``symbolic_declines``, the symbolic path's reasons for declining, counted;
``size_specializations``, static compiles for one concrete size (the per-size path).
``reset`` also empties ``pipeline.generated_sources`` (the sources tests read, also as
``compile.generated_sources``).
"""
from __future__ import annotations

import collections
import contextlib
import sys
import time

generated_kernel_count = 0
fallback_ops: collections.Counter = collections.Counter()
extern_calls: collections.Counter = collections.Counter()
compile_seconds: collections.Counter = collections.Counter()
symbolic_compiles = 0
size_specializations = 0
symbolic_declines: collections.Counter = collections.Counter()


@contextlib.contextmanager
def timed(stage: str):
    """Add the time the block takes to ``compile_seconds[stage]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        compile_seconds[stage] += time.perf_counter() - start


def reset() -> None:
    global generated_kernel_count, symbolic_compiles, size_specializations
    generated_kernel_count = 0
    symbolic_compiles = size_specializations = 0
    symbolic_declines.clear()
    fallback_ops.clear()
    extern_calls.clear()
    compile_seconds.clear()
    pipeline = sys.modules.get("ember.backend.pipeline")   # not imported: nothing kept
    if pipeline is not None:
        pipeline.generated_sources.clear()
