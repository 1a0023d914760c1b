"""Index arithmetic of the loop planner (``ember.backend.loops``)."""
import random

import sympy

from ember.backend import loops


def _runs_with_by_derivatives(expr, outer, inner, inner_size) -> bool:
    c_inner, c_outer = sympy.diff(expr, inner), sympy.diff(expr, outer)
    if c_inner.free_symbols or c_outer.free_symbols:
        return False
    rest = sympy.expand(expr - c_inner * inner - c_outer * outer)
    if {outer, inner} & rest.free_symbols:
        return False
    return c_outer == c_inner * inner_size


def test_runs_with_agrees_with_its_definition_by_derivatives():
    """The fast path for sums of ``number * var`` answers what the derivatives answer, on
    affine, non-affine (floor division, products of vars) and symbolic-stride indices."""
    x0, x1, x2, s0 = sympy.symbols("x0 x1 x2 s0", integer=True, nonnegative=True)
    rng = random.Random(0)
    shapes = [
        lambda a, b, c: a * x0 + b * x1 + c,
        lambda a, b, c: a * x0 + b * x1 + c * x2,
        lambda a, b, c: a * x0 + b * x1 + sympy.floor(x1 / 4),
        lambda a, b, c: a * x0 * x1 + b * x1,
        lambda a, b, c: s0 * x0 + b * x1 + c,
        lambda a, b, c: a * x0 + a * c * x0 + b * x1,
        lambda a, b, c: sympy.Rational(a, 2) * x0 + b * x1,
        lambda a, b, c: a * x0 + c,
        lambda a, b, c: sympy.Integer(c),
    ]
    checked = 0
    for shape in shapes:
        for _ in range(20):
            a, b, c = rng.randint(0, 64), rng.randint(0, 4), rng.randint(0, 9)
            expr = sympy.expand(shape(a, b, c))
            for size in (1, 2, 4, 8, 16, 32):
                want = _runs_with_by_derivatives(expr, x0, x1, size)
                assert loops.runs_with(expr, x0, x1, size) == want, (expr, size)
                checked += want
    assert checked > 0          # some pairs do merge
