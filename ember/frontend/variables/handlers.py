"""The registry of capture-time handlers for Python callables.

A handler stands in for a callable during capture: ``handler(tx, args, kwargs) -> tracker``.
``builtins``, ``introspection``, ``iterators`` and ``numpy`` register theirs here
(``@builtin(len)``); a value found in the registry is wrapped as a
:class:`HandlerFunctionVariable`. The registry lives apart from the handlers so that trackers
that only look handlers up need not import them.
"""
from __future__ import annotations

from typing import Any, Callable

from ember.frontend.variables.base import ConstantVariable, VariableTracker

Handler = Callable[[Any, list, dict], VariableTracker]
HANDLERS: dict[Any, Handler] = {}


def builtin(*fns):
    def deco(handler: Handler) -> Handler:
        for fn in fns:
            HANDLERS[fn] = handler
        return handler
    return deco


def handler_for(value) -> Handler | None:
    try:
        return HANDLERS.get(value)
    except TypeError:   # unhashable
        return None


class HandlerFunctionVariable(VariableTracker):
    """A Python callable whose capture-time behaviour is a handler (builtins, ``math``,
    ``operator``, special torch functions). ``handler(tx, args, kwargs) -> tracker``."""

    def __init__(self, fn: Callable, handler: Callable, source=None):
        super().__init__(source)
        self.value = fn
        self.handler = handler

    def as_python_constant(self):
        return self.value

    def python_type(self):
        return type(self.value)

    def truthy(self, tx):
        return True

    def call_function(self, tx, args, kwargs):
        return self.handler(tx, args, kwargs)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.value, name))
        # a class-level function of a handled class (``dict.fromkeys``)
        handler = handler_for(getattr(self.value, name, None))
        if handler is not None:
            return HandlerFunctionVariable(getattr(self.value, name), handler)
        return super().var_getattr(tx, name)

    def __repr__(self):
        return f"HandlerFunctionVariable({getattr(self.value, '__name__', self.value)})"
