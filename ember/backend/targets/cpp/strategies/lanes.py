"""Sums and Welford states in two levels, and lane blocks: a long inner range reduced by
PARTIAL_SUMS lanes at a time, each lane's fine accumulator folded into a coarse one every
CASCADE steps, so no chain of adds grows long."""
from __future__ import annotations

from ember.backend.codegen.common import group_kind
from ember.backend.targets.cpp.ops import CPP_TYPES
from ember.backend.targets.cpp.prelude import CASCADE
from ember.backend.targets.cpp.strategies.base import FOLDED, LoopStrategy, coarse_type

PARTIAL_SUMS = 32                # lanes of partial sums in a row sum (4 AVX2 vectors)


class FoldingStrategy(LoopStrategy):
    """A strategy whose sums and Welford states accumulate per lane into fine accumulators
    of at most CASCADE steps, which are then folded into coarse ones (lane blocks along the
    inner range, column blocks along the outer dim)."""

    def declare_fine(self, groups, lanes: int) -> None:
        """Zeroed fine accumulators, one per lane, of the sum and Welford groups."""
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            if kind in FOLDED:
                ctype = CPP_TYPES[dtype]
                fields = ("",) if kind == "sum" else ("_mean", "_m2")
                self.line(" ".join(f"{ctype} {acc}_fine{f}[{lanes}] = {{}};" for f in fields))

    def welford_inv(self, groups) -> None:
        """1 / (values each lane's fine Welford state will have seen after this step)."""
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            if kind == "welford":
                ctype = CPP_TYPES[dtype]
                self.line(f"const {ctype} {acc}_inv = ember_inverse<{ctype}>.v[r_fine];")

    def fold(self, groups, lane: str, count: str, coarse, total: str) -> None:
        """Fold the fine accumulators (``r_fine`` steps each) into the coarse ones
        (``coarse(acc, field)``; ``total`` steps after the fold) and zero them."""
        if not groups:
            return
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            if kind == "welford":
                ctype = CPP_TYPES[dtype]
                self.line(f"const {ctype} {acc}_w = r_fine ? static_cast<{ctype}>(r_fine) / "
                          f"static_cast<{ctype}>({total}) : {ctype}(0);")
                self.line(f"const {ctype} {acc}_before = static_cast<{ctype}>({total} - r_fine);")
        self.line("#pragma omp simd")
        self.open(f"for (int64_t {lane} = 0; {lane} < {count}; {lane}++) {{")
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            fine = f"{acc}_fine"
            if kind == "sum":
                c = coarse(acc, "")
                self.line(f"{c} = {c} + {fine}[{lane}]; {fine}[{lane}] = 0;")
                continue
            mean, m2 = coarse(acc, "_mean"), coarse(acc, "_m2")
            self.line(f"const auto {acc}_d = {fine}_mean[{lane}] - {mean};")
            self.line(f"{mean} = {mean} + {acc}_d * {acc}_w;")
            self.line(f"{m2} = {m2} + {fine}_m2[{lane}] + {acc}_d * {acc}_d * {acc}_before * "
                      f"{acc}_w;")
            self.line(f"{fine}_mean[{lane}] = 0; {fine}_m2[{lane}] = 0;")
        self.close()


class LaneBlocks(FoldingStrategy):
    """Sums and Welford reductions over ``[start, end)`` as blocks of PARTIAL_SUMS lanes,
    one accumulator per lane (independent add chains pipeline and vectorise). Lanes
    accumulate CASCADE blocks into fine accumulators, which are then folded into coarse
    ones: no add chain grows long, so a sum of millions of elements stays as accurate as
    eager's cascade sum. The lanes are merged into the scalars after the blocks; the
    tail goes straight into the scalars."""

    def generate(self, nodes, groups, x, r, start, end) -> None:
        lanes = PARTIAL_SUMS
        if _fits_one_fold(start, end, lanes) and all(
                group_kind(m)[0] == "sum" for m in groups.values()):
            self._one_fold(nodes, groups, x, r, start, end)
            return
        self.open("{")
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            fields = ("",) if kind == "sum" else ("_mean", "_m2")
            self.line(" ".join(f"{coarse_type(kind, dtype)} {acc}_lane{f}[{lanes}] = {{}};"
                               for f in fields))
        self.line(f"int64_t r_block = {start}, r_blocks = 0;")
        self.open(f"while (r_block + {lanes} <= {end}) {{")
        self.line(f"const int64_t r_stop = r_block + std::min<int64_t>(({end} - r_block) / "
                  f"{lanes}, {CASCADE}) * {lanes};")
        self.declare_fine(groups, lanes)
        self.line("int64_t r_fine = 0;")
        self.open(f"for (; r_block < r_stop; r_block += {lanes}, r_blocks++, r_fine++) {{")
        self.welford_inv(groups)
        self._lanes(nodes, groups, x, r)
        self.fold(groups, "r_lane", str(lanes), lambda acc, field: f"{acc}_lane{field}[r_lane]",
                  "r_blocks")
        self.close()
        for acc, members in groups.items():
            if group_kind(members)[0] == "sum":
                self._merge_sum(acc, members, "_lane")
            else:
                self.line(f"for (int64_t lane = 0; lane < {lanes}; lane++) "
                          f"ember_welford_combine({acc}_mean, {acc}_m2, {acc}_n, "
                          f"{acc}_lane_mean[lane], {acc}_lane_m2[lane], r_blocks);")
        self._tail(nodes, groups, x, r, end)

    def _one_fold(self, nodes, groups, x, r, start, end) -> None:
        """Sums over a range of at most CASCADE blocks (a transformer's rows: layer norm's
        and softmax's 256-4096 values): the fine accumulators are merged into the scalars
        directly, with the same values and order as through the coarse lanes (each would
        hold one fold: ``0 + fine``, exact), without them (layer norm's backward over
        2048x256, 1 thread: 168 -> 145 us a call)."""
        lanes = PARTIAL_SUMS
        self.open("{")
        self.declare_fine(groups, lanes)
        self.line(f"int64_t r_block = {start};")
        self.open(f"for (; r_block + {lanes} <= {end}; r_block += {lanes}) {{")
        self._lanes(nodes, groups, x, r)
        for acc, members in groups.items():
            self._merge_sum(acc, members, "_fine")
        self._tail(nodes, groups, x, r, end)

    def _lanes(self, nodes, groups, x, r) -> None:
        """The loop over one block's lanes (SIMD), closing the block loop around it."""
        self.line("#pragma omp simd")
        self.open(f"for (int64_t r_lane = 0; r_lane < {PARTIAL_SUMS}; r_lane++) {{")
        if len(r) == 1:
            self.line(f"int64_t {r[0]} = r_block + r_lane;")
        else:
            self.line("int64_t r_lin = r_block + r_lane;")
            self.unflatten("r_lin", r)
        self.loop_body(nodes, groups, x, r, "r_lane")
        self.close()
        self.close()

    def _merge_sum(self, acc: str, members, lanes_name: str) -> None:
        """The sum's lanes (``{acc}{lanes_name}``) added to its scalar as one SIMD
        reduction in the coarse type."""
        kind, dtype = group_kind(members)
        self.line(f"{coarse_type(kind, dtype)} {acc}_total = {acc};")
        self.line(f"#pragma omp simd reduction(+:{acc}_total)")
        self.line(f"for (int64_t lane = 0; lane < {PARTIAL_SUMS}; lane++) "
                  f"{acc}_total = {acc}_total + {acc}{lanes_name}[lane];")
        self.line(f"{acc} = static_cast<{CPP_TYPES[dtype]}>({acc}_total);")

    def _tail(self, nodes, groups, x, r, end) -> None:
        """The values after the last whole block, straight into the scalars; closes the
        strategy's scope."""
        self.open_linear(r, "r_block", end)
        self.loop_body(nodes, groups, x, r, None)
        self.close()
        self.close()


def _fits_one_fold(start, end, lanes: int) -> bool:
    """Whether the static range ``[start, end)`` has at most CASCADE blocks of ``lanes``."""
    try:
        length = int(str(end)) - int(str(start))
    except ValueError:          # a symbolic bound
        return False
    return length <= CASCADE * lanes
