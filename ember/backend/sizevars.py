"""Size arithmetic for the code generators: every question about a size is asked here.

Sizes are sympy expressions; today every one is an Integer (graphs are specialised to their
input shapes). Code generators never call ``int()`` on a size: they ask for a *hint* (the
value seen at compile time, to choose block sizes and loop strategies) or for a fact that
holds for every value (``statically_known_*``). When symbolic shapes arrive, only this
module learns about symbols, their hints and their ranges.
"""
from __future__ import annotations

import sympy


def simplify(expr) -> sympy.Expr:
    return sympy.expand(sympy.sympify(expr))


def size_hint(expr) -> int:
    """The size's value for this compilation (used for heuristics, never for correctness)."""
    expr = simplify(expr)
    if not expr.is_Integer:
        raise NotImplementedError(f"symbolic size {expr} (symbolic shapes are not supported "
                                  f"by the code generators yet)")
    return int(expr)


def is_static(expr) -> bool:
    return simplify(expr).is_Integer


def statically_known_equals(a, b) -> bool:
    return simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def statically_known_leq(a, b) -> bool:
    diff = simplify(sympy.sympify(b) - sympy.sympify(a))
    return bool(diff.is_nonnegative) if not diff.is_Integer else int(diff) >= 0


def evaluate_min(a, b) -> sympy.Expr:
    """The smaller of two sizes, when it is known which is smaller."""
    if statically_known_leq(a, b):
        return sympy.sympify(a)
    if statically_known_leq(b, a):
        return sympy.sympify(b)
    raise NotImplementedError(f"cannot tell which of {a} and {b} is smaller")
