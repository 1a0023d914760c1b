"""C++/OpenMP code generation for fused kernels.

One ``extern "C"`` function per :class:`FusionGroup`. The outer loops are parallelised with
OpenMP when they carry enough iterations; otherwise each inner loop is (with OpenMP reduction
clauses for reductions). Inner loops carry ``#pragma omp simd`` so g++ vectorises them.
Bodies are emitted by running each node's ``inner_fn`` under :class:`CppOpsHandler`, which
writes one ``auto tmpN = ...;`` per distinct expression (common subexpressions are shared
within a scope). Values are cast to their dtype's C++ type after every arithmetic operation,
so C++'s integer promotion never changes a result; max/min/relu propagate NaN like eager.

float16 and bfloat16 buffers hold ``uint16_t`` bits and their values are computed in float,
as eager's CPU kernels compute them: a load widens, a store rounds once (``_stored_value``;
later reads in the kernel see the rounded value, and a loaded value stored again moves its
bits), and an op's half result is rounded where a cast, a comparison or a reduction reads
it (``CppOpsHandler.exact``): what eager's op rounded. Arithmetic chains stay in float.

:class:`CppKernel` holds what is per kernel (common subexpressions, the values hoisted out of
inner loops, the names invariant in them, value bounds, error flags) and chooses how each
part of the nest is generated: a loop strategy of ``strategies/`` (column blocks, or
transposed tiles for a pointwise kernel reading across its loops, or lookup tables for a
pointwise kernel of one half-precision input, for the whole kernel; for
each inner loop of a row nest split pieces, a plain loop with precomputed
arrays, parallel chunks, lane blocks or row sums), to which it delegates. Each strategy keeps
the state only it needs; while one generates, the kernel and its ops handler ask it what its
loops know (``LoopStrategy.index_bounds``, ``values_per_lane``).

Errors eager raises are flags, not branches: a kernel that checks indirect indices or
integer divisors ORs each failed check into an OpenMP reduction (``_flag_errors``), and the
wrapper raises eager's exception after the call: ``RuntimeError: ZeroDivisionError``, or
for an index out of range the one of the op it belongs to (an ``ops.IndexCheck`` per op
kind, one flag bit each, as a kernel may fuse a gather with an embedding: RuntimeError and
IndexError in eager). A
checked integer division divides by 1 where the divisor is 0 or -1 (negating for -1,
wrapping), so no kernel traps (SIGFPE; g++ compiles a constant 0 divisor to ud2, SIGILL).

FMA contraction: kernels are compiled with ``-ffp-contract=off`` (see build.py) because eager
PyTorch computes ``a * b + c`` with two roundings; contracting to FMA would change results.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re

import sympy
import torch

from ember.backend.codegen.common import HALF, Kernel, group_kind, reduction_groups
from ember.backend.codegen.kernel_names import loop_kind
from ember.backend.ir import index_vars, product, split_index
from ember.backend.loops import access_indices, runs_with
from ember.backend.ops import use_handler
from ember.backend.scheduler import (CHUNK, FusionGroup, Regroup, SchedulerNode,
                                    in_store_order)
from ember.backend import sizevars
from ember.backend.sizevars import size_hint
from ember.backend.targets.cpp.build import has_avx512
from ember.backend.targets.cpp.prelude import CASCADE
from ember.backend.targets.cpp.ops import (CPP_TYPES, CppOpsHandler, CppValue, _fields,
                                           calls_libm, cpp_index, from_storage, storage_type,
                                           to_storage)
from ember.backend.targets.cpp.strategies.base import (PARALLEL_MIN_INNER, PARALLEL_MIN_ITERS,
                                                       LoopStrategy, reads_only)
from ember.backend.targets.cpp.strategies.chunks import ParallelChunks
from ember.backend.targets.cpp.strategies.column import ColumnBlocks
from ember.backend.targets.cpp.strategies.lanes import PARTIAL_SUMS, LaneBlocks
from ember.backend.targets.cpp.strategies.pieces import SplitPieces
from ember.backend.targets.cpp.strategies.plain import PlainLoop
from ember.backend.targets.cpp.strategies.precompute import PrecomputedArrays
from ember.backend.targets.cpp.strategies.table import LOOKUP_ATTRIBUTE, HalfTable
from ember.backend.targets.cpp.strategies.table import plan as plan_tables
from ember.backend.targets.cpp.strategies.rows import ROW_SUM_MIN, RowSums
from ember.backend.targets.cpp.strategies.tiles import TransposedTiles, transposed_reads

MERGE_BELOW = 1024               # pointwise inner loops shorter than this absorb outer dims

_DOUBLE_LIBM = re.compile(r"double.*ember_(exp|erf|gelu(?:_grad)?|tanh|sigmoid)\(")   # one line
_SIMD_PRAGMA = re.compile(r"(#pragma omp (?:parallel for )?simd)")


_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_OMP_LOOP = re.compile(r"^(\s*#pragma omp (?:parallel for|simd).*)$")


def _flag_errors(lines: list[str]) -> list[str]:
    """A kernel that checks its indirect indices or integer divisors ORs each check's
    bit (EMBER_ZERO_DIVISION; ``1 << (2 + slot)`` for an index check, one per op kind:
    ``Kernel.index_check_slot``) into ``ember_flags_r``: a reduction of every
    OpenMP loop (one private copy per thread and per SIMD lane), ORed into the library's
    flags once, at the end. A per-index ``if`` that stores the flag (the old form) kept g++
    from vectorising the loop: deeplabv3's bilinear upsampling, 4 gathers an element, took
    2.8x as long."""
    body = [_OMP_LOOP.sub(r"\1 reduction(|:ember_flags_r)", line) for line in lines]
    return ["  int ember_flags_r = 0;", *body,
            "  if (ember_flags_r) __atomic_fetch_or(&ember_flags, ember_flags_r, "
            "__ATOMIC_RELAXED);"]


def _widen_vectors(text: str) -> str:
    """On an AVX-512 host, loops of 16 floats rather than g++'s default 8, in kernels whose
    math is all inline (float exp, erf, tanh and sigmoid are: exp is 1.3x faster so, at
    eager's speed). A kernel that calls libm keeps 8 lanes: glibc's 16-lane ``sinf`` made a
    sum of ``t * sin(t)`` three times as wrong as eager's, and double functions widen to it.
    A kernel reading or writing half-precision bits (``uint16_t``) takes 32 lanes: with 16,
    g++ sizes its vectors by the 16-bit elements (32 bytes) and computes the floats in
    256-bit halves (bf16 GELU of 4M values, 1 thread: 4.1 ms, 3.0 with 32 lanes)."""
    if not has_avx512() or calls_libm(text):
        return text
    if "ember_randn(" in text or _DOUBLE_LIBM.search(text):
        return text      # Box-Muller's log and cos, and the double functions, are libm's
    lanes = 32 if "uint16_t*" in text else 16
    return _SIMD_PRAGMA.sub(rf"\1 simdlen({lanes})", text)


class CppKernel(Kernel):
    """Generates one fused kernel's C++ function."""

    def __init__(self, group: FusionGroup, name: str, dtypes: dict[str, torch.dtype]):
        super().__init__(name, dtypes)
        self.group = group
        # the kernel checks indirect indices or integer divisors, so its library exports
        # ``<name>_flags`` (see _flag_errors), which the wrapper reads after each call
        self.exports_flags = False
        # the loop strategy generating now (see delegating); the kernel's own loops outside
        self.strategy = LoopStrategy(self)
        self.hoist: _Hoist | None = None    # where loop-invariant values go (see cse)
        # names whose value does not change inside the inner loops being generated: outer
        # loop variables, pointers to memory the kernel never writes, values computed
        # outside the inner loops (see _invariant)
        self.invariant: set[str] = set()
        self.var_dtypes: dict[str, torch.dtype] = {}   # temporaries' dtypes (for precompute)
        # integer bounds of temporaries: constants, and what a piece of a split loop decides
        # (see CppOpsHandler._fold)
        self.bounds: dict[str, tuple[int, int]] = {}
        self.size_args: list[str] = []    # size symbols it takes (after the buffers)
        # half-precision temporaries that hold a value of their dtype exactly (loaded,
        # stored, cast): the others are a float result not rounded yet (see to_dtype)
        self.exact_half: set[str] = set()
        # a temporary rounded to half precision -> the float it rounds: stored, its bits
        # come from that float in one conversion (see _stored_value)
        self.rounded_from: dict[str, str] = {}
        # a half temporary loaded or stored -> the temporary of its bits: stored again (a
        # copy, a transpose), the bits are, with no conversion
        self.half_bits: dict[str, str] = {}
        # max/min accumulators of half values not rounded yet: rounding is monotonic, so
        # the result is rounded once instead of every element (see LoopStrategy.loop_body)
        self.rounded_after: dict[str, torch.dtype] = {}

    @property
    def kind(self) -> str:
        return loop_kind(self.group)

    def declare(self, var: str, text: str) -> str:
        return f"auto {var} = {text};"

    def cse(self, text: str, dtype: torch.dtype) -> CppValue:
        """A value for ``text``; inside an inner loop, one that does not change in it (a
        per-channel scale, a mean) is computed once before the loop instead of per element.
        Besides the saved work this keeps g++ vectorising: it sinks a load used by one
        branch of a ``?:`` into that branch, and cannot vectorise the masked load of a
        loop-invariant address that if-conversion then makes of it."""
        for scope in reversed(self.scopes):
            if text in scope:
                return _as_dtype(scope[text], dtype)
        hoist = self.hoist
        if hoist is None or not self._invariant(text):
            var = super().cse(text, dtype)
            self.var_dtypes[var.name] = dtype
            if hoist is None and not self.strategy.values_per_lane:
                self.invariant.add(var.name)     # declared outside any inner loop
            return var
        if text not in hoist.values:
            var = CppValue(self.new_var(), dtype)
            self.var_dtypes[var.name] = dtype
            self._insert_hoisted([self.declare(var.name, text)])
            hoist.values[text] = var
            self.invariant.add(var.name)
        return _as_dtype(hoist.values[text], dtype)

    def _insert_hoisted(self, lines: list[str]) -> None:
        """``lines`` where the inner loop's invariant values go (before it)."""
        hoist = self.hoist
        pad = " " * (self.indent_unit * hoist.indent)
        self.lines[hoist.at:hoist.at] = [pad + line for line in lines]
        hoist.at += len(lines)

    def _invariant(self, text: str) -> bool:
        """Every name ``text`` reads (not functions, types, literals) is invariant."""
        return reads_only(text, self.invariant)

    @contextlib.contextmanager
    def _hoisting(self, reductions=()):
        """Inner loops generated inside this block move their invariant values to its
        start (only loops known to run: a value moved out is computed even when the loop
        has no iteration). On exit the reductions' accumulators hold final values."""
        size = product(self.group.inner)
        # (a symbolic size runs at least once where the ranges say so: symbols are >= 2)
        if self.hoist is not None or not sizevars.statically_known_leq(1, size):
            yield
            return
        with self._hoist_region():
            yield
        for acc, members in reduction_groups(reductions).items():
            self.invariant.update(f"{acc}{field}" for _, field, _ in
                                  _fields(*group_kind(members)))

    @contextlib.contextmanager
    def hoisting_out_of_lanes(self, lane_var: str, loop_vars):
        """A column block's lane loop generated inside this block moves the values that do
        not change from lane to lane (those of ``loop_vars``, the enclosing loops' variables,
        and not of ``lane_var``) to its start: an embedding bag's gathered row index, loaded,
        checked and flagged once per step, not once per lane."""
        saved = self.invariant
        self.invariant = (saved - {lane_var}) | {str(v) for v in loop_vars}
        try:
            with self._hoist_region():
                yield
        finally:
            self.invariant = saved

    @contextlib.contextmanager
    def _hoist_region(self):
        """Invariant values of the inner loops generated inside go before them."""
        self.hoist = _Hoist(len(self.lines), self.indent)
        try:
            yield
        finally:
            self.hoist = None

    def emit_invariant(self, lines: list[str], reads: str) -> bool:
        """Emit ``lines`` (statements that read the names in ``reads``) where the inner
        loop's invariant values go, if they are invariant there; False: not moved."""
        if self.hoist is None or not self._invariant(reads):
            return False
        self._insert_hoisted(lines)
        return True

    def call_lines(self, refs: dict[str, str]) -> list[str]:
        ptrs = ", ".join([f"{refs[a]}.data_ptr()" for a in self.args] + self.size_args)
        lines = [f"{self.name}({ptrs})"]
        if self.exports_flags:
            # eager's exceptions: ZeroDivisionError (a RuntimeError) for integer division
            lines.append(f"if (flags := {self.name}_flags()) & 2: raise RuntimeError("
                         f"'ZeroDivisionError')")
            lines += [f"if flags & {1 << (2 + slot)}: {check.raise_line()}"
                      for slot, check in enumerate(self.index_checks)]
        return lines

    def load(self, name: str, index) -> CppValue:
        known = self.known_value(name, index)
        if known is not None:
            return known
        if name in self.group.local:
            raise AssertionError(f"{name} is kept local but read where it is not available")
        self.loaded.add(name)
        dtype = self.dtypes[name]
        element = self.strategy.tiled_element(name, index) or \
            f"p_{name}[{cpp_index(self._hoisted(index))}]"
        if dtype not in HALF:
            return self.cse(element, dtype)
        bits = self.cse(element, torch.int16)
        value = self.cse(from_storage(str(bits), dtype), dtype)
        self.exact_half.add(value.name)
        self.half_bits[value.name] = str(bits)
        return value

    def store(self, node: SchedulerNode, index, value: CppValue) -> None:
        dtype = node.buf.get_dtype()
        value, element = self._stored_value(value, dtype)
        self.set_value(node.writes, index, value)
        if node.name in self.group.local:
            return
        self.stored.add(node.writes)
        target = self.strategy.stored_element(node.writes, index) or \
            f"p_{node.writes}[{cpp_index(self._hoisted(index))}]"
        self.line(f"{target} = {element};")

    def _stored_value(self, value: CppValue, dtype: torch.dtype) -> tuple[CppValue, str]:
        """(the value a buffer of ``dtype`` holds after storing ``value``, the element
        stored). A half value is rounded here, once, and the kernel's later reads of the
        buffer see the rounded value, as a kernel that loads it does."""
        if dtype in HALF:
            if value.dtype in HALF and value.dtype != dtype:
                value = CppOpsHandler(self).to_dtype(value, dtype)    # rounded as eager's
            if value.dtype == dtype and value.name in self.half_bits:
                return value, self.half_bits[value.name]
            text = self.rounded_from.get(value.name) or (
                str(value) if CPP_TYPES[value.dtype] == "float" else
                f"static_cast<float>({value})")
            element = self.cse(to_storage(text, dtype), torch.int16)
            value = self.cse(from_storage(str(element), dtype), dtype)
            self.exact_half.add(value.name)
            self.half_bits[value.name] = str(element)
            return value, str(element)
        if value.dtype != dtype:
            value = CppOpsHandler(self).to_dtype(value, dtype)
        return value, str(value)

    def _hoisted(self, index):
        """``index`` with its loop-invariant parts that are not sums or products (a pooling
        window's clamped corner, ``max(0, 2*h - 1)``) read from values computed before the
        inner loop: g++ vectorises no loop whose addresses contain a ``std::max``, even an
        invariant one (a max-pool over channels-last data: 1.8 ms scalar, 0.2 vectorised)."""
        if self.hoist is None or not isinstance(index, sympy.Basic):
            return index
        found: dict = {}

        def visit(e):
            if e.is_Atom:
                return
            if e.func not in (sympy.Add, sympy.Mul):
                text = cpp_index(e)
                if self._invariant(text):
                    found[e] = sympy.Symbol(self.cse(text, torch.int64).name, integer=True)
                    return
            for arg in e.args:
                visit(arg)
        visit(index)
        return index.xreplace(found) if found else index

    # -- structure: choosing the loop strategies ------------------------------------------------
    @contextlib.contextmanager
    def delegating(self, strategy: LoopStrategy):
        """Generate with ``strategy``: meanwhile cse and the ops handler ask it what its
        loops know."""
        outer, self.strategy = self.strategy, strategy
        try:
            yield strategy
        finally:
            self.strategy = outer

    def generate(self) -> str:
        x = index_vars("x", len(self.group.outer))
        r = index_vars("r", len(self.group.inner))
        self.group = in_store_order(self.group, x, r)
        self.group, x = _merge_contiguous_dims(self.group, x, r)
        k = self.group
        across = any(n.role == "across" for n in k.nodes)    # rows in chunks: _row_nest
        column = not across and ColumnBlocks.fits(k, x, r)
        written = {n.writes for n in k.nodes} | {n.name for n in k.nodes} | {
            n.buf.reuses for n in k.nodes if n.buf.reuses}
        self.invariant = {v.name for v in x if isinstance(v, sympy.Symbol)} | {
            f"p_{name}" for name in self.dtypes if name not in written} | set(
            sizevars.symbol_names())
        tiled = {} if column or across else transposed_reads(k, x, r, self.dtypes, written)
        table = None if across else self._half_tables(x, r)
        with use_handler(CppOpsHandler(self)):
            if table:
                with self.delegating(HalfTable(self, table[0])) as lookups:
                    lookups.generate(x, r, table[2])
            elif column:
                with self.delegating(ColumnBlocks(self)) as blocks:
                    blocks.generate(x, r)
            elif tiled:
                with self.delegating(TransposedTiles(self, tiled)) as tiles:
                    tiles.generate(x, r)
            else:
                self._row_nest(x, r)
        lines = _flag_errors(self.lines) if self.exports_flags else self.lines
        prologue = "".join(line + "\n" for line in table[1]) if table else ""
        signature = self._signature()
        if table:
            signature = signature.replace('extern "C" ', f'extern "C" {LOOKUP_ATTRIBUTE} ', 1)
        text = _widen_vectors(prologue + signature + " {\n" + "\n".join(lines) + "\n}\n")
        if self.exports_flags:
            # one word of flags per kernel library, ORed by any call that met a bad index or a
            # zero divisor, read and cleared by the wrapper after each call
            text = ("static int ember_flags = 0;\n" + text +
                    f'extern "C" int {self.name}_flags() {{ int v = ember_flags; '
                    f"ember_flags = 0; return v; }}\n")
        return text

    def _half_tables(self, x, r):
        """(the plan, the table builder's lines, the outputs) where the kernel reads its
        results from half-precision lookup tables (strategies/table.py), else None. The
        builder is generated in a scratch kernel: declined, it leaves this one untouched."""
        table = plan_tables(self.group, x, r, self.dtypes)
        if table is None:
            return None
        scratch = type(self)(self.group, self.name, self.dtypes)
        with scratch.delegating(HalfTable(scratch, table)) as filling:
            builder = filling.builder(x, r)
        return None if builder is None else (table, builder, filling.outputs)

    def _row_nest(self, x, r) -> None:
        """The outer loops (parallel when they carry enough iterations), in them each
        segment: per outer iteration, the outer nodes, or one inner loop."""
        k = self.group
        across = [n for n in k.nodes if n.role == "across"]
        if across:
            self._chunks_of_rows(x, r, across)
            return
        outer_n = product(k.outer)
        scatter = any(n.role == "scatter" for n in k.nodes)
        # (from the hints where sizes are symbolic: threads are right at any size)
        parallel_outer = bool(k.outer) and size_hint(outer_n) >= PARALLEL_MIN_ITERS and \
            not scatter
        inner_n = product(k.inner)
        parallel_inner = not parallel_outer and size_hint(inner_n) >= PARALLEL_MIN_INNER
        if k.outer:
            if parallel_outer:
                collapse = f" collapse({len(k.outer)})" if len(k.outer) > 1 else ""
                self.line(f"#pragma omp parallel for{collapse}")
            for var, size in zip(x, k.outer):
                self.line(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++) {{")
                self.indent += 1
                self.push()
        self._segments(x, r, parallel_inner)
        for _ in k.outer:
            self.pop()
            self.indent -= 1
            self.line("}")

    def _segments(self, x, r, parallel_inner: bool) -> None:
        """One outer iteration: per segment, the outer nodes, or one inner loop."""
        for kind, nodes in self.group.segments:
            if kind == "outer":
                for node in nodes:
                    if node.role == "scatter":
                        self._scatter(node, x)
                    else:
                        self.store(node, node.where(x, []), node.value(x, []))
            else:
                self._inner_loop(nodes, x, r, parallel_inner)

    def _chunks_of_rows(self, x, r, across: list) -> None:
        """A row kernel that also sums columns over chunks of its rows (``across`` nodes,
        scheduler.Across): threads take whole chunks, each chunk's rows run in order, and
        the chunk's column sums accumulate as the split column kernel's would (float per
        column, folded into double every CASCADE rows, rounded once), so the results keep
        their bits."""
        k = self.group
        plan = across[0].perm
        rows, columns = plan.rows, cpp_index(k.inner[0])
        chunk, row = CHUNK.name, "x_row"
        self.invariant |= {chunk, row}
        self.line("#pragma omp parallel for")
        self.line(f"for (int64_t {chunk} = 0; {chunk} < {plan.chunks}; {chunk}++) {{")
        self.indent += 1
        self.push()
        for node in across:
            self.line(f"double acc_{node.name}[{columns}];")
            self.line(f"for (int64_t c = 0; c < {columns}; c++) acc_{node.name}[c] = 0;")
            self.line(f"float acc_{node.name}_fine[{columns}] = {{}};")
        self.line("int64_t rows_fine = 0;")
        self.line(f"for (int64_t {row} = 0; {row} < {rows}; {row}++) {{")
        self.indent += 1
        self.push()
        self.line(f"const int64_t x_flat = {chunk} * {rows} + {row};")
        for var, index in zip(x, split_index(sympy.Symbol("x_flat", integer=True),
                                             list(k.outer))):
            self.line(f"const int64_t {var} = {cpp_index(index)};")
        self._segments(x, r, False)
        self.line(f"if (++rows_fine == {CASCADE}) {{")
        self.indent += 1
        self._fold_across(across, columns)
        self.line("rows_fine = 0;")
        self.indent -= 1
        self.line("}")
        self.pop()
        self.indent -= 1
        self.line("}")
        self._fold_across(across, columns)
        self.line("#pragma omp simd")
        self.line(f"for (int64_t {r[0]} = 0; {r[0]} < {columns}; {r[0]}++) {{")
        self.indent += 1
        self.push()
        for node in across:
            self.store(node, node.where(x, r),
                       CppValue(f"static_cast<float>(acc_{node.name}[{r[0]}])", torch.float32))
        self.pop()
        self.indent -= 1
        self.line("}")
        self.pop()
        self.indent -= 1
        self.line("}")

    def _fold_across(self, across: list, columns: str) -> None:
        """The chunk's fine column sums added into its double ones, and zeroed."""
        self.line("#pragma omp simd")
        self.line(f"for (int64_t c = 0; c < {columns}; c++) {{")
        for node in across:
            acc = f"acc_{node.name}"
            self.line(f"  {acc}[c] = {acc}[c] + {acc}_fine[c]; {acc}_fine[c] = 0;")
        self.line("}")

    def accumulate_across(self, node: SchedulerNode, x, r) -> None:
        """Add ``node``'s value at this element to its chunk's sum of the column."""
        value = CppOpsHandler(self).exact(node.value(x, r))
        if value.dtype != torch.float32:
            value = CppOpsHandler(self).to_dtype(value, torch.float32)
        fine = f"acc_{node.name}_fine[{r[0]}]"
        self.line(f"{fine} = {fine} + {value};")

    def _inner_loop(self, nodes, x, r, parallel) -> None:
        """One inner loop: its pointwise nodes store per element, its reductions accumulate
        and store once per outer iteration. ``parallel``: the loop itself is split over
        threads (few outer iterations)."""
        reductions = [n for n in nodes if n.role == "reduction"]
        groups = reduction_groups(reductions)
        size = product(self.group.inner)
        with self._hoisting(reductions):
            if not groups:
                cuts = [] if parallel else SplitPieces.find_cuts(self.group, nodes, x, r)
                if cuts:
                    with self.delegating(SplitPieces(self, cuts)) as pieces:
                        pieces.generate(nodes, x, r)
                elif parallel:
                    with self.delegating(PlainLoop(self)) as plain:
                        plain.generate(nodes, groups, x, r, parallel=True)
                else:
                    with self.delegating(PrecomputedArrays(self)) as plain:
                        plain.generate(nodes, x, r)
                return
            if parallel:
                with self.delegating(ParallelChunks(self)) as reduced:
                    reduced.generate(nodes, groups, x, r, size)
            else:
                self.strategy.declare_accumulators(groups)     # the scalars a range reduces into
                # (symbolic: from the hint; the lane loop handles any length)
                lanes = size_hint(size) >= 2 * PARTIAL_SUMS
                reduced = self.inner_range(nodes, groups, x, r, lanes=lanes)
        reduced.store_results(groups, x)

    def inner_range(self, nodes, groups, x, r, start=None, end=None, lanes=False,
                    parallel=False) -> LoopStrategy:
        """Generate the loop over inner indices ``[start, end)`` (linear over the inner dims;
        None: all of them), accumulating into the groups' scalars; returns the strategy
        chosen: lane blocks for sums and Welford states (``lanes``: long enough for them),
        row sums for a sum over several inner dims, else a plain loop."""
        kinds = {group_kind(m)[0] for m in groups.values()}
        if groups and kinds <= {"sum", "welford"} and (
                (lanes and len(r) == 1) or "welford" in kinds):
            with self.delegating(LaneBlocks(self)) as strategy:
                strategy.generate(nodes, groups, x, r, start or 0,
                                  end or cpp_index(product(self.group.inner)))
        elif start is None and len(r) > 1 and kinds == {"sum"} and not parallel and \
                size_hint(self.group.inner[-1]) >= ROW_SUM_MIN:
            with self.delegating(RowSums(self)) as strategy:
                strategy.generate(nodes, groups, x, r)
        else:
            with self.delegating(PlainLoop(self)) as strategy:
                strategy.generate(nodes, groups, x, r, start, end, parallel)
        return strategy

    def _scatter(self, node, x):
        data = node.buf.data
        value = node.body(x)
        dtype = node.buf.get_dtype()
        target = f"p_{node.writes}[{cpp_index(node.store_index(x))}]"
        self.stored.add(node.writes)
        if data.accumulate and dtype in HALF:    # added in float, rounded once
            if value.dtype != dtype:
                value = CppOpsHandler(self).to_dtype(value, dtype)
            value = self.cse(f"{from_storage(target, dtype)} + {value}", dtype)
            self.line(f"{target} = {self._stored_value(value, dtype)[1]};")
            return
        if value.dtype != dtype:
            value = CppOpsHandler(self).to_dtype(value, dtype)
        value = self._stored_value(value, dtype)[1]
        self.line(f"{target} {'+' if data.accumulate else ''}= {value};")

    def _signature(self) -> str:
        params = []
        self.args = self.buffer_args()
        for name in self.args:
            ctype = storage_type(self.dtypes[name])
            const = "" if name in self.stored else "const "
            params.append(f"{const}{ctype}* p_{name}")
        # the size symbols the body reads (graphs with symbolic sizes), after the buffers
        names = sizevars.symbol_names()
        body = "\n".join(self.lines)
        self.size_args = sorted({m for m in _WORD.findall(body) if m in names},
                                key=lambda n: int(n[1:]))
        params += [f"int64_t {n}" for n in self.size_args]
        return f'extern "C" void {self.name}({", ".join(params)})'


def _as_dtype(value: CppValue, dtype: torch.dtype) -> CppValue:
    """``value`` under the dtype an expression of the same text was asked for: a half op
    and its float32 twin are the same C++ (``a + 1`` of bfloat16 values, held in float, and
    ``a.float() + 1``), but only the first is rounded where it leaves bfloat16."""
    return value if value.dtype == dtype else CppValue(value.name, dtype)


@dataclasses.dataclass
class _Hoist:
    """Where values invariant in the inner loops being generated are declared."""
    at: int                     # index in the kernel's lines
    indent: int
    values: dict = dataclasses.field(default_factory=dict)    # C++ text -> value


def _merge_contiguous_dims(group: FusionGroup, x: list, r: list):
    """A pointwise group whose every index runs through its last outer dim and its inner
    dim as one contiguous range (``W * h + w``) loops over them as one inner dim: a
    ``[n, c, 4, 4]`` plane is one loop of 16, not four loops of 4. Repeated while it holds.
    Returns the group (a copy with merged loops) and the outer variables to call bodies
    with (a merged dim's variable is 0: the inner variable covers it)."""
    # (symbolic sizes too: ``runs_with`` merges only dims whose strides it proves
    # contiguous, which a symbolic stride never is; the loop lengths are hints)
    if (len(group.inner) != 1 or not group.outer
            or any(n.role != "inner" for n in group.nodes)):
        return group, x
    indices = access_indices(group, x, r)
    outer, inner, merged = list(group.outer), group.inner[0], 0
    total = size_hint(product(group.outer + group.inner))
    # only short inner loops gain, and the outer loops keep enough rows to parallelise
    while outer and size_hint(inner) < MERGE_BELOW and (
            total < PARALLEL_MIN_INNER or size_hint(product(outer[:-1])) >= PARALLEL_MIN_ITERS):
        var = x[len(outer) - 1]
        if not all(runs_with(e, var, r[0], inner) for e in indices):
            break
        inner = inner * outer.pop()
        merged += 1
    if not merged:
        return group, x
    x = list(x[:len(outer)]) + [sympy.Integer(0)] * merged
    return dataclasses.replace(group, outer=outer, inner=[inner]), x
