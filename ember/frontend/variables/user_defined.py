"""User-defined objects and classes: instances (real ones from outside the frame and ones
made during capture), their ``__dict__``, ``copy``'s reduce protocol, class calls, and
dataclasses that are also dicts (HuggingFace's ``ModelOutput``)."""
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
from ember.frontend.variables.attribute_lookup import (MISSING, RealMethodVariable, class_attribute,
                                                       is_data_descriptor, static_lookup)
from ember.frontend.variables.base import BoundMethodVariable, ConstantVariable, VariableTracker
from ember.frontend.variables.container_iterators import ListIteratorVariable
from ember.frontend.variables.containers import (NamedTupleVariable, TupleVariable,
                                                 is_namedtuple_class)
from ember.frontend.variables.dicts import DictVariable, is_plain_dict_subclass, make_dict
from ember.frontend.variables.functions import UserFunctionVariable, UserMethodVariable, bind_args
from ember.frontend.variables.modules import create_module
from ember.frontend.variables.torch_state import read_state


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
        getattribute = static_lookup(self.cls, "__getattribute__")
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
        desc = static_lookup(cls, name)
        is_data_descriptor = desc is not MISSING and (
            isinstance(desc, property) or hasattr(type(desc), "__set__"))
        if not is_data_descriptor and not self.is_new:
            inst_dict = getattr(self.value, "__dict__", None)
            if inst_dict is not None and name in inst_dict:
                return tx.wrap(inst_dict[name],
                               AttrSource(self.source, name) if self.source else None)
            if isinstance(inst_dict, dict) and self.source is not None and \
                    desc is not MISSING:
                # read from the class: an instance attribute set later would shadow it
                tx.output.guards.add(guards.not_in_instance_dict(self.source, name))
        if isinstance(desc, types.MemberDescriptorType) and not self.is_new:
            return tx.wrap(getattr(self.value, name),
                           AttrSource(self.source, name) if self.source else None)
        found = class_attribute(tx, cls, name, self, self.source)
        if found is not MISSING:
            return found
        getattr_fn = static_lookup(cls, "__getattr__")
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
        call = static_lookup(self.cls, "__call__")
        if isinstance(call, types.FunctionType):
            return UserFunctionVariable(call).call_function(tx, [self, *args], kwargs)
        raise Unsupported(f"calling a {self.cls.__name__} object")

    def truthy(self, tx):
        for name in ("__bool__", "__len__"):
            fn = static_lookup(self.cls, name)
            if isinstance(fn, types.FunctionType):
                out = UserFunctionVariable(fn).call_function(tx, [self], {})
                return bool(out.as_python_constant())
            if fn is not MISSING:
                raise Unsupported(f"truth value of {self.cls.__name__}")
        return True

    def store_attr(self, tx, name, value):
        """``obj.name = value``: through the class's Python ``__setattr__`` if it has one."""
        setter = static_lookup(self.cls, "__setattr__")
        if setter is MISSING or setter is object.__setattr__:
            self.generic_setattr(tx, name, value)
        elif isinstance(setter, types.FunctionType):
            UserFunctionVariable(setter).call_function(tx, [self, ConstantVariable(name), value],
                                                       {})
        else:
            raise Unsupported(f"setting an attribute of a {self.cls.__name__} "
                              f"({type(setter).__name__} __setattr__)")

    def generic_setattr(self, tx, name, value):
        """``object.__setattr__(self, name, value)``."""
        desc = static_lookup(self.cls, name)
        if isinstance(desc, property) and isinstance(desc.fset, types.FunctionType):
            UserFunctionVariable(desc.fset).call_function(tx, [self, value], {})
            return
        if desc is not MISSING and hasattr(type(desc), "__set__"):
            raise Unsupported(f"setting {self.cls.__name__}.{name}, a data descriptor")
        if self.is_new:
            self.attrs[name] = value
        else:
            tx.output.side_effects.store_attr(self, name, value)

    def del_attr(self, tx, name):
        """``del obj.name``: through the class's Python ``__delattr__`` if it has one."""
        deleter = static_lookup(self.cls, "__delattr__")
        if deleter is MISSING or deleter is object.__delattr__:
            self.generic_delattr(tx, name)
        elif isinstance(deleter, types.FunctionType):
            UserFunctionVariable(deleter).call_function(tx, [self, ConstantVariable(name)], {})
        else:
            raise Unsupported(f"deleting an attribute of a {self.cls.__name__} "
                              f"({type(deleter).__name__} __delattr__)")

    def generic_delattr(self, tx, name):
        """``object.__delattr__(self, name)``, for objects made during capture (a deletion
        on an object from outside the frame is not a replayable side effect yet)."""
        desc = static_lookup(self.cls, name)
        if not self.is_new or name not in self.attrs or (
                desc is not MISSING and hasattr(type(desc), "__delete__")):
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


def plain_reduce(cls: type) -> bool:
    """True when ``cls`` pickles and copies by ``object``'s own protocol: instances are
    ``copyreg.__newobj__(cls)`` plus the instance ``__dict__`` as state."""
    return (static_lookup(cls, "__reduce_ex__") is object.__reduce_ex__
            and static_lookup(cls, "__reduce__") is object.__reduce__
            and static_lookup(cls, "__getstate__") in (MISSING, getattr(object, "__getstate__",
                                                                             MISSING))
            and static_lookup(cls, "__getnewargs_ex__") is MISSING
            and static_lookup(cls, "__getnewargs__") is MISSING
            and static_lookup(cls, "__new__") is object.__new__
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
        meta_attr = static_lookup(meta, name)
        if meta.__getattribute__ is type.__getattribute__ and meta_attr is not MISSING and \
                is_data_descriptor(meta_attr) and not isinstance(meta_attr, property):
            # what ``type`` itself answers first: __class__, __mro__, __bases__, __dict__...
            try:
                value = getattr(self.value, name)
            except AttributeError as e:
                raise ObservedException(AttributeError, [ConstantVariable(str(e))],
                                        str(e)) from None
            return tx.wrap(value, None)
        attr = static_lookup(self.value, name)
        if isinstance(attr, classmethod):
            return UserMethodVariable(tx.wrap(attr.__func__, None), self)
        found = class_attribute(tx, self.value, name, None, self.source)
        if found is not MISSING:
            return found
        if isinstance(static_lookup(type(self.value), name), property):
            # a metaclass property: state behind the class (GroupMember.WORLD)
            return read_state(tx, self.value, name, f"{self.value.__qualname__}.{name}")
        raise Unsupported(f"type object {self.value.__name__!r} has no attribute {name!r}")

    def call_function(self, tx, args, kwargs):
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
            return create_module(tx, cls, args, kwargs)
        if is_plain_dict_subclass(cls):
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
        init = static_lookup(cls, "__init__")
        if isinstance(init, types.FunctionType):
            UserFunctionVariable(init).call_function(tx, [obj, *args], kwargs)
        elif args or kwargs:
            raise Unsupported(f"{cls.__name__}() takes no arguments")
        post = static_lookup(cls, "__post_init__")
        if isinstance(post, types.FunctionType) and not dataclasses.is_dataclass(cls):
            pass  # only dataclass __init__ calls __post_init__, and it does so itself
        return obj

    def __repr__(self):
        return f"UserDefinedClassVariable({self.value.__name__})"


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
        post = static_lookup(cls, "__post_init__")
        if post is not MISSING and getattr(post, "__module__", "").split(".")[0] \
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
            return BoundMethodVariable(self, name)
        found = class_attribute(tx, self.cls, name, self, None)
        if found is not MISSING:
            return found
        raise Unsupported(f"AttributeError: {self.cls.__name__} has no attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
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
