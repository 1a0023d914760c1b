"""User-defined objects and classes, Python modules, super(), context managers
(nn.Modules: modules.py, re-exported here)."""
from __future__ import annotations

import abc
import collections
import dataclasses
import os
import types

import torch

from ember.frontend import guards
from ember.frontend.exc import ObservedException, Unsupported
from ember.frontend.source import AttrSource
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.dicts import DictVariable
from ember.frontend.variables.functions import (UserFunctionVariable, UserMethodVariable,
                                                bind_args)

_MISSING = object()


def _static_lookup(cls: type, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


def class_attribute(tx, cls: type, name: str, obj: VariableTracker | None, source):
    """What ``obj.name`` (or ``cls.name`` when obj is None) is when ``name`` is found on the
    class: methods bind, properties run their getter, other values are wrapped."""
    attr = _static_lookup(cls, name)
    if attr is _MISSING:
        return _MISSING
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


def _is_data_descriptor(desc) -> bool:
    return isinstance(desc, property) or hasattr(type(desc), "__set__") or \
        hasattr(type(desc), "__delete__")


class UserDefinedObjectVariable(VariableTracker):
    """An instance of a user class. ``value`` is the real object when it exists outside the
    frame; objects created during capture have ``value=None`` and keep their attributes in
    ``attrs`` (rebuilt after the graph if they escape)."""

    def __init__(self, value, source=None, cls: type | None = None):
        super().__init__(source)
        self.value = value
        self.cls = cls if cls is not None else type(value)
        self.attrs: dict[str, VariableTracker] = {}
        self.is_new = value is None

    mutable = True

    def python_type(self):
        return self.cls

    def var_getattr(self, tx, name):
        getattribute = _static_lookup(self.cls, "__getattribute__")
        if isinstance(getattribute, types.FunctionType) and (
                self.is_new or tx.output.side_effects.attr_stores.get(id(self))):
            # a Python __getattribute__ (config classes remapping names) on an object whose
            # attributes capture holds: run it, its object.__getattribute__ is generic_getattr
            return UserFunctionVariable(getattribute).call_function(
                tx, [self, ConstantVariable(name)], {})
        return self.generic_getattr(tx, name)

    def generic_getattr(self, tx, name):
        """``object.__getattribute__(self, name)``."""
        if name in self.attrs:
            return self.attrs[name]
        override = tx.output.side_effects.pending_attr(self, name)
        if override is not None:
            return override
        if name == "__class__":
            return tx.wrap(self.cls, None)
        if name == "__dict__" and self.is_new:
            return self.instance_dict()
        cls = self.cls
        if name == "__reduce_ex__" and plain_reduce(cls):
            return ReduceExVariable(self)
        if isinstance(self.value, os._Environ) and name in ("get", "__getitem__",
                                                            "__contains__"):
            return RealMethodVariable(getattr(cls, name), self)   # read, guarded by its answer
        if cls in (dict, collections.OrderedDict) and name in ("get", "__getitem__",
                                                                "__contains__"):
            # a dict with keys a DictVariable cannot hold (classes: copy's dispatch tables),
            # only read: each lookup is guarded by its answer, not the whole key list
            return RealMethodVariable(getattr(cls, name), self)
        if not self.is_new and type(cls).__getattribute__ is not type.__getattribute__:
            raise Unsupported(f"metaclass attribute access on {cls.__name__}")
        custom_getattribute = cls.__getattribute__ is not object.__getattribute__
        if custom_getattribute and not self.is_new and not tx.output.side_effects.attr_stores.get(
                id(self)):
            # e.g. config objects that remap attribute names: read the value for real
            try:
                value = getattr(self.value, name)
            except AttributeError as e:
                self._missing(tx, name)
                raise ObservedException(AttributeError, [ConstantVariable(str(e))],
                                        str(e)) from None
            return tx.wrap(value, AttrSource(self.source, name) if self.source else None)
        desc = _static_lookup(cls, name)
        is_data_descriptor = desc is not _MISSING and (
            isinstance(desc, property) or hasattr(type(desc), "__set__"))
        if not is_data_descriptor and not self.is_new:
            inst_dict = getattr(self.value, "__dict__", None)
            if inst_dict is not None and name in inst_dict:
                return tx.wrap(inst_dict[name],
                               AttrSource(self.source, name) if self.source else None)
            if isinstance(inst_dict, dict) and self.source is not None and \
                    desc is not _MISSING:
                # read from the class: an instance attribute set later would shadow it
                tx.output.guards.add(guards.not_in_instance_dict(self.source, name))
        if isinstance(desc, types.MemberDescriptorType) and not self.is_new:
            return tx.wrap(getattr(self.value, name),
                           AttrSource(self.source, name) if self.source else None)
        found = class_attribute(tx, cls, name, self, self.source)
        if found is not _MISSING:
            return found
        getattr_fn = _static_lookup(cls, "__getattr__")
        if isinstance(getattr_fn, types.FunctionType):
            return UserFunctionVariable(getattr_fn).call_function(
                tx, [self, ConstantVariable(name)], {})
        self._missing(tx, name)
        message = f"{cls.__name__!r} object has no attribute {name!r}"
        raise ObservedException(AttributeError, [ConstantVariable(message)], message)

    def _missing(self, tx, name: str) -> None:
        """An attribute found absent: an object from outside the frame may have it on a later
        call (``hasattr``, ``getattr(o, name, default)``), so its absence is guarded."""
        if not self.is_new and self.source is not None:
            tx.output.guards.add(guards.hasattr_match(self.source, name, False))

    def call_function(self, tx, args, kwargs):
        call = _static_lookup(self.cls, "__call__")
        if isinstance(call, types.FunctionType):
            return UserFunctionVariable(call).call_function(tx, [self, *args], kwargs)
        raise Unsupported(f"calling a {self.cls.__name__} object")

    def truthy(self, tx):
        for name in ("__bool__", "__len__"):
            fn = _static_lookup(self.cls, name)
            if isinstance(fn, types.FunctionType):
                out = UserFunctionVariable(fn).call_function(tx, [self], {})
                return bool(out.as_python_constant())
            if fn is not _MISSING:
                raise Unsupported(f"truth value of {self.cls.__name__}")
        return True

    def store_attr(self, tx, name, value):
        """``obj.name = value``: through the class's Python ``__setattr__`` if it has one."""
        setter = _static_lookup(self.cls, "__setattr__")
        if setter is _MISSING or setter is object.__setattr__:
            self.generic_setattr(tx, name, value)
        elif isinstance(setter, types.FunctionType):
            UserFunctionVariable(setter).call_function(tx, [self, ConstantVariable(name), value],
                                                       {})
        else:
            raise Unsupported(f"setting an attribute of a {self.cls.__name__} "
                              f"({type(setter).__name__} __setattr__)")

    def generic_setattr(self, tx, name, value):
        """``object.__setattr__(self, name, value)``."""
        desc = _static_lookup(self.cls, name)
        if isinstance(desc, property) and isinstance(desc.fset, types.FunctionType):
            UserFunctionVariable(desc.fset).call_function(tx, [self, value], {})
            return
        if desc is not _MISSING and hasattr(type(desc), "__set__"):
            raise Unsupported(f"setting {self.cls.__name__}.{name}, a data descriptor")
        if self.is_new:
            self.attrs[name] = value
        else:
            tx.output.side_effects.store_attr(self, name, value)

    def del_attr(self, tx, name):
        """``del obj.name``: through the class's Python ``__delattr__`` if it has one."""
        deleter = _static_lookup(self.cls, "__delattr__")
        if deleter is _MISSING or deleter is object.__delattr__:
            self.generic_delattr(tx, name)
        elif isinstance(deleter, types.FunctionType):
            UserFunctionVariable(deleter).call_function(tx, [self, ConstantVariable(name)], {})
        else:
            raise Unsupported(f"deleting an attribute of a {self.cls.__name__} "
                              f"({type(deleter).__name__} __delattr__)")

    def generic_delattr(self, tx, name):
        """``object.__delattr__(self, name)``, for objects made during capture (a deletion
        on an object from outside the frame is not a replayable side effect yet)."""
        desc = _static_lookup(self.cls, name)
        if not self.is_new or name not in self.attrs or (
                desc is not _MISSING and hasattr(type(desc), "__delete__")):
            raise Unsupported(f"deleting attribute {name!r} of a {self.cls.__name__}")
        del self.attrs[name]

    def instance_dict(self) -> VariableTracker:
        """``obj.__dict__`` of an object made during capture: a live view of ``attrs``."""
        if getattr(self, "_dict_view", None) is None:
            self._dict_view = InstanceDictVariable(self)
        return self._dict_view

    def rebuild(self, cg):
        if not self.is_new:
            raise Unsupported(f"cannot rebuild {self} after the graph")
        from ember.frontend.codegen import new_object
        pairs = ", ".join(f"{k!r}: {cg.reconstruct(v)}" for k, v in self.attrs.items())
        return cg.temp(self, f"{cg.const(new_object)}({cg.const(self.cls)}, {{{pairs}}})")

    def __repr__(self):
        return f"UserDefinedObjectVariable({self.cls.__name__})"


class InstanceDictVariable(DictVariable):
    """``obj.__dict__`` of an object made during capture: its ``items`` are the object's
    ``attrs`` (one dict), so ``y.__dict__.update(state)`` (``copy``'s reconstruction) sets
    attributes and attribute writes show in the dict."""

    def __init__(self, obj: "UserDefinedObjectVariable"):
        super().__init__({})
        self.obj = obj
        self.items = obj.attrs

    @property
    def keys(self):
        return {k: ConstantVariable(k) for k in self.items}

    @keys.setter
    def keys(self, value):
        pass    # the attribute names are the keys

    def setitem(self, key_vt, value_vt):
        key = key_vt.as_python_constant() if key_vt.is_python_constant() else None
        if not isinstance(key, str):
            raise Unsupported("a non-string key in an instance __dict__")
        self.items[key] = value_vt

    def rebuild(self, cg):
        return f"{cg.reconstruct(self.obj)}.__dict__"


class ExceptionVariable(VariableTracker):
    """An exception the traced program raised and an inlined handler caught
    (:class:`~ember.frontend.exc.ObservedException`)."""

    def __init__(self, exc_type: type, args: list[VariableTracker]):
        super().__init__()
        self.exc_type = exc_type
        self.args = args

    def python_type(self):
        return self.exc_type

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        from ember.frontend.variables.containers import TupleVariable
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "__class__":
            return tx.wrap(self.exc_type, None)
        raise Unsupported(f"attribute {name!r} of a {self.exc_type.__name__}")

    def rebuild(self, cg):
        return cg.temp(self, f"{cg.const(self.exc_type)}({cg.items(self.args)})")

    def __repr__(self):
        return f"ExceptionVariable({self.exc_type.__name__})"


def plain_reduce(cls: type) -> bool:
    """True when ``cls`` pickles and copies by ``object``'s own protocol: instances are
    ``copyreg.__newobj__(cls)`` plus the instance ``__dict__`` as state."""
    return (_static_lookup(cls, "__reduce_ex__") is object.__reduce_ex__
            and _static_lookup(cls, "__reduce__") is object.__reduce__
            and _static_lookup(cls, "__getstate__") in (_MISSING, getattr(object, "__getstate__",
                                                                             _MISSING))
            and _static_lookup(cls, "__getnewargs_ex__") is _MISSING
            and _static_lookup(cls, "__getnewargs__") is _MISSING
            and _static_lookup(cls, "__new__") is object.__new__
            and not any("__slots__" in k.__dict__ for k in cls.__mro__)
            and not issubclass(cls, (list, dict)))


class ReduceExVariable(VariableTracker):
    """``obj.__reduce_ex__`` of a plain object (see :func:`plain_reduce`), what
    ``copy.copy``/``copy.deepcopy`` call: ``(copyreg.__newobj__, (cls,), state, None, None)``
    with the instance dict as state (None when empty), as ``object.__reduce_ex__`` answers
    for protocols 2 and above."""

    def __init__(self, obj: "UserDefinedObjectVariable"):
        super().__init__()
        self.obj = obj

    def call_function(self, tx, args, kwargs):
        import copyreg
        from ember.frontend.variables.containers import TupleVariable
        if kwargs or len(args) != 1 or not args[0].is_python_constant() or \
                args[0].as_python_constant() < 2:
            raise Unsupported("__reduce_ex__ with a protocol below 2")
        obj = self.obj
        if obj.is_new:
            state = obj.instance_dict() if obj.attrs else ConstantVariable(None)
        else:
            entry = tx.output.side_effects.attr_stores.get(id(obj))
            if entry and entry[1]:
                raise Unsupported(f"__reduce_ex__ of a {obj.cls.__name__} with attribute "
                                  f"writes not yet applied")
            if obj.source is None:
                raise Unsupported(f"__reduce_ex__ of a {obj.cls.__name__} without a source")
            state = tx.wrap(obj.value.__dict__, AttrSource(obj.source, "__dict__")) \
                if obj.value.__dict__ else ConstantVariable(None)
            if state.is_python_constant() and state.as_python_constant() is None:
                tx.output.guards.add(guards.len_match(AttrSource(obj.source, "__dict__"),
                                                      dict, 0))
        none = ConstantVariable(None)
        return TupleVariable([tx.wrap(copyreg.__newobj__, None),
                              TupleVariable([tx.wrap(obj.cls, None)]), state, none, none])


def new_plain_object(tx, cls: type) -> "UserDefinedObjectVariable":
    """``object.__new__(cls)``: an instance made during capture, with no attributes yet."""
    if cls.__new__ is not object.__new__ or issubclass(cls, BaseException) or \
            getattr(cls, "__abstractmethods__", None) or (
            type(cls) not in (type, abc.ABCMeta) and not dataclasses.is_dataclass(cls)) or \
            any("__slots__" in k.__dict__ for k in cls.__mro__):
        raise Unsupported(f"object.__new__({cls.__name__})")
    obj = UserDefinedObjectVariable(None, cls=cls)
    tx.output.side_effects.track_new_object(obj)
    return obj


def _default_init(cls) -> bool:
    return cls.__init__ is object.__init__


class UserDefinedClassVariable(VariableTracker):
    def __init__(self, cls: type, source=None):
        super().__init__(source)
        self.value = cls

    def as_python_constant(self):
        return self.value

    def python_type(self):
        return type(self.value)

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.value, name))
        meta = type(self.value)
        meta_attr = _static_lookup(meta, name)
        if meta.__getattribute__ is type.__getattribute__ and meta_attr is not _MISSING and \
                _is_data_descriptor(meta_attr) and not isinstance(meta_attr, property):
            # what ``type`` itself answers first: __class__, __mro__, __bases__, __dict__...
            try:
                value = getattr(self.value, name)
            except AttributeError as e:
                raise ObservedException(AttributeError, [ConstantVariable(str(e))],
                                        str(e)) from None
            return tx.wrap(value, None)
        attr = _static_lookup(self.value, name)
        if isinstance(attr, classmethod):
            return UserMethodVariable(tx.wrap(attr.__func__, None), self)
        found = class_attribute(tx, self.value, name, None, self.source)
        if found is not _MISSING:
            return found
        if isinstance(_static_lookup(type(self.value), name), property):
            # a metaclass property: state behind the class (GroupMember.WORLD)
            from ember.frontend.variables.torch_state import read_state
            return read_state(tx, self.value, name, f"{self.value.__qualname__}.{name}")
        raise Unsupported(f"type object {self.value.__name__!r} has no attribute {name!r}")

    def call_function(self, tx, args, kwargs):
        from ember.frontend.variables.containers import NamedTupleVariable, is_namedtuple_class
        cls = self.value
        if is_namedtuple_class(cls):
            new = cls.__new__
            code = getattr(new, "__code__", None)
            if code is None:
                raise Unsupported(f"namedtuple {cls.__name__} without a Python __new__")
            defaults = [tx.wrap(d, None) for d in (new.__defaults__ or ())]
            bound = bind_args(code, cls.__name__, [self, *args], kwargs, defaults, None)
            return NamedTupleVariable([bound[f] for f in cls._fields], cls)
        if issubclass(cls, torch.nn.Module):
            from ember.frontend.variables.modules import create_module
            return create_module(tx, cls, args, kwargs)
        from ember.frontend.variables.dicts import is_plain_dict_subclass
        if is_plain_dict_subclass(cls):
            from ember.frontend.variables.builtins import make_dict
            return make_dict(tx, cls, args, kwargs)
        if dataclasses.is_dataclass(cls) and issubclass(cls, dict):
            return DataclassDictVariable.create(tx, cls, args, kwargs)
        if issubclass(cls, BaseException):
            raise Unsupported(f"creating exception {cls.__name__}")
        if cls.__new__ is not object.__new__:
            raise Unsupported(f"creating a {cls.__name__} (custom __new__ or builtin base)")
        if getattr(cls, "__abstractmethods__", None):
            raise Unsupported(f"instantiating abstract class {cls.__name__}")
        if type(cls) not in (type, abc.ABCMeta) and not dataclasses.is_dataclass(cls):
            raise Unsupported(f"creating a {cls.__name__} (metaclass {type(cls).__name__})")
        obj = UserDefinedObjectVariable(None, cls=cls)
        tx.output.side_effects.track_new_object(obj)
        init = _static_lookup(cls, "__init__")
        if isinstance(init, types.FunctionType):
            UserFunctionVariable(init).call_function(tx, [obj, *args], kwargs)
        elif args or kwargs:
            raise Unsupported(f"{cls.__name__}() takes no arguments")
        post = _static_lookup(cls, "__post_init__")
        if isinstance(post, types.FunctionType) and not dataclasses.is_dataclass(cls):
            pass  # only dataclass __init__ calls __post_init__, and it does so itself
        return obj

    def __repr__(self):
        return f"UserDefinedClassVariable({self.value.__name__})"


TRUSTED_MODULE_PREFIXES = ("torch", "math", "operator", "builtins", "functools", "itertools",
                           "collections", "typing", "numbers", "enum", "dataclasses",
                           "warnings", "inspect", "types", "abc", "copy", "einops")


class PythonModuleVariable(VariableTracker):
    def __init__(self, module: types.ModuleType, source=None):
        super().__init__(source)
        self.value = module

    def as_python_constant(self):
        return self.value

    def python_type(self):
        return types.ModuleType

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        try:
            value = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(f"AttributeError: {e}") from None
        if self.value.__name__.startswith("torch.backends."):
            # flags users switch between calls (cudnn.enabled, allow_tf32): guarded reads
            from ember.frontend.variables.torch_state import read_state
            return read_state(tx, self.value, name, f"{self.value.__name__}.{name}")
        trusted = self.value.__name__.split(".")[0] in TRUSTED_MODULE_PREFIXES
        # Library modules are assumed not to be monkeypatched between calls.
        source = None if trusted or self.source is None else AttrSource(self.source, name)
        return tx.wrap(value, source)

    def __repr__(self):
        return f"PythonModuleVariable({self.value.__name__})"


class SuperVariable(VariableTracker):
    def __init__(self, cls: type, obj: VariableTracker):
        super().__init__()
        self.cls = cls
        self.obj = obj

    def var_getattr(self, tx, name):
        from ember.frontend.variables.modules import (_MODULE_GETATTR, ModuleCallVariable,
                                                      ModuleGetattrVariable,
                                                      NewModuleVariable, NNModuleVariable,
                                                      is_module_call)
        obj_type = self.obj.python_type()
        if isinstance(self.obj, UserDefinedClassVariable):
            obj_type = self.obj.value
        mro = obj_type.__mro__
        start = mro.index(self.cls) + 1 if self.cls in mro else len(mro)
        for klass in mro[start:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if klass is object and name == "__init__":
                    return _NoOpVariable()
                if klass is torch.nn.Module and name == "__init__" and \
                        isinstance(self.obj, NewModuleVariable):
                    return _NoOpVariable()   # create_module already ran it for real
                if is_module_call(attr) and isinstance(self.obj, NNModuleVariable):
                    return ModuleCallVariable(self.obj)   # hooks and forward
                if attr is _MODULE_GETATTR and isinstance(self.obj, NNModuleVariable):
                    return ModuleGetattrVariable(self.obj)
                if isinstance(attr, types.FunctionType):
                    return UserMethodVariable(UserFunctionVariable(attr), self.obj)
                if isinstance(attr, classmethod):
                    return UserMethodVariable(UserFunctionVariable(attr.__func__),
                                              tx.wrap(obj_type, None))
                if isinstance(attr, staticmethod):
                    return UserFunctionVariable(attr.__func__)
                if isinstance(attr, property) and attr.fget is not None:
                    return tx.wrap(attr.fget, None).call_function(tx, [self.obj], {})
                if klass is torch.nn.Module and name == "__init__":
                    raise Unsupported("nn.Module.__init__ inside a compiled region")
                real = builtin_method(klass, name, attr, self.obj)
                if real is not None:
                    return real
                if attr in _OBJECT_ATTRIBUTE_SLOTS:
                    from ember.frontend.variables.functions import PartialVariable
                    return PartialVariable(tx.wrap(attr, None), [self.obj], {})
                return tx.wrap(attr, None)
        raise Unsupported(f"super().{name} not found")


_OBJECT_ATTRIBUTE_SLOTS = (object.__getattribute__, object.__setattr__, object.__delattr__)


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


class _NoOpVariable(VariableTracker):
    def call_function(self, tx, args, kwargs):
        return ConstantVariable(None)


class ContextManagerVariable(VariableTracker):
    """A ``with`` target the evaluator understands. ``enter``/``exit`` act at capture time
    and record what the compiled graph must do."""

    def enter(self, tx) -> VariableTracker:
        raise NotImplementedError

    def exit(self, tx) -> None:
        raise NotImplementedError

    def truthy(self, tx):
        return True

    def var_getattr(self, tx, name):
        if name == "__enter__":
            return CtxMethodVariable(self, self.enter, name)
        if name == "__exit__":
            return CtxMethodVariable(self, lambda tx: (self.exit(tx), ConstantVariable(None))[1],
                                     name)
        return super().var_getattr(tx, name)


class CtxMethodVariable(VariableTracker):
    """``ctx.__enter__`` or ``ctx.__exit__`` of a context manager the evaluator understands
    (a ``with`` block keeps the exit on the stack until the block ends)."""

    def __init__(self, ctx, fn, name: str):
        super().__init__()
        self.ctx = ctx
        self.fn = fn
        self.name = name

    def call_function(self, tx, args, kwargs):
        return self.fn(tx)

    def rebuild(self, cg):
        if isinstance(self.ctx, GradModeVariable) and self.name == "__exit__":
            return cg.const(GradModeExit(self.ctx.restore_mode()))
        return super().rebuild(cg)


class GradModeVariable(ContextManagerVariable):
    """``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(b)``: the graph
    gets ``torch._C._set_grad_enabled`` nodes, and capture follows the same mode."""

    def __init__(self, mode: bool, applied_on_create: bool = False,
                 before_create: bool | None = None):
        super().__init__()
        self.mode = mode
        self.prior: list[bool | None] = []
        self.before_create = before_create
        if applied_on_create:
            self.prior.append(None)  # set_grad_enabled(...) already took effect

    def python_type(self):
        return torch.autograd.grad_mode.no_grad if not self.mode else \
            torch.autograd.grad_mode.enable_grad

    def enter(self, tx):
        if self.prior and self.prior[-1] is None:
            return ConstantVariable(None)
        self.prior.append(torch.is_grad_enabled())
        tx.output.set_grad_enabled(self.mode)
        return ConstantVariable(None)

    def exit(self, tx):
        mode = self.restore_mode()
        self.prior.pop()
        tx.output.set_grad_enabled(mode)

    def restore_mode(self) -> bool:
        """The grad mode the innermost open block of this manager restores on exit."""
        prior = self.prior[-1]
        return self.before_create if prior is None else prior

    def call_function(self, tx, args, kwargs):
        # used as a decorator: @torch.no_grad() def f(...)
        if self.prior or self.before_create is not None or len(args) != 1 or kwargs:
            raise Unsupported("set_grad_enabled(...) as a decorator inside a compiled region")
        return GradModeFunctionVariable(args[0], self.mode)

    def rebuild(self, cg):
        if self.prior or self.before_create is not None:
            return super().rebuild(cg)     # an open block or set_grad_enabled: not a value
        return cg.const(torch.enable_grad() if self.mode else torch.no_grad())


class GradModeFunctionVariable(VariableTracker):
    """A function decorated inside the frame with ``@torch.no_grad()`` or
    ``@torch.enable_grad()``: a call runs the function in that mode, recorded in the graph
    like a ``with`` block around it."""

    def __init__(self, fn: VariableTracker, mode: bool):
        super().__init__()
        self.fn = fn
        self.mode = mode

    def python_type(self):
        return types.FunctionType

    def truthy(self, tx):
        return True

    def call_function(self, tx, args, kwargs):
        prior = torch.is_grad_enabled()
        tx.output.set_grad_enabled(self.mode)
        result = tx.call(self.fn, args, kwargs)
        tx.output.set_grad_enabled(prior)
        return result

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__wrapped__"):
            return self.fn if name == "__wrapped__" else tx.getattr(self.fn, name)
        return super().var_getattr(tx, name)

    def rebuild(self, cg):
        manager = torch.enable_grad() if self.mode else torch.no_grad()
        return f"{cg.const(manager)}({cg.reconstruct(self.fn)})"


class GlobalContextVariable(ContextManagerVariable):
    """A ``torch.autocast(...)`` or ``torch.inference_mode(...)`` block. Entered for real
    while capture is inside it (fake ops then see autocast's casts), and recorded in the
    graph as the enter/exit calls TorchDynamo also records (``torch.amp._enter_autocast``),
    so the compiled graph switches the same state around the same ops."""

    def __init__(self, enter_fn, exit_fn, args: tuple, py_type: type):
        super().__init__()
        self.enter_fn, self.exit_fn, self.args = enter_fn, exit_fn, args
        self.py_type = py_type
        self.open: list[tuple[object, object]] = []     # (real context, its graph node)

    def python_type(self):
        return self.py_type

    def enter(self, tx):
        real = tx.output.enter_global_context(self.enter_fn, self.exit_fn, self.args, self)
        node = tx.output.graph.call_function(self.enter_fn, self.args)
        self.open.append((real, node))
        return ConstantVariable(None)

    def exit(self, tx):
        real, node = self.open.pop()
        tx.output.exit_global_context(real)
        tx.output.graph.call_function(self.exit_fn, (node,))

    def call_function(self, tx, args, kwargs):
        raise Unsupported(f"{self.py_type.__name__} as a decorator inside a compiled region")

    def reentry_text(self, cg) -> str:
        """An expression making a :class:`GlobalContextReentry` of this block, for the
        entry of a graph break inside it."""
        return f"{cg.const(GlobalContextReentry)}({cg.const(self.py_type)}, {cg.const(self.args)})"


# py_type of a GlobalContextVariable -> (its graph's enter function, exit function)
GLOBAL_CONTEXTS = {
    torch.autocast: (torch.amp.autocast_mode._enter_autocast,
                     torch.amp.autocast_mode._exit_autocast),
    torch.inference_mode: (torch.autograd.grad_mode._enter_inference_mode,
                           torch.autograd.grad_mode._exit_inference_mode),
}


class GlobalContextReentry:
    """An autocast or inference-mode block open at a graph break, handed to the resume
    function, whose prologue enters it again (``BEFORE_WITH``) so that its ``__exit__``
    lies on the stack where the block left it. The graph before the break closed the block
    and the entry ran the instruction inside a real one; the resume function's capture
    models it in its own graph again. Run for real (a resume that runs eagerly), it enters
    a fresh ``py_type(*args)``."""
    __slots__ = ("py_type", "args", "_real")

    def __init__(self, py_type: type, args: tuple):
        self.py_type, self.args = py_type, args
        self._real: list = []

    def __enter__(self):
        real = self.py_type(*self.args)
        self._real.append(real)
        return real.__enter__()

    def __exit__(self, *exc_info):
        return self._real.pop().__exit__(*exc_info)

    def __repr__(self):
        return f"GlobalContextReentry({self.py_type.__name__}{self.args!r})"


class GradModeExit:
    """The exit of an open grad-mode ``with`` block, handed to a resume function after a
    graph break (the block's ``__exit__`` on the stack): restores grad mode to ``mode``."""
    __slots__ = ("mode",)

    def __init__(self, mode: bool):
        self.mode = mode

    def __call__(self, *exc_info) -> bool:
        torch._C._set_grad_enabled(self.mode)
        return False    # never swallows the exception

    def __repr__(self):
        return f"GradModeExit({self.mode})"


class GradModeExitVariable(VariableTracker):
    """A :class:`GradModeExit` read from a resume function's arguments."""

    def __init__(self, mode: bool, source=None):
        super().__init__(source)
        self.mode = mode

    def python_type(self):
        return GradModeExit

    def call_function(self, tx, args, kwargs):
        tx.output.set_grad_enabled(self.mode)
        return ConstantVariable(False)


class DataclassDictVariable(VariableTracker):
    """A dataclass that is also a dict (HuggingFace's ``ModelOutput``): fields are attributes,
    the non-None ones are also its items in field order, and ``obj[i]`` indexes them."""

    def __init__(self, cls, fields: dict[str, VariableTracker]):
        super().__init__()
        self.cls = cls
        self.fields = fields

    @classmethod
    def create(cls_, tx, cls, args, kwargs):
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        if len(args) > len(names):
            raise Unsupported(f"too many arguments for {cls.__name__}")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in values:
                raise Unsupported(f"bad keyword {k!r} for {cls.__name__}")
            values[k] = v
        for f in dataclasses.fields(cls):
            if f.name not in values:
                if f.default is not dataclasses.MISSING:
                    values[f.name] = tx.wrap_constant(f.default)
                elif f.default_factory is not dataclasses.MISSING:
                    values[f.name] = tx.wrap_constant(f.default_factory())
                else:
                    raise Unsupported(f"missing field {f.name!r} for {cls.__name__}")
        post = _static_lookup(cls, "__post_init__")
        if post is not _MISSING and getattr(post, "__module__", "").split(".")[0] \
                not in ("transformers",):
            raise Unsupported(f"{cls.__name__}.__post_init__ is not understood")
        return cls_(cls, values)

    def python_type(self):
        return self.cls

    def present(self) -> dict[str, VariableTracker]:
        return {k: v for k, v in self.fields.items()
                if not (isinstance(v, ConstantVariable) and v.value is None)}

    def truthy(self, tx):
        return bool(self.present())

    def var_getattr(self, tx, name):
        if name in self.fields:
            return self.fields[name]
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__", "__len__",
                    "__contains__", "__iter__"):
            from ember.frontend.variables.functions import BoundMethodVariable
            return BoundMethodVariable(self, name)
        found = class_attribute(tx, self.cls, name, self, None)
        if found is not _MISSING:
            return found
        raise Unsupported(f"AttributeError: {self.cls.__name__} has no attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        from ember.frontend.variables.container_iterators import ListIteratorVariable
        from ember.frontend.variables.containers import TupleVariable
        present = self.present()
        if name == "to_tuple":
            return TupleVariable(list(present.values()))
        if name == "keys":
            return TupleVariable([ConstantVariable(k) for k in present])
        if name == "values":
            return TupleVariable(list(present.values()))
        if name == "items":
            return TupleVariable([TupleVariable([ConstantVariable(k), v])
                                  for k, v in present.items()])
        if name == "__len__":
            return ConstantVariable(len(present))
        if name == "__iter__":
            return ListIteratorVariable([ConstantVariable(k) for k in present])
        if name == "__contains__":
            return ConstantVariable(args[0].as_python_constant() in present)
        if name in ("__getitem__", "get"):
            key = args[0].as_python_constant()
            if isinstance(key, str):
                if key in present:
                    return present[key]
                if name == "get":
                    return args[1] if len(args) > 1 else ConstantVariable(None)
                raise Unsupported(f"KeyError: {key!r}")
            values = list(present.values())
            return TupleVariable(values[key]) if isinstance(key, slice) else values[key]
        return super().call_method(tx, name, args, kwargs)

    def store_attr(self, tx, name, value):
        self.fields[name] = value

    def rebuild(self, cg):
        pairs = ", ".join(f"{k}={cg.reconstruct(v)}" for k, v in self.fields.items())
        return cg.temp(self, f"{cg.const(self.cls)}({pairs})")

    def unpack(self, tx):
        return [ConstantVariable(k) for k in self.present()]


_MODULE_NAMES = {"NNModuleVariable", "NewModuleVariable", "CompiledModuleVariable",
                 "ModuleCallVariable", "create_module", "real_module_argument"}


def __getattr__(name):
    # nn.Module handling lives in modules.py (built on the helpers above); its trackers are
    # also reachable from here, loaded on first use so either module may be imported first
    if name in _MODULE_NAMES:
        from ember.frontend.variables import modules
        return getattr(modules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
