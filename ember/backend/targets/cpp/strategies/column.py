"""Column blocks: a kernel whose memory runs along its last outer dim, generated a block of
that dim's lanes at a time, so every access in a SIMD loop is contiguous."""
from __future__ import annotations

import sympy

from ember.backend.codegen.common import group_kind, reduction_groups
from ember.backend.ir import product
from ember.backend.scheduler import FusionGroup, is_gathered, node_reads
from ember.backend.sizevars import is_static, size_hint
from ember.backend.targets.cpp.ops import CPP_TYPES, CppValue, _fields, cpp_index
from ember.backend.targets.cpp.prelude import CASCADE
from ember.backend.targets.cpp.strategies.base import FOLDED, PARALLEL_MIN_INNER, coarse_type
from ember.backend.targets.cpp.strategies.lanes import FoldingStrategy

COLUMN_BLOCK = (32, 512)         # lanes of a column kernel's block (see ColumnBlocks)
COLUMN_MIN = 16                  # ... whose last outer dim has at least this many elements


class ColumnBlocks(FoldingStrategy):
    """A kernel whose memory runs along its last outer dim (a reduction over a non-last
    dim: ``sum(0)`` of ``[n, c]`` reads ``p[r0 * c + x0]``): that dim is cut into blocks
    of up to COLUMN_BLOCK[1] lanes; per block, each segment runs the inner loops
    sequentially outside a SIMD loop over the block's lanes, with one accumulator per lane,
    so every access is contiguous. Per-lane values a later segment reads live in arrays
    ``v_<buf>[lane]``."""

    values_per_lane = True

    def __init__(self, kernel):
        super().__init__(kernel)
        last = kernel.group.outer[-1]
        self.lanes = (_column_block if is_static(last) else _symbolic_column_block)(
            size_hint(last))       # per block

    @staticmethod
    def fits(group: FusionGroup, x, r) -> bool:
        """Whether the group's memory accesses mostly run along its last outer dim (stride
        1) rather than its last inner dim: then it is generated with blocks of columns."""
        if (not group.outer or not group.inner
                or size_hint(group.outer[-1]) < COLUMN_MIN     # (symbolic: from the hint)
                or not any(n.is_reduction for n in group.nodes)
                or any(n.role == "scatter" for n in group.nodes)):
            return False
        along_outer = along_inner = 0
        for node in group.nodes:    # the accesses made per element of the inner loops
            if node.role == "outer":
                continue
            accesses = [index for _, index in node_reads(node, x, r)]
            if node.role == "inner":
                accesses.append(node.where(x, r))
            for index in accesses:
                # a gathered row (``w[x1 + 128 * ix]``, ix loaded per step of the inner
                # loops: a bag of embeddings summed) moves with the inner loops through ix
                if x[-1] not in index.free_symbols or (r[-1] not in index.free_symbols
                                                       and not is_gathered(index)):
                    # fixed along one of the two loops (a per-channel weight, a mean): a
                    # scalar of that loop's SIMD either way, no vote
                    continue
                if sympy.diff(index, r[-1]) == 1:
                    along_inner += 1
                elif sympy.diff(index, x[-1]) == 1:
                    along_outer += 1
        return along_outer > along_inner

    def acc(self, acc: str, field: str = "") -> str:
        return f"{acc}{field}[xl]"

    def result(self, acc: str, members, node) -> CppValue:
        kind, dtype = group_kind(members)
        if coarse_type(kind, dtype) != CPP_TYPES[dtype]:     # a float32 sum's double lanes
            return self.k.cse(f"static_cast<{CPP_TYPES[dtype]}>({self.acc(acc)})", dtype)
        return super().result(acc, members, node)

    def generate(self, x, r) -> None:
        """The whole kernel."""
        group = self.k.group
        last, size = x[-1], group.outer[-1]
        block = self.lanes
        blocks = (size_hint(size) + block - 1) // block
        iters = size_hint(product(group.outer[:-1])) * blocks
        # a symbolic size: the blocks and the last one's length computed in the kernel
        length = str(size_hint(size)) if is_static(size) else cpp_index(size)
        if not is_static(size):
            blocks = f"(({length} + {block - 1}) / {block})"
        if iters >= 2 and size_hint(product(group.outer + group.inner)) >= PARALLEL_MIN_INNER:
            collapse = f" collapse({len(group.outer)})" if len(group.outer) > 1 else ""
            self.line(f"#pragma omp parallel for{collapse}")
        for var, n in zip(x[:-1], group.outer[:-1]):
            self.open(f"for (int64_t {var} = 0; {var} < {cpp_index(n)}; {var}++) {{")
        self.open(f"for (int64_t {last}_blk = 0; {last}_blk < {blocks}; {last}_blk++) {{")
        self.line(f"const int64_t {last}_base = {last}_blk * {block};")
        if is_static(size):
            self.line(f"const int64_t {last}_len = std::min<int64_t>({block}, "
                      f"{length} - {last}_base);")
        else:
            # the block's body as a generic lambda, called with a compile-time length for
            # full blocks: its lane loops then have a constant trip count (unrolled, the
            # lane arrays in registers), 2x faster than with a run-time length
            self.line(f"const int64_t {last}_rest = {length} - {last}_base;")
            self.open(f"auto {last}_block = [&](const auto {last}_len) {{")
        self.k.push()
        for node in group.nodes:
            if node.role != "inner":
                self.line(f"{CPP_TYPES[node.buf.get_dtype()]} v_{node.name}[{block}];")
        for kind, nodes in group.segments:
            if kind == "outer":
                self._open_lanes(x)
                self.k.push()
                for node in nodes:
                    self._keep_lane(node, node.where(x, []), node.value(x, []))
                self.k.pop()
                self._close_lanes(nodes, x)
            else:
                self._blocked_loop(nodes, x, r)
        self.k.pop()
        if not is_static(size):
            self.close("};")
            self.line(f"if ({last}_rest >= {block}) "
                      f"{last}_block(std::integral_constant<int64_t, {block}>());")
            self.line(f"else {last}_block({last}_rest);")
        for _ in group.outer:
            self.close()

    def _open_lanes(self, x, simd: bool = True) -> None:
        last = x[-1]
        if simd:
            self.line("#pragma omp simd")
        self.open(f"for (int64_t xl = 0; xl < {last}_len; xl++) {{")
        self.line(f"const int64_t {last} = {last}_base + xl;")

    def _keep_lane(self, node, index, value) -> None:
        """Store a per-lane value (unless local) and keep it in ``v_<buf>[xl]``."""
        self.k.store(node, index, value)
        self.line(f"v_{node.name}[xl] = {self.k.known_value(node.writes, index)};")

    def _close_lanes(self, nodes, x) -> None:
        self.close()
        for node in nodes:    # later segments read the lane arrays
            self.k.set_value(node.writes, node.store_index(x),
                             CppValue(f"v_{node.name}[xl]", node.buf.get_dtype()))

    def _blocked_loop(self, nodes, x, r) -> None:
        groups = reduction_groups([n for n in nodes if n.role == "reduction"])
        block = self.lanes
        self.open("{")
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            for ctype, field, init in _fields(kind, dtype):
                if field != "_n":   # a Welford count is the same in every lane
                    if kind == "sum":
                        ctype = coarse_type(kind, dtype)
                    self.line(f"{ctype} {acc}{field}[{block}];")
                    self.line(f"for (int64_t xl = 0; xl < {block}; xl++) "
                              f"{acc}{field}[xl] = {init};")
        folded = {acc: m for acc, m in groups.items() if group_kind(m)[0] in FOLDED}
        self.declare_fine(folded, block)
        if folded:
            self.line("int64_t r_count = 0, r_fine = 0;")
        for var, n in zip(r, self.k.group.inner):
            self.open(f"for (int64_t {var} = 0; {var} < {cpp_index(n)}; {var}++) {{")
        self.welford_inv(folded)
        with self.k.hoisting_out_of_lanes(str(x[-1]), [*x[:-1], *r]):
            self._open_lanes(x)
            self.loop_body(nodes, groups, x, r, "xl")
            self.close()
        if folded:
            self.line("r_count++; r_fine++;")
            self.open(f"if (r_fine == {CASCADE}) {{")
            self.fold(folded, "xl", f"{x[-1]}_len", self.acc, "r_count")
            self.line("r_fine = 0;")
            self.close()
        for _ in r:
            self.close()
        if folded:
            self.fold(folded, "xl", f"{x[-1]}_len", self.acc, "r_count")
        finished = [n for members in groups.values() for n in members]
        if finished:
            self._open_lanes(x, simd=False)
            self.k.push()
            for acc, members in groups.items():
                for node in members:
                    self._keep_lane(node, node.store_index(x), self.result(acc, members, node))
            self.k.pop()
            self._close_lanes(finished, x)
        self.close()


def _column_block(size: int) -> int:
    """Lanes per block of a column kernel: wide blocks read long runs of each row, but
    there should be at least 4 blocks to share among threads."""
    lanes = COLUMN_BLOCK[0]
    while lanes * 2 <= COLUMN_BLOCK[1] and size >= lanes * 2 * 4:
        lanes *= 2
    return lanes


def _symbolic_column_block(hint: int) -> int:
    """Lanes per block for a symbolic last dim, whose full blocks run with a constant length
    (see ColumnBlocks.generate) and the last one with a run-time one (2x slower a lane):
    the widest block whose full blocks cover at least 3/4 of the hint's lanes (24: 8 lanes,
    not one partial block of 32)."""
    lanes = _column_block(hint)
    while lanes > 8 and (hint // lanes) * lanes * 4 < hint * 3:
        lanes //= 2
    return lanes
