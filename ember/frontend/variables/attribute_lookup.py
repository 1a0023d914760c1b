"""How a name resolves on a class during capture: the static MRO lookup, descriptors
(methods, properties, static and class methods) and the read-only methods of builtin bases,
shared by user objects, nn.Modules, containers of user subclasses and ``super()``."""
from __future__ import annotations

import types

from ember.frontend import guards
from ember.frontend.exc import ObservedException, Unsupported
from ember.frontend.source import AttrSource
from ember.frontend.variables.base import VariableTracker
from ember.frontend.variables.functions import UserFunctionVariable, UserMethodVariable


# what static_lookup answers for a name no class in the MRO defines (None is a value)
MISSING = object()


def static_lookup(cls: type, name: str):
    """``name`` from the first class dict along ``cls.__mro__`` (no descriptor call), or
    :data:`MISSING`."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return MISSING


def class_attribute(tx, cls: type, name: str, obj: VariableTracker | None, source):
    """What ``obj.name`` (or ``cls.name`` when obj is None) is when ``name`` is found on the
    class: methods bind, properties run their getter, other values are wrapped."""
    attr = static_lookup(cls, name)
    if attr is MISSING:
        return MISSING
    if isinstance(attr, staticmethod):
        return tx.wrap(attr.__func__, None)
    if isinstance(attr, classmethod):
        return UserMethodVariable(tx.wrap(attr.__func__, None), tx.wrap(cls, None))
    if isinstance(attr, property):
        if obj is None:
            return tx.wrap(attr, None)
        if attr.fget is None:
            raise Unsupported(f"unreadable property {name!r}")
        return tx.wrap(attr.fget, None).call_function(tx, [obj], {})
    if isinstance(attr, types.FunctionType):
        fn = UserFunctionVariable(attr)
        return fn if obj is None else UserMethodVariable(fn, obj)
    if obj is not None and hasattr(attr, "__get__") and not isinstance(attr, type):
        real = builtin_method(cls, name, attr, obj)
        if real is not None:
            return real
        raise Unsupported(f"descriptor {type(attr).__name__} for attribute {name!r}")
    return tx.wrap(attr, AttrSource(source, name) if source is not None else None)


def is_data_descriptor(desc) -> bool:
    """Whether ``desc`` takes precedence over an instance ``__dict__`` entry."""
    return isinstance(desc, property) or hasattr(type(desc), "__set__") or \
        hasattr(type(desc), "__delete__")


_READ_ONLY_METHODS = {"get", "keys", "values", "items", "__getitem__", "__contains__", "__len__",
                      "copy", "index", "count"}


class RealMethodVariable(VariableTracker):
    """A read-only method of a builtin base class (``dict.get``) on a real object that exists
    outside the frame: called for real with constant arguments; the answer is guarded."""

    def __init__(self, method, obj: VariableTracker):
        super().__init__()
        self.method = method
        self.obj = obj

    def call_function(self, tx, args, kwargs):
        if kwargs or self.obj.source is None:
            raise Unsupported(f"{self.method.__qualname__} with keywords or on an unsourced object")
        try:
            const_args = tuple(a.as_python_constant() for a in args)
        except Exception:
            raise Unsupported(f"{self.method.__qualname__} with non-constant arguments") from None
        if self.method.__name__ == "__getitem__" and isinstance(self.obj.value, dict) and \
                const_args[0] not in self.obj.value:
            tx.output.guards.add(guards.call_result_match(
                self.obj.source, type(self.obj.value).__contains__, const_args, False))
            raise ObservedException(KeyError, list(args), repr(const_args[0]))
        try:
            result = self.method(self.obj.value, *const_args)
        except Exception as e:
            raise Unsupported(f"{type(e).__name__} from {self.method.__qualname__}: {e}") \
                from None
        tx.output.guards.add(guards.call_result_match(self.obj.source, self.method, const_args,
                                                      result))
        return tx.wrap(result, None)


# the builtin classes whose read-only methods answer plain values (an extension type's may
# answer an array, which a guard's ``==`` cannot compare)
_PLAIN_BUILTINS = (dict, list, tuple, str, bytes, set, frozenset, int, float, bool, object)


def builtin_method(cls: type, name: str, attr, obj: VariableTracker):
    """A read-only builtin method bound to a real object, or None."""
    if name in _READ_ONLY_METHODS and type(attr).__name__ in (
            "method_descriptor", "wrapper_descriptor") and getattr(obj, "value", None) \
            is not None and getattr(attr, "__objclass__", None) in _PLAIN_BUILTINS:
        return RealMethodVariable(attr, obj)
    return None
