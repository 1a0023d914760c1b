"""C++ text for the ops a kernel body calls: :class:`CppOpsHandler` (run under
``use_handler`` by :class:`~ember.backend.targets.cpp.kernel.CppKernel`, into whose current scope
it writes), constants and index expressions, the range probe that finds where a split
loop's conditions change, and the C++ of reduction states (fields, merges, OpenMP
clauses). Loop strategies live in ``strategies/``; this module imports neither them nor
``kernel.py``.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import sympy
import torch

from ember.backend.codegen.common import HALF, IndexPrinter, Value, float_of_sizes

if TYPE_CHECKING:
    from ember.backend.targets.cpp.kernel import CppKernel

# the C++ type a value of each dtype is computed in; float16 and bfloat16 are computed in
# float and stored as their bits (``storage_type``, ``from_storage``, ``to_storage``)
CPP_TYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
             torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
             torch.uint8: "uint8_t", torch.bool: "bool", torch.float16: "float",
             torch.bfloat16: "float"}
_HALF_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}    # of the prelude's conversions

_REDUCTION_CLAUSE = {"sum": "+", "prod": "*", "any": "||", "all": "&&"}
# math ops: {0} (and {1}) the operands; in UNARY_CPP {1} is the operand's C++ type
# (``CppTarget.op_templates``: ``targets.register_op`` adds to these)
UNARY_CPP = {
    "neg": "-{0}", "abs": "std::abs({0})", "exp": "ember_exp({0})", "exp2": "std::exp2({0})",
    "expm1": "ember_expm1({0})", "log": "ember_log({0})", "log2": "ember_log2({0})",
    "log10": "ember_log10({0})", "log1p": "ember_log1p({0})", "sqrt": "std::sqrt({0})",
    "rsqrt": "{1}(1) / std::sqrt({0})", "sin": "std::sin({0})", "cos": "std::cos({0})",
    "tan": "std::tan({0})", "asin": "std::asin({0})", "acos": "std::acos({0})",
    "atan": "std::atan({0})", "sinh": "std::sinh({0})", "cosh": "std::cosh({0})",
    "tanh": "ember_tanh({0})", "asinh": "std::asinh({0})", "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})", "erf": "ember_erf({0})", "erfc": "std::erfc({0})",
    "gelu": "ember_gelu({0})", "gelu_grad": "ember_gelu_grad({0})",
    "sigmoid": "ember_sigmoid({0})", "relu": "ember_relu({0})",
    "reciprocal": "{1}(1) / {0}", "floor": "std::floor({0})", "ceil": "std::ceil({0})",
    "round": "std::nearbyint({0})", "trunc": "std::trunc({0})", "sign": "ember_sign({0})",
    "bitwise_not": "~{0}", "square": "{0} * {0}", "frac": "{0} - std::trunc({0})",
}
BINARY_CPP = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}",
    "pow": "std::pow({0}, {1})",
    "maximum": "ember_max({0}, {1})", "minimum": "ember_min({0}, {1})",
    "atan2": "std::atan2({0}, {1})", "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}",
    "bitwise_xor": "{0} ^ {1}", "bitwise_left_shift": "{0} << {1}",
    "bitwise_right_shift": "{0} >> {1}", "copysign": "std::copysign({0}, {1})",
    "hypot": "std::hypot({0}, {1})", "nextafter": "std::nextafter({0}, {1})",
}
# std functions that are inline code or single instructions (no libm call): a kernel calling
# only these takes 16-lane vectors (kernel.py), and a half lookup table may be filled by it
# (strategies/table.py)
_INLINE_STD = frozenset({"abs", "sqrt", "floor", "ceil", "trunc", "nearbyint", "copysign", "min",
                         "max", "numeric_limits", "isinf", "is_floating_point"})
_STD_CALL = re.compile(r"std::(\w+)")


def calls_libm(text: str) -> bool:
    """C++ ``text`` calls a std function that is not inline code (libm's)."""
    return any(fn not in _INLINE_STD for fn in _STD_CALL.findall(text))


_COMPARE_CPP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class _RangeProbe:
    """An ops handler that records where ``var + c`` is compared with an integer constant:
    the cuts of the var's range at which such a condition can change."""

    def __init__(self, var: sympy.Symbol):
        self.var = var
        self.cuts: set[int] = set()
        self._opaque = object()

    def index_expr(self, expr, dtype):
        shift = sympy.expand(expr - self.var)
        return ("at", int(shift)) if shift.is_Integer else self._opaque

    def constant(self, value, dtype):
        if isinstance(value, (bool, int)) or (isinstance(value, sympy.Expr) and
                                              value.is_Integer):
            return ("const", int(value))
        return self._opaque

    def to_dtype(self, value, dtype):
        return value if isinstance(value, tuple) and not dtype.is_floating_point \
            else self._opaque

    _FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}

    def _compare(self, name, a, b):
        if isinstance(a, tuple) and isinstance(b, tuple) and {a[0], b[0]} == {"at", "const"}:
            if a[0] == "const":
                a, b, name = b, a, self._FLIPPED[name]
            at = b[1] - a[1]       # var + shift against value: var against value - shift
            # where the condition can change: var == at starts the true (ge, lt: false)
            # side, var == at + 1 the one after it (gt, le); eq and ne both
            self.cuts.update({"ge": {at}, "lt": {at}, "gt": {at + 1}, "le": {at + 1}}.get(
                name, {at, at + 1}))
        return self._opaque

    def masked(self, mask, body, other):
        body()
        return self._opaque

    def indirect_indexing(self, value, size, wrap_negative=False, check=None):
        return sympy.Symbol("probe_ix", integer=True)

    def __getattr__(self, name):
        if name in _COMPARE_CPP:
            return lambda a, b: self._compare(name, a, b)
        return lambda *args, **kwargs: self._opaque


class CppIndexPrinter(IndexPrinter):
    def integer(self, value: int) -> str:
        return f"{value}L" if abs(value) > 2**31 - 1 else str(value)

    fold_template = "std::{fn}<int64_t>({a}, {b})"

    def python_floordiv(self, a: str, b: str) -> str:
        return f"ember_floordiv<int64_t>({a}, {b})"

    def python_mod(self, a: str, b: str) -> str:
        return f"ember_remainder<int64_t>({a}, {b})"

    def float_to_int(self, rounding: str, e) -> str:
        return f"static_cast<int64_t>(std::{rounding}({cpp_float(e)}))"


cpp_index = CppIndexPrinter()   # C++ for an index expression (int64 arithmetic)


def cpp_float(e) -> str:
    """C++ (double arithmetic) for a float expression of sizes (``codegen.common``)."""
    return float_of_sizes(e, lambda i: f"static_cast<double>({cpp_index(i)})",
                          "std::sqrt({})", "std::pow({}, {})")


def cpp_constant(value, dtype: torch.dtype) -> str:
    ctype = CPP_TYPES[dtype]
    if isinstance(value, sympy.Expr):
        value = int(value) if value.is_Integer else float(value)
    if dtype is torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        if math.isinf(value):
            sign = "-" if value < 0 else ""
            return f"{sign}std::numeric_limits<{ctype}>::infinity()"
        text = repr(value)
        return f"static_cast<{ctype}>({text})"
    return f"static_cast<{ctype}>({int(value)}L)"


CppValue = Value


def storage_type(dtype: torch.dtype) -> str:
    """The C++ type of a buffer's elements."""
    return "uint16_t" if dtype in HALF else CPP_TYPES[dtype]


def from_storage(text: str, dtype: torch.dtype) -> str:
    """C++ for the value of the element ``text`` (of ``storage_type(dtype)``)."""
    return f"ember_from_{_HALF_NAMES[dtype]}({text})" if dtype in HALF else text


def to_storage(text: str, dtype: torch.dtype) -> str:
    """C++ for the element that stores the value ``text`` (of ``CPP_TYPES[dtype]``): a half
    value rounded to nearest even."""
    return f"ember_to_{_HALF_NAMES[dtype]}({text})" if dtype in HALF else text


class CppOpsHandler:
    """Emits C++ for the ops a body calls, into the kernel's current scope."""

    def __init__(self, kernel: "CppKernel"):
        self.k = kernel

    def _emit(self, text: str, dtype: torch.dtype) -> CppValue:
        return self.k.cse(text, dtype)

    def load(self, name: str, index) -> CppValue:
        return self.k.load(name, index)

    def constant(self, value, dtype) -> CppValue:
        if isinstance(value, sympy.Expr) and value.free_symbols:    # a symbolic size
            text = cpp_index(value) if value.is_integer else cpp_float(value)
            return self._emit(f"static_cast<{CPP_TYPES[dtype]}>({text})", dtype)
        out = self._emit(cpp_constant(value, dtype), dtype)
        if not dtype.is_floating_point and (isinstance(value, (bool, int)) or (
                isinstance(value, sympy.Expr) and value.is_Integer)):
            self.k.bounds[out.name] = (int(value), int(value))
        return out

    def index_expr(self, expr, dtype) -> CppValue:
        out = self._emit(f"static_cast<{CPP_TYPES[dtype]}>({cpp_index(expr)})", dtype)
        if not dtype.is_floating_point:
            known = self.k.strategy.index_bounds(expr)    # a piece of a split loop's index
            if known is not None:
                self.k.bounds[out.name] = known
        return out

    def _known(self, value) -> bool | None:
        """A condition's value where the piece's bounds decide it, else None."""
        b = self.k.bounds.get(getattr(value, "name", None))
        return None if b is None or b[0] != b[1] else bool(b[0])

    def _fold(self, sign: str, a, b):
        """``a sign b`` as a constant when the bounds of both decide it (a concatenation's
        ``index >= start`` inside one piece of a split loop), else None."""
        ba, bb = (self.k.bounds.get(getattr(v, "name", None)) for v in (a, b))
        if ba is None or bb is None:
            return None
        (alo, ahi), (blo, bhi) = ba, bb
        always, never = {"<": (ahi < blo, alo >= bhi), "<=": (ahi <= blo, alo > bhi),
                         ">": (alo > bhi, ahi <= blo), ">=": (alo >= bhi, ahi < blo),
                         "==": (alo == ahi == blo == bhi, ahi < blo or alo > bhi),
                         "!=": (ahi < blo or alo > bhi, alo == ahi == blo == bhi)}[sign]
        return self.constant(True, torch.bool) if always else \
            self.constant(False, torch.bool) if never else None

    def to_dtype(self, x: CppValue, dtype) -> CppValue:
        if x.dtype == dtype:
            return x
        x = self.exact(x)
        if dtype is torch.bool:
            return self._emit(f"({x} != 0)", dtype)
        if x.dtype in HALF and dtype is torch.float32:
            return CppValue(x.name, dtype)     # already a float
        if dtype in HALF:   # rounded as eager rounds (through float), computed on in float
            return self._round(x, dtype)
        return self._emit(f"static_cast<{CPP_TYPES[dtype]}>({x})", dtype)

    def exact(self, x: CppValue) -> CppValue:
        """``x`` as eager holds it: a half op's result, held in float, rounded to its dtype
        where a cast, a comparison, isnan/isinf or a reduction reads it, as eager's op
        rounded it (``(a + 1).float()`` is bfloat16's a + 1; float16's ``a * b`` past 65504
        is inf). Chains of arithmetic stay in float."""
        if x.dtype in HALF and x.name not in self.k.exact_half:
            return self._round(x, x.dtype)
        return x

    def _round(self, x: CppValue, dtype: torch.dtype) -> CppValue:
        """``x`` rounded to the half ``dtype`` (through float: double and int64 values round
        twice, as eager's conversions do), held in float."""
        text = str(x) if CPP_TYPES[x.dtype] == "float" else f"static_cast<float>({x})"
        out = self._emit(f"ember_round_{_HALF_NAMES[dtype]}({text})", dtype)
        self.k.exact_half.add(out.name)
        self.k.rounded_from[out.name] = text
        return out

    def where(self, c: CppValue, a: CppValue, b: CppValue) -> CppValue:
        known = self._known(c)
        if known is not None and a.dtype == b.dtype:
            return a if known else b
        # a condition that does not change in the inner loop (a padded pooling window's
        # edge) selects bits: with ?: g++ sinks the other operand's load into a branch on
        # it and leaves the loop scalar. A per-element condition keeps ?:, one blend
        # (densenet's 32-way concatenation: 0.43 ms, 0.68 with bit selects)
        if a.dtype.is_floating_point and b.dtype == a.dtype and \
                getattr(c, "name", None) in self.k.invariant:
            return self._emit(f"ember_select({c}, {a}, {b})", a.dtype)
        return self._emit(f"{c} ? {a} : {b}", a.dtype)

    def logical_not(self, a):
        return self._emit(f"!static_cast<bool>({a})", torch.bool)

    def logical_and(self, a, b):
        ka, kb = self._known(a), self._known(b)
        if ka is False or kb is False or (ka and kb):
            return self.constant(bool(ka and kb), torch.bool)
        if ka or kb:
            return b if ka else a
        return self._emit(f"static_cast<bool>({a}) && static_cast<bool>({b})", torch.bool)

    def logical_or(self, a, b):
        ka, kb = self._known(a), self._known(b)
        if ka or kb or (ka is False and kb is False):
            return self.constant(bool(ka or kb), torch.bool)
        if ka is False or kb is False:
            return b if ka is False else a
        return self._emit(f"static_cast<bool>({a}) || static_cast<bool>({b})", torch.bool)

    def logical_xor(self, a, b):
        return self._emit(f"static_cast<bool>({a}) != static_cast<bool>({b})", torch.bool)

    def bitwise_not(self, a):
        if a.dtype is torch.bool:
            return self._emit(f"!{a}", torch.bool)
        return self._typed(f"~{a}", a.dtype)

    def isnan(self, a):
        a = self.exact(a)
        return self._emit(f"({a} != {a})", torch.bool)

    def isinf(self, a):
        return self._emit(f"std::isinf({self.exact(a)})", torch.bool)

    def truncdiv(self, a, b):
        if a.dtype.is_floating_point:
            return self._typed(f"std::trunc({a} / {b})", a.dtype)
        return self._int_division("truncdiv", f"{a} / {b}", a, b)

    def floordiv(self, a, b):
        text = f"ember_floordiv({a}, {b})"
        return self._typed(text, a.dtype) if a.dtype.is_floating_point else \
            self._int_division("floordiv", text, a, b)

    def remainder(self, a, b):
        text = f"ember_remainder({a}, {b})"
        return self._typed(text, a.dtype) if a.dtype.is_floating_point else \
            self._int_division("remainder", text, a, b)

    def fmod(self, a, b):
        if a.dtype.is_floating_point:
            return self._typed(f"std::fmod({a}, {b})", a.dtype)
        return self._int_division("fmod", f"{a} % {b}", a, b)   # not through double

    def _int_division(self, name: str, fast: str, a, b):
        """An integer division whose divisor is a constant other than 0 and -1 as ``fast``
        (g++ multiplies by the inverse, and vectorises). Any other divisor is checked
        (``ember_checked_*``): the kernel never traps, a zero divisor sets the flag that the
        wrapper turns into eager's ZeroDivisionError, ``INT_MIN / -1`` wraps."""
        known = self.k.bounds.get(b.name)
        if known is not None and known[0] == known[1] and known[0] not in (0, -1):
            return self._typed(fast, a.dtype)
        self.k.exports_flags = True
        return self._typed(f"ember_checked_{name}<{CPP_TYPES[a.dtype]}>({a}, {b}, "
                           f"ember_flags_r)", a.dtype)

    def _typed(self, text, dtype):
        return self._emit(f"static_cast<{CPP_TYPES[dtype]}>({text})", dtype)

    def rand(self, seed, offset):
        return self._emit(f"ember_rand({seed}, {offset})", torch.float32)

    def randn(self, seed, offset):
        return self._emit(f"ember_randn({seed}, {offset})", torch.float32)

    def masked(self, mask, body, other):
        """``body()`` computed (its loads made) only where ``mask`` holds; ``other``
        elsewhere. The body's lines go inside an ``if``; its result is declared before. A
        mask the piece of a split loop decides is no ``if`` at all."""
        k = self.k
        known = self._known(mask)
        if known:
            return body()
        start = len(k.lines)
        k.indent += 1
        k.push()
        hoist, k.hoist = k.hoist, None    # the body's loads are guarded: none moves out
        value = body()
        k.hoist = hoist
        k.pop()
        k.indent -= 1
        inner = k.lines[start:]
        del k.lines[start:]
        if known is False:
            return other if isinstance(other, CppValue) else self.constant(other, value.dtype)
        var = k.new_var()
        ctype = CPP_TYPES[value.dtype]
        fill = other if isinstance(other, CppValue) else cpp_constant(other, value.dtype)
        k.line(f"{ctype} {var} = {fill};")
        k.line(f"if ({mask}) {{")
        k.lines.extend(inner)
        k.line(f"  {var} = {value};")
        k.line("}")
        return CppValue(var, value.dtype)

    def indirect_indexing(self, value: CppValue, size, wrap_negative=False,
                          check=None) -> sympy.Symbol:
        """An index read from a tensor (negative values wrap, for Python-style indexing, when
        ``wrap_negative``); one out of range is clamped, so memory stays safe, and flagged
        (bit 2 + the check's slot): the wrapper then raises ``check``'s exception, eager's."""
        k = self.k
        var = f"ix{k.counter}"
        k.counter += 1
        n = cpp_index(size)
        lines = [f"int64_t {var} = static_cast<int64_t>({value});"]
        if wrap_negative:
            lines.append(f"{var} += {var} < 0 ? {n} : 0;")
        # branch-free, so the loop stays vectorised: the flag is a reduction of every loop
        # (``_flag_errors`` in kernel.py)
        bit = 2 + k.index_check_slot(check)
        lines.append(f"{{ bool bad = static_cast<uint64_t>({var}) >= static_cast<uint64_t>"
                     f"({n}); ember_flags_r |= static_cast<int>(bad) << {bit}; "
                     f"{var} = bad ? 0 : {var}; }}")
        k.exports_flags = True
        # an index the same for every element of the inner loop is checked once, before it
        if k.emit_invariant(lines, f"{value} {n}"):
            k.invariant.add(var)
        else:
            for line in lines:
                k.line(line)
        return sympy.Symbol(var, integer=True)

    def __getattr__(self, name):
        if name in UNARY_CPP:
            template = UNARY_CPP[name]
            return lambda a: self._typed(template.format(a, CPP_TYPES[a.dtype]), a.dtype)
        if name in BINARY_CPP:
            template = BINARY_CPP[name]
            return lambda a, b: self._typed(template.format(a, b), a.dtype)
        if name in _COMPARE_CPP:
            sign = _COMPARE_CPP[name]
            return lambda a, b: self._fold(sign, a, b) or \
                self._emit(f"{self.exact(a)} {sign} {self.exact(b)}", torch.bool)
        raise AttributeError(f"no C++ for ops.{name}")


def _fields(kind: str, dtype: torch.dtype) -> list[tuple[str, str, str]]:
    """(C++ type, name suffix, initial value) of each part of a reduction's state."""
    ctype = CPP_TYPES[dtype]
    if kind == "welford":
        return [(ctype, "_mean", cpp_constant(0, dtype)), (ctype, "_m2", cpp_constant(0, dtype)),
                ("int64_t", "_n", "0")]
    if kind in ("argmax", "argmin"):
        return [(ctype, "", _init(kind[3:], dtype)), ("int64_t", "_i", "0")]
    fields = [(ctype, "", _init(kind, dtype))]
    if kind in ("max", "min") and dtype.is_floating_point:
        fields.append(("int", "_nan", "0"))   # NaNs seen (max/min below skip them)
    return fields


def _merge(acc: str, kind: str, dtype: torch.dtype, part) -> str:
    """C++ merging a partial state (``part(suffix)`` names its fields) into ``acc``, the
    state of the elements before it."""
    if kind == "welford":
        return (f"ember_welford_combine({acc}_mean, {acc}_m2, {acc}_n, {part('_mean')}, "
                f"{part('_m2')}, {part('_n')});")
    value = part("")
    if kind in ("argmax", "argmin"):
        better = ">" if kind == "argmax" else "<"
        return (f"if ({acc} == {acc} && ({value} != {value} || {value} {better} {acc})) "
                f"{{ {acc} = {value}; {acc}_i = {part('_i')}; }}")
    if kind in ("max", "min"):
        sign = ">" if kind == "max" else "<"
        flag = f" {acc}_nan |= {part('_nan')};" if dtype.is_floating_point else ""
        return f"{acc} = {acc} {sign} {value} ? {acc} : {value};{flag}"
    return f"{acc} = {_combine(kind, acc, value)};"


def _clause(acc: str, kind: str, dtype: torch.dtype) -> str:
    if kind in ("max", "min"):
        flag = f" reduction(|:{acc}_nan)" if dtype.is_floating_point else ""
        return f"reduction({kind}:{acc}){flag}"
    return f"reduction({_REDUCTION_CLAUSE[kind]}:{acc})"


def _init(reduction_type: str, dtype: torch.dtype) -> str:
    ctype = CPP_TYPES[dtype]
    return {"sum": cpp_constant(0, dtype), "prod": cpp_constant(1, dtype),
            "max": f"ember_lowest<{ctype}>()", "min": f"ember_highest<{ctype}>()",
            "any": "false", "all": "true"}[reduction_type]


def _combine(reduction_type: str, acc: str, value) -> str:
    return {"sum": f"{acc} + {value}", "prod": f"{acc} * {value}",
            "max": f"ember_max({acc}, {value})", "min": f"ember_min({acc}, {value})",
            "any": f"{acc} || {value}", "all": f"{acc} && {value}"}[reduction_type]
