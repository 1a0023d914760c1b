"""Loop transforms shared by the code generators: which adjacent loop dims of a fused kernel
can run as one.

Two dims ``a`` (outer) and ``b`` (inner, ``size_b`` long) can be merged when every index the
kernel computes with -- loads, stores, index values -- is ``c * (size_b * a + b) + rest``
with neither variable in ``rest``: one loop of ``size_a * size_b`` then visits the same
elements in the same order. A contiguous tensor of any rank becomes one flat dim. The C++
target merges a short inner dim with the outer dims around it; the Triton target merges
every dim it can, so its indices are the tile's linear index where the memory allows.
"""
from __future__ import annotations

import sympy

from ember.backend.ops import use_handler
from ember.backend.sizevars import is_static


class _IndexRecorder:
    """An ops handler recording every index a body computes with."""

    def __init__(self):
        self.indices: list = []
        self.indirect = 0

    def load(self, name, index):
        self.indices.append(index)
        return 0

    def index_expr(self, expr, dtype):
        self.indices.append(expr)
        return 0

    def indirect_indexing(self, *args, **kwargs):
        self.indirect += 1
        return sympy.Symbol(f"indirect{self.indirect}", integer=True)

    def masked(self, mask, body, other):
        return body()

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


def access_indices(kernel, x: list, r: list) -> list:
    """Every index expression the kernel's nodes use, over the kernel's loop variables."""
    recorder = _IndexRecorder()
    with use_handler(recorder):
        for node in kernel.nodes:
            if node.role in ("outer", "scatter"):
                node.value(x, [])
                recorder.indices.append(node.where(x, []))
            else:
                node.value(x, r)
                if node.role != "reduction":
                    recorder.indices.append(node.where(x, r))
                else:
                    recorder.indices.append(node.store_index(x))
    return [sympy.expand(e) for e in recorder.indices]


def runs_with(expr, outer_var, inner_var, inner_size) -> bool:
    """``expr`` is ``c * (inner_size * outer_var + inner_var) + rest`` with neither var in
    ``rest``: the two vars advance it as one contiguous range."""
    linear = linear_coefficients(expr, (outer_var, inner_var))
    if linear is not None:
        c_outer, c_inner = linear
        return c_outer == c_inner * inner_size
    c_inner = sympy.diff(expr, inner_var)
    c_outer = sympy.diff(expr, outer_var)
    if c_inner.free_symbols or c_outer.free_symbols:
        return False
    rest = sympy.expand(expr - c_inner * inner_var - c_outer * outer_var)
    if outer_var in rest.free_symbols or inner_var in rest.free_symbols:
        return False
    return c_outer == c_inner * inner_size


def linear_coefficients(expr, variables):
    """The number multiplying each of ``variables`` in the sum ``expr``, when each appears
    only in terms ``number * var``; None otherwise (the caller asks sympy). Most indices
    are such sums, and this costs a fraction of ``sympy.diff``."""
    coefficients = dict.fromkeys(variables, 0)
    for term in sympy.Add.make_args(expr):
        number, factor = term.as_coeff_Mul()
        if factor in coefficients:
            coefficients[factor] += number
        elif not factor.free_symbols.isdisjoint(coefficients):
            return None
    return [coefficients[v] for v in variables]


def merge_dims(kernel, x: list, r: list, sizes: list, loop_vars: list):
    """Merge adjacent dims of ``loop_vars`` (some of the kernel's variables ``x + r``, in
    loop order, with ``sizes``) wherever every access allows. Returns ``(sizes, vars,
    substitution)``: the remaining dims, their variables, and the value each merged-away
    variable takes in bodies (0: the next variable now covers its range)."""
    sizes, vars_ = list(sizes), list(loop_vars)
    if len(vars_) < 2 or not all(is_static(s) for s in sizes):
        return sizes, vars_, {}
    indices = access_indices(kernel, x, r)
    substitution: dict = {}
    i = len(vars_) - 2
    while i >= 0:
        a, b = vars_[i], vars_[i + 1]
        if all(runs_with(e, a, b, sizes[i + 1]) for e in indices):
            sizes[i + 1] = sizes[i] * sizes[i + 1]
            del sizes[i], vars_[i]
            substitution[a] = sympy.Integer(0)
            indices = [sympy.expand(e.subs(a, 0)) for e in indices]
        i -= 1
    return sizes, vars_, substitution


def store_order(kernel, x: list, r: list, sizes: list, loop_vars: list,
                stored: bool = False):
    """``(sizes, loop_vars)`` reordered so the kernel's first store walks memory in order:
    a value stored channels-last is computed channel-fastest, whatever its logical order.
    ``stored``: the first node written to memory (not a local value, whose index is only
    its logical one). Unchanged when that store's index is not affine, or writes one
    element twice."""
    inner = [n for n in kernel.nodes if n.role == "inner"]
    first = next((n for n in inner if not (stored and n.writes in kernel.local)),
                 inner[0] if inner else None)
    if first is None or len(loop_vars) < 2:
        return list(sizes), list(loop_vars)
    expr = sympy.expand(first.where(x, r))
    coeffs = [sympy.diff(expr, v) for v in loop_vars]
    if not all(c.is_number for c in coeffs) or any(
            c == 0 and s != 1 for c, s in zip(coeffs, sizes)):
        return list(sizes), list(loop_vars)
    order = sorted(range(len(loop_vars)), key=lambda i: -int(coeffs[i]))   # stable
    return [sizes[i] for i in order], [loop_vars[i] for i in order]
