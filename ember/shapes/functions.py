"""Sympy functions for size arithmetic with Python's integer semantics.

Decisions
---------
* ``FloorDiv(a, b)`` and ``Mod(a, b)`` are Ember's own functions rather than
  ``sympy.floor(a / b)`` and ``sympy.Mod``: they print back to Python as ``a // b`` and
  ``a % b`` (guards are Python text), their simplification rules are the few that are exact
  for every integer (any sign, Python's floor semantics), and they evaluate fast on numbers.
  Rules: ``FloorDiv(q*b + r, b) -> q + FloorDiv(r, b)`` and ``Mod(q*b + r, b) -> Mod(r, b)``
  where ``q`` is an integer expression (read off ``(term / b).is_integer``); nested
  ``FloorDiv(FloorDiv(a, b), c) -> FloorDiv(a, b*c)`` for positive constants ``b, c``.
* ``TruncToInt(x)`` is Python's ``int(float)`` (toward zero); ``sympy.floor`` and
  ``sympy.ceiling`` serve ``math.floor``/``math.ceil``.
* Division by a zero constant raises ``ZeroDivisionError`` as Python does.
"""
from __future__ import annotations

import sympy


def _is_int_const(x) -> bool:
    return isinstance(x, sympy.Integer)


def _split_multiples(a: sympy.Expr, b: sympy.Expr):
    """``a`` as ``q*b + r``: the terms of ``a`` that are integer multiples of ``b``, divided
    by ``b`` (``q``), and the rest (``r``)."""
    quotient, rest = [], []
    for term in sympy.Add.make_args(a):
        q = term / b
        (quotient if q.is_integer else rest).append(q if q.is_integer else term)
    return sympy.Add(*quotient), sympy.Add(*rest)


class FloorDiv(sympy.Function):
    """``a // b`` on integers, with Python's floor semantics."""
    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b.is_zero:
            raise ZeroDivisionError(f"integer division by zero: ({a}) // 0")
        if _is_int_const(a) and _is_int_const(b):
            return sympy.Integer(int(a) // int(b))
        if b == 1:
            return a
        if a.is_zero:
            return sympy.Integer(0)
        if isinstance(a, FloorDiv) and _is_int_const(b) and b > 0 and \
                _is_int_const(a.args[1]) and a.args[1] > 0:
            return FloorDiv(a.args[0], a.args[1] * b)
        quotient, rest = _split_multiples(a, b)
        if quotient != 0:
            return quotient + FloorDiv(rest, b)
        return None

    def _eval_is_nonnegative(self):
        a, b = self.args
        if a.is_nonnegative and b.is_positive:
            return True
        return None


class Mod(sympy.Function):
    """``a % b`` on integers, with Python's semantics (the result has the sign of ``b``)."""
    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b.is_zero:
            raise ZeroDivisionError(f"integer modulo by zero: ({a}) % 0")
        if _is_int_const(a) and _is_int_const(b):
            return sympy.Integer(int(a) % int(b))
        if b == 1 or b == -1 or a.is_zero:
            return sympy.Integer(0)
        quotient, rest = _split_multiples(a, b)
        if quotient != 0:
            return Mod(rest, b)
        return None

    def _eval_is_nonnegative(self):
        return True if self.args[1].is_positive else None


class TruncToInt(sympy.Function):
    """``int(x)`` of a float: rounds toward zero."""
    nargs = (1,)
    is_integer = True

    @classmethod
    def eval(cls, x):
        if x.is_integer:
            return x
        if x.is_Number:
            return sympy.Integer(int(x))
        return None


# Math functions a SymFloat may go through (``torch._sym_sqrt`` and friends): the sympy
# function and the ``math`` function the guard text calls.
MATH_FUNCTIONS = {
    "sqrt": sympy.sqrt, "cos": sympy.cos, "cosh": sympy.cosh, "sin": sympy.sin,
    "sinh": sympy.sinh, "tan": sympy.tan, "tanh": sympy.tanh, "asin": sympy.asin,
    "acos": sympy.acos, "atan": sympy.atan, "log2": lambda x: sympy.log(x, 2),
}
