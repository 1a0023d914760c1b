"""Plain loops: the inner dims as written, one element at a time, vectorised by ``#pragma omp
simd`` with OpenMP reduction clauses where the reductions allow."""
from __future__ import annotations

from ember.backend.codegen.common import group_kind
from ember.backend.targets.cpp.ops import _clause, cpp_index
from ember.backend.ir import product
from ember.backend.targets.cpp.strategies.base import LoopStrategy
from ember.backend.targets.cpp.strategies.rows import RowSums


class PlainLoop(LoopStrategy):
    """The loop over inner indices ``[start, end)`` (linear over the inner dims; None: all
    of them), accumulating into the groups' scalars."""

    def generate(self, nodes, groups, x, r, start=None, end=None, parallel=False) -> None:
        inner = self.k.group.inner
        kinds = {group_kind(m)[0] for m in groups.values()}
        # the first extreme element, or a Welford state outside lanes: one element at a time
        sequential = bool(kinds & {"argmax", "argmin", "welford"})
        clauses = "" if sequential else " ".join(_clause(acc, *group_kind(m))
                                                 for acc, m in groups.items())
        pragma = None if sequential or not r else \
            ("#pragma omp parallel for simd" if parallel else "#pragma omp simd")
        if start is None:
            if pragma:
                collapse = f" collapse({len(r)})" if len(r) > 1 else ""
                self.line(f"{pragma}{collapse} {clauses}".rstrip())
            for var, size in zip(r, inner):
                self.open(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++) {{")
            depth = len(r)
        else:
            depth = 1
            if len(r) > 1 and kinds == {"sum"}:
                # each run in two levels too, the runs' totals in the coarse type (a chunk
                # of a long sum holds thousands of runs)
                def runs():
                    self._open_segments(r, start, end)
                    return f"{r[-1].name}_lo", f"{r[-1].name}_hi", 1

                RowSums(self.k).in_totals(nodes, groups, x, r, runs)
                return
            if len(r) > 1:
                self._open_segments(r, start, end)
                depth = 2
            if pragma:
                self.line(f"{pragma} {clauses}".rstrip())
            if len(r) > 1:
                last = r[-1].name
                self.open(f"for (int64_t {last} = {last}_lo; {last} < {last}_hi; {last}++) {{")
            else:
                self.open_linear(r, start, end)
        self.loop_body(nodes, groups, x, r, None)
        for _ in range(depth):
            self.close()

    def _open_segments(self, r, start, end) -> None:
        """A linear inner range ``[start, end)`` over several inner dims as runs along the
        last one: a ``while`` over the runs defines the other inner variables and the run's
        bounds ``<last>_lo``/``<last>_hi``; the caller opens the loop over the last dim.
        (Unflattening every element instead costs a division and a gather per element.)"""
        sizes = self.k.group.inner
        n = cpp_index(sizes[-1])
        last = r[-1].name
        self.open(f"for (int64_t r_seg = {start}; r_seg < {end};) {{")
        self.line(f"const int64_t r_row = r_seg / {n};")
        for i, var in enumerate(r[:-1]):
            stride = product(sizes[i + 1:-1])
            text = "r_row" if stride == 1 else f"(r_row / {cpp_index(stride)})"
            if i > 0:
                text = f"{text} % {cpp_index(sizes[i])}"
            self.line(f"const int64_t {var} = {text};")
        self.line(f"const int64_t {last}_lo = r_seg % {n};")
        self.line(f"const int64_t {last}_hi = std::min<int64_t>({n}, {last}_lo + ({end} - r_seg));")
        self.line(f"r_seg += {last}_hi - {last}_lo;")
