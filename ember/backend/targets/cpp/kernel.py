"""C++/OpenMP code generation for fused kernels.

One ``extern "C"`` function per :class:`FusionGroup`. The outer loops are parallelised with
OpenMP when they carry enough iterations; otherwise each inner loop is (with OpenMP reduction
clauses for reductions). Inner loops carry ``#pragma omp simd`` so g++ vectorises them.
Bodies are emitted by running each node's ``inner_fn`` under :class:`CppOpsHandler`, which
writes one ``auto tmpN = ...;`` per distinct expression (common subexpressions are shared
within a scope). Values are cast to their dtype's C++ type after every arithmetic operation,
so C++'s integer promotion never changes a result; max/min/relu propagate NaN like eager.

Errors eager raises are flags, not branches: a kernel that checks indirect indices or
integer divisors ORs each failed check into an OpenMP reduction (``_flag_errors``), and the
wrapper raises eager's IndexError or ``RuntimeError: ZeroDivisionError`` after the call. A
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

from ember.backend.targets.cpp.build import has_avx512
from ember.backend.codegen.common import Kernel, group_kind, loop_steps, reduction_groups
from ember.backend.targets.cpp.ops import (CPP_TYPES, CppOpsHandler, CppValue, _clause,
                                           _combine, _fields, _init, _merge, _RangeProbe,
                                           cpp_index)
from ember.backend.targets.cpp.prelude import CASCADE
from ember.backend.ir import index_vars, product
from ember.backend.loops import access_indices, runs_with, store_order
from ember.backend.ops import use_handler
from ember.backend.scheduler import FusionGroup, SchedulerNode, node_reads
from ember.backend.sizevars import is_static, size_hint

PARALLEL_MIN_ITERS = 64          # fewer outer iterations than this: parallelise inner loops
PARALLEL_MIN_INNER = 8192        # ... and only inner loops at least this long
PARTIAL_SUMS = 32                # lanes of partial sums in a row sum (4 AVX2 vectors)
PARALLEL_CHUNKS = 64             # slices of a reduction split over threads
COLUMN_BLOCK = (32, 512)         # lanes of a column kernel's block (see _generate_blocked)
COLUMN_MIN = 16                  # ... whose last outer dim has at least this many elements
MERGE_BELOW = 1024               # pointwise inner loops shorter than this absorb outer dims
ROW_SUM_MIN = 16                 # a multi-dim sum's last dim summed per row from this length
PRECOMPUTE_MAX = 4096            # inner loops up to this long get per-index values precomputed
_FOLDED = ("sum", "welford")     # reductions accumulated in two levels (see _lane_range)

# what a kernel may call and still take 16-lane vectors: inline code and single instructions
_INLINE_STD = frozenset({"abs", "sqrt", "floor", "ceil", "trunc", "nearbyint", "copysign", "min",
                         "max", "numeric_limits", "isinf", "is_floating_point"})
_STD_CALL = re.compile(r"std::(\w+)")
_DOUBLE_LIBM = re.compile(r"double.*ember_(exp|erf|tanh|sigmoid)\(")    # on one line
_SIMD_PRAGMA = re.compile(r"(#pragma omp (?:parallel for )?simd)")


_OMP_LOOP = re.compile(r"^(\s*#pragma omp (?:parallel for|simd).*)$")


MAX_PIECES = 64     # a loop splits into at most this many + 1 pieces (see _cuts)


def _flag_errors(lines: list[str]) -> list[str]:
    """A kernel that checks its indirect indices or integer divisors ORs each check's
    EMBER_BAD_INDEX or EMBER_ZERO_DIVISION bit into ``ember_flags_r``: a reduction of every
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
    sum of ``t * sin(t)`` three times as wrong as eager's, and double functions widen to it."""
    if not has_avx512() or any(fn not in _INLINE_STD for fn in _STD_CALL.findall(text)):
        return text
    if "ember_randn(" in text or _DOUBLE_LIBM.search(text):
        return text      # Box-Muller's log and cos, and the double functions, are libm's
    return _SIMD_PRAGMA.sub(r"\1 simdlen(16)", text)


class CppKernel(Kernel):
    """Generates one fused kernel's C++ function."""

    def __init__(self, group: FusionGroup, name: str, dtypes: dict[str, torch.dtype]):
        super().__init__(name, dtypes)
        self.group = group
        # the kernel checks indirect indices or integer divisors, so its library exports
        # ``<name>_flags`` (see _flag_errors), which the wrapper reads after each call
        self.exports_flags = False
        self.block = False              # a column kernel (see _generate_blocked)
        self.hoist: _Hoist | None = None    # where loop-invariant values go (see cse)
        # names whose value does not change inside the inner loops being generated: outer
        # loop variables, pointers to memory the kernel never writes, values computed
        # outside the inner loops (see _invariant)
        self.invariant: set[str] = set()
        self.row_accumulators: dict[str, str] = {}     # see _row_sums
        self.var_dtypes: dict[str, torch.dtype] = {}   # temporaries' dtypes (see _precompute)
        # inside one piece of a split inner loop (``_pieces``): its var and [start, end),
        # and the integer bounds of values that follow from it (see CppOpsHandler._fold)
        self.piece: tuple[sympy.Symbol, int, int] | None = None
        self.bounds: dict[str, tuple[int, int]] = {}

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
                return scope[text]
        hoist = self.hoist
        if hoist is None or not self._invariant(text):
            var = super().cse(text, dtype)
            self.var_dtypes[var.name] = dtype
            if hoist is None and not self.block:
                self.invariant.add(var.name)     # declared outside any inner loop
            return var
        if text not in hoist.values:
            var = CppValue(self.new_var(), dtype)
            self.var_dtypes[var.name] = dtype
            self.lines.insert(hoist.at, " " * (self.indent_unit * hoist.indent)
                              + self.declare(var.name, text))
            hoist.at += 1
            hoist.values[text] = var
            self.invariant.add(var.name)
        return hoist.values[text]

    def _invariant(self, text: str) -> bool:
        """Every name ``text`` reads (not functions, types, literals) is invariant."""
        return self._reads_only(text, self.invariant)

    @contextlib.contextmanager
    def _hoisting(self, reductions=()):
        """Inner loops generated inside this block move their invariant values to its
        start (only loops known to run: a value moved out is computed even when the loop
        has no iteration). On exit the reductions' accumulators hold final values."""
        size = product(self.group.inner)
        if self.hoist is not None or self.block or not is_static(size) or size_hint(size) < 1:
            yield
            return
        self.hoist = _Hoist(len(self.lines), self.indent)
        try:
            yield
        finally:
            self.hoist = None
        for acc, members in reduction_groups(reductions).items():
            self.invariant.update(f"{acc}{field}" for _, field, _ in
                                  _fields(*group_kind(members)))

    def call_lines(self, refs: dict[str, str]) -> list[str]:
        ptrs = ", ".join(f"{refs[a]}.data_ptr()" for a in self.args)
        lines = [f"{self.name}({ptrs})"]
        if self.exports_flags:
            # eager's exceptions: ZeroDivisionError (a RuntimeError) for integer division
            lines.append(f"if (flags := {self.name}_flags()) & 2: raise RuntimeError("
                         f"'ZeroDivisionError')")
            lines.append(f"if flags: raise IndexError('index out of range in a "
                         f"gather/index/embedding of {self.name}')")
        return lines

    def load(self, name: str, index) -> CppValue:
        known = self.known_value(name, index)
        if known is not None:
            return known
        if name in self.group.local:
            raise AssertionError(f"{name} is kept local but read where it is not available")
        self.loaded.add(name)
        return self.cse(f"p_{name}[{cpp_index(self._hoisted(index))}]", self.dtypes[name])

    def store(self, node: SchedulerNode, index, value: CppValue) -> None:
        dtype = node.buf.get_dtype()
        if value.dtype != dtype:
            value = CppOpsHandler(self).to_dtype(value, dtype)
        self.set_value(node.writes, index, value)
        if node.name in self.group.local:
            return
        self.stored.add(node.writes)
        self.line(f"p_{node.writes}[{cpp_index(self._hoisted(index))}] = {value};")

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

    # -- structure ---------------------------------------------------------------------------
    def generate(self) -> str:
        x = index_vars("x", len(self.group.outer))
        r = index_vars("r", len(self.group.inner))
        self.group = _in_store_order(self.group, x, r)
        self.group, x = _merge_contiguous_dims(self.group, x, r)
        k = self.group
        segs = self.group.segments
        handler = CppOpsHandler(self)
        outer_n = product(k.outer)
        scatter = any(n.role == "scatter" for n in k.nodes)
        parallel_outer = bool(k.outer) and outer_n.is_Integer and \
            size_hint(outer_n) >= PARALLEL_MIN_ITERS and not scatter
        inner_n = product(k.inner)
        parallel_inner = not parallel_outer and inner_n.is_Integer and \
            size_hint(inner_n) >= PARALLEL_MIN_INNER
        self.block = _column_kernel(k, x, r)
        written = {n.writes for n in k.nodes} | {n.name for n in k.nodes} | {
            n.buf.reuses for n in k.nodes if n.buf.reuses}
        self.invariant = {v.name for v in x if isinstance(v, sympy.Symbol)} | {
            f"p_{name}" for name in self.dtypes if name not in written}
        with use_handler(handler):
            if self.block:
                self._generate_blocked(x, r)
            elif k.outer:
                if parallel_outer:
                    collapse = f" collapse({len(k.outer)})" if len(k.outer) > 1 else ""
                    self.line(f"#pragma omp parallel for{collapse}")
                for var, size in zip(x, k.outer):
                    self.line(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++) {{")
                    self.indent += 1
                    self.push()
            if not self.block:
                for kind, nodes in segs:
                    if kind == "outer":
                        for node in nodes:
                            if node.role == "scatter":
                                self._scatter(node, x)
                            else:
                                self.store(node, node.store_index(x), node.body(x))
                    else:
                        self._loop(nodes, x, r, parallel_inner)
                for _ in k.outer:
                    self.pop()
                    self.indent -= 1
                    self.line("}")
        lines = _flag_errors(self.lines) if self.exports_flags else self.lines
        text = _widen_vectors(self._signature() + " {\n" + "\n".join(lines) + "\n}\n")
        if self.exports_flags:
            # one word of flags per kernel library, ORed by any call that met a bad index or a
            # zero divisor, read and cleared by the wrapper after each call
            text = ("static int ember_flags = 0;\n" + text +
                    f'extern "C" int {self.name}_flags() {{ int v = ember_flags; '
                    f"ember_flags = 0; return v; }}\n")
        return text

    # -- column kernels: the last outer dim in SIMD blocks -------------------------------------
    def _generate_blocked(self, x, r) -> None:
        """A kernel whose memory runs along its last outer dim (a reduction over a non-last
        dim: ``sum(0)`` of ``[n, c]`` reads ``p[r0 * c + x0]``): that dim is cut into blocks
        of up to COLUMN_BLOCK[1] lanes; per block, each segment runs the inner loops sequentially outside a
        SIMD loop over the block's lanes, with one accumulator per lane, so every access is
        contiguous. Per-lane values a later segment reads live in arrays ``v_<buf>[lane]``."""
        k = self.group
        last, size = x[-1], k.outer[-1]
        block = self.block_lanes = _column_block(size_hint(size))
        blocks = (size_hint(size) + block - 1) // block
        iters = size_hint(product(k.outer[:-1])) * blocks
        if iters >= 2 and size_hint(product(k.outer + k.inner)) >= PARALLEL_MIN_INNER:
            collapse = f" collapse({len(k.outer)})" if len(k.outer) > 1 else ""
            self.line(f"#pragma omp parallel for{collapse}")
        for var, n in zip(x[:-1], k.outer[:-1]):
            self.line(f"for (int64_t {var} = 0; {var} < {cpp_index(n)}; {var}++) {{")
            self.indent += 1
        self.line(f"for (int64_t {last}_blk = 0; {last}_blk < {blocks}; {last}_blk++) {{")
        self.indent += 1
        self.line(f"const int64_t {last}_base = {last}_blk * {block};")
        self.line(f"const int64_t {last}_len = std::min<int64_t>({block}, "
                  f"{size_hint(size)} - {last}_base);")
        self.push()
        for node in k.nodes:
            if node.role != "inner":
                self.line(f"{CPP_TYPES[node.buf.get_dtype()]} v_{node.name}[{block}];")
        for kind, nodes in k.segments:
            if kind == "outer":
                self._open_lanes(x)
                self.push()
                for node in nodes:
                    self._keep_lane(node, node.store_index(x), node.body(x))
                self.pop()
                self._close_lanes(nodes, x)
            else:
                self._blocked_loop(nodes, x, r)
        self.pop()
        for _ in k.outer:
            self.indent -= 1
            self.line("}")

    def _open_lanes(self, x, simd: bool = True) -> None:
        last = x[-1]
        if simd:
            self.line("#pragma omp simd")
        self.line(f"for (int64_t xl = 0; xl < {last}_len; xl++) {{")
        self.indent += 1
        self.line(f"const int64_t {last} = {last}_base + xl;")

    def _keep_lane(self, node, index, value) -> None:
        """Store a per-lane value (unless local) and keep it in ``v_<buf>[xl]``."""
        self.store(node, index, value)
        self.line(f"v_{node.name}[xl] = {self.known_value(node.writes, index)};")

    def _close_lanes(self, nodes, x) -> None:
        self.indent -= 1
        self.line("}")
        for node in nodes:    # later segments read the lane arrays
            self.set_value(node.writes, node.store_index(x),
                           CppValue(f"v_{node.name}[xl]", node.buf.get_dtype()))

    def _blocked_loop(self, nodes, x, r) -> None:
        groups = reduction_groups([n for n in nodes if n.role == "reduction"])
        block = self.block_lanes
        self.line("{")
        self.indent += 1
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            for ctype, field, init in _fields(kind, dtype):
                if field != "_n":   # a Welford count is the same in every lane
                    if kind == "sum":
                        ctype = _coarse_type(kind, dtype)
                    self.line(f"{ctype} {acc}{field}[{block}];")
                    self.line(f"for (int64_t xl = 0; xl < {block}; xl++) "
                              f"{acc}{field}[xl] = {init};")
        folded = {acc: m for acc, m in groups.items() if group_kind(m)[0] in _FOLDED}
        self._declare_fine(folded, block)
        if folded:
            self.line("int64_t r_count = 0, r_fine = 0;")
        for var, n in zip(r, self.group.inner):
            self.line(f"for (int64_t {var} = 0; {var} < {cpp_index(n)}; {var}++) {{")
            self.indent += 1
        self._welford_inv(folded)
        self._open_lanes(x)
        self._loop_body(nodes, groups, x, r, "xl")
        self.indent -= 1
        self.line("}")
        if folded:
            self.line("r_count++; r_fine++;")
            self.line(f"if (r_fine == {CASCADE}) {{")
            self.indent += 1
            self._fold(folded, "xl", f"{x[-1]}_len", lambda acc, field: f"{acc}{field}[xl]",
                       "r_count")
            self.line("r_fine = 0;")
            self.indent -= 1
            self.line("}")
        for _ in r:
            self.indent -= 1
            self.line("}")
        if folded:
            self._fold(folded, "xl", f"{x[-1]}_len", lambda acc, field: f"{acc}{field}[xl]",
                       "r_count")
        finished = [n for members in groups.values() for n in members]
        if finished:
            self._open_lanes(x, simd=False)
            self.push()
            for acc, members in groups.items():
                for node in members:
                    self._keep_lane(node, node.store_index(x), self._result(acc, members, node))
            self.pop()
            self._close_lanes(finished, x)
        self.indent -= 1
        self.line("}")

    def _acc(self, acc: str, field: str = "") -> str:
        """An accumulator field of the element being reduced (per lane in column kernels;
        a row's own inside ``_row_sums``)."""
        acc = self.row_accumulators.get(acc, acc)
        return f"{acc}{field}[xl]" if self.block else f"{acc}{field}"

    def _result(self, acc: str, members, node) -> CppValue:
        """A reduction's final value from its group's state (NaN seen by max/min wins)."""
        kind, dtype = group_kind(members)
        if kind in ("argmax", "argmin"):
            return CppValue(self._acc(acc, "_i"), torch.int64)
        if kind == "welford":
            return CppValue(self._acc(acc, "_" + node.buf.data.reduction_type[8:]), dtype)
        value = self._acc(acc)
        if self.block and _coarse_type(kind, dtype) != CPP_TYPES[dtype]:
            return self.cse(f"static_cast<{CPP_TYPES[dtype]}>({value})", dtype)
        if kind in ("max", "min") and dtype.is_floating_point:
            return self.cse(f"{self._acc(acc, '_nan')} ? std::numeric_limits<"
                            f"{CPP_TYPES[dtype]}>::quiet_NaN() : {value}", dtype)
        return CppValue(value, dtype)

    # -- inner loops and reductions ------------------------------------------------------------
    def _loop(self, nodes, x, r, parallel):
        """One inner loop: its pointwise nodes store per element, its reductions accumulate
        and store once per outer iteration. ``parallel``: the loop itself is split over
        threads (few outer iterations)."""
        reductions = [n for n in nodes if n.role == "reduction"]
        groups = reduction_groups(reductions)
        size = product(self.group.inner)
        first = len(self.lines)
        with self._hoisting(reductions):
            if not groups:
                cuts = [] if parallel else self._cuts(nodes, x, r)
                if cuts:
                    self._pieces(nodes, x, r, cuts)
                    return
                self._range(nodes, groups, x, r, None, None, parallel=parallel)
                if not parallel:
                    self._precompute(first, r)
                return
            if parallel:
                self._chunked(nodes, groups, x, r, size)
            else:
                self._declare(groups)
                lanes = is_static(size) and size_hint(size) >= 2 * PARTIAL_SUMS
                self._range(nodes, groups, x, r, None, None, lanes=lanes)
        for acc, members in groups.items():
            for node in members:
                self.store(node, node.store_index(x), self._result(acc, members, node))

    def _cuts(self, nodes, x, r) -> list[int]:
        """Where a pointwise loop over one inner dim splits so that each piece decides its
        range conditions: the starts of a concatenation's parts along that dim (a
        channels-last ``cat`` of channels), found by evaluating the bodies under
        ``_RangeProbe``. Empty when there are none, or too many."""
        if len(r) != 1 or self.block or not is_static(self.group.inner[0]):
            return []
        probe = _RangeProbe(r[0])
        try:
            with use_handler(probe):
                for node in nodes:
                    node.value(x, r)
        except (AttributeError, TypeError):   # a body that inspects its values: no cuts
            return []
        n = size_hint(self.group.inner[0])
        cuts = sorted(c for c in probe.cuts if 0 < c < n)
        return cuts if len(cuts) <= MAX_PIECES else []

    def _pieces(self, nodes, x, r, cuts: list[int]) -> None:
        """The loop as one loop per range between ``cuts``: within each, the range
        conditions fold to constants (``CppOpsHandler._fold``), so a concatenation's piece
        loads one part, with no branch (deeplabv3's 5-way ASPP concatenation of 14x14x1280:
        0.84 ms with a masked load per part in one loop)."""
        bounds = [0, *cuts, size_hint(self.group.inner[0])]
        for start, end in zip(bounds, bounds[1:]):
            self.piece = (r[0], start, end)
            try:
                self._range(nodes, {}, x, r, str(start), str(end))
            finally:
                self.piece = None

    def _precompute(self, first: int, r) -> None:
        """Per-element values of the pointwise loop generated from line ``first`` on that do
        not depend on the outer loops, only on the inner index and memory the kernel never
        writes (batch norm's ``1 / sqrt(var + eps)`` per channel of channels-last data), and
        that cost a division or a call: computed once per kernel call into an array before
        the outer loops, instead of once per element (the same code, so the same bits).
        efficientnet_b0's BN + SiLU over 56 x 56 x 144: 0.17 -> 0.11 ms."""
        k = self.group
        size = product(k.inner)
        if len(r) != 1 or self.block or not k.outer or not is_static(size) or \
                size_hint(size) > PRECOMPUTE_MAX or size_hint(product(k.outer)) < 2:
            return
        loop = next((i for i in range(first, len(self.lines))
                     if self.lines[i].lstrip().startswith(f"for (int64_t {r[0].name} = ")), None)
        if loop is None:
            return
        body_indent = _indent(self.lines[loop]) + self.indent_unit
        free = {r[0].name} | {n for n in self.invariant if n.startswith("p_")}
        defs: dict[str, tuple[int, str]] = {}     # outer-free temporary -> (line, text)
        for i in range(first, len(self.lines)):
            m = _DEF.match(self.lines[i])
            # not inside a masked load's `if`: its loads may be out of bounds elsewhere
            if m and _indent(self.lines[i]) <= body_indent and \
                    self._reads_only(m.group(2), free):
                free.add(m.group(1))
                defs[m.group(1)] = (i, m.group(2))

        def inputs(v: str) -> set[str]:               # v and the outer-free values it reads
            seen, stack = set(), [v]
            while stack:
                u = stack.pop()
                if u not in seen:
                    seen.add(u)
                    stack += [n for n in _NAME.findall(defs[u][1]) if n in defs]
            return seen
        # the outer-free values the rest of the loop reads, where computing them costs
        def_lines = {i for i, _ in defs.values()}
        read = {n for i in range(loop, len(self.lines)) if i not in def_lines
                for n in _NAME.findall(self.lines[i]) if n in defs}
        costly = [v for v in defs if v in read and defs[v][0] > loop and
                  self.var_dtypes.get(v) in CPP_TYPES and
                  any(_COSTLY.search(defs[u][1]) for u in inputs(v))]
        if not costly:
            return
        needed = set().union(*map(inputs, costly))
        n, var = cpp_index(size), r[0].name
        pad = " " * self.indent_unit
        prologue = [f"{pad}{CPP_TYPES[self.var_dtypes[v]]} h_{v}[{n}];" for v in costly]
        prologue += [f"{pad}#pragma omp simd",
                     f"{pad}for (int64_t {var} = 0; {var} < {n}; {var}++) {{"]
        prologue += [f"{pad * 2}auto {v} = {text};" for v, (_, text) in defs.items()
                     if v in needed]
        prologue += [f"{pad * 2}h_{v}[{var}] = {v};" for v in costly] + [f"{pad}}}"]
        for v in costly:
            i = defs[v][0]
            self.lines[i] = f"{' ' * _indent(self.lines[i])}auto {v} = h_{v}[{var}];"
        # the loop's declarations of their inputs that nothing reads any more
        dead: set[int] = set()
        for v in sorted(needed - set(costly), key=lambda u: -defs[u][0]):
            i = defs[v][0]
            if i > loop and not any(v in _NAME.findall(self.lines[j])
                                    for j in range(loop, len(self.lines))
                                    if j != i and j not in dead):
                dead.add(i)
        self.lines[:] = prologue + [line for j, line in enumerate(self.lines) if j not in dead]

    def _reads_only(self, text: str, names: set[str]) -> bool:
        """Every name ``text`` reads (not functions, types, literals) is in ``names``."""
        for m in _NAME.finditer(text):
            name, after = m.group(0), text[m.end():m.end() + 2]
            if (name in _CPP_WORDS or after.startswith(("(", "<", "::"))
                    or text[max(0, m.start() - 2):m.start()] == "::"):
                continue
            if name not in names:
                return False
        return True

    def _declare(self, groups, count: int | None = None) -> None:
        """The accumulators of each reduction group (arrays of ``count`` when given)."""
        for acc, members in groups.items():
            for ctype, field, init in _fields(*group_kind(members)):
                if count is None:
                    self.line(f"{ctype} {acc}{field} = {init};")
                else:
                    self.line(f"{ctype} {acc}{field}_c[{count}];")

    def _chunked(self, nodes, groups, x, r, size) -> None:
        """A long reduction split over threads: PARALLEL_CHUNKS fixed slices of the inner
        range, each reduced on its own, then merged in slice order -- the result does not
        depend on the number of threads."""
        chunks = PARALLEL_CHUNKS
        self._declare(groups, count=chunks)
        n = cpp_index(size)
        self.line("#pragma omp parallel for")
        self.line(f"for (int64_t chunk = 0; chunk < {chunks}; chunk++) {{")
        self.indent += 1
        self.push()
        self.line(f"const int64_t r_start = chunk * {n} / {chunks}, "
                  f"r_end = (chunk + 1) * {n} / {chunks};")
        self._declare(groups)
        self._range(nodes, groups, x, r, "r_start", "r_end", lanes=True)
        for acc, members in groups.items():
            for _, field, _ in _fields(*group_kind(members)):
                self.line(f"{acc}{field}_c[chunk] = {acc}{field};")
        self.pop()
        self.indent -= 1
        self.line("}")
        self._declare(groups)
        self.line(f"for (int64_t chunk = 0; chunk < {chunks}; chunk++) {{")
        self.indent += 1
        for acc, members in groups.items():
            part = lambda field, acc=acc: f"{acc}{field}_c[chunk]"   # noqa: E731
            self.line(_merge(acc, *group_kind(members), part))
        self.indent -= 1
        self.line("}")

    def _range(self, nodes, groups, x, r, start, end, lanes=False, parallel=False) -> None:
        """The loop over inner indices ``[start, end)`` (linear over the inner dims; None: all
        of them), accumulating into the groups' scalars."""
        kinds = {group_kind(m)[0] for m in groups.values()}
        if groups and kinds <= {"sum", "welford"} and (
                (lanes and len(r) == 1) or "welford" in kinds):
            self._lane_range(nodes, groups, x, r, start or 0, end or cpp_index(
                product(self.group.inner)))
            return
        if start is None and len(r) > 1 and kinds == {"sum"} and not parallel and \
                not self.block and size_hint(self.group.inner[-1]) >= ROW_SUM_MIN:
            self._row_sums(nodes, groups, x, r)
            return
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
            for var, size in zip(r, self.group.inner):
                self.line(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++) {{")
                self.indent += 1
            depth = len(r)
        else:
            depth = 1
            if len(r) > 1:
                self._open_segments(r, start, end)
                depth = 2
                if kinds == {"sum"} and not self.block:     # each run in two levels too
                    last = r[-1].name
                    self._row(nodes, groups, x, r, f"{last}_lo", f"{last}_hi", "")
                    self.indent -= 1
                    self.line("}")
                    return
            if pragma:
                self.line(f"{pragma} {clauses}".rstrip())
            if len(r) > 1:
                last = r[-1].name
                self.line(f"for (int64_t {last} = {last}_lo; {last} < {last}_hi; {last}++) {{")
                self.indent += 1
            else:
                self._open_linear(r, start, end)
        self._loop_body(nodes, groups, x, r, None)
        for _ in range(depth):
            self.indent -= 1
            self.line("}")

    def _row_sums(self, nodes, groups, x, r) -> None:
        """Sums over several inner dims in two levels: each run of the last dim into a
        row accumulator (SIMD lanes), each row's total into a coarse one (double for
        float32). One collapsed SIMD loop chained n/8 adds per lane: a batch norm's
        gradient sums over (N, H*W) came out 15x further from float64 than eager's cascade
        sum, enough to fail the bench's accuracy check."""
        inner = self.group.inner
        self.line("{")
        self.indent += 1
        for acc, m in groups.items():
            self.line(f"{_coarse_type('sum', group_kind(m)[1])} {acc}_total = 0;")
        for var, size in zip(r[:-1], inner[:-1]):
            self.line(f"for (int64_t {var} = 0; {var} < {cpp_index(size)}; {var}++) {{")
            self.indent += 1
        self._row(nodes, groups, x, r, "0", cpp_index(inner[-1]), "_total")
        for _ in r[:-1]:
            self.indent -= 1
            self.line("}")
        for acc, m in groups.items():
            self.line(f"{acc} = {acc} + static_cast<{CPP_TYPES[group_kind(m)[1]]}>"
                      f"({acc}_total);")
        self.indent -= 1
        self.line("}")

    def _row(self, nodes, groups, x, r, low: str, high: str, into: str) -> None:
        """The last inner dim from ``low`` to ``high`` summed into row accumulators, then
        added to ``<acc><into>``."""
        for acc, m in groups.items():
            dtype = group_kind(m)[1]
            self.line(f"{CPP_TYPES[dtype]} {acc}_row = {_init('sum', dtype)};")
        self.line("#pragma omp simd " + " ".join(
            _clause(f"{acc}_row", "sum", group_kind(m)[1]) for acc, m in groups.items()))
        last = r[-1]
        self.line(f"for (int64_t {last} = {low}; {last} < {high}; {last}++) {{")
        self.indent += 1
        self.row_accumulators = {acc: f"{acc}_row" for acc in groups}
        try:
            self._loop_body(nodes, groups, x, r, None)
        finally:
            self.row_accumulators = {}
        self.indent -= 1
        self.line("}")
        for acc in groups:
            self.line(f"{acc}{into} += {acc}_row;")

    def _open_segments(self, r, start, end) -> None:
        """A linear inner range ``[start, end)`` over several inner dims as runs along the
        last one: a ``while`` over the runs defines the other inner variables and the run's
        bounds ``<last>_lo``/``<last>_hi``; the caller opens the loop over the last dim.
        (Unflattening every element instead costs a division and a gather per element.)"""
        sizes = self.group.inner
        n = cpp_index(sizes[-1])
        last = r[-1].name
        self.line(f"for (int64_t r_seg = {start}; r_seg < {end};) {{")
        self.indent += 1
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

    def _open_linear(self, r, start, end) -> None:
        """``for`` over a linear inner index in ``[start, end)``, defining the inner vars."""
        var = r[0].name if len(r) == 1 else "r_lin"
        self.line(f"for (int64_t {var} = {start}; {var} < {end}; {var}++) {{")
        self.indent += 1
        if len(r) > 1:
            self._unflatten(var, r)

    def _unflatten(self, linear: str, r) -> None:
        sizes = self.group.inner
        for i, var in enumerate(r):
            stride = product(sizes[i + 1:])
            text = linear if stride == 1 else f"({linear} / {cpp_index(stride)})"
            if i > 0:
                text = f"{text} % {cpp_index(sizes[i])}"
            self.line(f"int64_t {var} = {text};")

    def _lane_range(self, nodes, groups, x, r, start, end) -> None:
        """Sums and Welford reductions over ``[start, end)`` as blocks of PARTIAL_SUMS lanes,
        one accumulator per lane (independent add chains pipeline and vectorise). Lanes
        accumulate CASCADE blocks into fine accumulators, which are then folded into coarse
        ones: no add chain grows long, so a sum of millions of elements stays as accurate as
        eager's cascade sum. The lanes are merged into the scalars after the blocks; the
        tail goes straight into the scalars."""
        lanes = PARTIAL_SUMS
        self.line("{")
        self.indent += 1
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            ctype = CPP_TYPES[dtype]
            fields = ("",) if kind == "sum" else ("_mean", "_m2")
            self.line(" ".join(f"{_coarse_type(kind, dtype)} {acc}_lane{f}[{lanes}] = {{}};"
                               for f in fields))
        self.line(f"int64_t r_block = {start}, r_blocks = 0;")
        self.line(f"while (r_block + {lanes} <= {end}) {{")
        self.indent += 1
        self.line(f"const int64_t r_stop = r_block + std::min<int64_t>(({end} - r_block) / "
                  f"{lanes}, {CASCADE}) * {lanes};")
        self._declare_fine(groups, lanes)
        self.line("int64_t r_fine = 0;")
        self.line(f"for (; r_block < r_stop; r_block += {lanes}, r_blocks++, r_fine++) {{")
        self.indent += 1
        self._welford_inv(groups)
        self.line("#pragma omp simd")
        self.line(f"for (int64_t r_lane = 0; r_lane < {lanes}; r_lane++) {{")
        self.indent += 1
        if len(r) == 1:
            self.line(f"int64_t {r[0]} = r_block + r_lane;")
        else:
            self.line("int64_t r_lin = r_block + r_lane;")
            self._unflatten("r_lin", r)
        self._loop_body(nodes, groups, x, r, "r_lane")
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")
        self._fold(groups, "r_lane", str(lanes), lambda acc, field: f"{acc}_lane{field}[r_lane]",
                   "r_blocks")
        self.indent -= 1
        self.line("}")
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            if kind == "sum":
                self.line(f"{_coarse_type(kind, dtype)} {acc}_total = {acc};")
                self.line(f"for (int64_t lane = 0; lane < {lanes}; lane++) "
                          f"{acc}_total = {acc}_total + {acc}_lane[lane];")
                self.line(f"{acc} = static_cast<{CPP_TYPES[dtype]}>({acc}_total);")
            else:
                self.line(f"for (int64_t lane = 0; lane < {lanes}; lane++) "
                          f"ember_welford_combine({acc}_mean, {acc}_m2, {acc}_n, "
                          f"{acc}_lane_mean[lane], {acc}_lane_m2[lane], r_blocks);")
        self._open_linear(r, "r_block", end)
        self._loop_body(nodes, groups, x, r, None)
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")

    def _declare_fine(self, groups, lanes: int) -> None:
        """Zeroed fine accumulators, one per lane, of the sum and Welford groups."""
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            if kind in _FOLDED:
                ctype = CPP_TYPES[dtype]
                fields = ("",) if kind == "sum" else ("_mean", "_m2")
                self.line(" ".join(f"{ctype} {acc}_fine{f}[{lanes}] = {{}};" for f in fields))

    def _welford_inv(self, groups) -> None:
        """1 / (values each lane's fine Welford state will have seen after this step)."""
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            if kind == "welford":
                ctype = CPP_TYPES[dtype]
                self.line(f"const {ctype} {acc}_inv = ember_inverse<{ctype}>.v[r_fine];")

    def _fold(self, groups, lane: str, count: str, coarse, total: str) -> None:
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
        self.line(f"for (int64_t {lane} = 0; {lane} < {count}; {lane}++) {{")
        self.indent += 1
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
        self.indent -= 1
        self.line("}")

    def _loop_body(self, nodes, groups, x, r, lane: str | None) -> None:
        """The nodes of one inner loop; reductions update their group's accumulator (lane
        ``lane``'s, inside a lane block) once per element."""
        k = self.group
        self.push()
        for node, acc in loop_steps(nodes, groups):
            if acc is None:
                self.store(node, node.where(x, r), node.value(x, r))
                continue
            node = groups[acc][0]
            data = node.buf.data
            value = node.value(x, r)
            if value.dtype != data.src_dtype:
                value = CppOpsHandler(self).to_dtype(value, data.src_dtype)
            kind, _ = group_kind(groups[acc])
            a = lambda field="", acc=acc: self._acc(acc, field)   # noqa: E731
            if kind in ("argmax", "argmin"):
                linear = sympy.Integer(0)
                for var, size in zip(r, k.inner):
                    linear = linear * size + var
                better = ">" if kind == "argmax" else "<"
                # NaN wins and the first one is kept, as in eager
                self.line(f"if ({a()} == {a()} && ({value} != {value} || {value} {better} "
                          f"{a()})) {{ {a()} = {value}; {a('_i')} = {cpp_index(linear)}; }}")
            elif kind in ("max", "min"):
                sign = ">" if kind == "max" else "<"
                self.line(f"{a()} = {a()} {sign} {value} ? {a()} : {value};")
                if data.src_dtype.is_floating_point:
                    self.line(f"{a('_nan')} |= ({value} != {value});")
            elif kind == "welford" and lane is not None:
                # every lane has seen the same count: 1 / count is computed outside
                mean, m2 = f"{acc}_fine_mean[{lane}]", f"{acc}_fine_m2[{lane}]"
                delta = self.cse(f"{value} - {mean}", data.src_dtype)
                self.line(f"{mean} = {mean} + {delta} * {acc}_inv;")
                self.line(f"{m2} = {m2} + {delta} * ({value} - {mean});")
            elif kind == "welford":
                self.line(f"ember_welford_update({acc}_mean, {acc}_m2, {acc}_n, {value});")
            elif kind == "sum" and lane is not None:
                self.line(f"{acc}_fine[{lane}] = {acc}_fine[{lane}] + {value};")
            else:
                self.line(f"{a()} = {_combine(kind, a(), value)};")
        self.pop()

    def _scatter(self, node, x):
        data = node.buf.data
        value = node.body(x)
        dtype = node.buf.get_dtype()
        if value.dtype != dtype:
            value = CppOpsHandler(self).to_dtype(value, dtype)
        target = f"p_{node.writes}[{cpp_index(node.store_index(x))}]"
        self.stored.add(node.writes)
        self.line(f"{target} {'+' if data.accumulate else ''}= {value};")

    def _signature(self) -> str:
        params = []
        for name in sorted(self.loaded | self.stored):
            ctype = CPP_TYPES[self.dtypes[name]]
            const = "" if name in self.stored else "const "
            params.append(f"{const}{ctype}* p_{name}")
        self.args = sorted(self.loaded | self.stored)
        return f'extern "C" void {self.name}({", ".join(params)})'


@dataclasses.dataclass
class _Hoist:
    """Where values invariant in the inner loops being generated are declared."""
    at: int                     # index in the kernel's lines
    indent: int
    values: dict = dataclasses.field(default_factory=dict)    # C++ text -> value


_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_DEF = re.compile(r"\s*auto (tmp\d+) = (.*);$")        # a temporary's declaration
_COSTLY = re.compile(r"/|std::|ember_")                  # a division or a call
_CPP_WORDS = set(CPP_TYPES.values()) | {"true", "false", "auto", "const"}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _coarse_type(kind: str, dtype: torch.dtype) -> str:
    """C++ type of a sum's coarse (folded) accumulators: double for float32, whose long
    chains of adds would otherwise lose digits that eager's cascade sum keeps."""
    return "double" if kind == "sum" and dtype == torch.float32 else CPP_TYPES[dtype]


def _in_store_order(kernel: FusionGroup, x: list, r: list) -> FusionGroup:
    """A pointwise kernel whose first store walks memory in another order than its loops (a
    channels-last value over logical ``[n, c, h, w]``) iterates in that store's order: its
    inner loop runs along stride 1 (contiguous SIMD loads and stores), not along ``w`` with
    a stride of ``c``. Returns a copy whose nodes take their dims through ``perm``, or the
    kernel itself."""
    if (len(kernel.inner) != 1 or not kernel.outer
            or any(n.role != "inner" or n.perm is not None for n in kernel.nodes)
            or not all(s.is_Integer for s in kernel.outer + kernel.inner)):
        return kernel
    sizes, kernel_vars = list(kernel.outer) + list(kernel.inner), list(x) + list(r)
    order = [kernel_vars.index(v) for v in store_order(kernel, x, r, sizes, kernel_vars)[1]]
    if order == sorted(order):
        return kernel
    at = {dim: i for i, dim in enumerate(order)}
    perm = tuple(at[dim] for dim in range(len(sizes)))
    copies = {id(n): dataclasses.replace(n, perm=perm, read_cache={}) for n in kernel.nodes}
    sizes = [sizes[dim] for dim in order]
    return dataclasses.replace(
        kernel, outer=sizes[:-1], inner=sizes[-1:],
        nodes=[copies[id(n)] for n in kernel.nodes],
        segments=[(kind, [copies[id(n)] for n in nodes]) for kind, nodes in kernel.segments])


def _merge_contiguous_dims(kernel: FusionGroup, x: list, r: list):
    """A pointwise kernel whose every index runs through its last outer dim and its inner
    dim as one contiguous range (``W * h + w``) loops over them as one inner dim: a
    ``[n, c, 4, 4]`` plane is one loop of 16, not four loops of 4. Repeated while it holds.
    Returns the kernel (a copy with merged loops) and the outer variables to call bodies
    with (a merged dim's variable is 0: the inner variable covers it)."""
    if (len(kernel.inner) != 1 or not kernel.outer
            or any(n.role != "inner" for n in kernel.nodes)
            or not all(s.is_Integer for s in kernel.outer + kernel.inner)):
        return kernel, x
    indices = access_indices(kernel, x, r)
    outer, inner, merged = list(kernel.outer), kernel.inner[0], 0
    total = size_hint(product(kernel.outer + kernel.inner))
    # only short inner loops gain, and the outer loops keep enough rows to parallelise
    while outer and size_hint(inner) < MERGE_BELOW and (
            total < PARALLEL_MIN_INNER or size_hint(product(outer[:-1])) >= PARALLEL_MIN_ITERS):
        var = x[len(outer) - 1]
        if not all(runs_with(e, var, r[0], inner) for e in indices):
            break
        inner = inner * outer.pop()
        merged += 1
    if not merged:
        return kernel, x
    x = list(x[:len(outer)]) + [sympy.Integer(0)] * merged
    return dataclasses.replace(kernel, outer=outer, inner=[inner]), x


def _column_block(size: int) -> int:
    """Lanes per block of a column kernel: wide blocks read long runs of each row, but
    there should be at least 4 blocks to share among threads."""
    lanes = COLUMN_BLOCK[0]
    while lanes * 2 <= COLUMN_BLOCK[1] and size >= lanes * 2 * 4:
        lanes *= 2
    return lanes


def _column_kernel(kernel: FusionGroup, x, r) -> bool:
    """Whether the kernel's memory accesses mostly run along its last outer dim (stride 1)
    rather than its last inner dim: then it is generated with blocks of columns."""
    if (not kernel.outer or not kernel.inner or not kernel.outer[-1].is_Integer
            or size_hint(kernel.outer[-1]) < COLUMN_MIN
            or not all(s.is_Integer for s in kernel.outer + kernel.inner)
            or not any(n.is_reduction for n in kernel.nodes)
            or any(n.role == "scatter" for n in kernel.nodes)):
        return False
    along_outer = along_inner = 0
    for node in kernel.nodes:    # the accesses made per element of the inner loops
        if node.role == "outer":
            continue
        accesses = [index for _, index in node_reads(node, x, r)]
        if node.role == "inner":
            accesses.append(node.where(x, r))
        for index in accesses:
            if sympy.diff(index, r[-1]) == 1:
                along_inner += 1
            elif sympy.diff(index, x[-1]) == 1:
                along_outer += 1
    return along_outer > along_inner
