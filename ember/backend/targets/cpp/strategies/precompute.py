"""Precomputed arrays: a pointwise loop's costly per-index values that do not depend on the
outer loops, computed once per call before them."""
from __future__ import annotations

import re

from ember.backend.ir import product
from ember.backend.sizevars import is_static, size_hint
from ember.backend.targets.cpp.ops import CPP_TYPES, cpp_index
from ember.backend.targets.cpp.strategies.base import NAME, reads_only
from ember.backend.targets.cpp.strategies.plain import PlainLoop

PRECOMPUTE_MAX = 4096            # inner loops up to this long get per-index values precomputed

_DEF = re.compile(r"\s*auto (tmp\d+) = (.*);$")        # a temporary's declaration
_COSTLY = re.compile(r"/|std::|ember_")                  # a division or a call


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class PrecomputedArrays(PlainLoop):
    """A plain pointwise loop, then: its per-element values that do not depend on the outer
    loops, only on the inner index and memory the kernel never writes (batch norm's
    ``1 / sqrt(var + eps)`` per channel of channels-last data), and that cost a division or
    a call, are computed once per kernel call into an array before the outer loops, instead
    of once per element (the same code, so the same bits). efficientnet_b0's BN + SiLU over
    56 x 56 x 144: 0.17 -> 0.11 ms."""

    def generate(self, nodes, x, r) -> None:
        first = len(self.k.lines)
        super().generate(nodes, {}, x, r)
        self._precompute(first, r)

    def _precompute(self, first: int, r) -> None:
        """Rewrite the loop generated from line ``first`` on (see the class)."""
        k = self.k
        lines = k.lines
        size = product(k.group.inner)
        if len(r) != 1 or not k.group.outer or not is_static(size) or \
                size_hint(size) > PRECOMPUTE_MAX or size_hint(product(k.group.outer)) < 2:
            return
        loop = next((i for i in range(first, len(lines))
                     if lines[i].lstrip().startswith(f"for (int64_t {r[0].name} = ")), None)
        if loop is None:
            return
        body_indent = _indent(lines[loop]) + k.indent_unit
        free = {r[0].name} | {n for n in k.invariant if n.startswith("p_")}
        defs: dict[str, tuple[int, str]] = {}     # outer-free temporary -> (line, text)
        for i in range(first, len(lines)):
            m = _DEF.match(lines[i])
            # not inside a masked load's `if`: its loads may be out of bounds elsewhere
            if m and _indent(lines[i]) <= body_indent and reads_only(m.group(2), free):
                free.add(m.group(1))
                defs[m.group(1)] = (i, m.group(2))

        def inputs(v: str) -> set[str]:               # v and the outer-free values it reads
            seen, stack = set(), [v]
            while stack:
                u = stack.pop()
                if u not in seen:
                    seen.add(u)
                    stack += [n for n in NAME.findall(defs[u][1]) if n in defs]
            return seen
        # the outer-free values the rest of the loop reads, where computing them costs
        def_lines = {i for i, _ in defs.values()}
        read = {n for i in range(loop, len(lines)) if i not in def_lines
                for n in NAME.findall(lines[i]) if n in defs}
        costly = [v for v in defs if v in read and defs[v][0] > loop and
                  k.var_dtypes.get(v) in CPP_TYPES and
                  any(_COSTLY.search(defs[u][1]) for u in inputs(v))]
        if not costly:
            return
        needed = set().union(*map(inputs, costly))
        n, var = cpp_index(size), r[0].name
        pad = " " * k.indent_unit
        prologue = [f"{pad}{CPP_TYPES[k.var_dtypes[v]]} h_{v}[{n}];" for v in costly]
        prologue += [f"{pad}#pragma omp simd",
                     f"{pad}for (int64_t {var} = 0; {var} < {n}; {var}++) {{"]
        prologue += [f"{pad * 2}auto {v} = {text};" for v, (_, text) in defs.items()
                     if v in needed]
        prologue += [f"{pad * 2}h_{v}[{var}] = {v};" for v in costly] + [f"{pad}}}"]
        for v in costly:
            i = defs[v][0]
            lines[i] = f"{' ' * _indent(lines[i])}auto {v} = h_{v}[{var}];"
        # the loop's declarations of their inputs that nothing reads any more
        dead: set[int] = set()
        for v in sorted(needed - set(costly), key=lambda u: -defs[u][0]):
            i = defs[v][0]
            if i > loop and not any(v in NAME.findall(lines[j])
                                    for j in range(loop, len(lines))
                                    if j != i and j not in dead):
                dead.add(i)
        lines[:] = prologue + [line for j, line in enumerate(lines) if j not in dead]
