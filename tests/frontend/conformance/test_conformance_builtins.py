"""Conformance: Python builtins, the math module and the operator module, in one graph."""
import functools
import math
import operator

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def b_len_isinstance(x, lst):
    out = x * len(lst) + len(x) + len(x.shape)
    if isinstance(x, torch.Tensor) and isinstance(lst, (list, tuple)) and not isinstance(x, int):
        out = out + 1
    return out


def b_range_forms(x):
    acc = x
    for i in range(3):
        acc = acc + i
    for i in range(1, 7, 2):
        acc = acc * i
    for i in range(5, 0, -2):
        acc = acc - i
    return acc, list(range(4)), len(range(10)), range(6)[2], 3 in range(5)


def b_enumerate_zip(xs, ys):
    out = []
    for i, (a, b) in enumerate(zip(xs, ys)):
        out.append(a * i + b)
    for i, a in enumerate(xs, start=10):
        out.append(a + i)
    return out


def b_min_max_abs(x, a, b):
    return x * min(a, b) + max(a, b, 0) + abs(a - b) + min([3, a]) + max((b, 1)), \
        torch.maximum(x, x * 0) + max(x.shape)


def b_getattr_hasattr(x):
    shape = getattr(x, "shape")
    relu = getattr(torch, "relu")
    out = relu(x) + shape[0]
    if hasattr(x, "dtype") and not hasattr(x, "no_such_attribute"):
        out = out * 2
    return out, getattr(x, "no_such_attribute", 7)


class _Bag:
    pass


def b_setattr_local_object(x):
    obj = _Bag()
    setattr(obj, "scale", 3)
    obj.bias = x * 2
    setattr(obj, "bias", obj.bias + 1)
    return x * getattr(obj, "scale") + obj.bias


def b_type(x, n):
    out = x
    if type(n) is int:
        out = out + n
    if type(x) is torch.Tensor:
        out = out * 2
    return out, type(n) == int


def b_constructors(x, y):
    t = tuple([x, y])
    lst = list((x, y, x))
    d = dict(a=x, b=y)
    d2 = dict([("c", y), ("d", x)])
    s = set([1, 2, 2, 3])
    fs = frozenset((4, 4, 5))
    return t[0] + lst[2] + d["b"] + d2["c"], len(s), sorted(s), len(fs), tuple(range(3))


def b_sum_tensors(a, b, c):
    return sum([a, b, c]), sum((a, b), c), sum([1, 2, 3]) * a


def b_sorted_ints(x, lst):
    s = sorted(lst)
    s_rev = sorted(lst, reverse=True)
    s_key = sorted(lst, key=lambda v: -v)
    return x * s[0] + s_rev[0], s, s_rev, s_key


def b_any_all(x, flags):
    out = x
    if any(flags):
        out = out + 1
    if all(flags):
        out = out + 100
    if any([False, False]) or not all([True, False]):
        out = out * 3
    return out, any(f for f in flags), all([])


def b_round_int_float_bool(x, v):
    return x * round(v) + round(v, 1) + int(v) + float(3) + bool(v) + int("4") + bool(0), \
        round(2.5), round(-0.5), int(-2.7), float(True)


def b_reversed(xs):
    out = []
    for a in reversed(xs):
        out.append(a * len(out))
    return out, list(reversed(range(3))), tuple(reversed((1, 2, 3)))


def b_map_filter(xs):
    doubled = list(map(lambda t: t * 2, xs))
    pos = list(filter(lambda v: v > 1, [0, 1, 2, 3]))
    pairs = list(map(lambda a, b: a + b, xs, doubled))
    return doubled, pos, pairs, tuple(map(abs, [-1, 2, -3]))


def b_fstring_keys(x):
    out = {}
    for i in range(3):
        out[f"layer{i}"] = x * i
    key = "w_{}".format(2) + "_" + str(5)
    out[key] = x + 1
    out["%d-%s" % (1, "a")] = x - 1
    return out, f"{x.shape[0]}x{x.shape[1]}", str(3.5), repr(4)


def b_divmod_pow(x, a, b):
    q, m = divmod(a, b)
    return x * q + m + pow(a, 2) + pow(2, b, 5), (q, m)


def b_callable_iter_next(x, lst):
    it = iter(lst)
    first = next(it)
    second = next(it)
    rest = list(it)
    out = x * first + second
    if callable(torch.relu) and not callable(3):
        out = out + 1
    return out, rest


def b_chr_ord_bin(x):
    c = chr(ord("a") + 2)
    return x + len(c + bin(5)), c


BUILTINS = [
    (b_len_isinstance, lambda: (torch.randn(3, 2), [1, 2])),
    (b_range_forms, lambda: (torch.randn(3),)),
    (b_enumerate_zip, lambda: ([torch.randn(2) for _ in range(3)],
                               [torch.randn(2) for _ in range(3)])),
    (b_min_max_abs, lambda: (torch.randn(3, 5), 4, -2)),
    (b_getattr_hasattr, lambda: (torch.randn(3),)),
    (b_setattr_local_object, lambda: (torch.randn(3),)),
    (b_type, lambda: (torch.randn(3), 4)),
    (b_constructors, lambda: (torch.randn(3), torch.randn(3))),
    (b_sum_tensors, lambda: (torch.randn(3), torch.randn(3), torch.randn(3))),
    (b_sorted_ints, lambda: (torch.randn(3), [5, 1, 4, 2])),
    (b_any_all, lambda: (torch.randn(3), [False, True, True])),
    (b_round_int_float_bool, lambda: (torch.randn(3), 2.75)),
    (b_reversed, lambda: ([torch.randn(2) for _ in range(3)],)),
    (b_map_filter, lambda: ([torch.randn(2) for _ in range(3)],)),
    (b_fstring_keys, lambda: (torch.randn(2, 3),)),
    (b_divmod_pow, lambda: (torch.randn(3), 17, 5)),
    (b_callable_iter_next, lambda: (torch.randn(3), [2, 3, 4, 5])),
    (b_chr_ord_bin, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make", BUILTINS, ids=[f.__name__ for f, _ in BUILTINS])
def test_builtin(fn, make):
    check(fn, make())


# ----------------------------------------------------------------------------- math / operator

def m_attention_scale(q, k):
    d = q.shape[-1]
    return (q @ k.transpose(-1, -2)) / math.sqrt(d)


def m_functions(x, n):
    return (x * math.pi + math.log(n) - math.ceil(n / 3) + math.floor(2.5) + math.exp(1.0)
            + math.cos(0.0) + math.e, math.ceil(n / 3), math.isclose(math.sqrt(4.0), 2.0),
            math.prod([2, 3]), math.gcd(12, 18), math.inf > n)


def m_operator_module(x, y):
    a = operator.add(x, y)
    b = operator.mul(a, 2)
    c = operator.getitem([x, y], 1)
    d = operator.getitem(x, 0)
    e = operator.sub(b, operator.neg(c))
    f = operator.truediv(e, 2)
    return f, d, operator.mul(x, 3), operator.eq(1, 1)


def m_functools_reduce(xs):
    return functools.reduce(operator.add, xs), functools.reduce(operator.mul, [1, 2, 3], 1)


MATH_OPERATOR = [
    (m_attention_scale, lambda: (torch.randn(2, 3, 4), torch.randn(2, 5, 4))),
    (m_functions, lambda: (torch.randn(3), 7)),
    (m_operator_module, lambda: (torch.randn(3), torch.randn(3))),
    (m_functools_reduce, lambda: ([torch.randn(2) for _ in range(4)],)),
]


@pytest.mark.parametrize("fn,make", MATH_OPERATOR, ids=[f.__name__ for f, _ in MATH_OPERATOR])
def test_math_and_operator(fn, make):
    check(fn, make())
