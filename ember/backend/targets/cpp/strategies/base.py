"""What every loop strategy shares: emission into its kernel, the body of one inner-loop
step (pointwise stores and reduction updates), reductions' accumulators and final values."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch

from ember.backend.codegen.common import HALF, group_kind, loop_steps
from ember.backend.ir import flat_index, product
from ember.backend.targets.cpp.ops import (CPP_TYPES, CppOpsHandler, CppValue, _combine,
                                           _fields, cpp_index)

if TYPE_CHECKING:
    from ember.backend.targets.cpp.kernel import CppKernel

PARALLEL_MIN_ITERS = 64          # fewer outer iterations than this: parallelise inner loops
PARALLEL_MIN_INNER = 8192        # ... and only inner loops at least this long
FOLDED = ("sum", "welford")      # reductions accumulated in two levels (see lanes.py)

NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_CPP_WORDS = set(CPP_TYPES.values()) | {"true", "false", "auto", "const"}


class LoopStrategy:
    """One way of generating a kernel's loops. A strategy emits into its kernel (lines,
    scopes, values: ``self.k``); the kernel chooses it and, while it generates, asks it what
    its loops know (:meth:`index_bounds`, :attr:`values_per_lane`). Subclasses keep the
    state only they need."""

    # every value is computed inside a loop over lanes (column blocks): none is invariant
    # in the inner loops, even one declared outside a hoisting region (CppKernel.cse)
    values_per_lane = False

    def __init__(self, kernel: CppKernel):
        self.k = kernel

    def tiled_element(self, name: str, index) -> str | None:
        """The C++ element holding buffer ``name`` at ``index`` where the loops read it
        from a local copy (transposed tiles), else None: it is read from memory."""
        return None

    def stored_element(self, name: str, index) -> str | None:
        """The C++ element a store of buffer ``name`` at ``index`` writes where the loops
        write elsewhere than the buffer (a lookup table being filled), else None."""
        return None

    def index_bounds(self, expr) -> tuple[int, int] | None:
        """The integer range of the index expression ``expr`` where the loops being
        generated decide it, else None (see CppOpsHandler.index_expr)."""
        return None

    # -- emission ------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.k.line(text)

    def open(self, text: str) -> None:
        """A line that opens a block (ending in ``{``); what follows is one level deeper."""
        self.k.line(text)
        self.k.indent += 1

    def close(self, end: str = "}") -> None:
        self.k.indent -= 1
        self.k.line(end)

    def open_linear(self, r, start, end) -> None:
        """``for`` over a linear inner index in ``[start, end)``, defining the inner vars."""
        var = r[0].name if len(r) == 1 else "r_lin"
        self.open(f"for (int64_t {var} = {start}; {var} < {end}; {var}++) {{")
        if len(r) > 1:
            self.unflatten(var, r)

    def unflatten(self, linear: str, r) -> None:
        sizes = self.k.group.inner
        for i, var in enumerate(r):
            stride = product(sizes[i + 1:])
            text = linear if stride == 1 else f"({linear} / {cpp_index(stride)})"
            if i > 0:
                text = f"{text} % {cpp_index(sizes[i])}"
            self.line(f"int64_t {var} = {text};")

    # -- reductions ----------------------------------------------------------------------------
    def acc(self, acc: str, field: str = "") -> str:
        """An accumulator field of the element being reduced."""
        return f"{acc}{field}"

    def loop_body(self, nodes, groups, x, r, lane: str | None, naming=None) -> None:
        """The nodes of one inner loop; reductions update their group's accumulator (lane
        ``lane``'s, inside a lane block) once per element. ``naming(acc, field)``: the
        accumulator fields updated here (default :meth:`acc`)."""
        k = self.k
        naming = naming or self.acc
        k.push()
        for node, acc in loop_steps(nodes, groups):
            if acc is None and node.role == "across":
                k.accumulate_across(node, x, r)
                continue
            if acc is None:
                k.store(node, node.where(x, r), node.value(x, r))
                continue
            node = groups[acc][0]
            data = node.buf.data
            kind, _ = group_kind(groups[acc])
            value = node.value(x, r)
            value = self._unrounded(value, acc, data.src_dtype) if kind in ("max", "min") \
                else CppOpsHandler(k).exact(value)
            if value.dtype != data.src_dtype:
                value = CppOpsHandler(k).to_dtype(value, data.src_dtype)
            a = lambda field="", acc=acc: naming(acc, field)   # noqa: E731
            if kind in ("argmax", "argmin"):
                linear = flat_index(r, k.group.inner)
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
                delta = k.cse(f"{value} - {mean}", data.src_dtype)
                self.line(f"{mean} = {mean} + {delta} * {acc}_inv;")
                self.line(f"{m2} = {m2} + {delta} * ({value} - {mean});")
            elif kind == "welford":
                self.line(f"ember_welford_update({acc}_mean, {acc}_m2, {acc}_n, {value});")
            elif kind == "sum" and lane is not None:
                self.line(f"{acc}_fine[{lane}] = {acc}_fine[{lane}] + {value};")
            else:
                self.line(f"{a()} = {_combine(kind, a(), value)};")
        k.pop()

    def _unrounded(self, value: CppValue, acc: str, src_dtype: torch.dtype) -> CppValue:
        """A max or min's value (to reduce in ``src_dtype``) where it is a half op's float
        result, rounded or not yet (the product of ``x * scale`` in a bf16 softmax): that
        float, unrounded. Rounding is monotonic, so the max of rounded values is the rounded
        max, which :meth:`result` rounds once (bf16 softmax(x * c), 1M elements, 1 thread:
        0.81 -> 0.66 ms)."""
        k = self.k
        source, half = k.rounded_from.get(value.name), k.var_dtypes.get(value.name)
        if source is None and value.dtype in HALF and value.name not in k.exact_half:
            source, half = value.name, value.dtype    # a float result, rounded nowhere yet
        if source is None or not re.fullmatch(r"\w+", source) or half not in HALF or \
                value.dtype not in (half, torch.float32) or src_dtype not in (half,
                                                                              torch.float32):
            return CppOpsHandler(k).exact(value)
        k.rounded_after[acc] = half
        return CppValue(source, src_dtype)

    def result(self, acc: str, members, node) -> CppValue:
        """A reduction's final value from its group's state (NaN seen by max/min wins)."""
        kind, dtype = group_kind(members)
        if kind in ("argmax", "argmin"):
            return CppValue(self.acc(acc, "_i"), torch.int64)
        if kind == "welford":
            return CppValue(self.acc(acc, "_" + node.buf.data.reduction_type[8:]), dtype)
        value = self.acc(acc)
        if acc in self.k.rounded_after:    # see _unrounded
            half = self.k.rounded_after[acc]
            value = str(CppOpsHandler(self.k).exact(CppValue(value, half)))
        if kind in ("max", "min") and dtype.is_floating_point:
            return self.k.cse(f"{self.acc(acc, '_nan')} ? std::numeric_limits<"
                              f"{CPP_TYPES[dtype]}>::quiet_NaN() : {value}", dtype)
        return CppValue(value, dtype)

    def store_results(self, groups, x) -> None:
        """Store each reduction's final value (once per outer iteration)."""
        for acc, members in groups.items():
            for node in members:
                self.k.store(node, node.store_index(x), self.result(acc, members, node))

    def declare_accumulators(self, groups, count: int | None = None) -> None:
        """The accumulators of each reduction group (arrays of ``count`` when given: the
        parts of a split reduction, a sum's in its coarse type)."""
        for acc, members in groups.items():
            kind, dtype = group_kind(members)
            for ctype, field, init in _fields(kind, dtype):
                if count is None:
                    self.line(f"{ctype} {acc}{field} = {init};")
                else:
                    ctype = coarse_type(kind, dtype) if field == "" else ctype
                    self.line(f"{ctype} {acc}{field}_c[{count}];")


def coarse_type(kind: str, dtype: torch.dtype) -> str:
    """C++ type of a sum's coarse (folded) accumulators: double for float32, whose long
    chains of adds would otherwise lose digits that eager's cascade sum keeps."""
    return "double" if kind == "sum" and dtype == torch.float32 else CPP_TYPES[dtype]


def reads_only(text: str, names: set[str]) -> bool:
    """Every name C++ ``text`` reads (not functions, types, literals) is in ``names``."""
    for m in NAME.finditer(text):
        name, after = m.group(0), text[m.end():m.end() + 2]
        if (name in _CPP_WORDS or after.startswith(("(", "<", "::"))
                or text[max(0, m.start() - 2):m.start()] == "::"):
            continue
        if name not in names:
            return False
    return True
