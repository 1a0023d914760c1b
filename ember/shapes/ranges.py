"""Value ranges: bounds of size expressions, and what they decide without a guard.

Decisions
---------
* A range is a closed interval ``[lower, upper]`` of sympy numbers (``-oo``/``oo`` allowed).
  Each symbol has one (sizes: ``[2, oo]``, see ``env.py``); :func:`bound` propagates them
  through an expression by interval arithmetic, one operation at a time. This is sound
  (the true value always lies in the bounds) but not tight where a symbol occurs twice
  (``s0 - s0`` is simplified by sympy before it gets here; ``s0*s1 - s0`` is not), which
  only means a question is answered by a guard instead of statically.
* :func:`static_truth` answers a boolean expression with ``True``/``False`` where the
  bounds decide it for *every* value in the ranges, else ``None``. Comparisons are decided
  on the bounds of ``lhs - rhs``.
* An operation not listed has unknown bounds ``[-oo, oo]``: never wrong, only less useful.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

import sympy

from ember.shapes.functions import FloorDiv, Mod, TruncToInt

oo = sympy.oo


@dataclasses.dataclass(frozen=True)
class ValueRange:
    lower: sympy.Expr
    upper: sympy.Expr

    @staticmethod
    def of(lower, upper) -> "ValueRange":
        return ValueRange(sympy.sympify(lower), sympy.sympify(upper))

    @staticmethod
    def unknown() -> "ValueRange":
        return ValueRange(-oo, oo)

    def is_singleton(self) -> bool:
        return self.lower == self.upper

    def intersect(self, other: "ValueRange") -> "ValueRange":
        return ValueRange(sympy.Max(self.lower, other.lower), sympy.Min(self.upper, other.upper))

    def __contains__(self, value) -> bool:
        return bool(self.lower <= value) and bool(value <= self.upper)

    def __str__(self) -> str:
        return f"[{self.lower}, {self.upper}]"


UNKNOWN = ValueRange.unknown()


def _mul(a, b):
    # 0 * oo is 0 here: a bound of 0 times an unbounded factor is still 0
    if a == 0 or b == 0:
        return sympy.Integer(0)
    return a * b


def _mul_ranges(x: ValueRange, y: ValueRange) -> ValueRange:
    products = [_mul(a, b) for a in (x.lower, x.upper) for b in (y.lower, y.upper)]
    if any(p is sympy.nan for p in products):
        return UNKNOWN
    return ValueRange(sympy.Min(*products), sympy.Max(*products))


def _floor(v):
    return v if v.is_infinite else sympy.floor(v)


def _floordiv_ranges(a: ValueRange, b: ValueRange) -> ValueRange:
    if not b.lower.is_positive:
        return UNKNOWN
    # a // b is monotonic in a, and for b > 0 the extremes are at b's bounds
    candidates = []
    for x in (a.lower, a.upper):
        for y in (b.lower, b.upper):
            if x.is_infinite:
                candidates.append(x)                  # +-oo // (b > 0) stays +-oo
            elif y.is_infinite:
                candidates.append(sympy.Integer(0 if x >= 0 else -1))
            else:
                candidates.append(sympy.floor(x / y))
    return ValueRange(sympy.Min(*candidates), sympy.Max(*candidates))


def _mod_ranges(a: ValueRange, b: ValueRange) -> ValueRange:
    if not b.lower.is_positive:
        return UNKNOWN
    upper = b.upper - 1
    if a.lower.is_nonnegative:
        upper = sympy.Min(upper, a.upper)
    return ValueRange(sympy.Integer(0), upper)


def _pow_ranges(base: ValueRange, exp: sympy.Expr) -> ValueRange:
    if not (exp.is_Integer or exp.is_Rational) or not base.lower.is_nonnegative:
        return UNKNOWN
    if exp.is_nonnegative:
        return ValueRange(base.lower ** exp, base.upper ** exp)
    if base.lower.is_positive:
        return ValueRange(base.upper ** exp, base.lower ** exp)
    return UNKNOWN


def bound(expr: sympy.Expr, symbol_range: Callable[[sympy.Symbol], ValueRange] | Mapping
          ) -> ValueRange:
    """Bounds of ``expr`` given each symbol's range (a mapping or a function)."""
    lookup = symbol_range.get if isinstance(symbol_range, Mapping) else symbol_range

    def go(e) -> ValueRange:
        if e.is_Number:
            return ValueRange(e, e)
        if e.is_Symbol:
            r = lookup(e)
            return r if r is not None else UNKNOWN
        if isinstance(e, sympy.Pow):
            return _pow_ranges(go(e.base), e.exp)
        if isinstance(e, sympy.Piecewise):
            branches = [go(value) for value, _ in e.args]
            return ValueRange(sympy.Min(*[b.lower for b in branches]),
                              sympy.Max(*[b.upper for b in branches]))
        args = [go(a) for a in e.args]
        if isinstance(e, sympy.Add):
            return ValueRange(sympy.Add(*[a.lower for a in args]),
                              sympy.Add(*[a.upper for a in args]))
        if isinstance(e, sympy.Mul):
            out = args[0]
            for a in args[1:]:
                out = _mul_ranges(out, a)
            return out
        if isinstance(e, FloorDiv):
            return _floordiv_ranges(*args)
        if isinstance(e, Mod):
            return _mod_ranges(*args)
        if isinstance(e, sympy.Max):
            return ValueRange(sympy.Max(*[a.lower for a in args]),
                              sympy.Max(*[a.upper for a in args]))
        if isinstance(e, sympy.Min):
            return ValueRange(sympy.Min(*[a.lower for a in args]),
                              sympy.Min(*[a.upper for a in args]))
        if isinstance(e, sympy.floor):
            return ValueRange(_floor(args[0].lower), _floor(args[0].upper))
        if isinstance(e, sympy.ceiling):
            a = args[0]
            return ValueRange(a.lower if a.lower.is_infinite else sympy.ceiling(a.lower),
                              a.upper if a.upper.is_infinite else sympy.ceiling(a.upper))
        if isinstance(e, TruncToInt):
            a = args[0]
            lo = a.lower if a.lower.is_infinite else sympy.Integer(math.trunc(a.lower))
            hi = a.upper if a.upper.is_infinite else sympy.Integer(math.trunc(a.upper))
            return ValueRange(lo, hi)
        return UNKNOWN

    try:
        return go(sympy.sympify(expr))
    except (TypeError, ValueError):      # a comparison sympy cannot order: no knowledge
        return UNKNOWN


def static_truth(expr, symbol_range) -> bool | None:
    """``True``/``False`` if the ranges decide the boolean ``expr`` for every value, else
    ``None``."""
    expr = sympy.sympify(expr)
    if expr is sympy.true:
        return True
    if expr is sympy.false:
        return False
    if isinstance(expr, sympy.Not):
        inner = static_truth(expr.args[0], symbol_range)
        return None if inner is None else not inner
    if isinstance(expr, sympy.And):
        values = [static_truth(a, symbol_range) for a in expr.args]
        if any(v is False for v in values):
            return False
        return True if all(v is True for v in values) else None
    if isinstance(expr, sympy.Or):
        values = [static_truth(a, symbol_range) for a in expr.args]
        if any(v is True for v in values):
            return True
        return False if all(v is False for v in values) else None
    if not isinstance(expr, sympy.Rel):
        return None
    diff = expr.lhs - expr.rhs
    lookup = symbol_range.get if isinstance(symbol_range, Mapping) else symbol_range
    # interval arithmetic loses what sympy can see: retry on forms that share factors
    # (s0*s1 - s1 -> s1*(s0 - 1)) and with floor divisions written as exact ones
    for form in _forms(diff):
        if isinstance(form, tuple):
            form, extra = form
            ranges = lambda sym, extra=extra: extra.get(sym) or lookup(sym)  # noqa: E731
        else:
            ranges = lookup
        truth = _relation_truth(expr, bound(form, ranges))
        if truth is not None:
            return truth
    return None


def _forms(diff):
    yield diff
    const, rest = diff.as_coeff_Add()
    factored = sympy.factor_terms(rest) + const
    if factored != diff:
        yield factored
    # a storage size computed two ways (sum of (size - 1) * stride terms, and a product)
    # cancels only when multiplied out
    expanded = sympy.expand(diff)
    if expanded != diff and expanded != factored:
        yield expanded
    if diff.has(FloorDiv, Mod):
        # a // b == (a - r) / b and a % b == r with 0 <= r < b, for a constant b > 0;
        # for a symbolic b > 0, r's bound b - 1 is not a number: a // b == (a - r) / b with
        # r >= 0, and a % b == b - 1 - t with t >= 0 (sound, only the upper bounds are kept)
        extra = {}

        def dummy(lower, upper):
            r = sympy.Dummy("r", integer=True)
            extra[r] = ValueRange(sympy.Integer(lower), sympy.sympify(upper))
            return r

        def exact(e):
            a, b = e.args
            if b.is_Integer and b > 0:
                r = dummy(0, b - 1)
                return (a - r) / b if isinstance(e, FloorDiv) else r
            if b.is_positive:
                return (a - dummy(0, sympy.oo)) / b if isinstance(e, FloorDiv) else \
                    b - 1 - dummy(0, sympy.oo)
            return e
        rewritten = diff.replace(lambda e: isinstance(e, (FloorDiv, Mod)), exact)
        if extra:
            yield rewritten, extra
            const, rest = rewritten.as_coeff_Add()
            yield sympy.factor_terms(rest) + const, extra


def _relation_truth(expr, d: ValueRange) -> bool | None:
    lo, hi = d.lower, d.upper
    if isinstance(expr, sympy.Eq):
        if lo == 0 and hi == 0:
            return True
        return False if (lo > 0) == True or (hi < 0) == True else None   # noqa: E712
    if isinstance(expr, sympy.Ne):
        inner = _relation_truth(sympy.Eq(expr.lhs, expr.rhs, evaluate=False), d)
        return None if inner is None else not inner
    if isinstance(expr, sympy.StrictGreaterThan):
        return _decide(lo > 0, hi <= 0)
    if isinstance(expr, sympy.GreaterThan):
        return _decide(lo >= 0, hi < 0)
    if isinstance(expr, sympy.StrictLessThan):
        return _decide(hi < 0, lo >= 0)
    if isinstance(expr, sympy.LessThan):
        return _decide(hi <= 0, lo > 0)
    return None


def _decide(true_if, false_if) -> bool | None:
    if true_if == True:    # noqa: E712  (sympy booleans: only a decided True counts)
        return True
    if false_if == True:   # noqa: E712
        return False
    return None
