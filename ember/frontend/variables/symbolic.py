"""Python numbers that are symbolic sizes during capture: ``x.size(0)`` of a dynamic dim.

A :class:`SymNodeVariable` holds a ``torch.SymInt``/``SymFloat``/``SymBool`` of the capture's
shape environment (``ember.shapes``). Arithmetic on it (``x.size(0) // 2``, ``s * s1 + 1``,
``min(s, 4)``, ``math.sqrt(s)``, ``s > 16``) is computed on the SymInts themselves, giving new
symbolic values, without a guard. Where such a value flows into a graph call (``x.view(-1,
s)``, ``torch.arange(s)``, ``x * s``) the graph computes it from the size placeholders
(``OutputGraph.expr_node``); where it is returned or passed on after the graph, the entry
computes it from the inputs' sizes (:meth:`SymNodeVariable.reconstruct`).

Decisions
---------
* **Deciding is guarding.** Control flow on a symbolic value (``if s > 16:``), ``bool()``
  and comparisons that must give a Python bool evaluate it at the hints and record a guard
  (the shape environment's). Uses that need a real Python number (``range(s)``, an
  f-string, a dict key, ``str(s)``, a constant argument of a non-graph function) specialise
  it: ``as_python_constant`` returns the hint and guards ``s == hint``.
* **Not a constant to folders.** ``is_python_constant`` is False, and
  ``builtins.constants`` refuses symbolic operands (deep in containers too), so pure
  functions are not folded by specialising their arguments when a symbolic path exists
  (``x.shape == y.shape`` compares item by item: one guard per dim, not a specialisation).
* A result that the ranges decide (``s - s``, ``s == 1`` for a size symbol) is a plain
  constant: torch's carriers return Python numbers for constant nodes.
"""
from __future__ import annotations

import math
import operator

import sympy
import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables import base
from ember.frontend.variables.base import ConstantVariable, VariableTracker

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_PY_TYPES = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def specialize(value):
    """The Python number a symbolic value has now, guarding that it stays so."""
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    return value


def wrap_sym(value) -> VariableTracker:
    """A tracker for ``value``: a :class:`SymNodeVariable` for a symbolic number, else a
    constant (also for a SymInt whose expression became a number through a guard)."""
    if isinstance(value, SYM_TYPES):
        expr = value.node.expr
        if expr.is_Number or expr is sympy.true or expr is sympy.false:
            return ConstantVariable(specialize(value))
        return SymNodeVariable(value)
    return ConstantVariable(value)


def is_symbolic(vt) -> bool:
    """``vt`` is, or holds (in tuples, lists, slices), a symbolic number."""
    if isinstance(vt, SymNodeVariable):
        return True
    items = getattr(vt, "items", None)
    if type(items) is list:
        return any(is_symbolic(v) for v in items)
    parts = getattr(vt, "parts", None)
    if type(parts) in (list, tuple):
        return any(is_symbolic(v) for v in parts)
    return False


class SymNodeVariable(VariableTracker):
    """A symbolic int, float or bool (see the module docstring)."""

    def __init__(self, value, source=None):
        super().__init__(source)
        self.value = value

    @property
    def expr(self):
        return self.value.node.expr

    @property
    def sym_value(self):
        return self.value

    def python_type(self):
        return _PY_TYPES[type(self.value)]

    def is_python_constant(self) -> bool:
        return False

    def as_python_constant(self):
        return specialize(self.value)

    def truthy(self, tx) -> bool:
        return bool(self.value)

    def var_getattr(self, tx, name):
        # methods of the number (``bit_length``, ``real``): on the specialised value
        return ConstantVariable(self.as_python_constant()).var_getattr(tx, name)

    def unpack(self, tx):
        raise Unsupported(f"iterating over a number ({self})")

    def reconstruct(self, cg) -> str:
        return cg.size_expression(self.value)

    def __repr__(self):
        return f"SymNodeVariable({self.value.node.expr}, {self.python_type().__name__})"


def _number(vt):
    if isinstance(vt, SymNodeVariable):
        return vt.value
    if type(vt) is ConstantVariable and type(vt.value) in (int, float, bool):
        return vt.value
    return None


# the ``builtins`` module, handed in by its ``register`` call (it imports this module)
_builtins = None


def apply_operator(tx, op, args):
    """``op(*args)`` where some operand is symbolic (``OPERAND_OPERATORS``)."""
    builtins = _builtins
    op = builtins.INPLACE.get(op, op)      # numbers are immutable
    if any(isinstance(a, builtins.TensorVariable) for a in args):
        return tx.output.call_function(op, args, {})
    values = [_number(a) for a in args]
    if any(v is None for v in values) or op in _SPECIALISING:
        # another kind of operand (a list times a size, a comparison with None), or an
        # operation torch's symbolic numbers lack: on the specialised values
        return builtins.apply_operator(tx, op, [ConstantVariable(a.as_python_constant())
                                                if isinstance(a, SymNodeVariable) else a
                                                for a in args])
    try:
        result = op(*values)
    except Exception as e:
        error = Unsupported(f"{type(e).__name__} from {op.__name__} on sizes: {e}")
        error.symbolic_sizes = True
        raise error from None
    return wrap_sym(result)


# bitwise operators: torch's SymInt has none (nor does Ember's node)
_SPECIALISING = {operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift,
                 operator.invert, operator.matmul}


def _sym_builtin(fn, symbolic):
    """Wrap the handler of builtin ``fn``: ``symbolic(tx, values)`` where every argument is
    a number and some is symbolic; the original handler otherwise."""
    HANDLERS = _builtins.HANDLERS
    original = HANDLERS[fn]

    def handler(tx, args, kwargs):
        if not kwargs:
            items = args
            if fn in (min, max) and len(args) == 1 and is_symbolic(args[0]):
                items = tx.unpack_iterable(args[0])     # min(sizes) of a tuple of sizes
            values = [_number(a) for a in items]
            if values and any(isinstance(a, SymNodeVariable) for a in items) and \
                    all(v is not None for v in values):
                out = symbolic(values)
                if out is not NotImplemented:
                    return wrap_sym(out)
        return original(tx, args, kwargs)
    HANDLERS[fn] = handler


def _reduce(sym_fn):
    def run(values):
        out = values[0]
        for v in values[1:]:
            out = sym_fn(out, v)
        return out
    return run


def _one(fn):
    return lambda values: fn(values[0]) if len(values) == 1 else NotImplemented


def register(builtins_module) -> None:
    """Install the operators and builtins; ``builtins_module`` (``variables/builtins.py``)
    calls this once it has its handlers."""
    global _builtins
    _builtins = builtins_module
    builtins_module.OPERAND_OPERATORS[SymNodeVariable] = apply_operator
    _sym_builtin(min, _reduce(torch.sym_min))
    _sym_builtin(max, _reduce(torch.sym_max))
    _sym_builtin(abs, _one(abs))
    _sym_builtin(int, _one(lambda v: v if isinstance(v, (int, torch.SymInt))
                        else torch.sym_int(v)))
    _sym_builtin(float, _one(torch.sym_float))
    for name in ("floor", "ceil", "trunc"):
        _sym_builtin(getattr(math, name), _one(getattr(math, name)))
    for name in ("sqrt", "cos", "cosh", "sin", "sinh", "tan", "tanh", "asin", "acos",
                 "atan", "log2"):
        sym_fn = getattr(torch, f"_sym_{name}", None)
        if sym_fn is not None:
            _sym_builtin(getattr(math, name), _one(sym_fn))


base.wrap_symbolic = wrap_sym     # ConstantVariable(<a SymInt>) makes a SymNodeVariable

__all__ = ["SymNodeVariable", "wrap_sym", "specialize", "is_symbolic", "SYM_TYPES"]
