"""Row sums: a sum over several inner dims in two levels, each run of the last dim into a row
accumulator, each row's total into a coarse one."""
from __future__ import annotations

from ember.backend.codegen.common import group_kind
from ember.backend.sizevars import is_static, size_hint
from ember.backend.targets.cpp.ops import CPP_TYPES, _clause, _init, cpp_index
from ember.backend.targets.cpp.prelude import CASCADE
from ember.backend.targets.cpp.strategies.base import LoopStrategy, coarse_type

ROW_SUM_MIN = 16                 # a multi-dim sum's last dim summed per row from this length
RUN_MAX = 8 * CASCADE            # the longest run of a row summed into one row accumulator


class RowSums(LoopStrategy):
    """Sums over several inner dims in two levels: each run of the last dim into a row
    accumulator (SIMD lanes), each row's total into a coarse one (double for float32). One
    collapsed SIMD loop chained n/8 adds per lane: a batch norm's gradient sums over
    (N, H*W) came out 15x further from float64 than eager's cascade sum, enough to fail the
    bench's accuracy check."""

    def generate(self, nodes, groups, x, r) -> None:
        inner = self.k.group.inner

        def rows():
            for var, size in zip(r[:-1], inner[:-1]):
                self.open(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++) {{")
            return "0", cpp_index(inner[-1]), len(r) - 1

        self.in_totals(nodes, groups, x, r, rows)

    def in_totals(self, nodes, groups, x, r, rows) -> None:
        """Rows summed into coarse totals, added to the accumulators after: ``rows()`` opens
        the loops over the rows and returns a row's bounds along the last inner dim and how
        many loops it opened."""
        self.open("{")
        for acc, m in groups.items():
            self.line(f"{coarse_type('sum', group_kind(m)[1])} {acc}_total = 0;")
        low, high, loops = rows()
        self.row(nodes, groups, x, r, low, high, "_total")
        for _ in range(loops):
            self.close()
        for acc, m in groups.items():
            self.line(f"{acc} = {acc} + static_cast<{CPP_TYPES[group_kind(m)[1]]}>"
                      f"({acc}_total);")
        self.close()

    def row(self, nodes, groups, x, r, low: str, high: str, into: str) -> None:
        """The last inner dim from ``low`` to ``high`` summed into row accumulators, then
        added to ``<acc><into>``: in runs of at most RUN_MAX where the dim is longer (a
        SIMD lane of a run adds at most CASCADE values, as a lane block's fine
        accumulator does; a full sum over (3, 196608) was 0.016 off float64 with one
        run per row, eager's 5e-4)."""
        last = r[-1]
        size = self.k.group.inner[-1]
        pieces = not (is_static(size) and size_hint(size) <= RUN_MAX)
        if pieces:
            self.open(f"for (int64_t {last}_run = {low}; {last}_run < {high}; "
                      f"{last}_run += {RUN_MAX}) {{")
            low, high = f"{last}_run", f"std::min<int64_t>({high}, {last}_run + {RUN_MAX})"
        for acc, m in groups.items():
            dtype = group_kind(m)[1]
            self.line(f"{CPP_TYPES[dtype]} {acc}_row = {_init('sum', dtype)};")
        self.line("#pragma omp simd " + " ".join(
            _clause(f"{acc}_row", "sum", group_kind(m)[1]) for acc, m in groups.items()))
        self.open(f"for (int64_t {last} = {low}; {last} < {high}; {last}++) {{")
        self.loop_body(nodes, groups, x, r, None,
                       naming=lambda acc, field="": f"{acc}_row{field}")
        self.close()
        for acc in groups:
            self.line(f"{acc}{into} += {acc}_row;")
        if pieces:
            self.close()
