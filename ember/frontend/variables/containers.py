"""Tuples, lists, dicts, sets, torch.Size, named tuples and iterators during capture.

Mutable containers (list, dict, set) are tracked by identity: the tracker object *is* the
container, so aliasing inside the frame behaves like Python. A mutated container that came
from the frame's inputs (it has a source) is recorded as a side effect and written back after
the graph runs.
"""
from __future__ import annotations

import collections
import itertools
import operator
from typing import Any

import torch

from ember.frontend.exc import ObservedException, Unsupported
from ember.frontend.variables.base import ConstantVariable, NotConstant, VariableTracker


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
            from ember.frontend.variables.tensor import TensorVariable
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
        from ember.frontend.variables.functions import BoundMethodVariable
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
            return ConstantVariable(torch.Size(self.as_python_constant()).numel())
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
        from ember.frontend.variables.objects import _MISSING, class_attribute
        found = class_attribute(tx, self.cls, name, self, None)
        if found is not _MISSING:
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

    def _trim(self, drop_left: bool) -> None:
        excess = len(self.items) - self.maxlen if self.maxlen is not None else 0
        if excess > 0:
            del self.items[slice(None, excess) if drop_left else slice(self.maxlen, None)]

    def call_method(self, tx, name, args, kwargs):
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


class ListIteratorVariable(VariableTracker):
    """An iterator over a materialised list of items (every iterable is unrolled)."""
    mutable = True

    def __init__(self, items: list[VariableTracker], source=None):
        super().__init__(source)
        self.items = items
        self.index = 0

    py_type = type(iter([]))
    # set on an iterator over a dict or its view whose dict changed size or keys since:
    # Python raises RuntimeError at its next step (see DictVariable.live_iterator)
    invalid: str | None = None
    exhausted = False

    def python_type(self):
        return self.py_type

    def next(self, tx) -> VariableTracker | None:
        self._check_valid()
        if self.index >= len(self.items):
            self.exhausted = True     # Python's dict iterators then stop checking their dict
            return None
        item = self.items[self.index]
        self.index += 1
        return item

    def unpack(self, tx):
        self._check_valid()
        rest = self.items[self.index:]
        self.index = len(self.items)
        self.exhausted = True
        return rest

    def _check_valid(self) -> None:
        if self.invalid is not None:
            raise Unsupported(f"RuntimeError: {self.invalid}")

    passed_as_items = False   # set by a graph break that passes it to a resume function

    def rebuild(self, cg):
        if self.passed_as_items:
            # the resume function makes it again from its items: a second object here
            # would not advance with it
            raise Unsupported("an iterator reached both from the frame's stack or locals and "
                              "from another value at a graph break")
        return cg.temp(self, f"iter([{cg.items(self.items[self.index:])}])")

    def call_method(self, tx, name, args, kwargs):
        if name == "__next__":
            item = self.next(tx)
            if item is None:
                raise Unsupported("StopIteration inside a compiled region")
            return item
        if name == "__iter__":
            return self
        raise Unsupported(f"iterator.{name}()")


def claim_iterator(cg, it: ListIteratorVariable) -> None:
    """Each iterator is made once outside the graph: one reached twice through wrappers
    (``zip(*[iter(d)] * 2)``) would become two iterators that do not advance together."""
    if id(it) in cg.made_iterators:
        raise Unsupported("one iterator over a dict or list reached twice at a graph break")
    cg.made_iterators.add(id(it))


def skip_items(it, n: int):
    """``it`` advanced by ``n`` items (a dict iterator rebuilt where the frame's was)."""
    for _ in range(n):
        next(it)
    return it


class ResumedDictIterator:
    """The iterator over a dict that a resume function continues a loop with: a real
    iterator over the real dict, advanced past what the frame consumed (so it raises as
    eager's does if the dict then changes size), holding what capture needs to track it
    again (``builder``): the dict, which view, the position, the keys it iterates."""

    __slots__ = ("dict", "kind", "reverse", "pos", "keys", "it")

    def __init__(self, d: dict, kind: str, reverse: bool, pos: int):
        self.dict, self.kind, self.reverse, self.pos = d, kind, reverse, pos
        self.keys = tuple(d)
        self.it = skip_items((reversed if reverse else iter)(getattr(d, kind)()), pos)

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.it)
        self.pos += 1
        return item

    def unchanged(self) -> bool:
        """The dict has the keys it had when the iteration began: its next step cannot
        raise, and continues at ``pos`` in that order."""
        return tuple(self.dict) == self.keys


class ResumedListIterator:
    """The iterator over a list that a resume function continues a loop with (or that
    outlives the graph): over the real list, at the frame's index, stepping as CPython's
    list iterator and reverse iterator do (the item at the index if it is within the list
    as it is then, else the end, for good), so the list's later changes are seen as in
    eager. Unlike ``list_iterator.__setstate__`` the index is not clamped to the length at
    creation (items removed behind the index, then appended, are reached as in eager).
    ``builder`` tracks it again from its list and position."""

    __slots__ = ("list", "pos", "reverse", "done")

    def __init__(self, lst: list, pos: int, reverse: bool, done: bool = False):
        self.list, self.pos, self.reverse, self.done = lst, pos, reverse, done

    def __iter__(self):
        return self

    def __next__(self):
        pos = self.pos
        if not self.done and 0 <= pos < len(self.list):
            self.pos = pos - 1 if self.reverse else pos + 1
            return self.list[pos]
        self.done = True
        raise StopIteration

    def __length_hint__(self):
        if self.done:
            return 0
        if self.reverse:
            return self.pos + 1 if self.pos < len(self.list) else 0
        return max(0, len(self.list) - self.pos)


class ResumedWrapperIterator:
    """``enumerate``/``zip``/``map``/``filter``/``chain``/``islice`` over a live iterator (of a
    dict or list) that a resume function continues a loop with: the real wrapper over its
    sources (a ResumedDictIterator, ResumedListIterator or another of these, or the tuple
    of a plain iterator's remaining items), keeping them so
    capture can track it again (``builder``). ``head``: enumerate's count, the function of
    map and filter, islice's (start, stop, step) from where it is, zip's strict."""

    __slots__ = ("fn", "head", "sources", "it", "fresh")

    def __init__(self, fn, head, sources: tuple):
        self.fn, self.head, self.sources, self.fresh = fn, head, sources, True
        iters = [iter(s) for s in sources]
        self.it = (fn(*iters, strict=bool(head)) if fn is zip else
                   fn(*iters) if fn is itertools.chain else
                   fn(iters[0], *head) if fn is itertools.islice else
                   fn(iters[0], head) if fn is enumerate
                   else fn(head, *iters))

    def __iter__(self):
        return self

    def __next__(self):
        self.fresh = False
        return next(self.it)


RESUMABLE_WRAPPERS = (enumerate, zip, map, filter, itertools.chain, itertools.islice)


class DictIteratorVariable(ListIteratorVariable):
    """An iterator over a dict or one of its views (``DictVariable.live_iterator``).
    Outside the graph it is a real iterator over the real dict, advanced past the items
    the frame consumed, so the rest of a loop sees the dict as it is then, as in eager."""

    def __init__(self, items, dict_vt: "DictVariable", kind: str, reverse: bool):
        super().__init__(items)
        self.dict_vt, self.kind, self.reverse = dict_vt, kind, reverse

    def real_iterator(self, cg, before_replay: bool = False, resumed: bool = False) -> str:
        """An expression making the real iterator, for where the dict's mutations were
        replayed (a dict made by the frame is rebuilt as it is now); ``before_replay``:
        for where they were not (unsupported if there are any); ``resumed``: a
        ResumedDictIterator, for a resume function to track again."""
        claim_iterator(cg, self)
        if self.invalid is not None:   # its next step raises: the frame runs eagerly
            raise Unsupported(f"an iterator over a changed dict ({self.invalid}) outliving "
                              f"the graph")
        if before_replay and self.dict_vt.source is not None and self.dict_vt.stored:
            raise Unsupported("an iterator over a dict changed by the frame outliving the "
                              "graph")
        if self.exhausted:   # Python's stops checking its dict once it ended
            return "()" if resumed else f"{cg.const(iter)}(())"
        if resumed:
            return (f"{cg.const(ResumedDictIterator)}({cg.reconstruct(self.dict_vt)}, "
                    f"{self.kind!r}, {self.reverse}, {self.index})")
        view = f"{cg.reconstruct(self.dict_vt)}.{self.kind}()"
        make = f"{cg.const(reversed if self.reverse else iter)}({view})"
        return f"{cg.const(skip_items)}({make}, {self.index})"

    def rebuild(self, cg):
        if self.passed_as_items:
            raise Unsupported("an iterator reached both from the frame's stack or locals and "
                              "from another value at a graph break")
        return cg.temp(self, self.real_iterator(cg, before_replay=True))


class _SteppedIterator(ListIteratorVariable):
    """An iterator whose items are taken one step at a time (never sliced from ``items``)."""

    def unpack(self, tx):
        out = []
        while (item := self.next(tx)) is not None:
            out.append(item)
        return out


class LiveListIteratorVariable(_SteppedIterator):
    """``iter(lst)`` / ``reversed(lst)`` over a list: as CPython's, an index into the list
    as it is at each step (no snapshot), so stores, appends and removals during the loop
    act as in eager. Outside the graph it is an iterator over the real list (its mutations
    replayed, or the list rebuilt as it is now) at the same index: a real list iterator
    where it outlives the frame, a ResumedListIterator for a resume function."""

    def __init__(self, list_vt: ListVariable, reverse: bool = False):
        VariableTracker.__init__(self, None)
        self.list_vt, self.reverse = list_vt, reverse
        self.index = len(list_vt.items) - 1 if reverse else 0
        self.py_type = type(reversed([])) if reverse else type(iter([]))

    @property
    def items(self) -> list[VariableTracker]:
        return self.list_vt.items

    def next(self, tx):
        items = self.list_vt.items
        if not self.exhausted and 0 <= self.index < len(items):
            item = items[self.index]
            self.index += -1 if self.reverse else 1
            return item
        self.exhausted = True    # CPython's drops its list at the end: later appends unseen
        return None

    def real_iterator(self, cg, before_replay: bool = False, resumed: bool = False) -> str:
        """The real iterator; made before or after the list's replay alike (it reads the
        list only when stepped). ``resumed``: a ResumedListIterator, for a resume function
        to track again."""
        claim_iterator(cg, self)
        if self.exhausted:
            return "()" if resumed else f"{cg.const(iter)}([])"
        return (f"{cg.const(ResumedListIterator)}({cg.reconstruct(self.list_vt)}, "
                f"{self.index}, {self.reverse})")

    def rebuild(self, cg):
        """Outliving the graph: a real list iterator, positioned by ``__setstate__`` once
        the list's mutations are replayed (``cg.iterator_lines``: it clamps the index to
        the list's length then); a ResumedListIterator where the index is past the end."""
        if self.passed_as_items:
            raise Unsupported("an iterator reached both from the frame's stack or locals and "
                              "from another value at a graph break")
        size = len(self.list_vt.items)
        if not self.exhausted and not (0 <= self.index < size or
                                       (self.index == size and not self.reverse)):
            return cg.temp(self, self.real_iterator(cg))
        if self.exhausted:   # an ended list iterator acts as one over an empty list
            claim_iterator(cg, self)
            return cg.temp(self, f"{cg.const(iter)}([])")
        claim_iterator(cg, self)
        make = cg.const(reversed if self.reverse else iter)
        name = cg.temp(self, f"{make}({cg.reconstruct(self.list_vt)})")
        cg.iterator_lines.append(f"{name}.__setstate__({self.index})")
        return name


class LazyIteratorVariable(_SteppedIterator):
    """``enumerate``/``zip``/``map``/``filter``/``itertools`` over a live iterator (one
    over a list, a dict or its view): each step takes its items from the sources when it is
    reached, as Python's do, so a value stored into the dict meanwhile is seen (a snapshot
    at creation would not see it). Outside the graph it is the real wrapper made again
    (``remake``) around the sources' real iterators."""

    def __init__(self, sources: list[ListIteratorVariable], step, remake=None, py_type=None,
                 head=None):
        super().__init__([])
        self.sources = sources
        self.step = step        # tx -> the next item, None at the end
        self.remake = remake    # (cg, sources' expressions) -> expression; None: cannot
        self.head = head        # cg -> ResumedWrapperIterator's head (RESUMABLE_WRAPPERS)
        if py_type is not None:
            self.py_type = py_type

    def next(self, tx):
        if self.exhausted:
            return None
        item = self.step(tx)
        if item is None:
            self.exhausted = True
        return item

    def real_iterator(self, cg, before_replay: bool = False, resumed: bool = False) -> str:
        claim_iterator(cg, self)
        if self.exhausted:
            return "()" if resumed else f"{cg.const(iter)}(())"
        resumed = resumed and self.py_type in RESUMABLE_WRAPPERS and self.head is not None
        if self.remake is None and not resumed:
            raise Unsupported(f"{self.py_type.__name__} over a dict outliving the graph")
        sources = []
        for src in self.sources:
            if src.passed_as_items:   # one object with a name of its own: not made twice
                raise Unsupported("an iterator both wrapped and named at a graph break")
            if isinstance(src, (DictIteratorVariable, LazyIteratorVariable,
                                LiveListIteratorVariable)):
                sources.append(src.real_iterator(cg, before_replay, resumed))
            elif resumed and type(src) is ListIteratorVariable:
                claim_iterator(cg, src)
                sources.append(f"({cg.items(src.items[src.index:])})")
            else:
                sources.append(cg.reconstruct(src))
        if resumed:
            return (f"{cg.const(ResumedWrapperIterator)}({cg.const(self.py_type)}, "
                    f"{self.head(cg)}, ({', '.join(sources)},))")
        return self.remake(cg, sources)

    def rebuild(self, cg):
        if self.passed_as_items:
            raise Unsupported("an iterator reached both from the frame's stack or locals and "
                              "from another value at a graph break")
        return cg.temp(self, self.real_iterator(cg, before_replay=True))


def is_live_iterable(vt: VariableTracker) -> bool:
    """Iterating it reads a dict or list as it is at each step (see
    ``LazyIteratorVariable``)."""
    return type(vt) is ListVariable or isinstance(vt, (
        DictVariable, DictViewVariable, DictIteratorVariable, LazyIteratorVariable,
        LiveListIteratorVariable))


def hashable_key(vt: VariableTracker, among: dict | None = None) -> Any:
    """The Python key a tracker stands for in a dict or set (``among``: the keys of that
    dict or set, when it is looked up in)."""
    from ember.frontend.variables.scalars import IdVariable, identity_key
    if isinstance(vt, IdVariable):
        if among is not None and any(type(k) is int for k in among):
            # integer keys not made by id() during capture may be real ids: the answer would
            # depend on which object this is
            raise Unsupported("an id() looked up among integer keys")
        return ("__id__", vt.key)
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
        from ember.frontend.variables.functions import BoundMethodVariable
        if name == "move_to_end" and issubclass(self.cls, collections.OrderedDict):
            return BoundMethodVariable(self, name)
        if self.cls not in (dict, collections.OrderedDict, collections.defaultdict) and \
                not hasattr(dict, name):
            # a method a plain dict subclass adds
            from ember.frontend.variables.objects import _MISSING, class_attribute
            found = class_attribute(tx, self.cls, name, self, None)
            if found is not _MISSING:
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
        from ember.frontend.variables.functions import BoundMethodVariable
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

    def __init__(self, items: list[VariableTracker], source=None, frozen=False):
        super().__init__(source)
        self.frozen = frozen
        self.items: dict[Any, VariableTracker] = {}
        for item in items:
            self.items.setdefault(hashable_key(item, self.items), item)

    def python_type(self):
        return frozenset if self.frozen else set

    def rebuild(self, cg):
        text = f"{{{cg.items(list(self.items.values()))}}}" if self.items else "set()"
        return cg.temp(self, f"frozenset({text})" if self.frozen else text)

    def replay_mutation(self, target: str, value_of) -> str:
        items = ", ".join(value_of(v) for v in self.items.values())
        return f"{target}.clear(); {target}.update([{items}])"

    def as_python_constant(self):
        return self.python_type()(v.as_python_constant() for v in self.items.values())

    def truthy(self, tx):
        return bool(self.items)

    def unpack(self, tx):
        return list(self.items.values())

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
            return SetVariable([pool[k] for k in pool if k in result])
        if name == "copy":
            return SetVariable(list(self.items.values()))
        if name == "__iter__":
            return ListIteratorVariable(self.unpack(tx))
        tx.check_mutation(self)
        if name == "add":
            self.items.setdefault(hashable_key(args[0], self.items), args[0])
        elif name in ("discard", "remove"):
            key = hashable_key(args[0], self.items)
            if self.items.pop(key, None) is None and name == "remove":
                raise Unsupported("KeyError in set.remove")
        elif name == "update":
            for a in args:
                for item in tx.unpack_iterable(a):
                    self.items.setdefault(hashable_key(item, self.items), item)
        elif name == "clear":
            self.items.clear()
        elif name == "pop":
            key = next(iter(self.items))
            return self.items.pop(key)
        else:
            raise Unsupported(f"set.{name}()")
        return ConstantVariable(None)

    def var_getattr(self, tx, name):
        from ember.frontend.variables.functions import BoundMethodVariable
        if hasattr(set, name):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"set.{name}")


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
        return SetVariable([tx.wrap_constant(v) for v in vt.value],
                           frozen=type(vt.value) is frozenset)
    return vt


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


def _argument(args, kwargs, i: int, name: str, default):
    """The constant value of positional ``i`` or keyword ``name`` of a call."""
    if len(args) > i:
        return args[i].as_python_constant()
    return kwargs[name].as_python_constant() if name in kwargs else default


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


def is_namedtuple_class(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def is_structseq_class(cls) -> bool:
    return isinstance(cls, type) and cls.__module__ == "torch.return_types"


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
