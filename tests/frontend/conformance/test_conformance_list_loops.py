"""Conformance: loops over a list that the loop changes.

Python's list iterator is an index into the live list: each step reads ``lst[i]`` if ``i``
is below the list's length at that moment, so a store ahead of the index is seen, appends
extend the loop, removals before the index shift it; ``reversed(lst)`` steps down the same
way and stops once its index is past the end. Every program changes the list it iterates,
plainly and wrapped in enumerate/zip/map/filter/itertools, with the list made in the frame
or received, and across a graph break (a print) before or after the change: the resume
function continues over the real list at the same index. Loops over lists they do not
change stay one graph.
"""
import itertools

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def _three(x):
    return [x, x + 1, x + 2]


# ------------------------------------------------------------------- within one graph

def p_store_ahead(x):
    lst = _three(x)
    out = []
    for v in lst:
        if len(out) == 0:
            lst[1] = v * 100
        out.append(v + 1)
    return out


def p_store_behind_and_ahead(x):
    lst = _three(x)
    out = []
    for v in lst:
        if len(out) == 1:
            lst[0] = v * 100        # behind: not seen by the loop, seen in the returned list
            lst[2] = v * 50         # ahead: seen
        out.append(v + 1)
    return out, lst


def p_enumerate_store(x):
    lst = _three(x)
    out = []
    for i, v in enumerate(lst):
        if i == 0:
            lst[2] = v * 7
        out.append(v * i)
    return out


def p_append_worklist(x):
    lst = _three(x)
    out = []
    for v in lst:
        if len(lst) < 6:
            lst.append(v * 10)
        out.append(v)
    return out


def p_pop_shortens(x):
    lst = [x, x + 1, x + 2, x + 3]
    out = []
    for v in lst:
        lst.pop()
        out.append(v)
    return out, lst


def p_remove_before_index(x):
    lst = [x, x + 1, x + 2, x + 3]
    out = []
    for v in lst:
        if len(out) == 1:
            lst.remove(lst[0])       # the next item shifts under the index: skipped
        out.append(v)
    return out


def p_insert_front(x):
    lst = _three(x)
    out = []
    for v in lst:
        if len(out) == 1:
            lst.insert(0, v * 5)     # the item just seen is seen again
        out.append(v)
    return out


def p_del_ahead(x):
    lst = [x, x + 1, x + 2, x + 3]
    out = []
    for v in lst:
        if len(out) == 0:
            del lst[2]
        out.append(v)
    return out


def p_clear(x):
    lst = _three(x)
    out = []
    for v in lst:
        lst.clear()
        out.append(v * 2)
    return out, lst


def p_zip_store(x):
    lst = _three(x)
    out = []
    for a, b in zip(lst, (1, 2, 3)):
        lst[1] = a * 11
        out.append(a * b)
    return out


def p_map_append(x):
    lst = [x, x + 1]
    out = []
    for y in map(torch.neg, lst):
        if len(lst) < 4:
            lst.append(y)
        out.append(y)
    return out


def p_filter_store(x):
    lst = [1, 2, 3, 4]
    out = []
    for v in filter(lambda n: n % 2 == 0, lst):
        lst[3] = 9                   # 4 replaced by 9: filtered out
        out.append(x * v)
    return out


def p_islice_append(x):
    lst = [x, x + 1]
    out = []
    for v in itertools.islice(lst, 3):
        lst.append(v * 2)
        out.append(v)
    return out


def p_reversed_store(x):
    lst = _three(x)
    out = []
    for v in reversed(lst):
        lst[0] = v * 9
        out.append(v)
    return out


def p_reversed_append_and_pop(x):
    lst = [x, x + 1, x + 2, x + 3]
    out = []
    for v in reversed(lst):
        lst.append(v)                # not reached: the index only goes down
        out.append(v)
        if len(out) == 2:
            del lst[:5]              # index 1 now past the end: the loop stops
    return out, lst


def p_nested_same_list(x):
    lst = [x, x + 1]
    out = []
    for a in lst:
        for b in lst:
            if len(lst) < 4:
                lst.append(a + b)
            out.append(a * b)
    return out


def p_next_after_exhausted(x):
    lst = [x]
    it = iter(lst)
    out = [next(it) * 2]
    lst.append(x + 1)                # reached: the iterator has not ended yet
    out += [next(it, None), next(it, None)]
    lst.append(x + 2)                # an ended list iterator stays ended
    out.append(next(it, None))
    return out, lst


def p_iterator_kept_after_append(x):
    lst = [x, x + 1]
    it = iter(lst)
    first = next(it)
    lst.append(x * 3)
    return first, list(it)


WITHIN = [p_store_ahead, p_store_behind_and_ahead, p_enumerate_store, p_append_worklist,
          p_pop_shortens, p_remove_before_index, p_insert_front, p_del_ahead, p_clear,
          p_zip_store, p_map_append, p_filter_store, p_islice_append, p_reversed_store,
          p_reversed_append_and_pop, p_nested_same_list, p_next_after_exhausted,
          p_iterator_kept_after_append]


@pytest.mark.parametrize("fn", WITHIN)
def test_list_loop_sees_mutations(fn):
    check(fn, (torch.randn(3),), graphs=1)


def a_input_store(x, lst):
    out = []
    for i, v in enumerate(lst):
        if i == 0:
            lst[1] = v * 100
        out.append(v + x)
    return out


def a_input_append(x, lst):
    out = []
    for v in lst:
        if len(lst) < 4:
            lst.append(v * 2)
        out.append(v + x)
    return out


@pytest.mark.parametrize("fn", [a_input_store, a_input_append])
def test_input_list_loop_sees_mutations(fn):
    check(fn, (torch.randn(3), [torch.randn(3), torch.randn(3)]), graphs=1)


# ------------------------------------------------------------------ across a graph break

def b_store_after_break(x, lst):
    out = []
    for v in lst:
        print("at")
        if len(out) == 0:
            lst[1] = v * 100
        out.append(v + x)
    return out


def b_store_before_break(x, lst):
    out = []
    for v in lst:
        if len(out) == 0:
            lst[1] = v * 100         # replayed into the caller's list before the resume
        print("at")
        out.append(v + x)
    return out


def b_append_frame_list(x):
    lst = _three(x)
    out = []
    for v in lst:
        if len(lst) < 5:
            lst.append(v * 10)
        print("at")
        out.append(v)
    return out


def b_pop_after_break(x, lst):
    out = []
    for v in lst:
        print("at")
        lst.pop()
        out.append(v + x)
    return out, lst


def b_enumerate_insert(x):
    lst = _three(x)
    out = []
    for i, v in enumerate(lst):
        print("at")
        if i == 1:
            lst.insert(0, v * 4)
        out.append(v * i)
    return out


def b_zip_store(x, lst):
    out = []
    for a, n in zip(lst, [2, 3, 4]):
        lst[-1] = a * n
        print("at")
        out.append(a)
    return out


def b_map_append(x):
    lst = [x, x + 1]
    out = []
    for y in map(torch.neg, lst):
        print("y")
        if len(lst) < 4:
            lst.append(y * 3)
        out.append(y)
    return out


def b_reversed_store(x, lst):
    out = []
    for v in reversed(lst):
        print("at")
        lst[0] = v * 9
        out.append(v)
    return out


def b_clear_before_break(x):
    lst = _three(x)
    out = []
    for v in lst:
        lst.clear()
        print("at")
        out.append(v * 2)
    return out


def b_nested_same_list(x):
    lst = [x, x + 1]
    out = []
    for a in lst:
        for b in lst:
            if len(lst) < 3:
                lst.append(a - b)
            print("inner")
            out.append(a * b)
    return out


def b_iterator_local(x, lst):
    it = iter(lst)
    out = [next(it)]
    print("break")
    lst.append(x * 9)
    out.extend(it)
    return out


def b_named_iterator_in_loop(x, lst):
    it = iter(lst)                   # one iterator: the loop's and the name's
    out = []
    for v in it:
        print("at")
        if len(lst) < 5:
            lst.append(v * 2)
        out.append(v + x)
        if len(out) == 2:
            out.append(next(it))
    return out


def b_outer_loop_shrinks(x, lst):
    out = []
    for v in lst:
        for w in reversed(lst):
            out.append(v * w)
        print("at")
        del lst[-1]
    return out


def _input_list():
    return [torch.randn(3), torch.randn(3), torch.randn(3)]


# (function, takes the input list, graphs): each resume function captures the loop's rest
# again (a graph per step with tensor ops, and the entry's if it has any), so none runs
# eagerly
BREAKS = [(b_store_after_break, True, 3), (b_store_before_break, True, 4),
          (b_append_frame_list, False, 2), (b_pop_after_break, True, 2),
          (b_enumerate_insert, False, 5), (b_zip_store, True, 3), (b_map_append, False, 4),
          (b_reversed_store, True, 3), (b_clear_before_break, False, 1),
          (b_nested_same_list, False, 10), (b_iterator_local, True, 1),
          (b_named_iterator_in_loop, True, 4), (b_outer_loop_shrinks, True, 2)]


@pytest.mark.parametrize("fn, takes_list, graphs", BREAKS)
def test_list_loop_graph_break_sees_mutations(fn, takes_list, graphs):
    args = (torch.randn(3), _input_list()) if takes_list else (torch.randn(3),)
    check(fn, args, graphs=graphs)


# ------------------------------------------------ unchanged lists: one graph, few guards

def u_sum_list(x, lst):
    total = x
    for i, v in enumerate(lst):
        total = total + v * i
    for a, b in zip(lst, reversed(lst)):
        total = total - a * b
    return total


def test_unchanged_list_loop_is_one_graph():
    # not a bug test: loops over lists they do not change stay one unrolled graph
    check(u_sum_list, (torch.randn(3), _input_list()), graphs=1)


# ------------------------- wrappers continued by a resume function: a graph per step

def r_chain_append(x, lst):
    out = []
    for v in itertools.chain(lst, (x * 5,)):
        print("at")
        if len(lst) < 4:
            lst.append(v * 2)
        out.append(v + x)
    return out


def r_islice_store(x, lst):
    out = []
    for v in itertools.islice(lst, 0, None, 2):
        print("at")
        if len(out) == 0:
            lst[2] = v * 7
        out.append(v + x)
    return out


def r_islice_past_stop(x):
    lst = [x, x + 1, x + 2, x + 3, x + 4]
    it = iter(lst)
    s = itertools.islice(it, 0, 4, 2)
    out = [next(s), next(s)]
    print("at")
    out.append(next(s, None))        # skips x + 3 on its way to the stop
    out.append(next(it))
    return out


@pytest.mark.parametrize("fn, graphs", [(r_chain_append, 6), (r_islice_store, 2)])
def test_wrapped_list_loop_resumes_compiled(fn, graphs):
    check(fn, (torch.randn(3), _input_list()), graphs=graphs)


def r_islice_past_stop_dict(x):
    d = {"a": x, "b": x + 1, "c": x + 2, "d": x + 3, "e": x + 4}
    it = iter(d.values())
    s = itertools.islice(it, 0, 4, 2)
    out = [next(s), next(s), next(s, None), next(it)]
    return out


@pytest.mark.parametrize("fn", [r_islice_past_stop, r_islice_past_stop_dict])
def test_islice_skips_to_its_stop(fn):
    check(fn, (torch.randn(3),), graphs=None)


# ------------------------------------------------- in-place operators change the list itself

def o_imul_in_loop(x):
    lst = [x, x + 1]
    out = []
    for v in lst:
        if len(lst) < 4:
            lst *= 2
        out.append(v * 2)
    return out


def o_constant_list_inplace(x, lst, other):
    alias = lst
    alias += "ab"
    alias += (3,)
    other *= 2
    return x + len(lst), lst, other


def test_imul_in_loop():
    check(o_imul_in_loop, (torch.randn(3),), graphs=1)


def test_inplace_operators_on_constant_lists():
    # folding them as constants made new lists: the caller's lists were left unchanged
    check(o_constant_list_inplace, (torch.randn(3), [1, 2], [4]), graphs=1)


# ------------------------------------------------------------- zip(strict=True) over lists

def s_strict_zip(x, lst):
    out = []
    for u, n in zip(lst, [1, 2, 3], strict=True):
        out.append(u * n)
    return out


def s_strict_zip_append(x, lst):
    out = []
    for u, n in zip(lst, [1, 2, 3, 4], strict=True):
        if len(lst) < 4:
            lst.append(u * 2)        # now as long as the other: no error
        out.append(u * n)
    return out


def s_strict_zip_break(x, lst):
    out = []
    for u, n in zip(lst, [1, 2, 3], strict=True):
        print("at")
        out.append(u * n)
    return out


@pytest.mark.parametrize("fn, graphs", [(s_strict_zip, 1), (s_strict_zip_append, 1),
                                        (s_strict_zip_break, 3)])
def test_strict_zip_over_list(fn, graphs):
    check(fn, (torch.randn(3), _input_list()), graphs=graphs)


def test_strict_zip_over_list_unequal_raises():
    check(s_strict_zip, (torch.randn(3), _input_list()[:2]), graphs=None, raises=ValueError)
    check(s_strict_zip_break, (torch.randn(3), _input_list()[:2]), graphs=None,
          raises=ValueError)


# ----------------------------------- ResumedListIterator steps as CPython's list iterators

@pytest.mark.parametrize("reverse", [False, True])
def test_resumed_list_iterator_matches_cpython(reverse):
    import random
    from ember.frontend.variables.container_iterators import ResumedListIterator
    rng = random.Random(0)
    for _ in range(300):
        real_list, ours_list = list(range(5)), list(range(5))
        real = reversed(real_list) if reverse else iter(real_list)
        ours = ResumedListIterator(ours_list, len(ours_list) - 1 if reverse else 0, reverse)
        for _ in range(12):
            op = rng.choice(["next", "next", "append", "pop", "insert", "del", "set"])
            if rng.random() < 0.05:
                op = "clear"
            for lst in (real_list, ours_list):
                r = random.Random(len(lst) * 7 + len(op))
                if op == "append":
                    lst.append(r.randint(10, 99))
                elif op == "pop" and lst:
                    lst.pop(r.randrange(len(lst)))
                elif op == "insert":
                    lst.insert(r.randint(0, len(lst)), r.randint(10, 99))
                elif op == "del":
                    del lst[:2]
                elif op == "clear":
                    lst.clear()
                elif op == "set" and lst:
                    lst[r.randrange(len(lst))] = r.randint(10, 99)
            if op == "next":
                assert next(real, None) == next(ours, None)
            assert real.__length_hint__() == ours.__length_hint__()
        assert list(real) == list(ours)


# ---------------------------------------- an iterator over a list returned by the frame

def e_returned(x, lst):
    it = iter(lst)
    next(it)
    return x + 1, it


def e_returned_after_appends(x, lst):
    lst.append(x)
    lst.append(x * 2)
    it = iter(lst)
    for _ in range(4):
        next(it)
    return x + 1, it


def e_returned_reversed(x, lst):
    it = reversed(lst)
    next(it)
    lst.pop(0)
    return x + 1, it


def e_returned_exhausted(x, lst):
    it = iter(lst)
    for _ in it:
        pass
    return x + 1, it


@pytest.mark.parametrize("fn", [e_returned, e_returned_after_appends, e_returned_reversed,
                                e_returned_exhausted])
def test_returned_list_iterator_is_a_real_one(fn):
    import ember
    ember.reset()
    compiled = ember.compile(fn, backend="eager")
    lists = [[torch.full((2,), float(i)) for i in range(3)] for _ in range(2)]
    (_, want), (_, got) = fn(torch.ones(2), lists[0]), compiled(torch.ones(2), lists[1])
    assert type(got) is type(want)
    for lst in lists:               # it reads the caller's list as it is then
        lst.append(torch.full((2,), 7.0))
    assert [t.tolist() for t in got] == [t.tolist() for t in want]
