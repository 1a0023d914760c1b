"""Conformance: loops over a set or a deque that the loop changes.

CPython's set iterator raises RuntimeError("Set changed size during iteration") at its next
step once the set's size differs from when it began (none once it ended); its deque iterator
raises RuntimeError("deque mutated during iteration") after any append/pop/rotate/... (item
stores and reverse() do not count), also after its end. A compiled program must raise the
same, inside one graph and across a graph break (a print: the resume function continues over
the real container), and loops that change nothing, or only what does not count, give
eager's values. A dict changed during a loop over its items() is checked too.
"""
import collections

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


# ------------------------------------------------------------------- raising

def s_add(x):
    s = {1, 2}
    for v in s:
        s.add(v + 10)
        x = x + v
    return x


def s_discard_at_last_step(x):
    s = {1, 2, 3}
    for v in s:
        x = x + v
        if v == 3:
            s.discard(1)         # the step that would end the loop raises
    return x


def s_enumerate(x):
    s = {1, 2}
    for i, v in enumerate(s):
        s.add(v * 10)
        x = x * i
    return x


def s_received(x, s):
    for v in s:
        x = x + v
        s.add(v + 10)
    return x


def s_graph_break(x, s):
    for v in s:
        x = x + v
        print("at")
        if v == 2:
            s.add(7)
    return x


def q_append(x):
    dq = collections.deque([1, 2])
    for v in dq:
        dq.append(v)
        x = x + v
        if len(dq) > 4:
            break
    return x


def q_reversed_appendleft(x):
    dq = collections.deque([1, 2])
    for v in reversed(dq):
        dq.appendleft(v)
        x = x + v
    return x


def q_rotate_received(x, dq):
    for v in dq:
        x = x + v
        dq.rotate(0)             # counts, though nothing moves
    return x


def q_after_end(x):
    dq = collections.deque([1, 2])
    it = iter(dq)
    first = list(it)
    dq.append(3)
    return x + 1, first, list(it)


def q_graph_break(x, dq):
    for v in dq:
        x = x + v
        print("at")
        if v == 2:
            dq.popleft()
    return x


def q_iadd(x):
    dq = collections.deque([1, 2])
    for v in dq:
        dq += [v]
        x = x + v
    return x


def d_items_insert(x):
    d = {"a": 1, "b": 2}
    for k, v in d.items():
        d[k + "z"] = v
        x = x + v
    return x


RAISING = [(s_add, ()), (s_discard_at_last_step, ()), (s_enumerate, ()),
           (s_received, ({1, 2, 3},)), (s_graph_break, ({1, 2, 3},)), (q_append, ()),
           (q_reversed_appendleft, ()), (q_rotate_received, (collections.deque([1, 2]),)),
           (q_after_end, ()), (q_graph_break, (collections.deque([1, 2, 3]),)), (q_iadd, ()),
           (d_items_insert, ())]


@pytest.mark.parametrize("fn,extra", RAISING, ids=[f.__name__ for f, _ in RAISING])
def test_container_changed_during_iteration_raises(fn, extra):
    check(fn, (torch.randn(3), *extra), graphs=None, raises=RuntimeError)


# ------------------------------------------------------------------- not raising

def s_discard_then_add_back(x):
    s = {1, 2, 3}
    out = []
    for v in s:
        s.discard(3)
        s.add(3)                 # the same size at the next step
        out.append(v)
        x = x + v
    return x, out


def s_changed_after_end(x):
    s = {1, 2}
    it = iter(s)
    first = list(it)
    s.add(3)
    return x + 1, first, list(it)


def q_store_and_reverse(x, dq):
    out = []
    for v in dq:
        dq[0] = v * 10           # neither counts as a mutation
        dq.reverse()
        dq.reverse()
        out.append(v)
        x = x + v
    return x, out, dq


def q_uncounted_changes(x):
    dq = collections.deque([1, 2])
    out = []
    for v in dq:
        dq += []                 # adds nothing: not counted
        dq.extend([])
        out.append(v)
        x = x + v
    empty = collections.deque()
    it = iter(empty)
    empty.clear()                # of an empty deque: not counted either
    empty.rotate(2)
    return x, out, list(it)


def s_loop_graph_break(x, s):
    out = []
    for v in s:
        x = x + v
        print("at")
        out.append(v)
    return x, out


def q_loop_graph_break(x, dq):
    for v in dq:
        x = x * v
        print("at")
        dq[1] = 5
    return x, dq


@pytest.mark.parametrize("fn,extra,graphs", [
    (s_discard_then_add_back, (), None),
    (s_changed_after_end, (), 1),
    (q_store_and_reverse, (collections.deque([1, 2, 3]),), None),
    (q_uncounted_changes, (), 1),
    (s_loop_graph_break, ({1, 2, 3},), None),
    (q_loop_graph_break, (collections.deque([1, 2, 3]),), None),
], ids=lambda v: getattr(v, "__name__", ""))
def test_container_loop_matches_eager(fn, extra, graphs):
    check(fn, (torch.randn(3), *extra), graphs=graphs)


# ------------------------------------------------------------------- iteration order

def o_built_in_frame(x, n):
    # CPython iterates a set in its hash table's order, not the order of insertion
    s = set()
    s.add(n + 3)
    s.add(n)
    t = {n + 30, n + 1, 7}
    first = [k for k in t]
    t.discard(n + 1)
    t.add(n + 17)
    u = set([n + 8, n]) | {n + 3, 1}
    v = s.union([n + 14, 0])
    w = set({n + 6: 1, n: 2})
    out = x
    for k in u:
        out = out * 2 + k        # the order shows in the value
    return out, list(s), first, list(t), list(u), list(v), list(w), s.pop(), v.pop()


def test_set_iterates_in_eagers_order():
    check(o_built_in_frame, (torch.randn(3), 2), graphs=1)
