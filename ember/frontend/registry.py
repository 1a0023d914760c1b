"""Which callables compiled code must not trace: ``ember.disable`` and ``ember.allow_in_graph``.

The public API (``ember.api``) registers functions here; the frontend reads the registries
while capturing. Keeping them in the frontend means the evaluator never imports the API.
"""
from __future__ import annotations

import inspect
import types
import weakref
from typing import Any, Callable

_disabled: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_disabled_codes: set[types.CodeType] = set()
_allowed_in_graph: dict[int, Any] = {}   # id -> callable (held, so the id stays unique)


def unwrap_compiled(fn: Any) -> Any:
    """The user function behind an Ember-compiled callable (itself otherwise)."""
    return fn.__wrapped__ if getattr(type(fn), "_ember_wrapper", None) == "function" else fn


def disable(fn: Callable) -> Callable:
    target = unwrap_compiled(fn)
    code = getattr(inspect.unwrap(target), "__code__", None)
    if code is not None:
        _disabled_codes.add(code)
    try:
        _disabled[target] = True
    except TypeError:
        pass
    return target


def is_disabled(fn: Any) -> bool:
    try:
        if _disabled.get(fn):
            return True
    except TypeError:
        pass
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None) in _disabled_codes


def is_disabled_code(code: types.CodeType) -> bool:
    return code in _disabled_codes


def allow_in_graph(fn: Callable) -> Callable:
    if not callable(fn):
        raise TypeError(f"allow_in_graph expects a callable, got {type(fn).__name__}")
    _allowed_in_graph[id(fn)] = fn
    return fn


def is_allowed_in_graph(fn: Any) -> bool:
    return _allowed_in_graph.get(id(fn)) is fn
