"""What every kernel code generator shares: emitted values, a kernel base with common
subexpression elimination, an index-expression printer, and the grouping of reductions into
accumulator states.

A target's kernel (``targets/cpp/kernel.py``, ``targets/triton/kernel.py``) subclasses
:class:`Kernel` and :class:`IndexPrinter`; its ops handler calls :meth:`Kernel.cse` for
every expression it emits, so an expression computed twice in a scope becomes one
temporary. Loads and stores go through
:meth:`Kernel.known_value` / :meth:`Kernel.set_value`: a value a kernel already holds for
``(buffer, index)`` is reused instead of read again from memory.
"""
from __future__ import annotations

import re

import sympy
import torch

from ember.backend.ir import FloorDiv, ModIndex
from ember.backend.ops import DEFAULT_INDEX_CHECK, IndexCheck
from ember.backend.sizevars import statically_known_leq
from ember.shapes.functions import FloorDiv as SizeFloorDiv, Mod as SizeMod, TruncToInt


# float16 and bfloat16: every target holds their values in float32, as eager's kernels
# compute them ("opmath"): a load widens, a store rounds to the storage dtype, and an
# explicit ``to_dtype`` to one of them rounds and widens again
HALF = (torch.float16, torch.bfloat16)


_ARG_USE = re.compile(r"\bp_(\w+)")


class Value:
    """A named value in generated code, with the dtype of the IR value it holds."""
    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: torch.dtype):
        self.name = name
        self.dtype = dtype

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"Value({self.name}, {self.dtype})"


class Kernel:
    """Lines of one kernel's body, nested scopes of common subexpressions, and the buffers it
    loads and stores. Subclasses give :meth:`declare` (how a temporary is written)."""

    value_class = Value

    def __init__(self, name: str, dtypes: dict[str, torch.dtype]):
        self.name = name
        self.dtypes = dtypes            # storage name -> dtype
        self.lines: list[str] = []
        self.indent = 1
        self.scopes: list[dict] = [{}]
        self.values: list[dict] = [{}]  # (buffer, index key) -> value, per scope
        self.counter = 0
        self.loaded: set[str] = set()
        self.stored: set[str] = set()
        self.args: list[str] = []       # buffer arguments, in call order (after generate())
        self.source = ""
        # the distinct checks of its indirect indices, in the order met: one error flag
        # each (see index_check_slot)
        self.index_checks: list[IndexCheck] = []

    MAX_INDEX_CHECKS = 28
    kind = "poi"    # its loop structure in a word, in its name (codegen/kernel_names.py)

    def buffer_args(self) -> list[str]:
        """The buffers it loads and stores, in order of first use in its body (``p_<name>``),
        not by name: a layer reading a graph input (``arg5``) and the next reading an
        intermediate (``buf48``), or a shared ``buf53`` beside ``buf103``, then have the same
        source up to names, so repeated layers share one kernel."""
        names = self.loaded | self.stored
        used = dict.fromkeys(m for m in _ARG_USE.findall("\n".join(self.lines)) if m in names)
        return [*used, *sorted(names - used.keys())]

    def rename(self, name: str) -> None:
        """Called ``name`` from now on, in its generated source too (``<name>_flags``...)."""
        self.source = re.sub(rf"\b{re.escape(self.name)}(?![0-9A-Za-z])", name, self.source)
        self.name = name

    def index_check_slot(self, check: IndexCheck | None) -> int:
        """The error flag (0, 1, ...) of an index check: its own per distinct check, so
        a kernel fusing a gather (RuntimeError in eager) with an embedding (IndexError)
        raises the one eager raises; the wrapper raises the first flagged check's, as
        eager stops at the first op that fails. Past MAX_INDEX_CHECKS the rest share the
        last flag, which then raises a plain IndexError."""
        check = check or DEFAULT_INDEX_CHECK
        checks = self.index_checks
        if check in checks:
            return checks.index(check)
        if len(checks) == self.MAX_INDEX_CHECKS:
            checks[-1] = DEFAULT_INDEX_CHECK
            return len(checks) - 1
        checks.append(check)
        return len(checks) - 1

    # -- emission ------------------------------------------------------------------------------
    indent_unit = 2      # spaces per nesting level

    def line(self, text: str) -> None:
        self.lines.append(" " * (self.indent_unit * self.indent) + text)

    def push(self) -> None:
        self.scopes.append({})
        self.values.append({})

    def pop(self) -> None:
        self.scopes.pop()
        self.values.pop()

    def new_var(self, prefix: str = "tmp") -> str:
        name = f"{prefix}{self.counter}"
        self.counter += 1
        return name

    def declare(self, var: str, text: str) -> str:
        raise NotImplementedError

    def cse(self, text: str, dtype: torch.dtype) -> Value:
        for scope in reversed(self.scopes):
            if text in scope:
                return scope[text]
        var = self.value_class(self.new_var(), dtype)
        self.line(self.declare(var.name, text))
        self.scopes[-1][text] = var
        return var

    def known_value(self, name: str, index) -> Value | None:
        key = (name, sympy.expand(index))     # structural: no printing
        for scope in reversed(self.values):
            if key in scope:
                return scope[key]
        return None

    def set_value(self, name: str, index, value: Value) -> None:
        self.values[-1][(name, sympy.expand(index))] = value

    # -- the wrapper's side ----------------------------------------------------------------------
    def call_lines(self, refs: dict[str, str]) -> list[str]:
        """Python lines of the wrapper that run this kernel; ``refs`` maps each buffer
        argument to the wrapper's expression for its tensor."""
        raise NotImplementedError


class IndexPrinter:
    """Prints sympy index expressions (integer arithmetic over loop variables and sizes).
    Targets override the hooks for their syntax."""

    def __call__(self, expr) -> str:
        return self.print(sympy.expand(expr))

    def print(self, e) -> str:
        if isinstance(e, sympy.Integer):
            return self.integer(int(e))
        if isinstance(e, sympy.Symbol):
            return e.name
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(self.print(a) for a in e.args) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(self.print(a) for a in e.args) + ")"
        if isinstance(e, FloorDiv):
            return self.floordiv(self.print(e.args[0]), self.print(e.args[1]))
        if isinstance(e, ModIndex):
            return self.mod(self.print(e.args[0]), self.print(e.args[1]))
        # Python's // and % of sizes: truncation where the operands are known non-negative
        # and positive (they agree there), else floor semantics
        if isinstance(e, (SizeFloorDiv, SizeMod)):
            a, b = e.args
            plain = statically_known_leq(0, a) and statically_known_leq(1, b)
            if isinstance(e, SizeFloorDiv):
                return (self.floordiv if plain else self.python_floordiv)(self.print(a),
                                                                          self.print(b))
            return (self.mod if plain else self.python_mod)(self.print(a), self.print(b))
        if isinstance(e, sympy.Min):
            return self.fold("min", [self.print(a) for a in e.args])
        if isinstance(e, sympy.Max):
            return self.fold("max", [self.print(a) for a in e.args])
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([self.print(e.base)] * int(e.exp)) + ")"
        # ``int(s * 0.5)``, ``math.floor(s / 3)``: a float of sizes rounded, as Python does
        rounding = _ROUNDINGS.get(type(e))
        if rounding is not None:
            return self.float_to_int(rounding, e.args[0])
        raise NotImplementedError(f"index expression {e!r} ({type(e).__name__})")

    def float_to_int(self, rounding: str, e: sympy.Expr) -> str:
        """The float expression of sizes ``e`` rounded (``rounding``: trunc, floor or ceil)
        to an index value."""
        raise NotImplementedError(f"index expression {rounding}({e})")

    def integer(self, value: int) -> str:
        return str(value)

    def floordiv(self, a: str, b: str) -> str:
        """Division of non-negative operands (truncation and floor agree)."""
        return f"({a} / {b})"

    def mod(self, a: str, b: str) -> str:
        return f"({a} % {b})"

    def python_floordiv(self, a: str, b: str) -> str:
        """``a // b`` with Python's floor semantics, any signs."""
        raise NotImplementedError(f"floor division of sizes of any sign ({a} // {b})")

    def python_mod(self, a: str, b: str) -> str:
        raise NotImplementedError(f"modulo of sizes of any sign ({a} % {b})")

    fold_template = "{fn}({a}, {b})"     # min/max of two index values

    def fold(self, fn: str, parts: list[str]) -> str:
        out = parts[0]
        for p in parts[1:]:
            out = self.fold_template.format(fn=fn, a=out, b=p)
        return out


_ROUNDINGS = {TruncToInt: "trunc", sympy.floor: "floor", sympy.ceiling: "ceil"}


def float_of_sizes(e: sympy.Expr, integer, sqrt: str, power: str | None) -> str:
    """Code (float64 arithmetic) for a float expression of sizes, as Python computes it
    (``s ** 0.5``, ``1 / s``, ``s * 0.5``): ``integer(expr)`` converts an integer part;
    ``sqrt`` and ``power`` format the target's functions (``power`` None: only integer
    exponents)."""
    def text(e) -> str:
        if e.is_integer:
            return integer(e)
        if e.is_Number:
            return repr(float(e))
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(text(a) for a in e.args) + ")"
        if isinstance(e, sympy.Mul):
            num = [a for a in e.args if not (a.is_Pow and a.exp.is_negative)]
            den = [a.base ** -a.exp for a in e.args if a.is_Pow and a.exp.is_negative]
            product = " * ".join(text(a) for a in num) if num else "1.0"
            return "(" + product + "".join(f" / {text(d)}" for d in den) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Number:   # ``s ** 0.5``: a Float exponent
            if float(e.exp) == 0.5:
                return sqrt.format(text(e.base))
            if e.exp.is_negative:
                return f"(1.0 / {text(e.base ** -e.exp)})"
            if e.exp.is_Integer:
                return "(" + " * ".join([text(e.base)] * int(e.exp)) + ")"
        if isinstance(e, sympy.Pow) and power is not None:
            return power.format(text(e.base), text(e.exp))
        raise NotImplementedError(f"the symbolic float {e}")
    return text(e)


def reduction_groups(reductions) -> dict[str, list]:
    """Accumulator name -> the reduction nodes it serves: one each, except the Welford mean
    and M2 of the same body, which share one state."""
    groups: dict[str, list] = {}
    welford: dict[int, str] = {}
    for node in reductions:
        data = node.buf.data
        if data.reduction_type.startswith("welford_"):
            acc = welford.setdefault(id(data.inner_fn), f"acc_{node.name}")
            groups.setdefault(acc, []).append(node)
        else:
            groups[f"acc_{node.name}"] = [node]
    return groups


def group_kind(members) -> tuple[str, torch.dtype]:
    """(reduction kind, dtype it reduces) of a group: Welford's two outputs are "welford"."""
    data = members[0].buf.data
    kind = data.reduction_type
    return ("welford" if kind.startswith("welford_") else kind), data.src_dtype


def loop_steps(nodes, groups: dict[str, list]):
    """The nodes of one loop, in order: ``(node, None)`` for a pointwise value, ``(None,
    acc)`` once per reduction group, where its first member stands (a Welford mean and M2
    update one state)."""
    acc_of = {n.name: acc for acc, members in groups.items() for n in members}
    seen: set[str] = set()
    for node in nodes:
        if node.role != "reduction":
            yield node, None
        elif acc_of[node.name] not in seen:
            seen.add(acc_of[node.name])
            yield None, acc_of[node.name]
