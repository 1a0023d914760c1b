"""Ember's node class for ``torch.SymInt`` / ``torch.SymFloat`` / ``torch.SymBool``.

torch's symbolic scalars are thin carriers: ``torch.SymInt(node)`` forwards every operation
to ``node``, from Python (the magic methods torch installs on ``SymInt``: ``a + b`` calls
``a.node.add(b.node)``, after wrapping a plain ``b`` with ``a.node.wrap_int(b)``) and from
C++ (meta kernels computing output sizes call the same methods through
``PythonSymNodeImpl``). :class:`SymNode` is Ember's implementation of that protocol over a
sympy expression and a :class:`~ember.shapes.env.ShapeEnv`.

The protocol, as torch 2.11-2.13 calls it (read from ``torch/__init__.py``, ``torch/fx/
experimental/sym_node.py``'s magic-method installer and ``torch/csrc/utils/
python_symnode.h``; none of them is imported here):

* kind and constants: ``is_int is_float is_bool is_nested_int is_constant is_symbolic
  maybe_as_int maybe_as_float maybe_as_bool has_hint hint wrap_int wrap_float wrap_bool
  clone str _graph_repr``; ``expr`` (read by ``SymInt._sympy_``);
* arithmetic: ``add sub mul neg abs pos mod int_floordiv floordiv int_truediv
  float_truediv truediv pow_by_natural float_pow pow sym_float sym_int floor ceil trunc
  round is_integer sym_min sym_max sym_sum`` and ``sym_sqrt``-style math;
* booleans: ``eq ne lt le gt ge sym_and sym_or sym_not sym_ite``;
* decisions: ``guard_int guard_float guard_bool bool_ int_ expect_true
  guard_size_oblivious guard_or_false guard_or_true statically_known_true`` (they take
  ``file, line`` from C++, which Ember ignores: the guard's location is the user's frame);
* geometry: ``is_contiguous is_channels_last_contiguous_2d/3d is_channels_last_strides_2d/3d
  is_non_overlapping_and_dense(_indicator)`` over lists of size and stride nodes.

Decisions
---------
* **A node is immutable**: ``(expr, env, pytype)``. Its hint is computed from the env's
  symbol hints when asked, so it cannot go stale.
* **A result that is a number is a constant node** (``is_constant()`` true): torch's magic
  methods then hand back a plain ``int``/``bool`` (``s0 - s0`` is ``0``), and the C++ side
  reads it with ``maybe_as_int``. A float result stays a SymFloat (torch's magic methods
  cannot unwrap those); ``float()`` of it is the number, without a guard. Boolean results the ranges decide become
  constants too (``s0 == 1`` is ``False`` for a size symbol), so meta kernels' checks cost
  no guard.
* **Every decision is a guard** through ``ShapeEnv.evaluate``; ``guard_or_false``,
  ``guard_or_true``, ``expect_true`` and ``guard_size_oblivious`` all guard too: every
  symbol here has a hint (no data-dependent "unbacked" sizes yet), and size symbols are
  already >= 2, which is what size-oblivious reasoning assumes.
* **Hashing** follows torch, whose carrier classes decide it: a SymInt is unhashable
  (``TypeError``), a SymBool or SymFloat hashes its value, guarding on it.
* Floats are best-effort: a SymFloat's expression is evaluated in sympy (exact rationals
  for ``int / int``), then converted with ``float()``.
* Bitwise ``& | ^`` and shifts on SymInts are not implemented (``AttributeError``).
* ``torch.sym_ite(b, x, y)`` on Ember's SymBools raises ``AssertionError``: torch's Python
  wrapper insists that the branches' nodes are torch's own node class. C++ callers reach
  :meth:`SymNode.sym_ite` directly, and so can Ember (``b.node.sym_ite(x.node, y.node)``).
"""
from __future__ import annotations

import builtins
from typing import Sequence

import sympy
import torch

from ember.shapes.functions import MATH_FUNCTIONS, FloorDiv, Mod, TruncToInt

_SYM_TYPES = {int: torch.SymInt, float: torch.SymFloat, bool: torch.SymBool}


def _as_node(env, value) -> "SymNode":
    if isinstance(value, SymNode):
        return value
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node
    if isinstance(value, bool):
        return SymNode(sympy.true if value else sympy.false, env, bool)
    if isinstance(value, int):
        return SymNode(sympy.Integer(value), env, int)
    if isinstance(value, float):
        return SymNode(sympy.Float(value), env, float)
    raise TypeError(f"not a size value: {value!r}")


class SymNode:
    """A symbolic int, float or bool: a sympy expression over an env's size symbols."""

    __slots__ = ("_expr", "env", "pytype")


    def __init__(self, expr, env, pytype: type):
        if pytype not in _SYM_TYPES:
            raise TypeError(f"SymNode pytype must be int, float or bool, got {pytype}")
        self._expr = expr
        self.env = env
        self.pytype = pytype

    # -- identity ---------------------------------------------------------------------------

    @property
    def expr(self) -> sympy.Basic:
        return self.env.replace(self._expr)

    def wrapped(self):
        """This node as ``torch.SymInt``/``SymFloat``/``SymBool``, or the Python constant."""
        if self.is_constant() or (self.pytype is float and self.expr.is_Number):
            return self._constant()
        return _SYM_TYPES[self.pytype](self)

    def _constant(self):
        e = self.expr
        if self.pytype is bool:
            return bool(e)
        return self.pytype(e)

    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def nested_int(self):
        return None

    def is_symbolic(self) -> bool:
        return not self.is_constant()

    def is_constant(self) -> bool:
        # floats never count: torch's magic methods turn a constant result into a plain
        # number only for SymInt and SymBool (and raise for SymFloat)
        if self.pytype is float:
            return False
        e = self.expr
        return e.is_Number or e is sympy.true or e is sympy.false

    def maybe_as_int(self) -> int | None:
        e = self.expr
        return int(e) if self.pytype is int and e.is_Integer else None

    def maybe_as_float(self) -> float | None:
        e = self.expr
        return float(e) if e.is_Number else None

    def maybe_as_bool(self) -> bool | None:
        e = self.expr
        return True if e is sympy.true else False if e is sympy.false else None

    def has_hint(self) -> bool:
        return True

    # torch's Python helpers (symbolic_shapes.statically_known_true, reached from
    # decompositions that the Python dispatcher runs) read ``node._hint`` as a shortcut
    # that may disprove a boolean; None turns the shortcut off. They look for a
    # ``shape_env`` attribute too, and without one fall back to this protocol's methods.
    _hint = None

    @property
    def hint(self):
        return self._convert(self.env.hint_value(self.expr))

    def _convert(self, value):
        if self.pytype is bool:
            return bool(value)
        return self.pytype(value)

    def wrap_int(self, num: int) -> "SymNode":
        return SymNode(sympy.Integer(num), self.env, int)

    def wrap_float(self, num: float) -> "SymNode":
        return SymNode(sympy.Float(num), self.env, float)

    def wrap_bool(self, num: bool) -> "SymNode":
        return SymNode(sympy.true if num else sympy.false, self.env, bool)

    def clone(self) -> "SymNode":
        return self

    def str(self) -> str:
        return builtins.str(self.expr)

    __str__ = str

    def _graph_repr(self) -> str:
        return self.str()

    def __repr__(self) -> str:
        return f"SymNode({self.expr}, {self.pytype.__name__})"

    # -- building results -------------------------------------------------------------------

    def _new(self, expr, pytype: type) -> "SymNode":
        if pytype is bool and not (expr is sympy.true or expr is sympy.false):
            known = self.env.static_value(expr)
            if known is not None:
                expr = known
        else:
            expr = self.env.simplify(expr)
        return SymNode(expr, self.env, pytype)

    def _other(self, other) -> "SymNode":
        node = _as_node(self.env, other)
        if node.env is not self.env and node.free_symbols():
            raise ValueError(f"sizes of two shape environments meet: {self.expr} and "
                             f"{node.expr}")
        return node

    def free_symbols(self) -> set:
        return self._expr.free_symbols

    def _num_type(self, other: "SymNode") -> type:
        return float if float in (self.pytype, other.pytype) else int

    def _binary(self, other, fn, pytype=None) -> "SymNode":
        other = self._other(other)
        return self._new(fn(self.expr, other.expr), pytype or self._num_type(other))

    # -- arithmetic -------------------------------------------------------------------------

    def add(self, other):
        return self._binary(other, lambda a, b: a + b)

    def sub(self, other):
        return self._binary(other, lambda a, b: a - b)

    def mul(self, other):
        return self._binary(other, lambda a, b: a * b)

    def neg(self):
        return self._new(-self.expr, self.pytype)

    def pos(self):
        return self

    def abs(self):
        return self._new(sympy.Abs(self.expr), self.pytype)

    def int_floordiv(self, other):
        return self._binary(other, FloorDiv, int)

    def floordiv(self, other):
        other = self._other(other)
        if self._num_type(other) is int:
            return self.int_floordiv(other)
        return self._new(sympy.floor(self.expr / other.expr), float)

    def mod(self, other):
        other = self._other(other)
        if self._num_type(other) is int:
            return self._new(Mod(self.expr, other.expr), int)
        a, b = self.expr, other.expr
        return self._new(a - b * sympy.floor(a / b), float)

    def _check_divisor(self, other: "SymNode"):
        if other.expr.is_zero:
            raise ZeroDivisionError("division by zero")

    def int_truediv(self, other):
        other = self._other(other)
        self._check_divisor(other)
        return self._new(self.expr / other.expr, float)

    def float_truediv(self, other):
        other = self._other(other)
        self._check_divisor(other)
        return self._new(self.expr / other.expr, float)

    def truediv(self, other):
        return self.float_truediv(other)

    def pow_by_natural(self, other):
        return self._binary(other, sympy.Pow, int)

    def float_pow(self, other):
        return self._binary(other, sympy.Pow, float)

    def pow(self, other):
        other = self._other(other)
        if self._num_type(other) is int and self.env.statically_known_true(other.expr >= 0):
            return self.pow_by_natural(other)
        return self.float_pow(other)

    def sym_float(self):
        if self.pytype is bool:
            return self._new(sympy.Piecewise((sympy.Float(1.0), self.expr),
                                             (sympy.Float(0.0), True)), float)
        return self._new(self.expr, float)

    def sym_int(self):
        return self._new(TruncToInt(self.expr), int)

    def trunc(self):
        return self.sym_int()

    def floor(self):
        return self._new(sympy.floor(self.expr), int)

    def ceil(self):
        return self._new(sympy.ceiling(self.expr), int)

    def round(self, ndigits=None):
        # Python rounds halves to even; decided at the hints, with a guard
        value = builtins.round(self.guard_float("", 0), ndigits)
        return self.wrap_int(value) if ndigits is None else self.wrap_float(value)

    def is_integer(self):
        return self._new(sympy.Eq(sympy.floor(self.expr), self.expr), bool)

    def sym_max(self, other):
        return self._binary(other, sympy.Max)

    def sym_min(self, other):
        return self._binary(other, sympy.Min)

    def sym_sum(self, args: Sequence) -> "SymNode":
        nodes = [self._other(a) for a in args]
        pytype = float if any(n.pytype is float for n in nodes) else int
        return self._new(sympy.Add(*[n.expr for n in nodes]), pytype)

    # -- comparisons and booleans -----------------------------------------------------------

    def eq(self, other):
        return self._binary(other, sympy.Eq, bool)

    def ne(self, other):
        return self._binary(other, sympy.Ne, bool)

    def lt(self, other):
        return self._binary(other, sympy.Lt, bool)

    def le(self, other):
        return self._binary(other, sympy.Le, bool)

    def gt(self, other):
        return self._binary(other, sympy.Gt, bool)

    def ge(self, other):
        return self._binary(other, sympy.Ge, bool)

    def sym_and(self, other):
        return self._binary(other, sympy.And, bool)

    def sym_or(self, other):
        return self._binary(other, sympy.Or, bool)

    def sym_not(self):
        return self._new(sympy.Not(self.expr), bool)

    def sym_ite(self, then_node, else_node):
        then_node, else_node = self._other(then_node), self._other(else_node)
        if then_node.pytype is not else_node.pytype:
            raise TypeError(f"sym_ite branches differ: {then_node.pytype.__name__} and "
                            f"{else_node.pytype.__name__}")
        cond = self.expr
        if cond is sympy.true:
            return then_node
        if cond is sympy.false:
            return else_node
        return self._new(sympy.Piecewise((then_node.expr, cond), (else_node.expr, True)),
                         then_node.pytype)

    # -- decisions (each one a guard unless the ranges decide it) ---------------------------

    def _evaluate(self):
        return self._convert(self.env.evaluate(self.expr))

    def guard_int(self, file=None, line=None) -> int:
        return int(self._evaluate())

    def guard_float(self, file=None, line=None) -> float:
        return float(self._evaluate())

    def guard_bool(self, file=None, line=None) -> bool:
        return bool(self._evaluate())

    def bool_(self) -> bool:
        return self.guard_bool()

    def int_(self) -> int:
        return self.guard_int()

    def expect_true(self, file=None, line=None) -> bool:
        return self.guard_bool()

    def guard_size_oblivious(self, file=None, line=None) -> bool:
        return self.guard_bool()

    def guard_or_false(self, file=None, line=None) -> bool:
        return self.guard_bool()

    def guard_or_true(self, file=None, line=None) -> bool:
        return self.guard_bool()

    def statically_known_true(self, file=None, line=None) -> bool:
        return self.env.statically_known_true(self.expr)

    # -- geometry questions of meta kernels -------------------------------------------------

    def _exprs(self, values) -> list:
        return [self._other(v).expr for v in values]

    def _dense_in_order(self, sizes, strides, order, empty_is_contiguous: bool) -> sympy.Basic:
        """Strides are those of a dense tensor whose dims, fastest first, are ``order``
        (dims of size 1 may have any stride), as eager's contiguity checks define it."""
        sizes, strides = self._exprs(sizes), self._exprs(strides)
        expected = sympy.Integer(1)
        conditions = []
        for d in order:
            conditions.append(sympy.Or(sympy.Eq(sizes[d], 1), sympy.Eq(strides[d], expected)))
            expected = expected * sizes[d]
        dense = sympy.And(*conditions)
        if empty_is_contiguous:
            dense = sympy.Or(sympy.Eq(sympy.Mul(*sizes), 0), dense)
        return dense

    def is_contiguous(self, sizes, strides):
        order = range(len(sizes) - 1, -1, -1)
        return self._new(self._dense_in_order(sizes, strides, order, True), bool)

    def is_channels_last_contiguous_2d(self, sizes, strides):
        if len(sizes) != 4:
            return self.wrap_bool(False)
        return self._new(self._dense_in_order(sizes, strides, (1, 3, 2, 0), False), bool)

    def is_channels_last_contiguous_3d(self, sizes, strides):
        if len(sizes) != 5:
            return self.wrap_bool(False)
        return self._new(self._dense_in_order(sizes, strides, (1, 4, 3, 2, 0), False), bool)

    def _channels_last_strides(self, sizes, strides, order) -> bool:
        # eager's heuristic (c10 is_channels_last_strides_*_s4/_s5), decided with guards
        sizes, strides = self._exprs(sizes), self._exprs(strides)
        decide = self.env.guard_bool
        smallest = sympy.Integer(0)
        if decide(sympy.Eq(strides[1], 0)):
            return False
        for d in order:
            if decide(sympy.Eq(sizes[d], 0)) or decide(sympy.Lt(strides[d], smallest)):
                return False
            if d == 0 and decide(sympy.Eq(smallest, strides[1])):
                return False
            smallest = strides[d]
            if decide(sympy.Gt(sizes[d], 1)):
                smallest = smallest * sizes[d]
        return True

    def is_channels_last_strides_2d(self, sizes, strides):
        if len(sizes) != 4:
            return self.wrap_bool(False)
        return self.wrap_bool(self._channels_last_strides(sizes, strides, (1, 3, 2, 0)))

    def is_channels_last_strides_3d(self, sizes, strides):
        if len(sizes) != 5:
            return self.wrap_bool(False)
        return self.wrap_bool(self._channels_last_strides(sizes, strides, (1, 4, 3, 2, 0)))

    def is_non_overlapping_and_dense(self, sizes, strides):
        # eager's algorithm: sort the dims by stride (size-1 dims anywhere), then they must
        # be dense in that order; the ordering decisions are guards
        sizes, strides = self._exprs(sizes), self._exprs(strides)
        decide = self.env.guard_bool
        if len(sizes) == 1:
            return self.wrap_bool(decide(sympy.Lt(sizes[0], 2)) or
                                  decide(sympy.Eq(strides[0], 1)))
        order = list(range(len(sizes)))
        order.sort(key=_StrideKey.factory(sizes, strides, decide))
        expected = sympy.Integer(1)
        for d in order:
            if decide(sympy.Eq(sizes[d], 1)):
                continue
            if not decide(sympy.Eq(strides[d], expected)):
                return self.wrap_bool(False)
            expected = expected * sizes[d]
        return self.wrap_bool(True)

    def is_non_overlapping_and_dense_indicator(self, sizes, strides):
        dense = self.is_non_overlapping_and_dense(sizes, strides).expr is sympy.true
        return self.wrap_int(1 if dense else 0)

    # -- math functions (torch._sym_sqrt and friends call node.sym_<name>()) ---------------

    def __getattr__(self, name):
        if name.startswith("sym_") and name[4:] in MATH_FUNCTIONS:
            fn = MATH_FUNCTIONS[name[4:]]
            return lambda: self._new(fn(self.expr), float)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


class _StrideKey:
    """Sort key of eager's dense check (c10's comparator): dims of size < 2 go last,
    otherwise the smaller stride goes first."""

    __slots__ = ("dim", "sizes", "strides", "decide")

    @staticmethod
    def factory(sizes, strides, decide):
        def key(dim):
            k = _StrideKey()
            k.dim, k.sizes, k.strides, k.decide = dim, sizes, strides, decide
            return k
        return key

    def __lt__(self, other: "_StrideKey") -> bool:
        a, b = self.dim, other.dim
        if self.decide(sympy.Lt(self.sizes[a], 2)):
            return False
        if self.decide(sympy.Lt(self.sizes[b], 2)):
            return True
        return self.decide(sympy.Lt(self.strides[a], self.strides[b]))


__all__ = ["SymNode"]
