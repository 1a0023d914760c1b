"""Tuples, lists, deques, torch.Size, named tuples and slices during capture.

Mutable containers (list, dict, set) are tracked by identity: the tracker object *is* the
container, so aliasing inside the frame behaves like Python. A mutated container that came
from the frame's inputs (it has a source) is recorded as a side effect and written back after
the graph runs. Dicts and sets live in ``dicts``, iterators over containers in
``container_iterators``.
"""
from __future__ import annotations

import collections

import torch

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import (BoundMethodVariable, ConstantVariable, NotConstant,
                                           VariableTracker)
from ember.frontend.variables.container_iterators import (DequeIteratorVariable,
                                                          ListIteratorVariable,
                                                          LiveListIteratorVariable)
from ember.frontend.variables.tensor import TensorVariable


class BaseSequenceVariable(VariableTracker):
    py_type: type = tuple

    def __init__(self, items: list[VariableTracker], source=None):
        super().__init__(source)
        self.items = list(items)

    def python_type(self):
        return self.py_type

    def as_python_constant(self):
        return self.py_type(v.as_python_constant() for v in self.items)

    def unpack(self, tx):
        return list(self.items)

    def truthy(self, tx):
        return bool(self.items)

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        try:
            key = index.as_python_constant()
        except NotConstant:
            if isinstance(index, TensorVariable):
                raise Unsupported(f"indexing a {self.py_type.__name__} with a tensor (the "
                                  f"index is the tensor's value: data-dependent)") from None
            raise Unsupported(f"indexing {self.py_type.__name__} with {index}") from None
        if isinstance(key, slice):
            return self.new_like(self.items[key])
        try:
            return self.items[key]
        except (IndexError, TypeError) as e:
            raise Unsupported(f"{self.py_type.__name__} index: {e}") from None

    def new_like(self, items):
        return type(self)(items)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__":
            return tx.contains(self, args[0])
        if name in ("index", "count") and not kwargs:
            return ConstantVariable(getattr(self.as_value_list(tx), name)(
                *[a.as_python_constant() for a in args]))
        if name == "__iter__":
            return ListIteratorVariable(list(self.items))
        raise Unsupported(f"{self.py_type.__name__}.{name}()")

    def as_value_list(self, tx) -> list:
        try:
            return [v.as_python_constant() for v in self.items]
        except NotConstant:
            raise Unsupported(f"{self.py_type.__name__} method on non-constant items") from None

    def var_getattr(self, tx, name):
        if hasattr(self.py_type, name):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"{self.py_type.__name__}.{name}")

    def __repr__(self):
        return f"{type(self).__name__}({self.items!r})"


class TupleVariable(BaseSequenceVariable):
    py_type = tuple

    def rebuild(self, cg):
        return f"({cg.items(self.items)})"


class SizeVariable(TupleVariable):
    """``torch.Size``: a tuple of ints (static sizes are constants)."""
    py_type = torch.Size

    def call_method(self, tx, name, args, kwargs):
        if name == "numel":
            total = 1
            for v in self.items:     # symbolic sizes (SymNodeVariable) multiply symbolically
                value = getattr(v, "sym_value", None)
                total = total * (value if value is not None else v.as_python_constant())
            return tx.wrap_constant(total)
        return super().call_method(tx, name, args, kwargs)

    def getitem(self, tx, index):
        out = super().getitem(tx, index)
        return SizeVariable(out.items) if isinstance(out, TupleVariable) else out

    def rebuild(self, cg):
        return f"{cg.const(torch.Size)}(({cg.items(self.items)}))"


class NamedTupleVariable(TupleVariable):
    """A ``collections.namedtuple``/``typing.NamedTuple`` instance or ``torch.return_types``."""

    def __init__(self, items, cls: type, source=None):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def as_python_constant(self):
        return self.cls(*[v.as_python_constant() for v in self.items])

    def new_like(self, items):
        return TupleVariable(items)

    def rebuild(self, cg):
        if is_structseq_class(self.cls):
            return f"{cg.const(self.cls)}(({cg.items(self.items)}))"
        return f"{cg.const(self.cls)}({cg.items(self.items)})"

    def field_names(self):
        return list(getattr(self.cls, "_fields", ())) or [
            n for n in dir(self.cls) if not n.startswith("_") and n not in ("count", "index")
            and isinstance(getattr(self.cls, n, None), property)]

    def var_getattr(self, tx, name):
        fields = list(getattr(self.cls, "_fields", ()))
        if name in fields:
            return self.items[fields.index(name)]
        if self.cls.__module__ == "torch.return_types" and name not in fields:
            # structseq: values/indices etc. are positional in a fixed order
            order = {"values": 0, "indices": 1, "min": 0, "max": 0, "solution": 0,
                     "Q": 0, "R": 1, "L": 0, "U": 1, "S": 1, "V": 2, "eigenvalues": 0,
                     "eigenvectors": 1, "mantissa": 0, "exponent": 1, "sign": 0,
                     "logabsdet": 1}
            if name in order:
                return self.items[order[name]]
        # local: a namedtuple's methods are user functions, whose calls bind *args into tuples
        # (attribute_lookup -> functions -> containers)
        from ember.frontend.variables.attribute_lookup import MISSING, class_attribute
        found = class_attribute(tx, self.cls, name, self, None)
        if found is not MISSING:
            return found
        return super().var_getattr(tx, name)


class ListVariable(BaseSequenceVariable):
    py_type = list
    mutable = True

    def live_iterator(self, reverse: bool = False) -> "LiveListIteratorVariable":
        """``iter(lst)`` or ``reversed(lst)``: reads the list as it is at each step."""
        return LiveListIteratorVariable(self, reverse)

    def call_method(self, tx, name, args, kwargs):
        if type(self) is ListVariable and not args and not kwargs and \
                name in ("__iter__", "__reversed__"):
            return self.live_iterator(reverse=name == "__reversed__")
        tx.check_mutation(self)
        if name == "append":
            self.items.append(args[0])
        elif name == "extend":
            self.items.extend(tx.unpack_iterable(args[0]))
        elif name == "insert":
            self.items.insert(args[0].as_python_constant(), args[1])
        elif name == "pop":
            idx = args[0].as_python_constant() if args else -1
            try:
                return self.items.pop(idx)
            except IndexError as e:
                raise Unsupported(f"list.pop: {e}") from None
        elif name == "clear":
            self.items.clear()
        elif name == "reverse":
            self.items.reverse()
        elif name == "copy":
            return ListVariable(list(self.items))
        elif name == "remove":
            target = args[0]
            for i, item in enumerate(self.items):
                if tx.values_equal(item, target):
                    del self.items[i]
                    break
            else:
                raise Unsupported("list.remove(x): x not in list")
        elif name == "sort":
            key = kwargs.get("key")
            reverse = kwargs.get("reverse", ConstantVariable(False)).as_python_constant()
            self.items[:] = tx.sorted_items(self.items, key, reverse)
        elif name == "__setitem__":
            key = args[0].as_python_constant()
            if isinstance(key, slice):
                self.items[key] = tx.unpack_iterable(args[1])
            else:
                self.items[key] = args[1]
        elif name == "__delitem__":
            del self.items[args[0].as_python_constant()]
        else:
            return super().call_method(tx, name, args, kwargs)
        return ConstantVariable(None)

    def new_like(self, items):
        return ListVariable(items)

    def rebuild(self, cg):
        return cg.temp(self, f"[{cg.items(self.items)}]")

    def replay_mutation(self, target: str, value_of) -> str:
        """A statement giving the real container ``target`` this tracker's contents."""
        return f"{target}[:] = [{', '.join(value_of(v) for v in self.items)}]"


class DequeVariable(ListVariable):
    """``collections.deque``: a list with operations at both ends; with ``maxlen``, adding
    at one end drops items from the other, as the real deque does."""
    py_type = collections.deque

    def __init__(self, items, source=None, maxlen: int | None = None):
        super().__init__(items, source)
        self.maxlen = maxlen
        self.iterators: list[DequeIteratorVariable] = []

    stored = False   # changed during capture: the real deque differs until the replay

    def live_iterator(self, reverse: bool = False) -> DequeIteratorVariable:
        """``iter(dq)``/``reversed(dq)``: CPython's raises at its next step once the deque
        is mutated."""
        it = DequeIteratorVariable(self, reverse)
        self.iterators.append(it)
        return it

    # the methods that advance CPython's deque state (its iterators then raise); with an
    # empty argument extend/extendleft/+=/*=1 do not, nor do item stores and reverse()
    _COUNTED = frozenset(("append", "appendleft", "pop", "popleft", "clear", "rotate",
                          "remove", "insert", "__delitem__"))
    _COUNTED_IF_ITEMS = frozenset(("extend", "extendleft", "__iadd__"))

    def call_method(self, tx, name, args, kwargs):
        if name in ("__iter__", "__reversed__") and not args and not kwargs:
            return self.live_iterator(reverse=name == "__reversed__")
        if name in self._COUNTED_IF_ITEMS and args:
            args = [ListVariable(tx.unpack_iterable(args[0])), *args[1:]]
            counted = bool(args[0].items)
        else:   # clear() and rotate() of an empty deque do not count
            counted = name in self._COUNTED and (
                bool(self.items) or name not in ("clear", "rotate"))
        out = self._call_method(tx, name, args, kwargs)
        if counted:
            self.stored = True
            for it in self.iterators:
                it.container_changed()
        return out

    def _trim(self, drop_left: bool) -> None:
        excess = len(self.items) - self.maxlen if self.maxlen is not None else 0
        if excess > 0:
            del self.items[slice(None, excess) if drop_left else slice(self.maxlen, None)]

    def _call_method(self, tx, name, args, kwargs):
        if name in ("append", "extend"):
            out = super().call_method(tx, name, args, kwargs)
            self._trim(drop_left=True)
            return out
        if name == "copy":
            return DequeVariable(list(self.items), maxlen=self.maxlen)
        if name == "__len__" or name == "__getitem__" or name in ("index", "count"):
            return super().call_method(tx, name, args, kwargs)
        tx.check_mutation(self)
        if name == "appendleft":
            self.items.insert(0, args[0])
        elif name == "extendleft":
            for item in tx.unpack_iterable(args[0]):
                self.items.insert(0, item)
        elif name == "popleft":
            if not self.items:
                raise Unsupported("IndexError: pop from an empty deque")
            return self.items.pop(0)
        elif name == "rotate":
            n = args[0].as_python_constant() if args else 1
            if self.items:
                n %= len(self.items)
                self.items[:] = self.items[len(self.items) - n:] + self.items[:len(
                    self.items) - n]
        elif name in ("sort", "__setitem__") or (name == "insert" and self.maxlen is not None):
            raise Unsupported(f"deque.{name}()")
        else:
            return super().call_method(tx, name, args, kwargs)
        self._trim(drop_left=False)
        return ConstantVariable(None)

    def var_getattr(self, tx, name):
        if name == "maxlen":
            return ConstantVariable(self.maxlen)
        return super().var_getattr(tx, name)

    def new_like(self, items):
        return DequeVariable(items, maxlen=self.maxlen)

    def rebuild(self, cg):
        return cg.temp(self, f"{cg.const(self.py_type)}([{cg.items(self.items)}], "
                             f"{self.maxlen!r})")

    def replay_mutation(self, target: str, value_of) -> str:
        items = ", ".join(value_of(v) for v in self.items)
        return f"{target}.clear(); {target}.extend([{items}])"


class SliceVariable(VariableTracker):
    """A slice whose bounds are not all constants (e.g. hold a tensor index)."""

    def __init__(self, start, stop, step):
        super().__init__()
        self.parts = [start, stop, step]

    def python_type(self):
        return slice

    def as_python_constant(self):
        return slice(*[p.as_python_constant() for p in self.parts])

    def rebuild(self, cg):
        return f"slice({cg.items(self.parts)})"


def is_namedtuple_class(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def is_structseq_class(cls) -> bool:
    return isinstance(cls, type) and cls.__module__ == "torch.return_types"
