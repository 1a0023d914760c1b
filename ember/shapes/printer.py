"""Size expressions as Python source text, for guards checked at a compiled entry.

``to_python(expr, names)`` writes a sympy expression of sizes as a Python expression whose
value, with each symbol replaced by the text ``names`` gives it (``L['x'].size(0)``), is the
expression's value under Python's semantics: ``FloorDiv`` is ``//``, ``Mod`` is ``%``,
``x**-1`` a true division, ``Max``/``Min`` are ``max``/``min``, ``floor``/``ceiling`` and the
math functions are ``math.*``, ``Piecewise`` a conditional expression.

Decisions
---------
* Every compound sub-expression is parenthesised: the text is read by a machine first and
  a person second, and correct precedence matters more than brevity. The whole expression
  and a function's arguments go without, so a guard reads ``L['x'].size(0) > 16``.
* Rationals print as ``p / q`` true divisions (exact for the small values of sizes), and
  Floats with ``repr`` (round-trips exactly).
* The text needs the globals in :data:`GUARD_GLOBALS` (``math``) and nothing else.
* A symbol without a name raises ``KeyError`` naming it: a guard over a value the caller
  cannot read would be unsound to drop silently.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import sympy

from ember.shapes.functions import FloorDiv, Mod, TruncToInt

GUARD_GLOBALS = {"math": math}

_RELATIONS = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">",
              sympy.Ge: ">="}
_MATH = {sympy.floor: "math.floor", sympy.ceiling: "math.ceil", sympy.cos: "math.cos",
         sympy.cosh: "math.cosh", sympy.sin: "math.sin", sympy.sinh: "math.sinh",
         sympy.tan: "math.tan", sympy.tanh: "math.tanh", sympy.asin: "math.asin",
         sympy.acos: "math.acos", sympy.atan: "math.atan", TruncToInt: "int"}


def split_fraction(mul: sympy.Mul) -> tuple[list, list]:
    """The factors of a product as (numerator, denominator) lists: ``x**-n`` and the ``q``
    of a rational ``p/q`` go below, so ``s0/2`` reads as a true division ``s0 / 2``."""
    num, den = [], []
    for f in mul.args:
        if f.is_Pow and f.exp.is_negative and f.exp.is_Integer:
            den.append(f.base ** -f.exp)
        elif f.is_Rational and not f.is_Integer:
            if f.p != 1:
                num.append(sympy.Integer(f.p))
            den.append(sympy.Integer(f.q))
        else:
            num.append(f)
    return num, den


def to_python(expr, names: Mapping | Callable) -> str:
    """Python source for ``expr``; ``names`` maps each symbol to the text that reads it."""
    lookup = names if callable(names) else names.__getitem__

    def name(sym) -> str:
        try:
            return lookup(sym)
        except KeyError as e:
            raise KeyError(f"no Python name for size symbol {sym} (give one in source_names)"
                           f": {e.args[0] if e.args else ''}") from None

    def go(e, top=False) -> str:
        if e is sympy.true or e is sympy.false:
            return str(bool(e))
        if e.is_Symbol:
            return name(e)
        if e.is_Integer:
            return str(int(e)) if e >= 0 or top else f"({int(e)})"
        if e.is_Rational:
            return f"({e.p} / {e.q})"
        if e.is_Float:
            return repr(float(e))
        if e is sympy.oo:
            return "math.inf"
        if e is -sympy.oo:
            return "(-math.inf)"
        for cls, op in _RELATIONS.items():
            if isinstance(e, cls):
                text = f"{go(e.lhs)} {op} {go(e.rhs)}"
                return text if top else f"({text})"
        if isinstance(e, sympy.And):
            text = " and ".join(go(a) for a in e.args)
            return text if top else f"({text})"
        if isinstance(e, sympy.Or):
            return "(" + " or ".join(go(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(not {go(e.args[0])})"
        if isinstance(e, sympy.Add):
            # symbols first, the constant last: "s0 + 1", not "1 + s0"
            terms = sorted(sympy.Add.make_args(e), key=lambda t: t.is_Number)
            text = go(terms[0])
            for t in terms[1:]:
                coeff, rest = t.as_coeff_Mul()
                if coeff.is_negative:
                    text += f" - {go(-t)}"
                else:
                    text += f" + {go(t)}"
            return text if top else f"({text})"
        if isinstance(e, sympy.Mul):
            num, den = split_fraction(e)
            text = " * ".join(go(f) for f in num) if num else "1"
            for d in den:
                text = f"{text} / {go(d)}"
            return text if top else f"({text})"
        if isinstance(e, sympy.Pow):
            if e.exp == sympy.Rational(1, 2):
                return f"math.sqrt({go(e.base, True)})"
            if e.exp.is_Integer and e.exp.is_negative:
                return f"(1 / {go(e.base ** -e.exp)})"
            return f"({go(e.base)} ** {go(e.exp)})"
        if isinstance(e, FloorDiv):
            return f"({go(e.args[0])} // {go(e.args[1])})"
        if isinstance(e, Mod):
            return f"({go(e.args[0])} % {go(e.args[1])})"
        if isinstance(e, sympy.Max):
            return "max(" + ", ".join(go(a, True) for a in e.args) + ")"
        if isinstance(e, sympy.Min):
            return "min(" + ", ".join(go(a, True) for a in e.args) + ")"
        if isinstance(e, sympy.Abs):
            return f"abs({go(e.args[0], True)})"
        if isinstance(e, sympy.log) and len(e.args) == 1:
            return f"math.log({go(e.args[0], True)})"
        if isinstance(e, sympy.Piecewise):
            *branches, (last, _) = e.args
            text = go(last)
            for value, cond in reversed(branches):
                text = f"({go(value)} if {go(cond)} else {text})"
            return text
        for cls, fn in _MATH.items():
            if isinstance(e, cls):
                return f"{fn}({go(e.args[0], True)})"
        raise NotImplementedError(f"no Python text for {type(e).__name__} in {expr}")

    return go(sympy.sympify(expr), top=True)
