"""Callables during capture: user functions (inlined), torch functions (graph nodes), user
methods, ``functools.partial`` and closure cells. (Handled builtins: ``handlers``; methods of
trackers: ``base.BoundMethodVariable``.)"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable

from ember.frontend.exc import Unsupported
from ember.frontend.source import DefaultsSource, FunctionClosureSource
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.containers import TupleVariable
from ember.frontend.variables.dicts import DictVariable


class _EmptyCell(VariableTracker):
    """What a deleted cell holds: its replay empties the real cell."""

    def __repr__(self):
        return "EMPTY_CELL"


EMPTY_CELL = _EmptyCell()


class CellVariable(VariableTracker):
    """A closure cell. ``real_cell`` is set for cells that exist outside the frame (their
    writes are side effects); cells made during capture are plain boxes. ``source`` is where
    the cell's *contents* are read from; ``cell_source``, where the cell object itself is
    (a resume function receives the cells of the frame it continues as arguments)."""
    mutable = True

    def __init__(self, contents: VariableTracker | None = None, real_cell=None, source=None,
                 cell_source=None):
        super().__init__(source)
        self.real_cell = real_cell
        self.cell_source = cell_source
        self._contents = contents
        self.loaded = contents is not None or real_cell is None

    def get(self, tx) -> VariableTracker:
        if not self.loaded:
            try:
                value = self.real_cell.cell_contents
            except ValueError:
                raise Unsupported("reading an empty closure cell") from None
            self._contents = tx.wrap(value, self.source)
            self.loaded = True
        if self._contents is None:
            raise Unsupported("reading an unassigned closure variable")
        return self._contents

    def set(self, tx, value: VariableTracker) -> None:
        if self.real_cell is not None:
            tx.output.side_effects.store_cell(self, value)
        self._contents = value
        self.loaded = True

    def preload(self, contents: VariableTracker) -> None:
        """Contents read already, with their own guards (a function the frame made)."""
        self._contents = contents
        self.loaded = True

    def delete(self, tx) -> None:
        """``del`` of the variable (DELETE_DEREF): the cell becomes empty."""
        if self.real_cell is not None and not self.loaded:
            self.get(tx)     # deleting an empty cell raises: read it (an empty one refuses)
        if self._contents is None:
            raise Unsupported("deleting an unassigned closure variable")
        if self.real_cell is not None:
            tx.output.side_effects.store_cell(self, EMPTY_CELL)
        self._contents = None
        self.loaded = True

    def is_unbound(self) -> bool:
        return self.loaded and self._contents is None

    def var_getattr(self, tx, name):
        if name == "cell_contents":
            return self.get(tx)
        return super().var_getattr(tx, name)

    def reconstruct(self, cg) -> str:
        """The cell object (never its contents): read from ``cell_source``, held when it
        exists outside the frame, else made once with the contents it has now."""
        if self.cell_source is not None:
            return cg.load(self.cell_source)
        if self.real_cell is not None:
            return cg.const(self.real_cell)
        cell = cg.temp(self, f"{cg.const(types.CellType)}()")   # first: contents may be a
        if self._contents is not None:                          # function closing over it
            cg.lines.append(f"{cell}.cell_contents = {cg.reconstruct(self._contents)}")
        return cell


class CellRefVariable(VariableTracker):
    """A cell parameter of a resume function (``resume.CellRef``): ``value`` is the cell's
    contents, ``cell`` the cell. Rebuilt from its source, the parameter itself."""

    def __init__(self, cell: CellVariable, source):
        super().__init__(source)
        self.cell = cell

    def var_getattr(self, tx, name):
        if name == "value":
            return self.cell.get(tx)
        if name == "cell":
            return self.cell
        return super().var_getattr(tx, name)

    def __repr__(self):
        return f"CellRefVariable({self.source.name()})"


def bind_args(code: types.CodeType, name: str, args: list, kwargs: dict,
              defaults: list | None, kwdefaults: dict | None) -> dict[str, VariableTracker]:
    """Python's argument binding for ``code``, over trackers."""
    nargs = code.co_argcount
    nposonly = code.co_posonlyargcount
    nkwonly = code.co_kwonlyargcount
    names = code.co_varnames
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound: dict[str, Any] = {}
    for i, value in enumerate(args[:nargs]):
        bound[names[i]] = value
    extra = args[nargs:]
    if extra and not has_varargs:
        raise Unsupported(f"{name}() takes {nargs} positional arguments but {len(args)} "
                          f"were given")
    pos_names = names[:nargs]
    kwonly_names = names[nargs:nargs + nkwonly]
    varkw: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in kwonly_names or (key in pos_names and pos_names.index(key) >= nposonly):
            if key in bound:
                raise Unsupported(f"{name}() got multiple values for argument {key!r}")
            bound[key] = value
        elif has_varkw:
            varkw[key] = value
        else:
            raise Unsupported(f"{name}() got an unexpected keyword argument {key!r}")
    defaults = defaults or []
    first_default = nargs - len(defaults)
    for i, pname in enumerate(pos_names):
        if pname not in bound:
            if i >= first_default:
                bound[pname] = defaults[i - first_default]
            else:
                raise Unsupported(f"{name}() missing required argument {pname!r}")
    for pname in kwonly_names:
        if pname not in bound:
            if kwdefaults and pname in kwdefaults:
                bound[pname] = kwdefaults[pname]
            else:
                raise Unsupported(f"{name}() missing keyword-only argument {pname!r}")
    idx = nargs + nkwonly
    if has_varargs:
        bound[names[idx]] = TupleVariable(list(extra))
        idx += 1
    if has_varkw:
        bound[names[idx]] = DictVariable(varkw)
    return bound


class BaseUserFunctionVariable(VariableTracker):
    def call_function(self, tx, args, kwargs):
        return tx.inline_function(self, args, kwargs)

    def python_type(self):
        return types.FunctionType

    def truthy(self, tx):
        return True

    # what inlining needs
    def get_code(self) -> types.CodeType:
        raise NotImplementedError

    def get_globals(self) -> dict:
        raise NotImplementedError

    def bind(self, tx, args, kwargs) -> dict:
        raise NotImplementedError

    def closure_cells(self, tx) -> list[CellVariable]:
        raise NotImplementedError


class UserFunctionVariable(BaseUserFunctionVariable):
    """A Python function that exists outside the frame; calls to it are inlined."""

    def __init__(self, fn: types.FunctionType, source=None):
        super().__init__(source)
        self.value = fn

    def as_python_constant(self):
        return self.value

    def get_code(self):
        return self.value.__code__

    def get_globals(self):
        return self.value.__globals__

    def bind(self, tx, args, kwargs):
        fn = self.value
        defaults = None
        if fn.__defaults__:
            defaults = [tx.wrap(d, DefaultsSource(self.source, i) if self.source else None)
                        for i, d in enumerate(fn.__defaults__)]
        kwdefaults = None
        if fn.__kwdefaults__:
            kwdefaults = {k: tx.wrap(v, DefaultsSource(self.source, k, kw=True)
                                     if self.source else None)
                          for k, v in fn.__kwdefaults__.items()}
        return bind_args(fn.__code__, fn.__qualname__, args, kwargs, defaults, kwdefaults)

    def closure_cells(self, tx):
        cells = self.value.__closure__ or ()
        return [tx.cell_for(cell, FunctionClosureSource(self.source, i)
                            if self.source else None) for i, cell in enumerate(cells)]

    def var_getattr(self, tx, name):
        try:
            value = getattr(self.value, name)
        except AttributeError:
            raise Unsupported(f"AttributeError: function has no attribute {name!r}") from None
        from ember.frontend.source import AttrSource
        return tx.wrap(value, AttrSource(self.source, name) if self.source else None)

    def __repr__(self):
        return f"UserFunctionVariable({self.value.__qualname__})"


class NestedUserFunctionVariable(BaseUserFunctionVariable):
    """A function created by MAKE_FUNCTION during capture (a nested def or lambda)."""

    def __init__(self, code, f_globals, name, defaults, kwdefaults, closure):
        super().__init__()
        self.code = code
        self.f_globals = f_globals
        self.name = name
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure

    def get_code(self):
        return self.code

    def get_globals(self):
        return self.f_globals

    def bind(self, tx, args, kwargs):
        return bind_args(self.code, self.name, args, kwargs, self.defaults, self.kwdefaults)

    def closure_cells(self, tx):
        return list(self.closure or ())

    def var_getattr(self, tx, name):
        if name == "__name__":
            return ConstantVariable(self.code.co_name)
        if name == "__qualname__":
            return ConstantVariable(self.name)
        if name == "__module__":
            return ConstantVariable(self.f_globals.get("__name__"))
        return super().var_getattr(tx, name)

    def rebuild(self, cg):
        from ember.frontend.codegen import new_function
        defaults = cg.items(self.defaults) if self.defaults else ""
        kwdefaults = ", ".join(f"{k!r}: {cg.reconstruct(v)}"
                               for k, v in (self.kwdefaults or {}).items())
        closure = cg.items(self.closure) if self.closure else ""
        return cg.temp(self, f"{cg.const(new_function)}({cg.const(self.code)}, "
                             f"{cg.const(self.f_globals)}, {self.code.co_name!r}, "
                             f"({defaults}), {{{kwdefaults}}}, ({closure}))")

    def __repr__(self):
        return f"NestedUserFunctionVariable({self.name})"


class UserMethodVariable(VariableTracker):
    """``obj.method`` where method is a user function: calls inline it with ``self``."""

    def __init__(self, fn_var: VariableTracker, obj: VariableTracker, source=None):
        super().__init__(source)
        self.fn_var = fn_var
        self.obj = obj

    def python_type(self):
        return types.MethodType

    def truthy(self, tx):
        return True

    def call_function(self, tx, args, kwargs):
        return self.fn_var.call_function(tx, [self.obj, *args], kwargs)

    def rebuild(self, cg):
        return (f"{cg.const(types.MethodType)}({cg.reconstruct(self.fn_var)}, "
                f"{cg.reconstruct(self.obj)})")

    def var_getattr(self, tx, name):
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return self.fn_var
        return self.fn_var.var_getattr(tx, name)

    def __repr__(self):
        return f"UserMethodVariable({self.fn_var}, {self.obj})"


class PartialVariable(VariableTracker):
    def __init__(self, func: VariableTracker, args: list, kwargs: dict, source=None):
        super().__init__(source)
        self.func = func
        self.args = args
        self.kwargs = kwargs

    def truthy(self, tx):
        return True

    def call_function(self, tx, args, kwargs):
        return self.func.call_function(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def rebuild(self, cg):
        import functools
        args = "".join(f", {cg.reconstruct(a)}" for a in self.args)
        kwargs = "".join(f", {k}={cg.reconstruct(v)}" for k, v in self.kwargs.items())
        return f"{cg.const(functools.partial)}({cg.reconstruct(self.func)}{args}{kwargs})"

    def var_getattr(self, tx, name):
        if name == "func":
            return self.func
        if name == "args":
            return TupleVariable(self.args)
        if name == "keywords":
            return DictVariable({k: v for k, v in self.kwargs.items()})
        return super().var_getattr(tx, name)


class GraphCallableVariable(VariableTracker):
    """A callable that goes into the graph as one node: torch functions, ``torch.nn.
    functional``, Tensor methods called unbound, and ``ember.allow_in_graph`` functions."""

    def __init__(self, fn: Callable, source=None):
        super().__init__(source)
        self.value = fn

    def as_python_constant(self):
        return self.value

    def truthy(self, tx):
        return True

    def python_type(self):
        return type(self.value)

    def call_function(self, tx, args, kwargs):
        return tx.output.call_function(self.value, args, kwargs)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.value, name))
        import torch
        if isinstance(self.value, torch._ops.OpOverloadPacket):   # aten.add.Tensor
            try:
                return tx.wrap(getattr(self.value, name), None)
            except AttributeError:
                raise Unsupported(f"AttributeError: {self.value} has no overload {name!r}") \
                    from None
        return super().var_getattr(tx, name)

    def __repr__(self):
        return f"GraphCallableVariable({getattr(self.value, '__name__', self.value)})"
