"""Iterators over tuples, lists, dicts and their views, sets and deques during capture,
endless ones (``itertools.repeat``/``count``), and the iterators that resume such a loop in
eager code after a graph break (``Resumed*Iterator``).

Lists are read live (an index into the list); dicts, sets and deques are iterated over their
items when the iterator was made, and a change that makes CPython's iterator raise
RuntimeError at its next step (a dict's or set's size, any counted deque mutation) makes
capture stop there: the frame runs eagerly and raises it. Outside the graph each is the real
container's iterator at the same position, so eager code after a break raises as eager does.

(``iterators`` holds the ``itertools`` functions over tracked values.)
"""
from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import VariableTracker

if TYPE_CHECKING:
    from ember.frontend.variables.containers import ListVariable
    from ember.frontend.variables.dicts import DictVariable


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


class _CountingIterator:
    """A real iterator ``it`` that counts its steps in ``pos`` (what ``builder`` tracks it
    again from)."""

    __slots__ = ()

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.it)
        self.pos += 1
        return item


class ResumedDictIterator(_CountingIterator):
    """The iterator over a dict that a resume function continues a loop with: a real
    iterator over the real dict, advanced past what the frame consumed (so it raises as
    eager's does if the dict then changes size), holding what capture needs to track it
    again (``builder``): the dict, which view, the position, the keys it iterates."""

    __slots__ = ("dict", "kind", "reverse", "pos", "keys", "it")

    def __init__(self, d: dict, kind: str, reverse: bool, pos: int):
        self.dict, self.kind, self.reverse, self.pos = d, kind, reverse, pos
        self.keys = tuple(d)
        self.it = skip_items((reversed if reverse else iter)(getattr(d, kind)()), pos)

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


class _RebuiltReal:
    """Outliving the graph: its ``real_iterator``, made where the mutations are not
    replayed yet."""

    def rebuild(self, cg):
        if self.passed_as_items:
            raise Unsupported("an iterator reached both from the frame's stack or locals and "
                              "from another value at a graph break")
        return cg.temp(self, self.real_iterator(cg, before_replay=True))


class DictIteratorVariable(_RebuiltReal, ListIteratorVariable):
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


class LazyIteratorVariable(_RebuiltReal, _SteppedIterator):
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
                                LiveListIteratorVariable, *GUARDED_ITERATORS)):
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


class SetIteratorVariable(_RebuiltReal, ListIteratorVariable):
    """``iter(s)`` over a set: its items in the order capture knows, made invalid as
    CPython's set iterator is by a change of the set's size (RuntimeError at its next step,
    also the last one; none once it ended). A change keeping the size lets CPython's go on
    over its hash table, which capture does not model: the frame runs eagerly then too.
    Outside the graph it is ``real_set_iterator``/``ResumedSetIterator`` over the real set."""
    py_type = type(iter(set()))
    unmodelled = False

    def __init__(self, set_vt):
        super().__init__(set_vt.ordered())
        self.set_vt, self.keys = set_vt, tuple(set_vt.items)

    def container_changed(self) -> None:
        self.touched = True    # compared at the next step, as CPython's (discard then add)

    touched = False

    def _check_valid(self) -> None:
        if self.exhausted:     # CPython's drops its set at the end
            return
        if self.touched and self.invalid is None:
            keys = self.set_vt.items
            if len(keys) != len(self.keys):
                self.invalid = "Set changed size during iteration"
            elif any(k not in keys for k in self.keys):
                self.unmodelled = True
        if self.unmodelled:
            raise Unsupported("a set changed during iteration keeping its size (CPython's "
                              "iterator goes on over its hash table)")
        super()._check_valid()

    def real_iterator(self, cg, before_replay: bool = False, resumed: bool = False) -> str:
        claim_iterator(cg, self)
        if self.touched and not self.exhausted and tuple(self.set_vt.items) != self.keys:
            raise Unsupported("an iterator over a changed set outliving the graph")
        if before_replay and self.set_vt.source is not None and self.set_vt.stored:
            raise Unsupported("an iterator over a set changed by the frame outliving the graph")
        if self.exhausted:
            return "()" if resumed else f"{cg.const(iter)}(())"
        make = ResumedSetIterator if resumed else real_set_iterator
        return (f"{cg.const(make)}({cg.reconstruct(self.set_vt)}, "
                f"({cg.items(self.items)}{',' if len(self.items) == 1 else ''}), {self.index})")


def _same_items(a, b) -> bool:
    """``a`` iterates as the tuple ``b`` (items compared by identity, or value for
    literals: a constant rebuilt outside the graph may be another object)."""
    if len(a) != len(b):
        return False
    return all(x is y or (type(x) is type(y) and isinstance(x, (int, float, str, bytes))
                          and x == y) for x, y in zip(a, b))


def real_set_iterator(s: set, items: tuple, pos: int):
    """An iterator over the set ``s`` that capture iterated as ``items`` up to ``pos``: the
    real one where ``s`` iterates in that order, else a ResumedSetIterator."""
    if _same_items(s, items):
        return skip_items(iter(s), pos)
    return ResumedSetIterator(s, items, pos)


class ResumedSetIterator:
    """The iterator over a set that a resume function continues a loop with: the real
    set's iterator at ``pos`` where the set iterates in the order capture knew
    (``items``), else a stand-in over ``items`` that raises as CPython's does when the
    set's size changes (where the size stays, it goes on over ``items``: CPython's goes on
    over its hash table, which is not modelled). ``builder`` tracks it again when it is
    the real one and the set unchanged."""

    __slots__ = ("set", "items", "pos", "size", "it", "done")

    def __init__(self, s: set, items: tuple, pos: int):
        self.set, self.items, self.pos, self.size, self.done = s, items, pos, len(s), False
        self.it = skip_items(iter(s), pos) if _same_items(s, items) else None

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        if self.it is not None:
            try:
                item = next(self.it)
            except StopIteration:
                self.done = True
                raise
        else:
            if len(self.set) != self.size:
                self.size = -1      # sticky, as CPython's
                raise RuntimeError("Set changed size during iteration")
            if self.pos >= len(self.items):
                self.done = True
                raise StopIteration
            item = self.items[self.pos]
        self.pos += 1
        return item

    def resumable(self) -> bool:
        """Its next step is the real iterator's over the set unchanged since: capture
        can go on from ``pos`` in ``items``."""
        return (self.it is not None and not self.done and len(self.set) == self.size
                and _same_items(self.set, self.items))


class DequeIteratorVariable(_RebuiltReal, ListIteratorVariable):
    """``iter(dq)``/``reversed(dq)`` over a deque: its items, made invalid by any mutation
    of the deque that CPython counts (``DequeVariable``): RuntimeError at its next step,
    also after its end (CPython's keeps checking its deque). Outside the graph it is the
    real deque's iterator at the same position (``ResumedDequeIterator`` for a resume
    function)."""

    def __init__(self, deque_vt, reverse: bool = False):
        items = list(deque_vt.items)
        super().__init__(items[::-1] if reverse else items)
        self.deque_vt, self.reverse = deque_vt, reverse
        self.py_type = type((reversed if reverse else iter)(collections.deque()))

    def next(self, tx):
        item = super().next(tx)
        self.exhausted = False    # CPython's keeps its deque: later mutations still raise
        return item

    def container_changed(self) -> None:
        if self.invalid is None:
            self.invalid = "deque mutated during iteration"

    def real_iterator(self, cg, before_replay: bool = False, resumed: bool = False) -> str:
        claim_iterator(cg, self)
        if self.invalid is not None:
            raise Unsupported(f"an iterator over a changed deque ({self.invalid}) outliving "
                              f"the graph")
        if before_replay and self.deque_vt.source is not None and self.deque_vt.stored:
            raise Unsupported("an iterator over a deque changed by the frame outliving the "
                              "graph")
        dq = cg.reconstruct(self.deque_vt)
        if resumed:
            return f"{cg.const(ResumedDequeIterator)}({dq}, {self.index}, {self.reverse})"
        make = f"{cg.const(reversed if self.reverse else iter)}({dq})"
        return f"{cg.const(skip_items)}({make}, {self.index})"


class ResumedDequeIterator(_CountingIterator):
    """The iterator over a deque that a resume function continues a loop with: the real
    deque's iterator at ``pos`` (so it raises as eager's on a mutation), with the deque's
    items when it was made, for ``builder`` to track it again where they are unchanged (a
    mutation outside the graph that leaves the same items is not seen there)."""

    __slots__ = ("deque", "pos", "reverse", "items", "it")

    def __init__(self, dq: collections.deque, pos: int, reverse: bool):
        self.deque, self.pos, self.reverse, self.items = dq, pos, reverse, tuple(dq)
        self.it = skip_items((reversed if reverse else iter)(dq), pos)

    def unchanged(self) -> bool:
        return _same_items(self.deque, self.items)


GUARDED_ITERATORS = (SetIteratorVariable, DequeIteratorVariable)


class EndlessIteratorVariable(ListIteratorVariable):
    """``itertools.repeat(x)`` or ``itertools.count(start, step)``: items made on demand."""

    def __init__(self, make_item):
        super().__init__([])
        self.make_item = make_item   # position -> tracker

    def next(self, tx):
        self.items.append(self.make_item(tx, len(self.items)))
        self.index = len(self.items)
        return self.items[-1]

    def take(self, tx, n: int) -> list[VariableTracker]:
        return [self.next(tx) for _ in range(n)]

    def unpack(self, tx):
        raise Unsupported("unrolling an endless iterator (itertools.repeat/count without an end)")

    def rebuild(self, cg):
        raise Unsupported("an endless iterator outliving the graph")


def finite_lists(tx, iterables) -> list[list[VariableTracker]]:
    """The items of each iterable; endless ones give as many as the shortest finite one
    (what ``zip`` consumes of them)."""
    finite = [None if isinstance(a, EndlessIteratorVariable) else tx.unpack_iterable(a)
              for a in iterables]
    lengths = [len(items) for items in finite if items is not None]
    if not lengths:
        raise Unsupported("zip of endless iterators only")
    n = min(lengths)
    return [items if items is not None else a.take(tx, n)
            for a, items in zip(iterables, finite)]
