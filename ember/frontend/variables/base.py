"""Base tracker and Python constants."""
from __future__ import annotations

import enum
import inspect
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.frontend.exc import Unsupported

if TYPE_CHECKING:
    from ember.frontend.translator import InstructionTranslator
    from ember.frontend.source import Source


class NotConstant(Exception):
    pass


class VariableTracker:
    """One Python value during capture. Subclasses override the operations they support;
    the defaults raise :class:`Unsupported`, which makes the frame fall back to eager."""

    mutable = False

    def __init__(self, source: "Source | None" = None):
        self.source = source

    # -- what it is -------------------------------------------------------------------------
    def python_type(self) -> type:
        raise Unsupported(f"type() of {self}")

    def as_python_constant(self) -> Any:
        raise NotConstant(self)

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
            return True
        except NotConstant:
            return False

    # -- what it does -----------------------------------------------------------------------
    def var_getattr(self, tx: "InstructionTranslator", name: str) -> "VariableTracker":
        raise Unsupported(f"attribute {name!r} of {self}")

    def call_function(self, tx, args: list, kwargs: dict) -> "VariableTracker":
        raise Unsupported(f"calling {self}")

    def call_method(self, tx, name: str, args: list, kwargs: dict) -> "VariableTracker":
        return self.var_getattr(tx, name).call_function(tx, args, kwargs)

    def unpack(self, tx) -> list["VariableTracker"]:
        """The items of an iterable value, for unrolled loops and unpacking."""
        raise Unsupported(f"iterating over {self}")

    def truthy(self, tx) -> bool:
        raise Unsupported(f"truth value of {self}")

    # -- after the graph ----------------------------------------------------------------------
    def reconstruct(self, cg) -> str:
        """A Python expression for this value in the generated entry (after the graph ran,
        at a return or a graph break): read again from its source, else rebuilt."""
        if self.source is not None:
            return cg.load(self.source)
        return self.rebuild(cg)

    def rebuild(self, cg) -> str:
        """An expression making the value anew (trackers without a source)."""
        value = getattr(self, "value", None)
        if value is not None:
            return cg.const(value)    # functions, modules, classes the frame holds
        raise Unsupported(f"cannot rebuild {self} after the graph")

    def __repr__(self):
        src = f" from {self.source.name()}" if self.source is not None else ""
        return f"{type(self).__name__}{src}"


_CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                   type(NotImplemented), torch.dtype, torch.device, torch.layout,
                   torch.memory_format, range, slice, types.CodeType, enum.Enum,
                   torch.finfo, torch.iinfo, inspect.Signature, inspect.Parameter,
                   types.MappingProxyType)
try:   # NumPy's dtypes, type information and scalars are immutable constants too
    import numpy as _np
    _CONSTANT_TYPES += (_np.dtype, _np.finfo, _np.iinfo, _np.generic)
except ImportError:
    pass


def is_constant_value(value: Any) -> bool:
    """Immutable scalars a ConstantVariable holds (tuples become TupleVariables)."""
    return isinstance(value, _CONSTANT_TYPES)


# ``symbolic.wrap_sym``, installed by ``variables/symbolic.py`` (which imports this module)
wrap_symbolic = None
_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class ConstantVariable(VariableTracker):
    """An immutable Python value known at capture time (numbers, strings, None, dtypes,
    devices, slices, ranges, enum members). Operations on constants are evaluated for real.

    ``ConstantVariable(v)`` of a symbolic size (a ``torch.SymInt`` read from a fake tensor's
    metadata) makes a ``SymNodeVariable`` instead: baked into the graph or the entry as a
    constant it would be wrong at every other size."""

    def __new__(cls, *args, **kwargs):
        if cls is ConstantVariable and args and isinstance(args[0], _SYM_TYPES) and \
                wrap_symbolic is not None:
            return wrap_symbolic(args[0])
        return super().__new__(cls)

    def __init__(self, value: Any, source=None):
        super().__init__(source)
        self.value = value

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def truthy(self, tx):
        return bool(self.value)

    def var_getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(f"{e}") from None
        if callable(attr) and not isinstance(attr, _CONSTANT_TYPES):
            return ConstantMethodVariable(self, name)
        return tx.wrap_constant(attr)

    def reconstruct(self, cg):
        return cg.literal(self.value)

    def unpack(self, tx):
        if isinstance(self.value, (str, range, bytes)):
            return [ConstantVariable(v) for v in self.value]
        return super().unpack(tx)

    def __repr__(self):
        return f"ConstantVariable({self.value!r})"


class BoundMethodVariable(VariableTracker):
    """``obj.name`` on a tracker that implements ``call_method`` (containers, constants)."""

    def __init__(self, obj: VariableTracker, name: str):
        super().__init__()
        self.obj = obj
        self.name = name

    def python_type(self):
        return types.BuiltinMethodType

    def truthy(self, tx):
        return True

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def rebuild(self, cg):
        return f"getattr({cg.reconstruct(self.obj)}, {self.name!r})"


class ConstantMethodVariable(BoundMethodVariable):
    """A method of a constant (``"a,b".split``, ``dtype.to_complex``): evaluated for real."""

    def call_function(self, tx, args, kwargs):
        try:
            const_args = [a.as_python_constant() for a in args]
            const_kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
        except Exception:
            raise Unsupported(f"{self.name}() of a constant with non-constant arguments") \
                from None
        try:
            result = getattr(self.obj.value, self.name)(*const_args, **const_kwargs)
        except Exception as e:
            raise Unsupported(f"{type(e).__name__} in {self.name}(): {e}") from None
        return tx.wrap_constant(result)
