"""``itertools`` over tracked values, and the class-level constructors of builtin containers
(``dict.fromkeys``, ``chain.from_iterable``).

Every finite iterator is unrolled at capture: the real ``itertools`` function runs on the
item positions (``product(range(2), range(3))``), so ordering and edge cases are Python's
own, and the result is a :class:`ListIteratorVariable` over the trackers at those positions.
``repeat(x)`` and ``count()`` without an end are :class:`EndlessIteratorVariable`: ``zip``,
``islice`` and ``for`` loops with a ``break`` take what they need from them.

Over a list, a dict, its views or their iterators, the lazy ones (``chain``, ``islice``,
``starmap``, ``zip_longest``, ``pairwise``, ``accumulate``) are :class:`LazyIteratorVariable`:
each item is read from the list or dict when reached, as Python's are (``product``,
``combinations`` and ``permutations`` read their whole input at creation in Python too);
``chain`` and ``islice`` continue in resume functions after a graph break in their loop.
"""
from __future__ import annotations

import collections
import itertools
import operator

from ember.frontend.exc import Unsupported
from ember.frontend.variables.base import ConstantVariable, VariableTracker
from ember.frontend.variables.builtins import apply_operator
from ember.frontend.variables.container_iterators import (EndlessIteratorVariable,
                                                          LazyIteratorVariable,
                                                          ListIteratorVariable)
from ember.frontend.variables.containers import TupleVariable
from ember.frontend.variables.dicts import is_live_iterable, make_fromkeys
from ember.frontend.variables.handlers import HANDLERS, builtin


def _constant(vt: VariableTracker | None, default=None):
    return default if vt is None else vt.as_python_constant()


def _positions(items, pick) -> ListIteratorVariable:
    """The iterator over ``items`` at the index tuples ``pick`` yields."""
    return ListIteratorVariable([TupleVariable([items[i] for i in combo]) for combo in pick])


@builtin(itertools.product)
def _product(tx, args, kwargs):
    lists = [tx.unpack_iterable(a) for a in args] * _constant(kwargs.get("repeat"), 1)
    out = []
    for combo in itertools.product(*[range(len(items)) for items in lists]):
        out.append(TupleVariable([lists[k][i] for k, i in enumerate(combo)]))
    return ListIteratorVariable(out)


def _lazy(tx, fn, iterables, step, remake=None) -> LazyIteratorVariable:
    sources = [tx.get_iter(a) for a in iterables]
    return LazyIteratorVariable(sources, lambda tx: step(tx, sources), remake, fn)


@builtin(itertools.chain)
def _chain(tx, args, kwargs):
    if any(is_live_iterable(a) for a in args):
        def step(tx, sources):
            while sources:
                item = sources[0].next(tx)
                if item is not None:
                    return item
                del sources[0]     # ended: what is left is the chain of the rest
            return None
        it = _lazy(tx, itertools.chain, args, step,
                   lambda cg, s: f"{cg.const(itertools.chain)}({', '.join(s)})")
        it.head = lambda cg: "None"   # resumable (ResumedWrapperIterator) over the rest
        return it
    return ListIteratorVariable([item for a in args for item in tx.unpack_iterable(a)])


@builtin(itertools.chain.from_iterable)
def _chain_from_iterable(tx, args, kwargs):
    return _chain(tx, tx.unpack_iterable(args[0]), {})


def _index_combinatoric(fn):
    def handler(tx, args, kwargs):
        items = tx.unpack_iterable(args[0])
        r = args[1] if len(args) > 1 else kwargs.get("r")
        r_value = _constant(r, None)
        if fn is not itertools.permutations and r_value is None:
            raise Unsupported(f"itertools.{fn.__name__} without r")
        pick = fn(range(len(items))) if r_value is None else fn(range(len(items)), r_value)
        return _positions(items, pick)
    return handler


for _fn in (itertools.combinations, itertools.permutations,
            itertools.combinations_with_replacement):
    HANDLERS[_fn] = _index_combinatoric(_fn)


@builtin(itertools.zip_longest)
def _zip_longest(tx, args, kwargs):
    fill = kwargs.get("fillvalue", ConstantVariable(None))
    if any(is_live_iterable(a) for a in args):
        done: set[int] = set()

        def step(tx, sources):
            items = []
            for i, src in enumerate(sources):
                item = None if i in done else src.next(tx)
                if item is None:
                    done.add(i)
                items.append(fill if item is None else item)
            return None if len(done) == len(sources) else TupleVariable(items)
        return _lazy(tx, itertools.zip_longest, args, step)
    lists = [tx.unpack_iterable(a) for a in args]
    n = max((len(items) for items in lists), default=0)
    return ListIteratorVariable([TupleVariable([items[i] if i < len(items) else fill
                                                for items in lists]) for i in range(n)])


@builtin(itertools.accumulate)
def _accumulate(tx, args, kwargs):
    func = args[1] if len(args) > 1 else kwargs.get("func")
    if func is not None and func.is_python_constant() and func.as_python_constant() is None:
        func = None
    initial = kwargs.get("initial")
    if initial is not None and initial.is_python_constant() and \
            initial.as_python_constant() is None:
        initial = None

    def combine(total, item):
        if func is None:
            return apply_operator(tx, operator.add, [total, item])
        return tx.call(func, [total, item], {})
    if is_live_iterable(args[0]):
        total = [initial]
        started = [False]

        def step(tx, sources):
            if not started[0]:
                started[0] = True
                if initial is not None:
                    return initial
            item = sources[0].next(tx)
            if item is None:
                return None
            total[0] = item if total[0] is None else combine(total[0], item)
            return total[0]
        return _lazy(tx, itertools.accumulate, args[:1], step)
    out = [] if initial is None else [initial]
    for item in tx.unpack_iterable(args[0]):
        out.append(combine(out[-1], item) if out else item)
    return ListIteratorVariable(out)


@builtin(itertools.islice)
def _islice(tx, args, kwargs):
    bounds = [_constant(a) for a in args[1:]]
    window = slice(*bounds) if len(bounds) > 1 else slice(bounds[0])
    source = args[0]
    if is_live_iterable(source):
        return _lazy_islice(tx, source, window)
    if isinstance(source, EndlessIteratorVariable):
        if window.stop is None:
            raise Unsupported("itertools.islice without a stop over an endless iterator")
        items = source.take(tx, window.stop)
    elif isinstance(source, ListIteratorVariable) and window.stop is not None:
        # an iterator the frame goes on using: consume only what islice reads of it
        items = source.items[source.index:source.index + window.stop]
        source.index += len(items)
    else:
        items = tx.unpack_iterable(source)
    picked = list(itertools.islice(range(len(items)), *(
        (window.start, window.stop, window.step) if len(bounds) > 1 else (window.stop,))))
    return ListIteratorVariable([items[i] for i in picked])


def _lazy_islice(tx, source, window: slice) -> LazyIteratorVariable:
    start, stop, stride = window.start or 0, window.stop, window.step or 1
    pos, want = [0], [start]     # items read from the source; the next one to yield

    def step(tx, sources):
        if stop is not None and want[0] >= stop:
            # Python's next index is clamped to stop: it still skips up to there
            while pos[0] < stop and sources[0].next(tx) is not None:
                pos[0] += 1
            return None
        while pos[0] < want[0]:
            if sources[0].next(tx) is None:
                return None
            pos[0] += 1
        item = sources[0].next(tx)
        if item is None:
            return None
        pos[0] += 1
        want[0] += stride
        return item

    def bounds() -> str:   # a fresh islice in the state this one is in
        if stop is None:
            return f"{want[0] - pos[0]}, None, {stride}"
        return f"{min(want[0], stop) - pos[0]}, {stop - pos[0]}, {stride}"

    def remake(cg, s):
        return f"{cg.const(itertools.islice)}({s[0]}, {bounds()})"
    it = _lazy(tx, itertools.islice, [source], step, remake)
    it.head = lambda cg: f"({bounds()})"    # resumable (ResumedWrapperIterator)
    return it


@builtin(itertools.repeat)
def _repeat(tx, args, kwargs):
    obj = args[0] if args else kwargs["object"]
    times = args[1] if len(args) > 1 else kwargs.get("times")
    if times is None:
        return EndlessIteratorVariable(lambda tx, i: obj)
    return ListIteratorVariable([obj] * max(0, times.as_python_constant()))


@builtin(itertools.count)
def _count(tx, args, kwargs):
    start = args[0] if args else kwargs.get("start", ConstantVariable(0))
    step = args[1] if len(args) > 1 else kwargs.get("step", ConstantVariable(1))

    def item(tx, i):
        offset = apply_operator(tx, operator.mul, [step, ConstantVariable(i)])
        return apply_operator(tx, operator.add, [start, offset])
    return EndlessIteratorVariable(item)


@builtin(itertools.starmap)
def _starmap(tx, args, kwargs):
    fn, iterable = args
    if is_live_iterable(iterable):
        def step(tx, sources):
            item = sources[0].next(tx)
            return None if item is None else tx.call(fn, tx.unpack_iterable(item), {})

        def remake(cg, s):
            return f"{cg.const(itertools.starmap)}({cg.reconstruct(fn)}, {s[0]})"
        return _lazy(tx, itertools.starmap, [iterable], step, remake)
    return ListIteratorVariable([tx.call(fn, tx.unpack_iterable(item), {})
                                 for item in tx.unpack_iterable(iterable)])


@builtin(itertools.pairwise)
def _pairwise(tx, args, kwargs):
    if is_live_iterable(args[0]):
        last = [None]

        def step(tx, sources):
            if last[0] is None:
                last[0] = sources[0].next(tx)
                if last[0] is None:
                    return None
            item = sources[0].next(tx)
            if item is None:
                return None
            pair, last[0] = TupleVariable([last[0], item]), item
            return pair
        return _lazy(tx, itertools.pairwise, args[:1], step)
    items = tx.unpack_iterable(args[0])
    return ListIteratorVariable([TupleVariable([a, b]) for a, b in zip(items, items[1:])])


# ------------------------------------------------------------------ class-level constructors

for _cls in (dict, collections.OrderedDict, collections.defaultdict):
    HANDLERS[_cls.fromkeys] = make_fromkeys(_cls)
