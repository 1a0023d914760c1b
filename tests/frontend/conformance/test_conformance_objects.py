"""Conformance: user-defined classes and objects, dataclasses, NamedTuples."""
import dataclasses
from typing import NamedTuple

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


class Scaler:
    factor_default = 3.0

    def __init__(self, factor=None):
        self.factor = self.factor_default if factor is None else factor
        self.calls = 0

    @property
    def double(self):
        return self.factor * 2

    @classmethod
    def make(cls, f):
        return cls(f)

    @staticmethod
    def shift(x):
        return x + 1

    def __call__(self, x):
        return self.apply(x)

    def apply(self, x):
        return self.shift(x) * self.factor


class Base:
    def __init__(self, k):
        self.k = k

    def run(self, x):
        return x * self.k


class Mid(Base):
    def __init__(self, k):
        super().__init__(k + 1)

    def run(self, x):
        return super().run(x) + 1


class Leaf(Mid):
    def run(self, x):
        return super().run(x) * 2


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class FrozenPair:
    a: torch.Tensor
    b: int


class Result(NamedTuple):
    out: torch.Tensor
    loss: torch.Tensor
    n: int


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def norm2(self):
        return self.x * self.x + self.y * self.y

    def __add__(self, other):
        return Point(self.x + other.x, self.y + other.y)


class Accumulator:
    def __init__(self):
        self.items = []

    def add(self, t):
        self.items.append(t)
        return self

    def total(self):
        return torch.stack(self.items).sum(0)


def o_attribute_reads(x, s):
    return x * s.factor + s.calls


def o_methods_property_classmethod_staticmethod(x, s):
    s2 = Scaler.make(0.5)
    return s.apply(x) + s2(x) + s.double + Scaler.shift(x) + s.shift(x) + Scaler.factor_default


def o_super_chain(x):
    return Leaf(2).run(x), Mid(1).run(x)


def o_dataclass_argument(x, batch):
    return (batch.x @ x).sum() * batch.weight + batch.y.mean()


def o_dataclass_created_and_returned(x, y):
    b = Batch(x * 2, y + 1, weight=0.5)
    b.weight = b.weight * 4
    return b, b.weight * b.x


def o_frozen_dataclass_argument(x, p):
    return x * p.b + p.a


def o_object_created_inside(x, y):
    p = Point(x, y)
    q = p + Point(y, x)
    return q.norm2(), q


def o_object_mutated_inside(x):
    acc = Accumulator()
    acc.add(x).add(x * 2)
    acc.add(x + 1)
    return acc.total(), len(acc.items)


def o_mutate_argument_object(x, s):
    s.calls += 1
    s.factor = s.factor * 2
    s.extra = x.sum()
    return s.apply(x)


def o_namedtuple_return(x, t):
    out = x * 2
    return Result(out, (out - t).pow(2).mean(), 3)


def o_namedtuple_argument_fields(x, r):
    a, b, n = r
    return r.out + a * n + r.loss + b, r._fields, r[-1]


def o_isinstance_user_classes(x, s):
    out = x
    if isinstance(s, Scaler):
        out = out + 1
    if isinstance(Leaf(1), Base) and not isinstance(s, Base):
        out = out * 2
    return out, type(s).__name__


def o_class_attribute_and_getattr(x, s):
    name = "factor"
    return x * getattr(s, name) + getattr(Scaler, "factor_default"), hasattr(s, "double")


OBJECTS = [
    (o_attribute_reads, lambda: (torch.randn(3), Scaler(2.0))),
    (o_methods_property_classmethod_staticmethod, lambda: (torch.randn(3), Scaler(1.5))),
    (o_super_chain, lambda: (torch.randn(3),)),
    (o_dataclass_argument, lambda: (torch.randn(3), Batch(torch.randn(2, 3), torch.randn(2),
                                                         0.25))),
    (o_dataclass_created_and_returned, lambda: (torch.randn(3), torch.randn(3))),
    (o_frozen_dataclass_argument, lambda: (torch.randn(3), FrozenPair(torch.randn(3), 4))),
    (o_object_created_inside, lambda: (torch.randn(3), torch.randn(3))),
    (o_object_mutated_inside, lambda: (torch.randn(3),)),
    (o_mutate_argument_object, lambda: (torch.randn(3), Scaler(2.0))),
    (o_namedtuple_return, lambda: (torch.randn(3), torch.randn(3))),
    (o_namedtuple_argument_fields, lambda: (torch.randn(3), Result(torch.randn(3),
                                                                    torch.randn(()), 2))),
    (o_isinstance_user_classes, lambda: (torch.randn(3), Scaler())),
    (o_class_attribute_and_getattr, lambda: (torch.randn(3), Scaler(4.0))),
]


@pytest.mark.parametrize("fn,make", OBJECTS, ids=[f.__name__ for f, _ in OBJECTS])
def test_user_object(fn, make):
    check(fn, make())


def test_method_compiled_directly():
    s = Scaler(2.0)
    check(s.apply, (torch.randn(3),))
