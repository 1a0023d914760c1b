"""Capture-time behaviour of Python builtins and the ``operator`` and ``math`` modules.

Handlers are registered per callable (``@builtin(len)``, into ``handlers.HANDLERS``). A call
whose arguments are all constants is evaluated for real (these functions are pure); otherwise
the handler decides: tensors go into the graph, containers are handled structurally, user
objects through their dunder methods.
"""
from __future__ import annotations

import collections
import functools
import inspect
import math
import operator
import sys
import types
import typing
from typing import Any, Callable

import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables.attribute_lookup import static_lookup
from ember.frontend.variables.base import ConstantVariable, NotConstant, VariableTracker
from ember.frontend.variables.container_iterators import (LazyIteratorVariable,
                                                          ListIteratorVariable, finite_lists)
from ember.frontend.variables.containers import (BaseSequenceVariable, DequeVariable, ListVariable,
                                                 NamedTupleVariable, SizeVariable, SliceVariable,
                                                 TupleVariable)
from ember.frontend.variables.dicts import (DictVariable, DictViewVariable, SetVariable,
                                            compare_dicts, compare_sets, is_live_iterable,
                                            make_dict, make_set)
from ember.frontend.variables.functions import PartialVariable, UserFunctionVariable
from ember.frontend.variables.handlers import HANDLERS, builtin
from ember.frontend.variables.scalars import IdVariable
from ember.frontend.variables.symbolic import is_symbolic
from ember.frontend.variables.symbolic import register as symbolic_register
from ember.frontend.variables.tensor import TensorVariable
from ember.frontend.variables.user_defined import UserDefinedObjectVariable


def constants(args, kwargs, specialize: bool = True):
    """(args, kwargs) as Python values, or None when any is not a constant. Symbolic sizes
    (``symbolic.py``) are specialised (guarded), or with ``specialize=False`` make it None:
    for operators whose symbolic operands have a path of their own (sizes compared dim by
    dim)."""
    if not specialize and (any(is_symbolic(a) for a in args) or
                           any(is_symbolic(v) for v in kwargs.values())):
        return None
    try:
        return ([a.as_python_constant() for a in args],
                {k: v.as_python_constant() for k, v in kwargs.items()})
    except NotConstant:
        return None


def fold(tx, fn, args, kwargs, specialize: bool = True) -> VariableTracker | None:
    """Evaluate a pure function on constant arguments; None when some are not constant
    (``specialize``: see ``constants``)."""
    consts = constants(args, kwargs, specialize)
    if consts is None:
        return None
    try:
        result = fn(*consts[0], **consts[1])
    except Exception as e:
        raise Unsupported(f"{type(e).__name__} from {getattr(fn, '__name__', fn)}(): {e}") \
            from None
    return tx.wrap_constant(result)


def unsupported(msg):
    """Raise :class:`Unsupported` (``fold(...) or unsupported(...)`` in handlers)."""
    raise Unsupported(msg)


def has_tensor(args) -> bool:
    for a in args:
        if isinstance(a, TensorVariable):
            return True
        if isinstance(a, (TupleVariable, ListVariable)) and has_tensor(a.items):
            return True
        if isinstance(a, SliceVariable) and has_tensor(a.parts):
            return True
    return False


# ------------------------------------------------------------------------------- operators

# operator -> (method, reflected method) for user objects
_DUNDERS = {
    operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"),
    operator.mul: ("__mul__", "__rmul__"), operator.truediv: ("__truediv__", "__rtruediv__"),
    operator.floordiv: ("__floordiv__", "__rfloordiv__"), operator.mod: ("__mod__", "__rmod__"),
    operator.pow: ("__pow__", "__rpow__"), operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.and_: ("__and__", "__rand__"), operator.or_: ("__or__", "__ror__"),
    operator.xor: ("__xor__", "__rxor__"), operator.lshift: ("__lshift__", "__rlshift__"),
    operator.rshift: ("__rshift__", "__rrshift__"),
    operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"),
    operator.lt: ("__lt__", "__gt__"), operator.gt: ("__gt__", "__lt__"),
    operator.le: ("__le__", "__ge__"), operator.ge: ("__ge__", "__le__"),
    operator.neg: ("__neg__", None), operator.pos: ("__pos__", None),
    operator.invert: ("__invert__", None), operator.abs: ("__abs__", None),
}
INPLACE = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod, operator.ipow: operator.pow, operator.imatmul: operator.matmul,
    operator.iand: operator.and_, operator.ior: operator.or_, operator.ixor: operator.xor,
    operator.ilshift: operator.lshift, operator.irshift: operator.rshift,
}

# Tracker types with their own operator semantics, and the function ``apply_operator`` hands
# an operation with such an operand to: numpy.py registers ndarrays (it builds on this module).
OPERAND_OPERATORS: dict[type, Callable[[Any, Any, list], VariableTracker]] = {}


def apply_operator(tx, op, args: list[VariableTracker]) -> VariableTracker:
    """``op(*args)`` for an ``operator`` function, the core of BINARY_OP/COMPARE_OP."""
    if op in (operator.is_, operator.is_not):
        same = tx.is_same_object(args[0], args[1])
        return ConstantVariable(same if op is operator.is_ else not same)
    if op is operator.getitem:
        return getitem(tx, args[0], args[1])
    if op is operator.contains:
        return tx.contains(args[0], args[1])
    if op is operator.not_:
        return ConstantVariable(not args[0].truthy(tx))
    if op is operator.truth:
        return ConstantVariable(args[0].truthy(tx))
    if op in (operator.eq, operator.ne) and any(isinstance(a, IdVariable) for a in args):
        if not all(isinstance(a, IdVariable) for a in args):
            raise Unsupported("comparing an id() with another value")
        return ConstantVariable((args[0].key == args[1].key) == (op is operator.eq))
    if op in INPLACE and not isinstance(args[0], TensorVariable) and \
            isinstance(args[0], ConstantVariable):
        op = INPLACE[op]   # immutable left side: Python falls back to the plain operator
    for operand_type, on_operands in OPERAND_OPERATORS.items():
        if any(isinstance(a, operand_type) for a in args):
            return on_operands(tx, op, args)
    if any(isinstance(a, TensorVariable) for a in args):
        return tx.output.call_function(op, args, {})
    base_op = INPLACE.get(op)
    a = args[0]
    # in place, also on a list of constants: aliases, the caller and iterators see it
    if base_op is operator.add and isinstance(a, ListVariable):
        a.call_method(tx, "extend", [args[1]], {})
        return a
    if base_op is operator.mul and type(a) is ListVariable and args[1].is_python_constant():
        tx.check_mutation(a)
        a.items[:] = a.items * operator.index(args[1].as_python_constant())
        return a
    folded = fold(tx, op, args, {}, specialize=False)
    if folded is not None:
        return folded
    if base_op is not None:
        if isinstance(a, (ListVariable, DictVariable, SetVariable)) or _user_object(a):
            method = _lookup_dunder(a, "__" + op.__name__.strip("_") + "__")
            if method is not None:
                return method.call_function(tx, [a, args[1]], {})
        return apply_operator(tx, base_op, args)
    return _structural_operator(tx, op, args)


def _user_object(vt) -> bool:
    return isinstance(vt, UserDefinedObjectVariable)


def _lookup_dunder(vt, name):
    if not _user_object(vt):
        return None
    fn = static_lookup(vt.cls, name)
    if isinstance(fn, types.FunctionType):
        return UserFunctionVariable(fn)
    return None


_SET_OPERATORS = {operator.or_: "__or__", operator.and_: "__and__", operator.sub: "__sub__",
                  operator.xor: "__xor__"}


def _structural_operator(tx, op, args):
    a = args[0]
    b = args[1] if len(args) > 1 else None
    seq = (TupleVariable, ListVariable)
    if op is operator.add and isinstance(a, seq) and isinstance(b, seq):
        if type(a) is ListVariable and type(b) is ListVariable:
            return ListVariable(a.items + b.items)
        if not isinstance(a, ListVariable) and not isinstance(b, ListVariable):
            items = a.items + b.items
            return SizeVariable(items) if isinstance(a, SizeVariable) else TupleVariable(items)
    if op is operator.mul and isinstance(a, seq) and b is not None and b.is_python_constant():
        return a.new_like(a.items * b.as_python_constant()) if not isinstance(
            a, NamedTupleVariable) else TupleVariable(a.items * b.as_python_constant())
    if op is operator.mul and isinstance(b, seq) and a.is_python_constant():
        return _structural_operator(tx, op, [b, a])
    set_like = (SetVariable, DictViewVariable)
    set_op = _SET_OPERATORS.get(op)
    if set_op is not None and b is not None:
        # dict views take any iterable on either side; sets only other sets
        if isinstance(a, set_like) and (isinstance(b, set_like) or
                                        isinstance(a, DictViewVariable)):
            return a.call_method(tx, set_op, [b], {})
        if isinstance(b, DictViewVariable):
            return b.call_method(tx, "__r" + set_op[2:], [a], {})
    if b is not None:
        compared = compare_sets(tx, op, a, b)
        if compared is None:
            compared = compare_dicts(tx, op, a, b)
        if compared is not None:
            return compared
    if op in (operator.eq, operator.ne):
        if isinstance(a, seq) and isinstance(b, seq):
            equal = a.python_type() is b.python_type() or {a.python_type(), b.python_type()} \
                <= {tuple, torch.Size}
            equal = equal and len(a.items) == len(b.items) and all(
                tx.values_equal(x, y) for x, y in zip(a.items, b.items))
            return ConstantVariable(equal if op is operator.eq else not equal)
    # user objects: __op__ then reflected __rop__
    names = _DUNDERS.get(op)
    if names:
        method = _lookup_dunder(a, names[0])
        if method is not None:
            return method.call_function(tx, list(args), {})
        if b is not None and names[1]:
            method = _lookup_dunder(b, names[1])
            if method is not None:
                return method.call_function(tx, [b, a], {})
        if op in (operator.eq, operator.ne) and b is not None:
            same = tx.is_same_object(a, b)
            return ConstantVariable(same if op is operator.eq else not same)
    raise Unsupported(f"operator {op.__name__} on {a} and {b}")


def getitem(tx, obj, index):
    if isinstance(obj, TensorVariable):
        return tx.output.call_function(operator.getitem, [obj, index], {})
    subscripted = subscript_type(tx, obj, index)
    if subscripted is not None:
        return subscripted
    if isinstance(obj, (BaseSequenceVariable, DictVariable)):
        return obj.call_method(tx, "__getitem__", [index], {})
    if isinstance(obj, ConstantVariable):
        folded = fold(tx, operator.getitem, [obj, index], {})
        if folded is not None:
            return folded
    return obj.call_method(tx, "__getitem__", [index], {})


# classes whose ``cls[...]`` is a pure types.GenericAlias (``list[int]``)
_GENERIC_ALIAS_MODULES = ("builtins", "collections", "collections.abc", "_collections_abc")


def is_type_expression(value) -> bool:
    """A typing construct (``List``, ``Optional``, ``Dict[str, Tensor]``, a TypeVar,
    ``list[int]``, ``int | None``) or a class whose subscription makes one: subscribing it is
    pure (typing caches the results), so capture evaluates it for real."""
    if type(value).__module__ in ("typing", "typing_extensions") or isinstance(
            value, (types.GenericAlias, types.UnionType)):
        return True
    if isinstance(value, type) and hasattr(value, "__class_getitem__"):
        return value.__module__ in _GENERIC_ALIAS_MODULES or issubclass(value, typing.Generic)
    return False


def type_argument(vt):
    """The Python value of a subscript of a type expression (classes, type expressions,
    constants, tuples and lists of them); NotConstant otherwise."""
    if isinstance(vt, (TupleVariable, ListVariable)) and not isinstance(vt, SizeVariable):
        return (tuple if isinstance(vt, TupleVariable) else list)(
            type_argument(v) for v in vt.items)
    if isinstance(vt, ConstantVariable):
        return vt.value
    value = getattr(vt, "value", None)
    if isinstance(value, type) or is_type_expression(value):
        return value
    raise NotConstant


def subscript_type(tx, obj, index) -> VariableTracker | None:
    """``List[torch.Tensor]``, ``Optional[T]``, ``dict[str, int]`` as the constant it is
    (inlined, typing's ``__getitem__`` asks ``sys._getframe``: a graph break at every use);
    None when ``obj`` is not a type expression."""
    value = getattr(obj, "value", None)
    if isinstance(obj, TensorVariable) or not is_type_expression(value):
        return None
    try:
        arg = type_argument(index)
    except NotConstant:
        raise Unsupported(f"subscription of {value!r} by {index}") from None
    try:
        result = value[arg]
    except Exception as e:    # noqa: BLE001 - the program's own error, raised eagerly too
        raise Unsupported(f"{type(e).__name__} from {value!r}[...]: {e}") from None
    return ConstantVariable(result)    # immutable; rebuilt after the graph as the object


@builtin(typing.cast)
def _typing_cast(tx, args, kwargs):
    """``typing.cast(T, value)`` is ``value``."""
    return bind_arguments(typing.cast, args, kwargs)["val"]


def bind_arguments(fn, args, kwargs) -> dict:
    """``fn``'s parameters bound to the trackers of a call (a bad call is the program's
    error: the graph breaks there and it raises eagerly)."""
    try:
        return inspect.signature(fn).bind(*args, **kwargs).arguments
    except TypeError as e:
        raise Unsupported(f"TypeError from {fn.__name__}(): {e}") from None


for _op in [*_DUNDERS, *INPLACE, operator.getitem, operator.contains, operator.is_,
            operator.is_not, operator.not_, operator.truth]:
    HANDLERS[_op] = (lambda op: lambda tx, args, kwargs: apply_operator(tx, op, args))(_op)


@builtin(operator.setitem)
def _setitem(tx, args, kwargs):
    return tx.store_subscr(args[0], args[1], args[2])


class GetterVariable(VariableTracker):
    """``operator.itemgetter(*keys)`` or ``operator.attrgetter(*names)`` with constant keys."""

    def __init__(self, cls: type, keys: list, source=None):
        super().__init__(source)
        self.cls = cls
        self.keys = keys

    def python_type(self):
        return self.cls

    def truthy(self, tx):
        return True

    def as_python_constant(self):
        return self.cls(*self.keys)

    def rebuild(self, cg):
        return cg.const(self.as_python_constant())

    def call_function(self, tx, args, kwargs):
        obj = args[0]
        results = []
        for key in self.keys:
            if self.cls is operator.itemgetter:
                results.append(getitem(tx, obj, ConstantVariable(key)))
            else:
                value = obj
                for part in key.split("."):
                    value = tx.getattr(value, part)
                results.append(value)
        return results[0] if len(results) == 1 else TupleVariable(results)


def _getter_factory(cls):
    def handler(tx, args, kwargs):
        if kwargs or not args:
            raise Unsupported(f"operator.{cls.__name__} with keywords or no arguments")
        return GetterVariable(cls, [a.as_python_constant() for a in args])
    return handler


HANDLERS[operator.itemgetter] = _getter_factory(operator.itemgetter)
HANDLERS[operator.attrgetter] = _getter_factory(operator.attrgetter)


# -------------------------------------------------------------------------------- builtins

@builtin(len)
def _len(tx, args, kwargs):
    obj = args[0]
    if isinstance(obj, ConstantVariable):
        return fold(tx, len, args, kwargs)
    return obj.call_method(tx, "__len__", [], {})


@builtin(iter)
def _iter(tx, args, kwargs):
    if len(args) != 1:
        raise Unsupported("iter() with a sentinel")
    return tx.get_iter(args[0])


@builtin(next)
def _next(tx, args, kwargs):
    it = args[0]
    if isinstance(it, ListIteratorVariable):
        item = it.next(tx)
        if item is None:
            if len(args) > 1:
                return args[1]
            raise Unsupported("StopIteration from next()")
        return item
    raise Unsupported(f"next() on {it}")


@builtin(range)
def _range(tx, args, kwargs):
    # a symbolic bound is specialised (guarded): the loop is unrolled for this size
    return fold(tx, range, args, kwargs) or unsupported("range() of non-constants")


def _make_seq_ctor(cls):
    def handler(tx, args, kwargs):
        if cls in (set, frozenset):
            return make_set(tx, args[0] if args else None, frozen=cls is frozenset)
        items = tx.unpack_iterable(args[0]) if args else []
        if cls is tuple:
            return TupleVariable(items)
        return ListVariable(items)
    return handler


for _cls in (tuple, list, set, frozenset):
    HANDLERS[_cls] = _make_seq_ctor(_cls)


@builtin(dict)
def _dict(tx, args, kwargs):
    out = DictVariable({})
    if args:
        out.call_method(tx, "update", args, {})
    for k, v in kwargs.items():
        out.setitem(ConstantVariable(k), v)
    return out


for _cls in (collections.OrderedDict, collections.defaultdict):
    HANDLERS[_cls] = (lambda c: lambda tx, args, kwargs: make_dict(tx, c, args, kwargs))(_cls)


@builtin(collections.namedtuple)
def _namedtuple(tx, args, kwargs):
    """A namedtuple class made inside the frame: made once, at capture (as class statements
    are), from constant field names."""
    return fold(tx, collections.namedtuple, args, kwargs) or unsupported(
        "collections.namedtuple() of non-constant arguments")


@builtin(collections.deque)
def _deque(tx, args, kwargs):
    maxlen = args[1] if len(args) > 1 else kwargs.get("maxlen", ConstantVariable(None))
    out = DequeVariable([], maxlen=maxlen.as_python_constant())
    if args:
        out.call_method(tx, "extend", [args[0]], {})
    return out


def _lazily(iterables) -> bool:
    """zip/map take their items step by step: over a dict (live), or when one iterator is
    passed twice (``zip(*[iter(xs)] * 2)`` pairs consecutive items; unpacking each
    argument in turn would give the first all of them)."""
    ids = [id(a) for a in iterables if isinstance(a, ListIteratorVariable)]
    return any(is_live_iterable(a) for a in iterables) or len(ids) != len(set(ids))


def _resumed_head(fn):
    """How a ResumedWrapperIterator gets map's or filter's function: None (it is then passed
    as the plain wrapper, and its resume function runs eagerly) for one made in the frame,
    whose identity would change at every call and fail the resume's guards."""
    if fn is None:
        return lambda cg: "None"
    if fn.source is None and getattr(fn, "value", None) is None:
        return None
    return lambda cg: cg.reconstruct(fn)


def _lazy_enumerate(tx, iterable, start: int) -> LazyIteratorVariable:
    src = tx.get_iter(iterable)
    count = [start]

    def step(tx):
        item = src.next(tx)
        if item is None:
            return None
        count[0] += 1
        return TupleVariable([ConstantVariable(count[0] - 1), item])
    return LazyIteratorVariable(
        [src], step, lambda cg, s: f"{cg.const(enumerate)}({s[0]}, {count[0]})", enumerate,
        head=lambda cg: str(count[0]))


def _lazy_zip(tx, iterables, fn=None, strict=False) -> LazyIteratorVariable:
    """``zip(*iterables)``, or ``map(fn, *iterables)``."""
    sources = [tx.get_iter(a) for a in iterables]

    def step(tx):
        items = []
        for i, src in enumerate(sources):
            item = src.next(tx)
            if item is None:
                if strict and (i > 0 or any(s.next(tx) is not None for s in sources[1:])):
                    # Python raises ValueError here: the frame runs eagerly
                    raise Unsupported("zip(strict=True) of unequal lengths")
                return None
            items.append(item)
        return TupleVariable(items) if fn is None else fn.call_function(tx, items, {})

    def remake(cg, s):
        if fn is None:
            return f"{cg.const(zip)}({', '.join(s)}{', strict=True' if strict else ''})"
        return f"{cg.const(map)}({', '.join([cg.reconstruct(fn), *s])})"
    head = (lambda cg: "True") if strict else _resumed_head(fn)   # zip's: strict
    return LazyIteratorVariable(sources, step, remake, zip if fn is None else map, head=head)


@builtin(enumerate)
def _enumerate(tx, args, kwargs):
    start = (args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0)))
    start = start.as_python_constant()
    if is_live_iterable(args[0]):
        return _lazy_enumerate(tx, args[0], start)
    items = tx.unpack_iterable(args[0])
    return ListIteratorVariable([TupleVariable([ConstantVariable(i + start), v])
                                 for i, v in enumerate(items)])


@builtin(zip)
def _zip(tx, args, kwargs):
    strict = kwargs.get("strict") is not None and kwargs["strict"].as_python_constant()
    if _lazily(args):
        return _lazy_zip(tx, args, strict=strict)
    if strict:
        lists = [tx.unpack_iterable(a) for a in args]
        if len({len(x) for x in lists}) > 1:
            raise Unsupported("zip(strict=True) of unequal lengths")
    lists = finite_lists(tx, args)
    return ListIteratorVariable([TupleVariable(list(t)) for t in zip(*lists)])


@builtin(map)
def _map(tx, args, kwargs):
    fn, *iterables = args
    if _lazily(iterables):
        return _lazy_zip(tx, iterables, fn)
    lists = finite_lists(tx, iterables)
    return ListIteratorVariable([fn.call_function(tx, list(t), {}) for t in zip(*lists)])


@builtin(filter)
def _filter(tx, args, kwargs):
    fn, iterable = args
    is_none = fn.is_python_constant() and fn.as_python_constant() is None

    def kept(tx, item) -> bool:
        return (item if is_none else fn.call_function(tx, [item], {})).truthy(tx)
    if is_live_iterable(iterable):
        src = tx.get_iter(iterable)

        def step(tx):
            while (item := src.next(tx)) is not None:
                if kept(tx, item):
                    return item
            return None

        def remake(cg, s):
            return f"{cg.const(filter)}({'None' if is_none else cg.reconstruct(fn)}, {s[0]})"
        return LazyIteratorVariable([src], step, remake, filter,
                                    head=_resumed_head(None if is_none else fn))
    return ListIteratorVariable([item for item in tx.unpack_iterable(iterable)
                                 if kept(tx, item)])


@builtin(reversed)
def _reversed(tx, args, kwargs):
    if isinstance(args[0], (DictVariable, DictViewVariable)):   # live, as iter()
        return args[0].call_method(tx, "__reversed__", [], {})
    if type(args[0]) in (ListVariable, DequeVariable):   # live, as iter()
        return args[0].live_iterator(reverse=True)
    return ListIteratorVariable(list(reversed(tx.unpack_iterable(args[0]))))


@builtin(sorted)
def _sorted(tx, args, kwargs):
    items = tx.unpack_iterable(args[0])
    reverse = kwargs.get("reverse", ConstantVariable(False)).as_python_constant()
    return ListVariable(tx.sorted_items(items, kwargs.get("key"), reverse))


@builtin(sum)
def _sum(tx, args, kwargs):
    items = tx.unpack_iterable(args[0])
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    total = start
    for item in items:
        total = apply_operator(tx, operator.add, [total, item])
    return total


def _min_max(fn, op):
    def handler(tx, args, kwargs):
        if kwargs.get("key") is not None or kwargs.get("default") is not None:
            folded = fold(tx, fn, args, kwargs)
            if folded is not None:
                return folded
            return _min_max_by_key(tx, fn, args, kwargs)
        items = tx.unpack_iterable(args[0]) if len(args) == 1 else list(args)
        if not items:
            raise Unsupported(f"{fn.__name__}() of an empty sequence")
        if has_tensor(items):
            return _min_max_of_tensors(tx, fn, items)
        folded = fold(tx, fn, items, {})
        if folded is not None:
            return folded
        best = items[0]
        for item in items[1:]:
            if apply_operator(tx, op, [item, best]).truthy(tx):
                best = item
        return best
    return handler


def _min_max_of_tensors(tx, fn, items):
    """``max(a, b, ...)`` of one-element tensors is an elementwise maximum: the same value
    Python's comparisons pick. Only when every tensor has one shape and dtype: otherwise
    eager returns one of the objects as it is (its dtype and shape depend on the data), and
    tensors of more elements make eager raise."""
    first = items[0]
    if not all(isinstance(t, TensorVariable) and t.fake.numel() == 1 and
               t.fake.shape == first.fake.shape and t.fake.dtype == first.fake.dtype
               for t in items):
        raise Unsupported(f"{fn.__name__}() over tensors of other shapes or dtypes, or with "
                          f"Python numbers (which one it returns is data-dependent)")
    tensor_fn = torch.maximum if fn is max else torch.minimum
    best = first
    for item in items[1:]:
        best = tx.output.call_function(tensor_fn, [best, item], {})
    return best


def _min_max_by_key(tx, fn, args, kwargs):
    """``max(items, key=f, default=d)``: f's results must be constants; ties keep the first
    item, as Python's do."""
    items = tx.unpack_iterable(args[0]) if len(args) == 1 else list(args)
    if not items:
        if "default" in kwargs:
            return kwargs["default"]
        raise Unsupported(f"ValueError: {fn.__name__}() of an empty sequence")
    key = kwargs.get("key")
    if key is None or (key.is_python_constant() and key.as_python_constant() is None):
        keys = [item.as_python_constant() for item in items]
    else:
        keys = [key.call_function(tx, [item], {}).as_python_constant() for item in items]
    return items[fn(range(len(items)), key=keys.__getitem__)]


HANDLERS[max] = _min_max(max, operator.gt)
HANDLERS[min] = _min_max(min, operator.lt)


@builtin(abs)
def _abs(tx, args, kwargs):
    return apply_operator(tx, operator.abs, args)


def _make_all_any(is_all):
    def handler(tx, args, kwargs):
        for item in tx.unpack_iterable(args[0]):
            if item.truthy(tx) != is_all:
                return ConstantVariable(not is_all)
        return ConstantVariable(is_all)
    return handler


HANDLERS[all] = _make_all_any(True)
HANDLERS[any] = _make_all_any(False)


def _numeric_ctor(cls):
    def handler(tx, args, kwargs):
        if args and isinstance(args[0], TensorVariable):
            raise Unsupported(f"{cls.__name__}() of a tensor (data-dependent)")
        folded = fold(tx, cls, args, kwargs)
        if folded is not None:
            return folded
        if cls is bool and len(args) == 1:
            return ConstantVariable(args[0].truthy(tx))
        if cls is str and len(args) == 1:
            return ConstantVariable(str(args[0].as_python_constant()))
        raise Unsupported(f"{cls.__name__}() of {args}")
    return handler


for _cls in (int, float, bool, str, complex):
    HANDLERS[_cls] = _numeric_ctor(_cls)


def _side_effecting(fn):
    def handler(tx, args, kwargs):
        raise Unsupported(f"call to {fn.__name__}(), a builtin with effects outside the graph")
    return handler


@builtin(id)
def _id(tx, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("id() takes exactly one argument")
    return IdVariable(args[0])


for _fn in (print, input, open, breakpoint, exec, eval, compile, globals, locals):
    HANDLERS[_fn] = _side_effecting(_fn)


@builtin(slice)
def _slice(tx, args, kwargs):
    # (a symbolic bound stays symbolic, as in ``x[: s // 2]``'s BUILD_SLICE)
    folded = fold(tx, slice, args, kwargs, specialize=False)
    if folded is not None:
        return folded
    parts = list(args) + [ConstantVariable(None)] * (3 - len(args))
    if len(args) == 1:
        parts = [ConstantVariable(None), args[0], ConstantVariable(None)]
    return SliceVariable(*parts)


def _make_pure(fn):
    def handler(tx, args, kwargs):
        if fn in (pow, round) and has_tensor(args):
            if fn is pow:
                return tx.output.call_function(operator.pow, args[:2], {})
            return tx.output.call_function(torch.round, args[:1], {})
        folded = fold(tx, fn, args, kwargs)
        if folded is None:
            raise Unsupported(f"{fn.__name__}() of non-constant arguments")
        return folded
    return handler


for _fn in (divmod, pow, round, ord, chr, hash, format, repr, hex, oct, bin, ascii,
            sys.intern):
    HANDLERS[_fn] = _make_pure(_fn)


@builtin(functools.partial)
def _partial(tx, args, kwargs):
    return PartialVariable(args[0], list(args[1:]), dict(kwargs))


@builtin(functools.reduce)
def _reduce(tx, args, kwargs):
    fn, iterable = args[0], tx.unpack_iterable(args[1])
    if len(args) > 2:
        acc = args[2]
    elif iterable:
        acc, iterable = iterable[0], iterable[1:]
    else:
        raise Unsupported("reduce() of empty sequence with no initial value")
    for item in iterable:
        acc = fn.call_function(tx, [acc, item], {})
    return acc


# ------------------------------------------------------------------------------------ math

def _math_handler(fn):
    def handler(tx, args, kwargs):
        if has_tensor(args):
            raise Unsupported(f"math.{fn.__name__} on a tensor (converts it to a Python number)")
        folded = fold(tx, fn, args, kwargs)
        if folded is None:
            raise Unsupported(f"math.{fn.__name__} of non-constant arguments")
        return folded
    return handler


for _name in dir(math):
    _fn = getattr(math, _name)
    if callable(_fn):
        HANDLERS[_fn] = _math_handler(_fn)


symbolic_register(sys.modules[__name__])   # symbolic sizes' operators and builtins wrap
#                                            the ones above
