"""Conformance: tuples, lists, dicts, sets, comprehensions, unpacking, container returns."""
import collections

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def c_list_methods(x, y):
    lst = [x]
    lst.append(y)
    lst.extend([x * 2, y * 2])
    lst.insert(1, x + y)
    popped = lst.pop()
    first = lst.pop(0)
    lst.reverse()
    nums = [3, 1, 2, 3]
    nums.sort()
    nums.remove(2)
    return torch.stack(lst).sum(0) + popped - first, nums.index(3), nums.count(3), nums, len(lst)


def c_list_copy_and_alias(x):
    a = [x, x + 1]
    b = a.copy()
    c = a
    c.append(x * 3)
    b[0] = x - 1
    d = list(a)
    d.clear()
    return a, b, len(d), a + b, [x] * 2


def c_dict_methods(x, y):
    d = {"a": x}
    d["b"] = y
    d.update({"c": x * y}, e=y + 1)
    d.setdefault("a", y)            # existing key: unchanged
    v = d.setdefault("f", x - y)    # new key
    g = d.get("g", x * 0) + d.get("a")
    keys = list(d.keys())
    vals = sum(d.values())
    items = [(k, t.sum()) for k, t in d.items()]
    popped = d.pop("c")
    del d["e"]
    return d, keys, vals, items, popped + v + g, "c" in d, len(d)


def c_dict_copy_and_merge(x, cfg):
    d = dict(cfg)
    d2 = d.copy()
    d2["scale"] = 3
    merged = {**d, **{"shift": 1}}
    return x * d["scale"] + merged["shift"] * d2["scale"], merged, sorted(d2)


def c_dict_argument(d):
    return {k: v * 2 for k, v in d.items() if k != "skip"}, d["skip"] + 1


def c_ordered_and_default_dict(x):
    od = collections.OrderedDict()
    od["z"] = x
    od["a"] = x + 1
    dd = collections.defaultdict(list)
    dd["k"].append(x)
    dd["k"].append(x * 2)
    return list(od.keys()), torch.cat(dd["k"]) + od["a"].sum()


def c_set_methods(x, s):
    t = set(s)
    t.add(10)
    t.discard(1)
    u = t.union({20, 21}) | {30}
    i = t & {2, 10, 99}
    diff = u - {20}
    out = x
    if 10 in t and 1 not in t:
        out = out + len(u)
    return out * len(i), sorted(diff), 20 in u


def c_tuple_ops(x, y):
    t = (x, y, 3)
    t2 = t + (4,)
    a, b, n = t
    return a * n + b, len(t2), t2[-1], (1, 3, 4).index(4), (3, 4, 4).count(4), t[:2]


def c_slicing(xs):
    return xs[1:], xs[:-1], xs[::2], xs[::-1], tuple(xs)[1:3], xs[-1] * 2


def c_unpacking(x, y, z):
    a, b = x, y
    first, *rest = [x, y, z]
    *init, last = (x, y, z)
    (p, q), r = (x, y), z
    ((m, n), o) = ((1, 2), 3)
    h, _, t = "abc"
    return first + last + p * q + r, len(rest), len(init), rest[0], m + n + o, h + t, a - b


def c_star_in_calls_and_displays(x, y):
    args = (x, y)
    lst = [*args, x * 2]
    tpl = (*lst, y)
    d1 = {"a": 1}
    d2 = {**d1, "b": 2}
    return torch.stack(lst), torch.cat([*tpl]), torch.add(*args), d2


def c_list_comprehensions(xs):
    a = [t * 2 for t in xs]
    b = [t + i for i, t in enumerate(xs) if i % 2 == 0]
    c = [[t * j for j in range(2)] for t in xs[:2]]
    return a, b, c


def c_dict_set_comprehensions(xs):
    d = {f"k{i}": t.sum() for i, t in enumerate(xs)}
    s = {i * i for i in range(-2, 3)}
    return d, sorted(s)


def c_generator_expressions(xs):
    t = tuple(x * 2 for x in xs)
    s = sum(x.sum() for x in xs)
    lst = list(x + 1 for x in xs if x.shape[0] > 1)
    m = max(len(x) for x in xs)
    return t, s, lst, m, any(x.dim() == 1 for x in xs)


def c_return_containers(x, y):
    return {"pair": (x, y), "list": [x * 2, {"nested": y - 1}], "n": 3}, [(x,), [y]]


def c_return_python_values_alongside(x):
    return x + 1, 3, "str", None, 2.5, True, (1, [2]), {"k": x.dtype}, torch.float32


def c_containers_of_tensor_args(lst, tup, d):
    return lst[0] + tup[1] + d["w"], [t * 2 for t in lst], {k: v + 1 for k, v in d.items()}


def c_mutate_list_argument(lst, x):
    lst.append(x * 2)
    lst[0] = lst[0] + 1
    lst.pop(1)
    return len(lst) + x


def c_mutate_dict_argument(d, x):
    d["new"] = x + 1
    d["a"] = d["a"] * 2
    del d["b"]
    return x.sum()


def c_deque(x, y):
    q = collections.deque([x])
    q.append(y)
    q.appendleft(x * 2)
    left = q.popleft()
    return left + q[-1], len(q)


CONTAINERS = [
    (c_list_methods, lambda: (torch.randn(3), torch.randn(3))),
    (c_list_copy_and_alias, lambda: (torch.randn(3),)),
    (c_dict_methods, lambda: (torch.randn(3), torch.randn(3))),
    (c_dict_copy_and_merge, lambda: (torch.randn(3), {"scale": 2, "shift": 0})),
    (c_dict_argument, lambda: ({"a": torch.randn(2), "b": torch.randn(3), "skip": 4},)),
    (c_ordered_and_default_dict, lambda: (torch.randn(3),)),
    (c_set_methods, lambda: (torch.randn(3), {1, 2, 3})),
    (c_tuple_ops, lambda: (torch.randn(3), torch.randn(3))),
    (c_slicing, lambda: ([torch.randn(2) for _ in range(5)],)),
    (c_unpacking, lambda: (torch.randn(3), torch.randn(3), torch.randn(3))),
    (c_star_in_calls_and_displays, lambda: (torch.randn(3), torch.randn(3))),
    (c_list_comprehensions, lambda: ([torch.randn(2) for _ in range(4)],)),
    (c_dict_set_comprehensions, lambda: ([torch.randn(2) for _ in range(3)],)),
    (c_generator_expressions, lambda: ([torch.randn(2), torch.randn(1), torch.randn(3)],)),
    (c_return_containers, lambda: (torch.randn(3), torch.randn(3))),
    (c_return_python_values_alongside, lambda: (torch.randn(3),)),
    (c_containers_of_tensor_args, lambda: ([torch.randn(3), torch.randn(3)],
                                           (torch.randn(3), torch.randn(3)),
                                           {"w": torch.randn(3), "v": torch.randn(1)})),
    (c_mutate_list_argument, lambda: ([torch.randn(3), torch.randn(3)], torch.randn(3))),
    (c_mutate_dict_argument, lambda: ({"a": torch.randn(3), "b": torch.randn(3)},
                                      torch.randn(3))),
    (c_deque, lambda: (torch.randn(3), torch.randn(3))),
]


@pytest.mark.parametrize("fn,make", CONTAINERS, ids=[f.__name__ for f, _ in CONTAINERS])
def test_container(fn, make):
    check(fn, make())
