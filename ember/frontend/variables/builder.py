"""Wrapping real Python values from the frame into trackers, installing guards.

``wrap(tx, value, source)`` decides what a value is during capture. With a source, the guards
that make the decision safe are added (a tensor's metadata, a constant's value, a module's or
function's identity, a container's length or keys); without one (values made by constant
folding, attributes of library modules) nothing is guarded.
"""
from __future__ import annotations

import collections
import functools
import itertools
import operator
import types

import torch

from ember.frontend import guards, trace_rules
from ember.frontend.exc import Unsupported
from ember.frontend.source import AttrSource, GetItemSource, LocalSource, Source
from ember.frontend.variables.base import ConstantVariable, VariableTracker, is_constant_value
from ember.frontend.variables.symbolic import SYM_TYPES, wrap_sym
# modules whose handlers register on import
from ember.frontend.variables import introspection, iterators, numpy  # noqa: F401
from ember.frontend.variables.builtins import GetterVariable
from ember.frontend.variables.container_iterators import (ResumedDequeIterator,
                                                          ResumedDictIterator,
                                                          ResumedListIterator,
                                                          ResumedSetIterator,
                                                          ResumedWrapperIterator)
from ember.frontend.variables.containers import (DequeVariable, ListVariable, NamedTupleVariable,
                                                 SizeVariable, TupleVariable, is_namedtuple_class,
                                                 is_structseq_class)
from ember.frontend.variables.ctx_manager import (GLOBAL_CONTEXTS, PROFILER_RANGE_EXIT,
                                                  PROFILER_RANGES, GlobalContextReentry,
                                                  GlobalContextVariable, GradModeExit,
                                                  GradModeExitVariable, ProfilerRangeExitVariable,
                                                  ProfilerRangeVariable)
from ember.frontend.variables.dicts import DictVariable, SetVariable, is_plain_dict_subclass
from ember.frontend.variables.functions import (GraphCallableVariable, PartialVariable,
                                                UserFunctionVariable, UserMethodVariable)
from ember.frontend.variables.handlers import HandlerFunctionVariable, handler_for
from ember.frontend.variables.modules import CompiledModuleVariable, NNModuleVariable
from ember.frontend.variables.python_module import PythonModuleVariable
from ember.frontend.variables.storage import UntypedStorageVariable
from ember.frontend.variables.tensor import TensorMethodVariable
from ember.frontend.variables.torch_functions import is_graph_callable, special_handler
from ember.frontend.variables.torch_state import TorchStateObjectVariable, is_torch_state_object
from ember.frontend.variables.user_defined import (UserDefinedClassVariable,
                                                   UserDefinedObjectVariable)


# Values tracked by identity: one tracker per object, however many names reach it, so a
# mutation through one name is seen through every other (see OutputGraph.tracked).
_BY_IDENTITY = (list, dict, collections.OrderedDict, collections.defaultdict, set,
                collections.deque)


def wrap(tx, value, source: Source | None) -> VariableTracker:
    if source is not None and (type(value) in _BY_IDENTITY or _is_user_object(value)):
        known = tx.output.tracked_object(value)
        if known is not None:
            if known.source is not None and known.source != source:
                tx.output.guards.add(guards.same_object(source, known.source))
            return known
        vt = _wrap(tx, value, source)
        if vt.source == source:   # not a wrapper unwrapped to what it wraps
            tx.output.track_object(value, vt)
        return vt
    return _wrap(tx, value, source)


def _is_user_object(value) -> bool:
    """An object whose attributes compiled code may change (modules, user instances)."""
    if isinstance(value, torch.nn.Module):
        return True
    typ = type(value)
    return (hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType,
            types.FunctionType, types.MethodType, functools.partial))
            and not is_constant_value(value) and not typ.__module__.startswith("torch"))


def _wrap(tx, value, source: Source | None) -> VariableTracker:
    add = tx.output.guards.add if source is not None else (lambda g: None)

    if isinstance(value, types.CellType):   # one tracker per cell: reads see its writes
        add(guards.type_match(source, types.CellType))
        return tx.cell_for(value, AttrSource(source, "cell_contents") if source else None,
                           cell_source=source)
    if isinstance(value, SYM_TYPES):     # a size computed during capture (no source)
        return wrap_sym(value)
    if type(value) is int and isinstance(source, LocalSource):
        # an int argument of the frame: a symbol if the dynamic= policy says so
        sym = tx.output.symbolic.int_input(value, source)
        if sym is not None:
            return wrap_sym(sym)
    if is_constant_value(value):
        add(guards.constant_match(source, value) if not isinstance(value, (
            torch.dtype, types.CodeType)) else guards.id_match(source, value))
        return ConstantVariable(value, source)
    if isinstance(value, torch.Tensor):
        return tx.output.add_input(value, source)
    if isinstance(value, torch.nn.Module):
        add(guards.id_match(source, value))
        if getattr(type(value), "_ember_wrapper", None) == "module":
            # its own type to type()/isinstance; the original module for everything else
            inner = wrap(tx, value._orig_mod,
                         AttrSource(source, "_orig_mod") if source is not None else None)
            return CompiledModuleVariable(inner, value, source)
        return NNModuleVariable(value, source)
    if type(value) is GlobalContextReentry and value.py_type in GLOBAL_CONTEXTS:
        add(guards.type_match(source, GlobalContextReentry))
        add(guards.id_match(AttrSource(source, "py_type"), value.py_type))
        add(guards.constant_match(AttrSource(source, "args"), value.args))
        enter_fn, exit_fn = GLOBAL_CONTEXTS[value.py_type]
        return GlobalContextVariable(enter_fn, exit_fn, value.args, value.py_type)
    if type(value) is ResumedDictIterator and source is not None:
        # a loop over a dict continued by a resume function: tracked again as the frame's
        # live iterator, at the same position over the same dict
        if not value.unchanged():
            raise Unsupported("a dict iterator whose dict changed (its next step raises)")
        add(guards.type_match(source, ResumedDictIterator))
        add(guards.call_result_match(source, ResumedDictIterator.unchanged, (), True))
        for attr in ("kind", "reverse", "pos"):
            add(guards.constant_match(AttrSource(source, attr), getattr(value, attr)))
        dict_vt = wrap(tx, value.dict, AttrSource(source, "dict"))
        if not isinstance(dict_vt, DictVariable):
            raise Unsupported("a dict iterator over a dict that cannot be tracked")
        it = dict_vt.live_iterator(value.kind, value.reverse)
        it.index = value.pos
        return it
    if type(value) is ResumedListIterator and source is not None:
        # a loop over a list continued by a resume function: the frame's live iterator
        add(guards.type_match(source, ResumedListIterator))
        for attr in ("pos", "reverse", "done"):
            add(guards.constant_match(AttrSource(source, attr), getattr(value, attr)))
        list_vt = wrap(tx, value.list, AttrSource(source, "list"))
        if type(list_vt) is not ListVariable:
            raise Unsupported("a list iterator over a list that cannot be tracked")
        it = list_vt.live_iterator(value.reverse)
        it.index, it.exhausted = value.pos, value.done
        return it
    if type(value) is ResumedSetIterator and source is not None:
        # a loop over a set continued by a resume function, the set unchanged since
        if not value.resumable():
            raise Unsupported("a set iterator whose set changed or iterates in an order "
                              "capture did not know")
        add(guards.type_match(source, ResumedSetIterator))
        add(guards.call_result_match(source, ResumedSetIterator.resumable, (), True))
        add(guards.constant_match(AttrSource(source, "pos"), value.pos))
        set_vt = wrap(tx, value.set, AttrSource(source, "set"))
        if type(set_vt) is not SetVariable or set_vt.frozen:
            raise Unsupported("a set iterator over a set that cannot be tracked")
        # the order the set iterates in (the guard on the set compares it as a set)
        add(guards.constant_match(AttrSource(source, "items"), value.items))
        it = set_vt.live_iterator()
        it.index = value.pos
        return it
    if type(value) is ResumedDequeIterator and source is not None:
        if not value.unchanged():
            raise Unsupported("a deque iterator whose deque changed (its next step raises)")
        add(guards.type_match(source, ResumedDequeIterator))
        add(guards.call_result_match(source, ResumedDequeIterator.unchanged, (), True))
        for attr in ("pos", "reverse"):
            add(guards.constant_match(AttrSource(source, attr), getattr(value, attr)))
        deque_vt = wrap(tx, value.deque, AttrSource(source, "deque"))
        if type(deque_vt) is not DequeVariable:
            raise Unsupported("a deque iterator over a deque that cannot be tracked")
        it = deque_vt.live_iterator(value.reverse)
        it.index = value.pos
        return it
    if type(value) is ResumedWrapperIterator and source is not None:
        # enumerate/zip/map/filter over a dict iterator, continued by a resume function:
        # made again by the builtin's handler over its sources, tracked again
        if not value.fresh:
            raise Unsupported("a wrapped dict iterator already advanced outside the graph")
        add(guards.type_match(source, ResumedWrapperIterator))
        add(guards.constant_match(AttrSource(source, "fresh"), True))
        add(guards.id_match(AttrSource(source, "fn"), value.fn))
        head = wrap(tx, value.head, AttrSource(source, "head"))
        sources = [tx.get_iter(s) for s in
                   wrap(tx, value.sources, AttrSource(source, "sources")).unpack(tx)]
        if value.fn is zip:
            return handler_for(zip)(tx, sources, {"strict": head})
        if value.fn is itertools.chain:
            return handler_for(value.fn)(tx, sources, {})
        if value.fn is itertools.islice:
            return handler_for(value.fn)(tx, [sources[0], *head.unpack(tx)], {})
        if value.fn is enumerate:
            return handler_for(enumerate)(tx, [sources[0], head], {})
        return handler_for(value.fn)(tx, [head, *sources], {})
    if type(value) is GradModeExit:
        add(guards.type_match(source, GradModeExit))
        add(guards.constant_match(AttrSource(source, "mode"), value.mode))
        return GradModeExitVariable(value.mode, source)
    if value is PROFILER_RANGE_EXIT:
        add(guards.id_match(source, value))
        return ProfilerRangeExitVariable(source)
    if type(value) in PROFILER_RANGES:
        # a profiler range made outside the frame (a decorator's): a no-op in the graph
        add(guards.type_match(source, type(value)))
        return ProfilerRangeVariable(type(value), None, source)
    if isinstance(value, torch.Size):
        add(guards.constant_match(source, value))
        return SizeVariable([ConstantVariable(v) for v in value], source)
    typ = type(value)
    if typ in (tuple, list) or is_namedtuple_class(typ) or is_structseq_class(typ):
        add(guards.len_match(source, typ, len(value)))
        items = [wrap(tx, v, GetItemSource(source, i) if source is not None else None)
                 for i, v in enumerate(value)]
        if typ is list:
            return ListVariable(items, source)
        if typ is tuple:
            return TupleVariable(items, source)
        return NamedTupleVariable(items, typ, source)
    if typ is collections.deque:
        add(guards.len_match(source, typ, len(value)))
        add(guards.constant_match(AttrSource(source, "maxlen"), value.maxlen))
        items = [wrap(tx, v, GetItemSource(source, i) if source is not None else None)
                 for i, v in enumerate(value)]
        return DequeVariable(items, source, maxlen=value.maxlen)
    if (typ in (dict, collections.OrderedDict) or is_plain_dict_subclass(typ)) and \
            all(is_constant_value(k) for k in value):
        add(guards.dict_keys_match(source, typ, list(value)))
        items = {k: wrap(tx, v, GetItemSource(source, k) if source is not None else None)
                 for k, v in value.items()}
        return DictVariable(items, source=source, cls=typ)
    if typ in (set, frozenset) and all(is_constant_value(k) for k in value):
        add(guards.constant_match(source, value))
        return SetVariable([ConstantVariable(v) for v in value], source, frozen=typ is frozenset,
                           mirror=False)
    if callable(value) or isinstance(value, types.ModuleType):
        return _wrap_callable(tx, value, source, add)
    if isinstance(value, (property, classmethod, staticmethod)):
        raise Unsupported(f"a bare {typ.__name__} object")
    if is_torch_state_object(value):
        add(guards.id_match(source, value))
        return TorchStateObjectVariable(value, source.name() if source is not None
                                        else typ.__qualname__, source)
    if typ is torch.UntypedStorage:   # a resume function's local: x.untyped_storage()
        add(guards.type_match(source, typ))
        return UntypedStorageVariable(source=source, real=value)
    if typ.__module__.startswith("torch") and not isinstance(value, torch.nn.Module):
        raise Unsupported(f"a {typ.__qualname__} object inside a compiled region")
    add(guards.type_match(source, typ))
    return UserDefinedObjectVariable(value, source)


_CONTAINER_METHOD_OWNERS = (list, dict, set, collections.OrderedDict, collections.deque)


_LITERALS = (type(None), bool, int, float, complex, str, bytes)


def _is_literal(value) -> bool:
    return isinstance(value, _LITERALS) or (type(value) in (tuple, frozenset) and
                                            all(_is_literal(v) for v in value))


def _cached_call(wrapper, inner: VariableTracker):
    """A call of a ``functools.lru_cache`` function (transformers' ``is_torch_available``
    and its kind). With literal arguments and a literal result, the call is made now and its
    result is a constant: the function runs once, as eager's first call would, and its cache
    answers every later call with that value. Its body (``importlib.metadata``, regular
    expressions, version parsing) would otherwise be inlined and break the graph. Other
    calls inline the body (a cached function is taken to be pure: the cache changes no
    result)."""
    def call(tx, args, kwargs):
        values = [a.as_python_constant() if a.is_python_constant() else _NOT_LITERAL
                  for a in (*args, *kwargs.values())]
        if all(_is_literal(v) for v in values):
            try:
                result = wrapper(*values[:len(args)], **dict(zip(kwargs, values[len(args):])))
            except Exception:       # the inlined body raises it again, traced
                result = _NOT_LITERAL
            if _is_literal(result):
                return tx.wrap_constant(result)
        return inner.call_function(tx, args, kwargs)
    return call


_NOT_LITERAL = object()


def _wrap_callable(tx, value, source, add) -> VariableTracker:
    if getattr(type(value), "_ember_wrapper", None) == "function":
        # compiled functions called from compiled code are inlined into the caller's graph
        add(guards.id_match(source, value))
        inner = value.__wrapped__
        return wrap(tx, inner, AttrSource(source, "__wrapped__") if source else None)
    if isinstance(value, torch.jit.ScriptFunction) and isinstance(
            getattr(value, "_torchdynamo_inline", None), types.FunctionType):
        # a ``torch.jit.script`` function (DeBERTa's relative positions): TorchScript keeps
        # the Python function it compiled for compilers to inline; its calls are traced
        add(guards.id_match(source, value))
        inner = value._torchdynamo_inline
        return wrap(tx, inner, AttrSource(source, "_torchdynamo_inline") if source else None)
    if type(value) in (operator.itemgetter, operator.attrgetter):
        add(guards.id_match(source, value))
        return GetterVariable(type(value), list(value.__reduce__()[1]), source)
    if isinstance(value, functools._lru_cache_wrapper):
        add(guards.id_match(source, value))
        inner = wrap(tx, value.__wrapped__, AttrSource(source, "__wrapped__") if source else None)
        return HandlerFunctionVariable(value, _cached_call(value, inner), source)
    reason = trace_rules.python_only_reason(value)
    if reason is not None:
        add(guards.id_match(source, value))
        return HandlerFunctionVariable(value, _unsupported_call(value, reason), source)
    if trace_rules.is_disabled(value):
        add(guards.id_match(source, value))
        return HandlerFunctionVariable(
            value, _unsupported_call(value, trace_rules.disabled_call_reason(value)), source)
    if trace_rules.is_allowed_in_graph(value):
        add(guards.id_match(source, value))
        return GraphCallableVariable(value, source)
    handler = special_handler(value) or handler_for(value)
    if handler is not None:
        add(guards.id_match(source, value))
        return HandlerFunctionVariable(value, handler, source)
    if is_graph_callable(value) or isinstance(value, (torch._ops.OpOverload,
                                                      torch._ops.OpOverloadPacket)):
        add(guards.id_match(source, value))
        return GraphCallableVariable(value, source)
    if isinstance(value, types.ModuleType):
        add(guards.id_match(source, value))
        return PythonModuleVariable(value, source)
    if isinstance(value, type):
        add(guards.id_match(source, value))
        return UserDefinedClassVariable(value, source)
    if isinstance(value, types.FunctionType):
        add(guards.id_match(source, value))
        return UserFunctionVariable(value, source)
    if isinstance(value, types.MethodType):
        func = wrap(tx, value.__func__, AttrSource(source, "__func__") if source else None)
        obj = wrap(tx, value.__self__, AttrSource(source, "__self__") if source else None)
        return UserMethodVariable(func, obj, source)
    if isinstance(value, functools.partial):
        add(guards.type_match(source, functools.partial))
        func = wrap(tx, value.func, AttrSource(source, "func") if source else None)
        args = [wrap(tx, a, GetItemSource(AttrSource(source, "args"), i) if source else None)
                for i, a in enumerate(value.args)]
        kwargs = {k: wrap(tx, v, GetItemSource(AttrSource(source, "keywords"), k)
                          if source else None) for k, v in value.keywords.items()}
        return PartialVariable(func, args, kwargs, source)
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)) and \
            value.__objclass__ in _CONTAINER_METHOD_OWNERS:
        # ``dict.copy`` unbound (copy's dispatch table), called with the container first
        add(guards.id_match(source, value))
        return HandlerFunctionVariable(value, _unbound_container_method(value), source)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        owner = getattr(value, "__self__", None)
        if isinstance(owner, torch.Tensor) and hasattr(torch.Tensor, value.__name__):
            # ``x.mul`` held as a value (e.g. across a graph break)
            add(guards.type_match(source, type(value)))
            obj = wrap(tx, owner, AttrSource(source, "__self__") if source else None)
            return TensorMethodVariable(obj, value.__name__)
        if type(owner) in _CONTAINER_METHOD_OWNERS and getattr(
                type(owner), value.__name__, None) is not None:
            # ``log.append`` held as a value (the stack below a graph break): the method
            # of the tracked container, so calls record the mutation
            add(guards.type_match(source, type(value)))
            add(guards.constant_match(AttrSource(source, "__name__"), value.__name__))
            obj = wrap(tx, owner, AttrSource(source, "__self__") if source else None)
            if isinstance(obj, UserDefinedObjectVariable):   # a container capture can't hold
                raise Unsupported(f"method {value.__qualname__} of a {type(owner).__name__} "
                                  f"capture cannot track")
            return tx.getattr(obj, value.__name__)
        if owner is not None and not isinstance(owner, types.ModuleType):
            # a C method of an object capture cannot model (``np.random.rand(1).item``
            # held across a graph break): passed on as it is, calling it breaks the graph
            if source is None:
                raise Unsupported(f"builtin method {value.__qualname__} of a "
                                  f"{type(owner).__name__} object")
            add(guards.type_match(source, type(value)))
            return HandlerFunctionVariable(value, _unsupported_call(
                value, f"a method of a {type(owner).__name__} object"), source)
        # held as a value (it may cross a graph break); calling it breaks the graph
        add(guards.id_match(source, value))
        return HandlerFunctionVariable(value, _unsupported_call(
            value, "a C function capture cannot see into"), source)
    if hasattr(type(value), "__call__") and not isinstance(value, types.BuiltinFunctionType):
        add(guards.type_match(source, type(value)))
        return UserDefinedObjectVariable(value, source)
    raise Unsupported(f"callable {type(value).__qualname__} {value!r}")


def _unbound_container_method(method):
    cls, name = method.__objclass__, method.__name__

    def handler(tx, args, kwargs):
        if not args or not _exactly(args[0], cls):
            raise Unsupported(f"{cls.__name__}.{name} called on something other than a "
                              f"{cls.__name__}")
        return tx.getattr(args[0], name).call_function(tx, list(args[1:]), kwargs)
    return handler


def _exactly(vt, cls) -> bool:
    try:
        return vt.python_type() is cls
    except Unsupported:
        return False


def _unsupported_call(fn, why: str):
    def handler(tx, args, kwargs):
        raise Unsupported(f"call to {getattr(fn, '__qualname__', fn)}: {why}")
    return handler
