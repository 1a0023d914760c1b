"""Parallel chunks: a long reduction with few outer iterations split over threads."""
from __future__ import annotations

from ember.backend.codegen.common import group_kind
from ember.backend.targets.cpp.ops import _fields, _merge, cpp_index
from ember.backend.targets.cpp.strategies.base import LoopStrategy

PARALLEL_CHUNKS = 64             # slices of a reduction split over threads


class ParallelChunks(LoopStrategy):
    """A long reduction split over threads: PARALLEL_CHUNKS fixed slices of the inner
    range, each reduced on its own (by the strategy the kernel chooses for a range), then
    merged in slice order -- the result does not depend on the number of threads."""

    def generate(self, nodes, groups, x, r, size) -> None:
        chunks = PARALLEL_CHUNKS
        self.declare_accumulators(groups, count=chunks)
        n = cpp_index(size)
        self.line("#pragma omp parallel for")
        self.open(f"for (int64_t chunk = 0; chunk < {chunks}; chunk++) {{")
        self.k.push()
        self.line(f"const int64_t r_start = chunk * {n} / {chunks}, "
                  f"r_end = (chunk + 1) * {n} / {chunks};")
        self.declare_accumulators(groups)
        self.k.inner_range(nodes, groups, x, r, "r_start", "r_end", lanes=True)
        for acc, members in groups.items():
            for _, field, _ in _fields(*group_kind(members)):
                self.line(f"{acc}{field}_c[chunk] = {acc}{field};")
        self.k.pop()
        self.close()
        self.declare_accumulators(groups)
        self.open(f"for (int64_t chunk = 0; chunk < {chunks}; chunk++) {{")
        for acc, members in groups.items():
            part = lambda field, acc=acc: f"{acc}{field}_c[chunk]"   # noqa: E731
            self.line(_merge(acc, *group_kind(members), part))
        self.close()
