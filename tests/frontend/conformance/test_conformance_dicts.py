"""Conformance: dict views and dict class methods.

Dict views (keys(), values(), items()) are live views of their dict: every program takes a
view, then changes the dict, then uses the view: comparisons with sets, frozensets, other
views and lists, set operators, membership, len, iteration and isdisjoint must all see the
dict as it is at the use, as in Python. Iterators over a dict read each value when they
reach it, and raise RuntimeError after the dict changes size (or an OrderedDict moves a key),
also wrapped in enumerate/zip/map/filter/itertools and across a graph break in the loop.
Dicts with tensor values compare by keys and values. ``fromkeys`` on dict, OrderedDict and
defaultdict (the class or an instance) of dicts, lists, iterators and views.
"""
import collections
import itertools

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def v_keys_equal_after_insert(x):
    d = {3: x}
    keys = d.keys()
    d[4] = x + 1
    d2 = {3: 2, 4: "aa"}
    return x * 2, d2.keys() == keys, keys == d2.keys(), keys != d2.keys()


def v_keys_compare_sets(x):
    d = {3: x}
    keys = d.keys()
    before = (keys == {3}, {3} == keys, keys == frozenset({3}))
    d[4] = x + 1
    return (x + 1, before, keys == {3, 4}, {3, 4} == keys, keys != {3}, {3} != keys,
            keys == frozenset({3, 4}), frozenset({3, 4}) == keys,
            keys <= {3, 4, 5}, keys < {3, 4, 5}, keys < {3, 4}, keys >= {3}, keys > {3},
            keys > {3, 4}, {3} < keys, {3, 4, 5} > keys, {3, 4} <= keys, {3, 9} <= keys)


def v_keys_compare_lists(x):
    d = {"a": x}
    keys = d.keys()
    d["b"] = x * 2
    # a list is not a set: == is identity, so False; list(...) compares items
    return x - 1, keys == ["a", "b"], keys != ["a", "b"], list(keys) == ["a", "b"]


def v_keys_set_operators(x):
    d = {3: x}
    keys = d.keys()
    d[4] = x + 1
    del d[3]
    d[5] = x * 3
    return (x.sum(), keys & {4, 9}, keys | {9}, keys - {5}, keys ^ {5, 8}, {4, 7} & keys,
            {1} | keys, {4, 9} - keys, {5, 6} ^ keys, keys & [4, 5], [9, 4] - keys,
            keys.isdisjoint([3]), keys.isdisjoint({4}), keys.isdisjoint(frozenset({3})))


def v_keys_membership_len_iteration(x):
    d = collections.OrderedDict(a=x)
    keys, values, items = d.keys(), d.values(), d.items()
    n_before = (len(keys), len(values), len(items), "b" in keys)
    d["b"] = x + 2
    d.pop("a")
    d["c"] = x * 4
    total = sum(values)
    return (total, n_before, len(keys), len(values), len(items), "b" in keys, "a" in keys,
            list(keys), [k for k, _ in items], list(reversed(keys)), bool(keys))


def v_views_between_dicts(x):
    d1 = {1: x, 2: x}
    d2 = {2: "b"}
    k1, k2 = d1.keys(), d2.keys()
    d2[1] = "a"
    first = (k1 == k2, k1 <= k2, k1 & k2, k1 | k2, k1 - k2, k1 ^ k2, k1.isdisjoint(k2))
    del d1[1]
    return (x + 3, first, k1 == k2, k1 < k2, k2 > k1, k1 & k2, k2 - k1, k1.isdisjoint(k2),
            k1 == d2.items(), d1.items() <= d1.items())


def v_items_views(x):
    d = {"a": 1}
    items = d.items()
    d["b"] = 2
    other = {"a": 1, "b": 2}
    return (x * 2, items == other.items(), items == {("a", 1), ("b", 2)},
            {("a", 1), ("b", 2)} == items, items >= {("a", 1)}, items < {("a", 1)},
            ("b", 2) in items, ("b", 3) in items, ("b",) in items, ["b", 2] in items,
            items & {("a", 1), ("c", 3)}, items - {("a", 1)}, items | {("z", 0)},
            items ^ {("a", 1)}, items.isdisjoint({("a", 2)}), items.isdisjoint([("a", 1)]))


def v_items_with_tensor_values(x):
    d = {"a": x}
    items = d.items()
    y = x + 1
    d["b"] = y
    return (y, ("a", x) in items, ("b", y) in items, len(items & {("a", x)}),
            len(items - {("b", y)}), items == {("a", x), ("b", y)},
            items.isdisjoint({("b", y)}))


def v_values_views(x):
    d = {"a": x}
    values = d.values()
    d["b"] = x + 1
    d["a"] = x * 2
    # values views compare by identity only
    return (torch.stack(list(values)).sum(0), len(values), values == values,
            d.values() == d.values(), values == [x * 2, x + 1], sum(1 for _ in values))


def v_views_of_argument(d, x):
    keys = d.keys()
    d["new"] = x + 1
    return x * 2, keys == {"a", "b", "new"}, keys - {"a"}, sorted(keys), len(d.values())


def v_dict_view_in_branch(x):
    d = {"a": x}
    keys = d.keys()
    d["b"] = x
    if keys == {"a", "b"}:
        return x + 1
    return x - 1


def v_iterate_items_while_storing(x):
    d = {"a": x, "b": x + 1, "c": x * 3}
    seen = []
    for k, v in d.items():
        if k == "a":
            d["c"] = v * 10          # a later value changes: the loop sees the new one
        seen.append(v + 0)
    return seen, d


def v_iterator_reads_values_when_reached(x):
    d = {"a": x, "b": x + 1}
    it = iter(d.values())
    items = iter(d.items())
    first = next(it)
    d["b"] = x * 5
    return first, next(it), next(items), next(items)


def v_reversed_views(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    rk, rv, ri, rd = reversed(d.keys()), reversed(d.values()), reversed(d.items()), reversed(d)
    d["a"] = x * 7
    return list(rk), list(rv), list(ri), list(rd), x.sum()


def v_loop_over_items_with_graph_break(x):
    d = {"a": x, "b": x + 1}
    out = x * 0
    for k, v in d.items():
        d["b"] = v * 2
        print("loop", k)           # graph break inside the loop
        out = out + d[k]
    return out, d


def v_dict_equality_with_tensor_values(x):
    d = {"a": x, "b": 1}
    d2 = dict(d)
    o1 = collections.OrderedDict(a=x, b=1)
    o2 = collections.OrderedDict(b=1, a=x)
    dd = collections.defaultdict(list, d)
    eq = (d == d2, d != d2, d2 == {"a": x, "b": 1}, d == {"a": x}, d == {"a": x, "c": 1},
          o1 == d, o1 == o2, o1 != o2, o2 == d, dd == d, d == dd, {1: [x]} == {1: [x]})
    d2["b"] = 2
    return x + 1, eq, d == d2, d != d2


def v_equal_key_stored_again_keeps_the_first(x):
    d = {1: x}
    d[1.0] = x + 1
    d[True] = x + 2
    s = {1, 2}
    s.add(1.0)
    return d, list(d.keys()), [type(k).__name__ for k in d], [type(k).__name__ for k in s]


def _popitem_or_none(d):
    try:
        return d.popitem()
    except KeyError:
        return None


def v_ordered_dict_moves_and_pops(x):
    d = collections.OrderedDict(a=x, b=1, c=x * 2)
    keys = d.keys()
    d.move_to_end("a")
    d.move_to_end("c", last=False)
    first = d.popitem(last=False)
    last = d.popitem()
    plain = {"p": x, "q": 2}
    popped = plain.popitem()
    empty = _popitem_or_none({})
    return x + 1, list(keys), first, last, d, popped, plain, empty, _popitem_or_none(d)


VIEWS = [
    (v_keys_equal_after_insert, lambda: (torch.randn(3),)),
    (v_keys_compare_sets, lambda: (torch.randn(3),)),
    (v_keys_compare_lists, lambda: (torch.randn(3),)),
    (v_keys_set_operators, lambda: (torch.randn(3),)),
    (v_keys_membership_len_iteration, lambda: (torch.randn(3),)),
    (v_views_between_dicts, lambda: (torch.randn(3),)),
    (v_items_views, lambda: (torch.randn(3),)),
    (v_items_with_tensor_values, lambda: (torch.randn(3),)),
    (v_values_views, lambda: (torch.randn(3),)),
    (v_views_of_argument, lambda: ({"a": torch.randn(2), "b": torch.randn(2)},
                                   torch.randn(2))),
    (v_dict_view_in_branch, lambda: (torch.randn(3),)),
    (v_iterate_items_while_storing, lambda: (torch.randn(3),)),
    (v_iterator_reads_values_when_reached, lambda: (torch.randn(3),)),
    (v_reversed_views, lambda: (torch.randn(3),)),
    (v_dict_equality_with_tensor_values, lambda: (torch.randn(3),)),
    (v_equal_key_stored_again_keeps_the_first, lambda: (torch.randn(3),)),
    (v_ordered_dict_moves_and_pops, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make", VIEWS, ids=[f.__name__ for f, _ in VIEWS])
def test_dict_view(fn, make):
    check(fn, make())


def test_dict_loop_with_graph_break():
    # a graph per loop iteration and one after: the iterator is passed on with the values
    # the dict holds at the break
    check(v_loop_over_items_with_graph_break, (torch.randn(3),), graphs=3)


def v_insert_while_iterating(x):
    d = {"a": x, "b": x + 1}
    for k in d:
        d[k + "z"] = x * 2        # RuntimeError: dictionary changed size during iteration
    return d


def v_delete_while_iterating_values(x):
    d = {"a": x, "b": x + 1}
    total = x * 0
    for v in d.values():
        total = total + v
        d.pop("b", None)
    return total


def v_move_to_end_while_iterating(x):
    d = collections.OrderedDict(a=x, b=x + 1)
    for k in d:
        d.move_to_end(k)          # RuntimeError: OrderedDict mutated during iteration
    return d


@pytest.mark.parametrize("fn", [v_insert_while_iterating, v_delete_while_iterating_values,
                                v_move_to_end_while_iterating])
def test_dict_changed_size_during_iteration_raises(fn):
    check(fn, (torch.randn(3),), graphs=None, raises=RuntimeError)


def v_keys_ordering_with_list(x):
    d = {1: x}
    keys = d.keys()
    d[2] = x
    return x + 1, keys < [1, 2, 3]     # TypeError in Python


def test_dict_view_ordering_against_list_raises():
    # the comparison breaks the graph and raises as eager does
    check(v_keys_ordering_with_list, (torch.randn(3),), graphs=None, raises=TypeError)


# ----------------------------------------------------------------------------- fromkeys

def f_fromkeys_chain(x):
    d = {1: 2, 3: 4}
    d1 = dict.fromkeys(d, x + 1)
    d2 = collections.defaultdict.fromkeys(iter(d1), x - 2)
    return d1, d2, type(d2).__name__, d2.default_factory, d1[1] is d1[3]


def f_fromkeys_sources(x):
    keys = ["a", "b"]
    d = {"p": 0}
    view = d.keys()
    d["q"] = 1
    od = collections.OrderedDict.fromkeys(keys)
    od2 = collections.OrderedDict.fromkeys(view, x * 2)
    dd = collections.defaultdict.fromkeys(d.items(), 0)
    plain = dict.fromkeys(range(3), x)
    from_iter = dict.fromkeys(iter(keys))
    return (x.sum(), od, od2, list(od2), dd, dict(dd), plain, from_iter,
            type(od).__name__, type(dd).__name__)


def f_fromkeys_on_instances(x):
    dd = collections.defaultdict(list)
    dd["z"].append(x)
    made = dd.fromkeys(["a", "b"], x + 1)
    od = collections.OrderedDict(k=1)
    made2 = od.fromkeys(od, x * 3)
    made3 = {"u": 1}.fromkeys("uv")
    copied = dd.copy()     # keeps the factory
    copied["w"].append(x * 5)
    return (made, type(made).__name__, made.default_factory, made2, type(made2).__name__,
            made3, dd, copied, copied.default_factory)


def f_fromkeys_then_mutate(x):
    d = dict.fromkeys(["a", "b"], 0)
    d["a"] = x + 1
    dd = collections.defaultdict.fromkeys(d, x)
    dd["c"] = x * 2
    return d, dd, sorted(dd.keys())


FROMKEYS = [
    (f_fromkeys_chain, lambda: (torch.randn(3),)),
    (f_fromkeys_sources, lambda: (torch.randn(3),)),
    (f_fromkeys_on_instances, lambda: (torch.randn(3),)),
    (f_fromkeys_then_mutate, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make", FROMKEYS, ids=[f.__name__ for f, _ in FROMKEYS])
def test_fromkeys(fn, make):
    check(fn, make())


# ------------------------------------------------- wrapped dict iterators (enumerate, zip, ...)
# Python's enumerate/zip/map/filter take each item from the dict iterator when they reach
# it: a value stored into the dict during the loop is seen at its key, and a change of size
# raises RuntimeError at the next step. Each program stores into "b" while at "a".

def w_enumerate_items(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for i, (k, v) in enumerate(d.items()):
        if k == "a":
            d["b"] = v * 100
        out.append(v + i)
    return out


def w_enumerate_values(x):
    d = {"a": x, "b": x + 1}
    out = []
    for i, v in enumerate(d.values(), 3):
        d["b"] = v * 7
        out.append(v * i)
    return out


def w_zip_list_and_values(x):
    d = {"a": x, "b": x + 1}
    out = []
    for n, v in zip([10, 20, 30], d.values()):
        d["b"] = v * n
        out.append(v + n)
    return out


def w_zip_two_views(x):
    d = {"a": x, "b": x + 1}
    e = {"p": x * 2, "q": x * 3}
    out = []
    for (k, v), w in zip(d.items(), e.values()):
        e["q"] = v + w
        d["b"] = w * 5
        out.append((k, v, w))
    return out


def w_zip_dict_itself(x):
    d = {"a": x, "b": x + 1}
    out = []
    for k, v in zip(d, d.values()):
        d["b"] = v * 4
        out.append((k, v))
    return out


def w_map_values(x):
    d = {"a": x, "b": x + 1}
    out = []
    for y in map(lambda v: v * 2, d.values()):
        d["b"] = y * 3
        out.append(y)
    return out


def w_filter_items(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for k, v in filter(lambda kv: kv[0] != "c", d.items()):
        d["b"] = v * 9
        out.append(v)
    return out


def w_next_on_enumerate(x):
    d = {"a": x, "b": x + 1}
    it = enumerate(d.values())
    first = next(it)
    d["b"] = x * 8
    return first, next(it), list(it)


WRAPPED_STORES = [w_enumerate_items, w_enumerate_values, w_zip_list_and_values,
                  w_zip_two_views, w_zip_dict_itself, w_map_values,
                  w_filter_items, w_next_on_enumerate]


@pytest.mark.parametrize("fn", WRAPPED_STORES)
def test_wrapped_dict_iterator_sees_stores(fn):
    check(fn, (torch.randn(3),), graphs=1)


def w_enumerate_insert(x):
    d = {"a": x, "b": x + 1}
    for i, k in enumerate(d):
        d[k + "z"] = x * i        # RuntimeError: dictionary changed size during iteration
    return d


def w_zip_delete(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    total = x * 0
    for n, v in zip(range(5), d.values()):
        total = total + v * n
        d.pop("c", None)
    return total


def w_map_keys_insert(x):
    d = {"a": x, "b": x + 1}
    out = []
    for k in map(lambda k: k + "!", d.keys()):
        d[k] = x
        out.append(k)
    return out


def w_zip_items_clear(x):
    d = {"a": x, "b": x + 1}
    for (k, v), n in zip(d.items(), [1, 2]):
        d.clear()
    return x


@pytest.mark.parametrize("fn", [w_enumerate_insert, w_zip_delete, w_map_keys_insert,
                                w_zip_items_clear])
def test_wrapped_dict_iterator_size_change_raises(fn):
    check(fn, (torch.randn(3),), graphs=None, raises=RuntimeError)


# --------------------------------------------------------- dict loops across a graph break
# The resume function continues over the real dict: stores made before or after the break
# are seen when the loop reaches their key, and size changes raise.

def b_items_break_before_store(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for k, v in d.items():
        print("at", k)
        if k == "a":
            d["b"] = v * 100
        out.append(v + 1)
    return out


def b_items_break_after_store(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for k, v in d.items():
        if k == "a":
            d["c"] = v * 100
        print("at", k)
        if k == "b":
            d["c"] = v * 50
        out.append(v + 1)
    return out


def b_values_input_dict(x, d):
    out = []
    for v in d.values():
        print("value")
        d["c"] = v * 3        # replayed into the caller's dict at the next break
        out.append(v + x)
    return out, d


def b_reversed_items(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for k, v in reversed(d.items()):
        print("at", k)
        d["a"] = v * 10
        out.append(v)
    return out


def b_enumerate_items(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for i, (k, v) in enumerate(d.items()):
        print("at", k)
        d["c"] = v * (i + 5)
        out.append(v)
    return out


def b_zip_list_and_items(x):
    d = {"a": x, "b": x + 1}
    out = []
    for n, (k, v) in zip([3, 4, 5], d.items()):
        d["b"] = v * n
        print("at", k)
        out.append(v)
    return out


def b_map_values(x):
    d = {"a": x, "b": x + 1}
    out = []
    for y in map(torch.neg, d.values()):
        print("y")
        d["b"] = y * 6
        out.append(y)
    return out


def b_iterator_local(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    it = iter(d.values())
    out = [next(it)]
    print("break")
    d["c"] = x * 9
    out.append(next(it))
    out.extend(it)
    return out


BREAK_STORES = [b_items_break_before_store, b_items_break_after_store, b_reversed_items,
                b_enumerate_items, b_zip_list_and_items, b_map_values, b_iterator_local]


# graphs: the loop's rest is captured again by each resume function (a graph per item and
# one after, where they have tensor ops), also when enumerate, zip or map wrap the iterator
BREAK_GRAPHS = {b_items_break_before_store: 4, b_items_break_after_store: 4,
                b_reversed_items: 4, b_enumerate_items: 4, b_zip_list_and_items: 2,
                b_map_values: 3, b_iterator_local: 2}


@pytest.mark.parametrize("fn", BREAK_STORES)
def test_dict_loop_graph_break_sees_stores(fn):
    check(fn, (torch.randn(3),), graphs=BREAK_GRAPHS[fn])


def test_dict_loop_graph_break_input_dict():
    # the caller's dict: stores captured in one resume function are replayed before the
    # next break makes the iterator the following one continues with
    d = {"a": torch.randn(3), "b": torch.randn(3), "c": torch.randn(3)}
    check(b_values_input_dict, (torch.randn(3), d), graphs=3)


def b_insert_after_break(x):
    d = {"a": x, "b": x + 1}
    for k in d:
        print("at", k)
        d[k + "z"] = x        # RuntimeError at the next step, in the resume function
    return d


def b_delete_before_break(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    for k, v in d.items():
        if k == "b":
            del d["c"]        # RuntimeError at the next step
        print("at", k)
    return d


def b_enumerate_insert_after_break(x):
    d = {"a": x, "b": x + 1}
    for i, v in enumerate(d.values()):
        print("at", i)
        d[i] = v
    return d


def b_last_step_insert(x):
    d = {"a": x, "b": x + 1}
    for k in d:
        print("at", k)
        if k == "b":
            d["c"] = x       # after the last item, before StopIteration: still raises
    return d


@pytest.mark.parametrize("fn", [b_insert_after_break, b_delete_before_break,
                                b_enumerate_insert_after_break, b_last_step_insert])
def test_dict_loop_graph_break_size_change_raises(fn):
    check(fn, (torch.randn(3),), graphs=None, raises=RuntimeError)


def i_chain(x):
    d = {"a": x, "b": x + 1}
    out = []
    for v in itertools.chain([x * 0], d.values(), [x * 5]):
        d["b"] = v * 3
        out.append(v)
    return out


def i_islice(x):
    d = {"a": x, "b": x + 1, "c": x + 2, "d": x + 3}
    out = []
    for k, v in itertools.islice(d.items(), 1, None, 2):
        d["d"] = v * 3
        out.append(v)
    return out


def i_starmap(x):
    d = {"a": x, "b": x + 1}
    out = []
    for y in itertools.starmap(lambda k, v: v * 2, d.items()):
        d["b"] = y * 3
        out.append(y)
    return out


def i_zip_longest(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for n, v in itertools.zip_longest([1], d.values(), fillvalue=7):
        d["c"] = v * n
        out.append(v)
    return out


def i_pairwise(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for v, w in itertools.pairwise(d.values()):
        d["c"] = v * 4
        out.append(v + w)
    return out


def i_accumulate(x):
    d = {"a": x, "b": x + 1, "c": x + 2}
    out = []
    for total in itertools.accumulate(d.values(), initial=x):
        d["c"] = total * 2
        out.append(total)
    return out


def i_islice_chain_break(x):
    d = {"a": x, "b": x + 1, "c": x + 2, "d": x + 3, "e": x + 4}
    out = []
    for v in itertools.islice(itertools.chain(d.values(), [x]), 1, 5, 2):
        print("at")
        d["d"] = v * 3
        out.append(v)
    return out


@pytest.mark.parametrize("fn", [i_islice_chain_break, i_chain, i_islice, i_starmap,
                                i_zip_longest, i_pairwise, i_accumulate])
def test_itertools_over_dict_sees_stores(fn):
    # with a break: chain and islice continue in resume functions (ResumedWrapperIterator),
    # which capture the loop's rest; the others' rest runs eagerly
    check(fn, (torch.randn(3),), graphs=3 if fn is i_islice_chain_break else 1)


def i_chain_insert(x):
    d = {"a": x}
    for v in itertools.chain(d.values(), [x]):
        d[len(d)] = v
    return d


def test_itertools_over_dict_size_change_raises():
    check(i_chain_insert, (torch.randn(3),), graphs=None, raises=RuntimeError)


# ------------------------------------------------------ one iterator passed to zip twice

def z_grouper_list(x):
    xs = [x, x + 1, x + 2, x + 3, x + 4]
    return [v + w for v, w in zip(*[iter(xs)] * 2)]


def z_grouper_dict(x):
    d = {"a": x, "b": x + 1, "c": x + 2, "d": x + 3}
    out = []
    for v, w in zip(*[iter(d.values())] * 2):
        d["d"] = v * 10
        out.append(v + w)
    return out


def z_grouper_dict_break(x):
    d = {"a": x, "b": x + 1, "c": x + 2, "d": x + 3}
    out = []
    for v, w in zip(*[iter(d.values())] * 2):
        print("pair")             # the resume function cannot get one iterator twice:
        d["d"] = v * 10           # the frame runs eagerly
        out.append(v + w)
    return out


@pytest.mark.parametrize("fn, graphs", [(z_grouper_list, 1), (z_grouper_dict, 1),
                                        (z_grouper_dict_break, 0)])
def test_zip_one_iterator_twice(fn, graphs):
    check(fn, (torch.randn(3),), graphs=graphs)
