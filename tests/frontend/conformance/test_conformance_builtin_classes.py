"""C-implemented and builtin classes inside compiled code: class-level constructors
(``dict.fromkeys``), OrderedDict subclasses, deques (``maxlen`` included), namedtuples made
in the frame, ``torch.Size``, ``sys.intern`` and the names of functions and Tensor
methods."""
import collections
import sys
from collections import OrderedDict, defaultdict, deque, namedtuple

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401


def bc_fromkeys(x):
    d = dict.fromkeys(["a", "b"], 0)
    od = OrderedDict.fromkeys("xy")
    dd = defaultdict.fromkeys(("c",), 2)
    return x + len(d) + dd["c"], list(od), type(dd) is defaultdict, d


class Registry(OrderedDict):
    def total(self):
        return sum(self.values())


def bc_ordered_dict_subclass(x):
    r = Registry()
    r["a"] = x
    r["b"] = x * 2
    r.setdefault("c", x * 3)
    return r.total(), list(r.keys()), r


def bc_ordered_dict_subclass_input(x, reg):
    reg["new"] = x
    return reg.total() + x


def bc_deque_methods(x):
    d = deque([x, x + 1])
    d.append(x + 2)
    d.appendleft(x - 1)
    e = d.copy()
    e.rotate(1)
    d.extendleft([x * 10])
    first, last = d.popleft(), d.pop()
    return first + last, list(d), list(e), deque([1, 2, 1]).count(1), len(e)


def bc_deque_maxlen(x):
    d = deque(maxlen=3)
    for i in range(5):
        d.append(x * i)
    d.appendleft(x)
    return list(d), d.maxlen, d.copy().maxlen


def bc_deque_input(x, d):
    d.append(x)
    d.rotate(-1)
    return sum(d)


def bc_namedtuple_in_frame(x):
    Point = namedtuple("Point", ["a", "b"])
    p = Point(x, b=2)
    q = p._replace(b=3)
    return p.a * p.b + q.b, p._fields, type(p).__name__


def bc_size_attributes(x):
    s = x.size()
    return (x * s.numel() + len(s) + s.index(4) + s.count(3), s[1:], s + (1,),
            torch.Size([2, s[0]]), type(s) is torch.Size)


def bc_intern(x):
    key = sys.intern("layer" + str(x.dim()))
    return x + len(key), key


def bc_names(x):
    def inner():
        pass
    return (x + 1, inner.__name__, inner.__qualname__, torch.Tensor.add.__name__,
            x.add.__name__, x.add.__qualname__, torch.relu.__name__, x.relu.__self__ is x)


ALL = [bc_fromkeys, bc_ordered_dict_subclass, bc_deque_methods, bc_deque_maxlen,
       bc_namedtuple_in_frame, bc_size_attributes, bc_intern, bc_names]


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_builtin_classes_in_one_graph(fn):
    check(fn, (torch.randn(3, 4),))


def test_ordered_dict_subclass_argument_is_mutated_like_eager():
    reg = Registry(a=torch.ones(2))
    check(bc_ordered_dict_subclass_input, (torch.randn(2), reg))


@pytest.mark.parametrize("maxlen", [None, 2])
def test_deque_argument_is_mutated_like_eager(maxlen):
    check(bc_deque_input, (torch.randn(2), deque([torch.randn(2), torch.randn(2)], maxlen)))
