"""Size arithmetic for the code generators: every question about a size is asked here.

Sizes are sympy expressions: an Integer for a static size, else an expression over the size
symbols of the graph being compiled (``symbols(env)`` makes an ``ember.shapes.ShapeEnv``'s
symbols known while a graph with symbolic sizes is lowered and generated). Code generators
never call ``int()`` on a size: they ask for a *hint* (the value seen at compile time, to
choose block sizes and loop strategies) or for a fact that holds for every value
(``statically_known_*``, decided by the symbols' ranges, every one ``>= 2``). A choice whose
correctness depends on a size's value must take the size only when ``is_static``.
"""
from __future__ import annotations

import contextlib
import threading

import sympy

# the ShapeEnv of the graph this thread is generating (``symbols``): per thread, as two
# threads may compile at once
_state = threading.local()


@contextlib.contextmanager
def symbols(env):
    """Within the block, ``env``'s symbols are the size symbols: hints and ranges known."""
    outer = shape_env()
    _state.env = env
    try:
        yield
    finally:
        _state.env = outer


def shape_env():
    """The ShapeEnv whose symbols are known now (``symbols``), or None."""
    return getattr(_state, "env", None)


def symbol_names() -> frozenset:
    """The names of the size symbols now known (none while a static graph is generated)."""
    env = shape_env()
    return frozenset(s.name for s in env.symbols) if env is not None else frozenset()


def simplify(expr) -> sympy.Expr:
    return sympy.expand(sympy.sympify(expr))


def size_hint(expr) -> int:
    """The size's value for this compilation (used for heuristics, never for correctness)."""
    expr = simplify(expr)
    if expr.is_Integer:
        return int(expr)
    env = shape_env()
    if env is not None:
        value = simplify(env.hint_value(expr))
        if value.is_Integer:
            return int(value)
    raise NotImplementedError(f"no hint for the size {expr}")


def is_static(expr) -> bool:
    return simplify(expr).is_Integer


def _known_nonnegative(diff) -> bool:
    if diff.is_Integer:
        return int(diff) >= 0
    if diff.is_nonnegative:
        return True
    env = shape_env()
    if env is None:
        return False
    # the ranges bound each term apart: s1*s0**2 - s0**2 has no lower bound so, its factored
    # form s0**2*(s1 - 1) does (a gapped slice's extent against its outer stride); only a
    # sum factors into something else
    for form in (diff, sympy.factor(diff)) if diff.is_Add else (diff,):
        try:
            if bool(env.bound(form).lower >= 0):
                return True
        except (TypeError, AttributeError):     # a function the ranges do not bound
            pass
    return False


def statically_known_equals(a, b) -> bool:
    return simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def statically_known_leq(a, b) -> bool:
    return _known_nonnegative(simplify(sympy.sympify(b) - sympy.sympify(a)))


_NO_SIZE_REACHES = 2 ** 62


def evaluate_min(a, b) -> sympy.Expr:
    """The smaller of two sizes, when it is known which is smaller."""
    a, b = sympy.sympify(a), sympy.sympify(b)
    # no tensor has 2**62 elements in a dim: ``x[:, :1]`` slices dim 0 up to 2**63 - 1
    for big, other in ((a, b), (b, a)):
        if big.is_Integer and big >= _NO_SIZE_REACHES and _known_nonnegative(other):
            return other
    if statically_known_leq(a, b):
        return sympy.sympify(a)
    if statically_known_leq(b, a):
        return sympy.sympify(b)
    raise NotImplementedError(f"cannot tell which of {a} and {b} is smaller")
