"""Things a compiled function builds for itself: functions decorated with grad-mode
managers, ``nn.Module`` instances built and called inside it, and user objects whose
``__init__`` runs under capture. Modules that would hold new tensors (parameters, buffers)
break the graph at their construction, and eager's random-number state is left exactly as
eager leaves it."""
import pytest
import torch
import torch.nn as nn

import ember
from conformance_util import _seed_rng, check  # noqa: F401


def bf_no_grad_decorator(x):
    @torch.no_grad()
    def scale(y):
        return y * 2

    return scale(x) + x


def bf_enable_grad_decorator(x):
    @torch.enable_grad()
    def scale(y):
        return y * 2

    with torch.no_grad():
        out = scale(x)
    return out + 1, torch.is_grad_enabled()


def bf_no_grad_decorator_without_call(x):
    @torch.no_grad
    def scale(y):
        return y * 2

    return scale(x) - x


def bf_decorator_name(x):
    @torch.no_grad()
    def scale(y):
        return y * 2

    return scale(x) + x, scale.__name__, scale.__qualname__


@pytest.mark.parametrize("fn", [bf_no_grad_decorator, bf_enable_grad_decorator,
                                bf_no_grad_decorator_without_call, bf_decorator_name],
                         ids=lambda f: f.__name__)
def test_grad_mode_decorators(fn):
    check(fn, (torch.randn(3, requires_grad=True),), backward=True)


def bf_softmax_module(x):
    return nn.Softmax(dim=1)(x)


def bf_sequential_of_new_modules(x):
    block = nn.Sequential(nn.ReLU(), nn.Dropout(p=0.0), nn.Tanh())
    return block(x) * 2


class Scale(nn.Module):
    def __init__(self, k, act=None):
        super().__init__()
        self.k = k
        self.act = act if act is not None else nn.Identity()

    def forward(self, x):
        return self.act(x) * self.k


def bf_user_module(x):
    return Scale(3)(x) + Scale(0.5, nn.GELU())(x)


class Plain(nn.Module):
    def forward(self, x):
        return x.sin()


def bf_module_without_init(x):
    return Plain()(x)


class Pair:
    def __init__(self, a, b):
        self.a = a
        self.b = b * 2

    def total(self):
        return self.a + self.b


def bf_user_object(x):
    p = Pair(x, x.cos())
    return p.total(), p.b


def bf_dropout_built_inside(x):
    return nn.Dropout(p=0.5)(x)


@pytest.mark.parametrize("fn", [bf_softmax_module, bf_sequential_of_new_modules,
                                bf_user_module, bf_module_without_init, bf_user_object,
                                bf_dropout_built_inside], ids=lambda f: f.__name__)
def test_objects_built_inside_the_frame(fn):
    check(fn, (torch.randn(4, 5, requires_grad=True),), backward=True)


COUNTER = []


class Counted(nn.Module):
    def __init__(self):
        super().__init__()
        COUNTER.append(1)

    def forward(self, x):
        return x + len(COUNTER)


def bf_init_with_side_effect(x):
    return Counted()(x)


def test_module_init_side_effects_happen_on_every_call():
    COUNTER.clear()
    eager = [bf_init_with_side_effect(torch.zeros(2)) for _ in range(3)]
    COUNTER.clear()
    compiled_fn = ember.compile(bf_init_with_side_effect, backend="eager")
    compiled = [compiled_fn(torch.zeros(2)) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
    assert len(COUNTER) == 3


def bf_linear_built_inside(x):
    y = x + 1
    layer = nn.Linear(5, 2)
    return layer(y)


def bf_module_holding_a_tensor(x):
    s = Scale(x.sum())
    return s(x)


@pytest.mark.parametrize("fn", [bf_linear_built_inside, bf_module_holding_a_tensor],
                         ids=lambda f: f.__name__)
def test_modules_with_new_tensors_break_with_a_reason(fn):
    """The construction runs eagerly (drawing eager's random numbers, once)."""
    check(fn, (torch.randn(4, 5),), graphs=None)
    ember.reset()
    explained = ember.explain(fn)(torch.randn(4, 5))
    assert explained.break_reasons and not any(r.frame_ran_eagerly
                                               for r in explained.break_reasons)
