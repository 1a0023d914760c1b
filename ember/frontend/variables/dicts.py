"""Dicts (and OrderedDict, defaultdict, plain dict subclasses), their views, and sets
during capture, with the comparisons between them. Like lists, they are tracked by identity
(see ``containers``).
"""
from __future__ import annotations

import collections
import operator
from typing import Any

from ember.frontend.exc import ObservedException, Unsupported
from ember.frontend.variables.base import BoundMethodVariable, ConstantVariable, VariableTracker
from ember.frontend.variables.container_iterators import (GUARDED_ITERATORS,
                                                          DictIteratorVariable,
                                                          LazyIteratorVariable,
                                                          ListIteratorVariable,
                                                          LiveListIteratorVariable,
                                                          SetIteratorVariable)
from ember.frontend.variables.containers import DequeVariable, ListVariable, TupleVariable
from ember.frontend.variables.scalars import IdVariable, identity_key
from ember.frontend.variables.symbolic import SymNodeVariable


def hashable_key(vt: VariableTracker, among: dict | None = None) -> Any:
    """The Python key a tracker stands for in a dict or set (``among``: the keys of that
    dict or set, when it is looked up in)."""
    if isinstance(vt, IdVariable):
        if among is not None and any(type(k) is int for k in among):
            # integer keys not made by id() during capture may be real ids: the answer would
            # depend on which object this is
            raise Unsupported("an id() looked up among integer keys")
        return ("__id__", vt.key)
    if isinstance(vt, SymNodeVariable):     # a size as a key: specialised (guarded)
        return vt.as_python_constant()
    if vt.is_python_constant() and type(vt.as_python_constant()) is int and among and any(
            type(k) is tuple and k[:1] == ("__id__",) for k in among):
        raise Unsupported("an integer looked up among id() keys")
    if vt.is_python_constant():
        return vt.as_python_constant()
    if isinstance(vt, TupleVariable):
        # a tuple hashes and compares by its items: two trackers of ``(k, t)`` are one key
        return ("__tuple__", tuple(hashable_key(item) for item in vt.items))
    if isinstance(vt, (ListVariable, DictVariable, DictViewVariable)) or (
            isinstance(vt, SetVariable) and not vt.frozen):
        raise Unsupported(f"TypeError: unhashable type: '{vt.python_type().__name__}'")
    return identity_key(vt)      # an object that hashes by identity


class DictVariable(VariableTracker):
    """A dict (or OrderedDict/defaultdict) with keys known at capture time."""
    mutable = True

    def __init__(self, items: dict, keys: dict | None = None, source=None, cls=dict,
                 default_factory: VariableTracker | None = None):
        super().__init__(source)
        self.items: dict[Any, VariableTracker] = dict(items)    # python key -> value tracker
        self.keys: dict[Any, VariableTracker] = dict(keys or {
            k: ConstantVariable(k) for k in items})               # python key -> key tracker
        self.cls = cls
        self.default_factory = default_factory
        self.iterators: list[tuple[ListIteratorVariable, str, tuple]] = []

    def python_type(self):
        return self.cls

    _ITER_TYPES = {(kind, rev): type((reversed if rev else iter)(getattr({}, kind)()))
                   for kind in ("keys", "values", "items") for rev in (False, True)}

    def live_iterator(self, kind: str, reverse: bool = False) -> ListIteratorVariable:
        """An iterator over the keys, values or items, as Python's dict iterators: a value
        is the one in the dict when the iterator reaches it, and a change of the dict's
        size (or keys) makes its next step raise RuntimeError (the graph breaks there)."""
        order = tuple(reversed(self.items) if reverse else self.items)
        it = DictIteratorVariable(self._items_of(kind, order), self, kind, reverse)
        it.py_type = self._ITER_TYPES[kind, reverse]
        self.iterators.append((it, kind, order))
        return it

    def _items_of(self, kind: str, order: tuple) -> list[VariableTracker]:
        if kind == "keys":
            return [self.keys[k] for k in order]
        if kind == "values":
            return [self.items[k] for k in order]
        return [TupleVariable([self.keys[k], self.items[k]]) for k in order]

    stored = False   # changed during capture: the real dict differs until the replay

    def _changed(self, reordered: bool = False) -> None:
        """After a store, deletion or move: the live iterators see it."""
        self.stored = True
        self.iterators = [entry for entry in self.iterators if not entry[0].exhausted]
        for it, kind, order in self.iterators:
            if it.invalid is not None:
                continue
            if reordered:
                it.invalid = "OrderedDict mutated during iteration"
            elif len(order) != len(self.items):
                it.invalid = "dictionary changed size during iteration"
            elif any(k not in self.items for k in order):
                it.invalid = "dictionary keys changed during iteration"
            elif kind != "keys":
                it.items = self._items_of(kind, order)

    def as_python_constant(self):
        return self.cls({k: v.as_python_constant() for k, v in self.items.items()})

    def truthy(self, tx):
        return bool(self.items)

    def unpack(self, tx):
        return [self.keys[k] for k in self.items]

    def rebuild(self, cg):
        pairs = ", ".join(f"{cg.reconstruct(self.keys[k])}: {cg.reconstruct(v)}"
                          for k, v in self.items.items())
        text = f"{{{pairs}}}" if self.cls is dict else f"{cg.const(self.cls)}({{{pairs}}})"
        if issubclass(self.cls, collections.defaultdict):
            # the factory comes first, None included (``defaultdict.fromkeys`` makes one)
            factory = "None" if self.default_factory is None else \
                cg.reconstruct(self.default_factory)
            text = f"{cg.const(self.cls)}({factory}, {{{pairs}}})"
        return cg.temp(self, text)

    def replay_mutation(self, target: str, value_of) -> str:
        pairs = ", ".join(f"{value_of(self.keys[k])}: {value_of(v)}"
                          for k, v in self.items.items())
        return f"{target}.clear(); {target}.update({{{pairs}}})"

    def setitem(self, key_vt, value_vt):
        key = hashable_key(key_vt, self.items)
        self.items[key] = value_vt
        self.keys.setdefault(key, key_vt)   # an equal key stored again keeps the first
        self._changed()

    def getitem(self, tx, key_vt):
        key = hashable_key(key_vt, self.items)
        if key in self.items:
            return self.items[key]
        if self.default_factory is not None:
            tx.check_mutation(self)
            value = self.default_factory.call_function(tx, [], {})
            self.setitem(key_vt, value)
            return value
        if self.cls in (dict, collections.OrderedDict, collections.defaultdict):
            raise ObservedException(KeyError, [key_vt], repr(key))
        raise Unsupported(f"KeyError: {key!r}")

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "get":
            key = hashable_key(args[0], self.items)
            return self.items.get(key, args[1] if len(args) > 1 else ConstantVariable(None))
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__":
            return ConstantVariable(hashable_key(args[0], self.items) in self.items)
        if name in ("keys", "values", "items") and not args and not kwargs:
            return DictViewVariable(self, name)
        if name == "copy":
            return DictVariable(self.items, self.keys, cls=self.cls,
                                default_factory=self.default_factory)
        if name == "fromkeys":
            # a class method reached through an instance: a new dict of the same class
            # (a defaultdict's has no factory)
            return make_fromkeys(self.cls)(tx, args, kwargs)
        if name == "__iter__":
            return self.live_iterator("keys")
        if name == "__reversed__":
            return self.live_iterator("keys", reverse=True)
        tx.check_mutation(self)
        self.stored = True
        if name == "__setitem__":
            self.setitem(args[0], args[1])
        elif name == "__delitem__":
            key = hashable_key(args[0], self.items)
            if key not in self.items:
                raise ObservedException(KeyError, [args[0]], repr(key))
            self.items.pop(key)
            self.keys.pop(key)
            self._changed()
        elif name == "update":
            if args:
                other = args[0]
                if isinstance(other, DictVariable):
                    for k, v in other.items.items():
                        self.setitem(other.keys[k], v)
                else:
                    for pair in tx.unpack_iterable(other):
                        k, v = tx.unpack_iterable(pair)
                        self.setitem(k, v)
            for k, v in kwargs.items():
                self.setitem(ConstantVariable(k), v)
        elif name == "setdefault":
            key = hashable_key(args[0], self.items)
            if key not in self.items:
                self.setitem(args[0], args[1] if len(args) > 1 else ConstantVariable(None))
            return self.items[key]
        elif name == "pop":
            key = hashable_key(args[0], self.items)
            if key in self.items:
                self.keys.pop(key)
                value = self.items.pop(key)
                self._changed()
                return value
            if len(args) > 1:
                return args[1]
            raise Unsupported(f"KeyError: {key!r}")
        elif name == "clear":
            self.items.clear()
            self.keys.clear()
            self._changed()
        elif name == "popitem":
            ordered = issubclass(self.cls, collections.OrderedDict)
            last = _argument(args, kwargs, 0, "last", True) if ordered else True
            if (args or kwargs) and not ordered:
                raise Unsupported("dict.popitem() takes no arguments")
            if not self.items:
                raise ObservedException(KeyError, [ConstantVariable(
                    "dictionary is empty")], "dictionary is empty")
            key = next(reversed(self.items)) if last else next(iter(self.items))
            pair = TupleVariable([self.keys.pop(key), self.items.pop(key)])
            self._changed()
            return pair
        elif name == "move_to_end":
            key = hashable_key(args[0], self.items)
            if key not in self.items:
                raise ObservedException(KeyError, [args[0]], repr(key))
            last = _argument(args, kwargs, 1, "last", True)
            key_vt, value = self.keys.pop(key), self.items.pop(key)
            if last:
                self.items[key], self.keys[key] = value, key_vt
            else:   # in place: the dicts may be shared
                for table, first in ((self.items, value), (self.keys, key_vt)):
                    rest = list(table.items())
                    table.clear()
                    table[key] = first
                    table.update(rest)
            self._changed(reordered=True)
        else:
            raise Unsupported(f"dict.{name}()")
        return ConstantVariable(None)

    def var_getattr(self, tx, name):
        if name == "move_to_end" and issubclass(self.cls, collections.OrderedDict):
            return BoundMethodVariable(self, name)
        if self.cls not in (dict, collections.OrderedDict, collections.defaultdict) and \
                not hasattr(dict, name):
            # a method a plain dict subclass adds; local: user functions bind **kwargs into
            # dicts (attribute_lookup -> functions -> dicts)
            from ember.frontend.variables.attribute_lookup import MISSING, class_attribute
            found = class_attribute(tx, self.cls, name, self, None)
            if found is not MISSING:
                return found
        if hasattr(dict, name):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"{self.cls.__name__}.{name}")


class DictViewVariable(VariableTracker):
    """``d.keys()``, ``d.values()`` or ``d.items()``: a live view, so every use reads the
    dict as it is then (``keys = d.keys(); d[k] = v; k in keys`` is True, as in Python)."""

    _TYPES = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}

    def __init__(self, dict_vt: DictVariable, kind: str):
        super().__init__()
        self.dict_vt = dict_vt
        self.kind = kind

    def python_type(self):
        return self._TYPES[self.kind]

    def as_python_constant(self):
        return getattr(self.dict_vt.as_python_constant(), self.kind)()

    def truthy(self, tx):
        return bool(self.dict_vt.items)

    def unpack(self, tx):
        d = self.dict_vt
        if self.kind == "keys":
            return [d.keys[k] for k in d.items]
        if self.kind == "values":
            return list(d.items.values())
        return [TupleVariable([d.keys[k], v]) for k, v in d.items.items()]

    def rebuild(self, cg):
        return f"{cg.reconstruct(self.dict_vt)}.{self.kind}()"

    def as_set(self, tx) -> "SetVariable":
        if self.kind == "values":
            raise Unsupported("set operations on dict.values()")
        return SetVariable(self.unpack(tx))

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return ConstantVariable(len(self.dict_vt.items))
        if name == "__iter__":
            return self.dict_vt.live_iterator(self.kind)
        if name == "__reversed__":
            return self.dict_vt.live_iterator(self.kind, reverse=True)
        if name == "__contains__":
            item = args[0]
            if self.kind == "keys":
                return ConstantVariable(hashable_key(item, self.dict_vt.items)
                                        in self.dict_vt.items)
            if self.kind == "items":
                # only a tuple of two can be an item; anything else is simply not in it
                if isinstance(item, TupleVariable):
                    pair = item.items
                elif item.is_python_constant() and isinstance(item.as_python_constant(),
                                                              tuple):
                    pair = [tx.wrap_constant(v) for v in item.as_python_constant()]
                else:
                    return ConstantVariable(False)
                if len(pair) != 2:
                    return ConstantVariable(False)
                key = hashable_key(pair[0], self.dict_vt.items)
                found = key in self.dict_vt.items and tx.values_equal(
                    self.dict_vt.items[key], pair[1])
                return ConstantVariable(found)
            return ConstantVariable(any(tx.values_equal(v, item) for v in self.unpack(tx)))
        if name in SetVariable.SET_OPERATIONS and self.kind != "values":
            return self.as_set(tx).call_method(tx, name, args, kwargs)
        raise Unsupported(f"dict_{self.kind}.{name}()")

    def var_getattr(self, tx, name):
        if name == "mapping":
            raise Unsupported(f"dict_{self.kind}.mapping")
        if hasattr(self.python_type(), name):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"dict_{self.kind}.{name}")


class SetVariable(VariableTracker):
    mutable = True
    SET_OPERATIONS = ("union", "intersection", "difference", "symmetric_difference",
                      "issubset", "issuperset", "isdisjoint", "__or__", "__and__", "__sub__",
                      "__xor__", "__ror__", "__rand__", "__rxor__", "__rsub__")

    def __init__(self, items: list[VariableTracker], source=None, frozen=False,
                 order: set | None = None, mirror: bool = True):
        super().__init__(source)
        self.frozen = frozen
        self.iterators: list[SetIteratorVariable] = []
        self.items: dict[Any, VariableTracker] = {}
        for item in items:
            self.items.setdefault(hashable_key(item, self.items), item)
        # a real set of the keys, changed by the same operations as eager's set: it
        # iterates (and pops) in eager's order, which hashes decide, not insertions
        # ({5, 2} iterates 2, 5). None where a key hashes by identity (a tensor, an
        # object), and for a set that exists outside the frame (``mirror=False``: no copy
        # has its table's layout; ``items`` are in its order): the order is then the
        # insertion order.
        self.order = order if order is not None else \
            _mirror(self.items) if mirror else None

    def python_type(self):
        return frozenset if self.frozen else set

    def ordered(self) -> list[VariableTracker]:
        """The items in the order the set iterates in."""
        if self.order is None:
            return list(self.items.values())
        return [self.items[k] for k in self.order]

    def rebuild(self, cg):
        text = f"{{{cg.items(self.ordered())}}}" if self.items else "set()"
        return cg.temp(self, f"frozenset({text})" if self.frozen else text)

    def replay_mutation(self, target: str, value_of) -> str:
        items = ", ".join(value_of(v) for v in self.ordered())
        return f"{target}.clear(); {target}.update([{items}])"

    def as_python_constant(self):
        return self.python_type()(v.as_python_constant() for v in self.ordered())

    def truthy(self, tx):
        return bool(self.items)

    def unpack(self, tx):
        return self.ordered()

    def call_method(self, tx, name, args, kwargs):
        if name == "__contains__":
            return ConstantVariable(hashable_key(args[0], self.items) in self.items)
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name in self.SET_OPERATIONS:
            others = [SetVariable(tx.unpack_iterable(a)) for a in args]
            mine = set(self.items)
            result = getattr(mine, name)(*[set(o.items) for o in others])
            if isinstance(result, bool):
                return ConstantVariable(result)
            pool = dict(self.items)
            for o in others:
                for k, v in o.items.items():
                    pool.setdefault(k, v)
            return SetVariable([pool[k] for k in pool if k in result],
                               order=_mirror_operation(self, name, args, others))
        if name == "copy":
            if self.frozen:
                return self       # frozenset.copy() is the frozenset itself
            return SetVariable(self.ordered(), order=None if self.order is None
                               else set.copy(self.order), mirror=False)
        if name == "__iter__":
            if self.frozen:
                return ListIteratorVariable(self.unpack(tx))
            return self.live_iterator()
        tx.check_mutation(self)
        before = tuple(self.items)
        out = self._mutate(tx, name, args)
        if tuple(self.items) != before:
            self.stored = True
            self.iterators = [it for it in self.iterators if not it.exhausted]
            for it in self.iterators:
                it.container_changed()
        return out

    stored = False   # changed during capture: the real set differs until the replay

    def live_iterator(self) -> SetIteratorVariable:
        """``iter(s)``: CPython's raises at its next step once the set's size changed."""
        it = SetIteratorVariable(self)
        self.iterators.append(it)
        return it

    def _mutate(self, tx, name, args):
        if name == "add":
            key = hashable_key(args[0], self.items)
            self.items.setdefault(key, args[0])
            self._order_add([key])
        elif name in ("discard", "remove"):
            key = hashable_key(args[0], self.items)
            if self.items.pop(key, None) is None and name == "remove":
                raise Unsupported("KeyError in set.remove")
            if self.order is not None:
                self.order.discard(key)
        elif name == "update":
            for a in args:
                if isinstance(a, SetVariable) and a.order is not None and \
                        self.order is not None:
                    self.order.update(a.order)     # merged as eager merges a set
                    self.items.update({k: v for k, v in a.items.items()
                                       if k not in self.items})
                    continue
                for item in tx.unpack_iterable(a):
                    key = hashable_key(item, self.items)
                    self.items.setdefault(key, item)
                    self._order_add([key])
        elif name == "clear":
            self.items.clear()
            self.order = set()
        elif name == "pop":
            if not self.items:
                raise Unsupported("KeyError: 'pop from an empty set'")
            key = self.order.pop() if self.order is not None else next(iter(self.items))
            return self.items.pop(key)
        else:
            raise Unsupported(f"set.{name}()")
        return ConstantVariable(None)

    def _order_add(self, keys) -> None:
        if self.order is None:
            return
        for key in keys:
            if not _hashes_as_itself(key):
                self.order = None
                return
            self.order.add(key)

    def var_getattr(self, tx, name):
        if hasattr(set, name):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"set.{name}")


def _hashes_as_itself(key) -> bool:
    """A set key that hashes at capture as the real value will at run time: a constant
    (``hashable_key`` marks identity-hashed keys with a tag tuple), not a float NaN (hashed
    by identity)."""
    if isinstance(key, tuple):
        if key[:1] in (("__id__",), ("__tuple__",), ("__object__",), ("__tensor__",),
                       ("__tracker__",)):
            return False
        return all(_hashes_as_itself(k) for k in key)
    return not (isinstance(key, float) and key != key)


def make_set(tx, iterable: VariableTracker | None, frozen: bool) -> SetVariable:
    """``set(iterable)``/``frozenset(iterable)``: its order made as eager's, from a set as a
    copy of it, from a dict through the dict (CPython sizes the table for them first)."""
    if iterable is None:
        return SetVariable([], frozen=frozen)
    items = tx.unpack_iterable(iterable)
    order = None
    if isinstance(iterable, SetVariable) and iterable.order is not None:
        order = set(iterable.order)
    elif type(iterable) is DictVariable and all(map(_hashes_as_itself, iterable.items)):
        order = set(dict.fromkeys(iterable.items))
    return SetVariable(items, frozen=frozen, order=order)


def _mirror(keys) -> set | None:
    """A real set of ``keys``, added in this order (as a set literal or ``set(list)``
    does), or None where one hashes by identity."""
    out = set()
    for key in keys:
        if not _hashes_as_itself(key):
            return None
        out.add(key)
    return out


def _mirror_operation(me: SetVariable, name: str, args, others) -> set | None:
    """The real result of ``me.<name>(*args)`` over the keys (so it iterates in eager's
    order): a set operand as its own mirror, any other as a list of its keys."""
    if me.order is None:
        return None
    operands = []
    for arg, other in zip(args, others):
        real = arg.order if isinstance(arg, SetVariable) else _mirror(other.items)
        if real is None:
            return None
        operands.append(real if isinstance(arg, SetVariable) or name.startswith("__")
                        else list(other.items))
    result = getattr(me.order, name)(*operands)
    return result if isinstance(result, set) else None


def is_set_like(vt: VariableTracker) -> bool:
    """A set, a frozenset or a keys/items view: what set comparisons take on both sides
    (``d.values()`` is not one: it compares by identity, as in Python)."""
    return isinstance(vt, SetVariable) or (isinstance(vt, DictViewVariable) and
                                           vt.kind != "values")


_SET_COMPARISONS = (operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
                    operator.ge)
_SWAPPED = {operator.eq: operator.eq, operator.ne: operator.ne, operator.lt: operator.gt,
            operator.le: operator.ge, operator.gt: operator.lt, operator.ge: operator.le}


def compare_sets(tx, op, a: VariableTracker, b: VariableTracker) -> VariableTracker | None:
    """``a op b`` for a comparison between two sets or keys/items views, as CPython's
    ``set_richcompare``/``dictview_richcompare`` compute it: sizes first, then membership
    of each item of one side in the other (a view's ``in`` reads its dict as it is now).
    None when one side is not set-like (Python then falls back to identity for ``==``, and
    raises TypeError for an ordering)."""
    if op not in _SET_COMPARISONS:
        return None
    a, b = _as_set_like(tx, a), _as_set_like(tx, b)
    if not (is_set_like(a) and is_set_like(b)):
        return None
    if isinstance(a, SetVariable) and isinstance(b, DictViewVariable):
        # a set declines to compare with a view: the view's reflected comparison answers
        a, b, op = b, a, _SWAPPED[op]

    def size(vt):
        return len(vt.dict_vt.items) if isinstance(vt, DictViewVariable) else len(vt.items)

    def all_in(items_of, container):
        return all(tx.contains(container, x).truthy(tx) for x in items_of.unpack(tx))

    na, nb = size(a), size(b)
    if op in (operator.eq, operator.ne):
        result = na == nb and all_in(a, b)
        return ConstantVariable(result if op is operator.eq else not result)
    if op in (operator.lt, operator.le):
        fits = na < nb if op is operator.lt else na <= nb
        return ConstantVariable(fits and all_in(a, b))
    fits = na > nb if op is operator.gt else na >= nb
    return ConstantVariable(fits and all_in(b, a))


def compare_dicts(tx, op, a: VariableTracker, b: VariableTracker) -> VariableTracker | None:
    """``a == b`` / ``a != b`` of two dicts: the same keys, and equal values (``is`` first,
    as Python's); two OrderedDicts also need the same order. None unless both are dicts."""
    if op not in (operator.eq, operator.ne) or not (
            isinstance(a, DictVariable) and isinstance(b, DictVariable)):
        return None
    equal = len(a.items) == len(b.items) and all(
        k in b.items and tx.values_equal(v, b.items[k]) for k, v in a.items.items())
    if equal and issubclass(a.cls, collections.OrderedDict) and \
            issubclass(b.cls, collections.OrderedDict):
        equal = list(a.items) == list(b.items)
    return ConstantVariable(equal if op is operator.eq else not equal)


def _as_set_like(tx, vt: VariableTracker) -> VariableTracker:
    """A constant set or frozenset (``x in {1, 2}`` loads a frozenset constant) as a tracker
    of its items; anything else as it is."""
    if isinstance(vt, ConstantVariable) and type(vt.value) in (set, frozenset):
        return SetVariable([tx.wrap_constant(v) for v in vt.value], mirror=False,
                           frozen=type(vt.value) is frozenset)
    return vt


def _argument(args, kwargs, i: int, name: str, default):
    """The constant value of positional ``i`` or keyword ``name`` of a call."""
    if len(args) > i:
        return args[i].as_python_constant()
    return kwargs[name].as_python_constant() if name in kwargs else default


def make_dict(tx, cls, args, kwargs) -> DictVariable:
    """``cls(...)`` for dict, OrderedDict, defaultdict and plain subclasses of them."""
    factory = None
    if issubclass(cls, collections.defaultdict):
        factory, args = (args[0] if args else ConstantVariable(None)), args[1:]
        if factory.is_python_constant() and factory.as_python_constant() is None:
            factory = None
    out = DictVariable({}, cls=cls, default_factory=factory)
    if args:
        out.call_method(tx, "update", args, {})
    for k, v in kwargs.items():
        out.setitem(ConstantVariable(k), v)
    return out


def make_fromkeys(cls):
    """The handler of ``cls.fromkeys(iterable, value=None)``: every key maps to the one
    ``value`` object, in the iterable's order (an iterator is consumed)."""
    def handler(tx, args, kwargs):
        if kwargs or not 1 <= len(args) <= 2:
            raise Unsupported(f"{cls.__name__}.fromkeys() with keywords or "
                              f"{len(args)} arguments")
        keys = tx.unpack_iterable(args[0])
        value = args[1] if len(args) > 1 else ConstantVariable(None)
        out = DictVariable({}, cls=cls)
        for key in keys:
            out.setitem(key, value)
        return out
    return handler


ORDERED_DICT_TYPES = (dict, collections.OrderedDict, collections.defaultdict)


# what a dict subclass must leave to dict for its instances to be tracked as dicts
_DICT_PROTOCOL = ("__new__", "__init__", "__getitem__", "__setitem__", "__delitem__",
                  "__missing__", "__iter__", "__len__", "__contains__", "__eq__", "keys",
                  "values", "items", "get", "update", "pop", "setdefault", "copy", "clear",
                  "__getattribute__", "__setattr__", "__getattr__", "move_to_end", "popitem")


def is_plain_dict_subclass(cls) -> bool:
    """A user subclass of dict or OrderedDict that adds methods but changes none of the
    dict protocol (``class Cache(OrderedDict): ...``)."""
    if not isinstance(cls, type) or cls in (dict, collections.OrderedDict) or \
            not issubclass(cls, dict) or issubclass(cls, collections.defaultdict):
        return False
    base = collections.OrderedDict if issubclass(cls, collections.OrderedDict) else dict
    for klass in cls.__mro__[:cls.__mro__.index(base)]:
        if any(name in vars(klass) for name in _DICT_PROTOCOL) or "__slots__" in vars(klass):
            return False
    return True


def is_live_iterable(vt: VariableTracker) -> bool:
    """Iterating it reads a dict or list as it is at each step (see
    ``LazyIteratorVariable``), or sees a set's or deque's mutations."""
    return type(vt) in (ListVariable, DequeVariable) or isinstance(vt, (
        DictVariable, DictViewVariable, DictIteratorVariable, LazyIteratorVariable,
        LiveListIteratorVariable, *GUARDED_ITERATORS)) or (
        isinstance(vt, SetVariable) and not vt.frozen)
