"""Conformance: user Python functions inlined into the caller's graph."""
import functools

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def _lvl3(x):
    return x.sin() + 1


def _lvl2(x, y):
    return _lvl3(x) * y


def _lvl1(x, y):
    return _lvl2(x, y) - _lvl3(y)


def f_nested_calls(x, y):
    return _lvl1(x, y) + _lvl2(y, x)


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


def _pow_rec(x, n):
    if n == 0:
        return torch.ones_like(x)
    return x * _pow_rec(x, n - 1)


def f_recursion(x):
    return _pow_rec(x, 4) + _fact(5)


def _fib(n):
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)


def f_recursion_fib(x):
    return x * _fib(7)


def _defaults(x, scale=2.0, shift=None, *, clip=None):
    y = x * scale
    if shift is not None:
        y = y + shift
    if clip is not None:
        y = y.clamp(-clip, clip)
    return y


def f_default_args(x):
    return _defaults(x), _defaults(x, 3.0), _defaults(x, shift=1.0), _defaults(x, clip=0.5)


def _kwonly(x, *, a, b=1):
    return x * a + b


def f_keyword_only(x):
    return _kwonly(x, a=2) + _kwonly(x, b=3, a=4)


def _varargs(*args):
    out = args[0]
    for a in args[1:]:
        out = out + a
    return out, len(args)


def _kwargs(x, **kwargs):
    out = x
    for k in sorted(kwargs):
        out = out * kwargs[k]
    return out, sorted(kwargs.keys())


def _forward_all(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def f_args_kwargs_forwarding(x, y):
    a, n = _varargs(x, y, x)
    b, keys = _kwargs(x, p=2, q=y)
    c = _forward_all(_defaults, x, 3.0, shift=y)
    d = _forward_all(_kwonly, x, a=5)
    return a, n, b, keys, c, d


def f_star_call(x, y):
    lst = [x, y]
    d = {"shift": y, "clip": 1.0}
    t = (x, 0.5)
    return _defaults(*t, **d), torch.stack([*lst, *lst]), _varargs(*lst, *t[:1])[0], \
        _defaults(x, **{"scale": 4})


def f_lambdas(x):
    sq = lambda t: t * t  # noqa: E731
    add = lambda a, b=1: a + b  # noqa: E731
    compose = lambda f, g: (lambda v: f(g(v)))  # noqa: E731
    return compose(sq, add)(x), (lambda: x + 5)()


def _scale_then_add(x, scale, bias):
    return x * scale + bias


def f_partial(x, y):
    p = functools.partial(_scale_then_add, scale=3)
    p2 = functools.partial(_scale_then_add, x)
    p3 = functools.partial(torch.add, alpha=2)
    return p(x, bias=y), p2(2, y), p3(x, y)


def _closure_factory(w):
    def apply(x):
        return x * w
    return apply


def f_closures_from_inner_factory(x, w):
    f = _closure_factory(w)
    g = _closure_factory(2.0)
    return f(x) + g(x)


def f_higher_order(x):
    def twice(f, v):
        return f(f(v))
    return twice(torch.relu, x - 0.5), twice(lambda t: t * 3, x)


def _returns_multiple(x):
    return x + 1, x - 1, {"k": x * 2}


def f_multiple_returns(x):
    a, b, d = _returns_multiple(x)
    return a * b + d["k"]


def _early_return(x, flag):
    if flag:
        return x * 2
    y = x + 1
    return y * y


def f_early_return(x):
    return _early_return(x, True) + _early_return(x, False)


def _generator(xs):
    for i, x in enumerate(xs):
        yield x * i


def f_generator_function(x, y):
    return list(_generator([x, y, x])), sum(_generator([x, y]))


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1
    return wrapper


@_decorated
def _wrapped_fn(x):
    return x * 3


def f_decorated(x):
    return _wrapped_fn(x), _wrapped_fn.__name__


class _Calc:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return self.helper(x) * self.k

    def helper(self, x):
        return x + self.k

    def __call__(self, x):
        return self.apply(x) - 1


def f_methods(x):
    c = _Calc(3)
    bound = c.apply
    return bound(x), c(x), _Calc.helper(c, x)


def f_method_of_argument(x, calc):
    return calc.apply(x) + calc(x)


FUNCTIONS = [
    (f_nested_calls, lambda: (torch.randn(3), torch.randn(3))),
    (f_recursion, lambda: (torch.randn(3),)),
    (f_recursion_fib, lambda: (torch.randn(3),)),
    (f_default_args, lambda: (torch.randn(4),)),
    (f_keyword_only, lambda: (torch.randn(3),)),
    (f_args_kwargs_forwarding, lambda: (torch.randn(3), torch.randn(3))),
    (f_star_call, lambda: (torch.randn(3), torch.randn(3))),
    (f_lambdas, lambda: (torch.randn(3),)),
    (f_partial, lambda: (torch.randn(3), torch.randn(3))),
    (f_closures_from_inner_factory, lambda: (torch.randn(3), torch.randn(3))),
    (f_higher_order, lambda: (torch.randn(3),)),
    (f_multiple_returns, lambda: (torch.randn(3),)),
    (f_early_return, lambda: (torch.randn(3),)),
    (f_generator_function, lambda: (torch.randn(3), torch.randn(3))),
    (f_decorated, lambda: (torch.randn(3),)),
    (f_methods, lambda: (torch.randn(3),)),
    (f_method_of_argument, lambda: (torch.randn(3), _Calc(2))),
]


@pytest.mark.parametrize("fn,make", FUNCTIONS, ids=[f.__name__ for f, _ in FUNCTIONS])
def test_inlined_function(fn, make):
    check(fn, make())


def test_compiled_function_with_default_and_kwonly_signature():
    def fn(x, y=None, *, scale=2):
        return x * scale if y is None else x * scale + y
    check(fn, (torch.randn(3),))


def test_compiled_function_with_varargs_signature():
    def fn(*xs):
        return torch.cat(xs) * len(xs)
    check(fn, (torch.randn(2), torch.randn(3), torch.randn(1)))


def test_compiled_function_taking_callable_argument():
    def fn(x, act):
        return act(x) * 2
    check(fn, (torch.randn(4), torch.tanh))
