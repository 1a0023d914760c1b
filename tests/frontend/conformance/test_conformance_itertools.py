"""``itertools`` and ``functools`` over tensors and Python values: unrolled at capture into
one graph, with Python's own order and edge cases."""
import functools
import itertools
import operator

import pytest
import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401


def it_product(x):
    return sum(x * a - b for a, b in itertools.product([1, 2], (3, 4)))


def it_product_repeat(x, ys):
    return [a * b for a, b in itertools.product(ys, repeat=2)]


def it_chain(x, ys):
    return [t + 1 for t in itertools.chain([x], ys, (x * 2,))]


def it_chain_from_iterable(x, ys):
    return [t * 2 for t in itertools.chain.from_iterable([ys, [x], []])]


def it_combinations(x, ys):
    return [a @ b for a, b in itertools.combinations(ys, 2)] + \
        [x * i * j for i, j in itertools.combinations_with_replacement(range(3), 2)]


def it_permutations(x, ys):
    return [a - b for a, b in itertools.permutations(ys, 2)] + \
        [x * p[0] for p in itertools.permutations((1, 2, 3))]


def it_zip_longest(x, ys):
    return [(a if a is not None else x) * b
            for a, b in itertools.zip_longest([x], [1, 2, 3], fillvalue=None)] + \
        [a + b for a, b in itertools.zip_longest(ys, ys[:1], fillvalue=x)]


def it_accumulate(x, ys):
    return (list(itertools.accumulate(ys)), list(itertools.accumulate(ys, torch.maximum)),
            list(itertools.accumulate([1, 2, 3], operator.mul, initial=x)))


def it_islice(x, ys):
    it = iter(ys)
    head = list(itertools.islice(it, 2))
    return [x * i for i in itertools.islice(range(10), 2, 8, 2)], head, list(it)


def it_repeat(x, ys):
    scaled = [y * k for y, k in zip(ys, itertools.repeat(3))]
    return scaled + list(itertools.repeat(x, 2)) + list(itertools.repeat(x, times=0))


def it_count(x, ys):
    out = [y * i for i, y in zip(itertools.count(1, 2), ys)]
    for i in itertools.count():
        if i == 2:
            break
        out.append(x + i)
    return out + [x * i for i in itertools.islice(itertools.count(5), 3)]


def it_starmap_pairwise(x, ys):
    return list(itertools.starmap(torch.add, itertools.pairwise(ys))) + [x]


def ft_partial(x, ys):
    add2 = functools.partial(torch.add, alpha=2)
    scale = functools.partial(operator.mul, 3)
    return add2(x, ys[0]), scale(x)


def ft_reduce(x, ys):
    return functools.reduce(operator.add, ys), functools.reduce(lambda a, b: a * b, ys, x)


@functools.lru_cache(maxsize=None)
def _powers(n):
    return tuple(2 ** i for i in range(n))


def ft_lru_cache(x, ys):
    return [x * p for p in _powers(3)]


ALL = [it_product, it_product_repeat, it_chain, it_chain_from_iterable, it_combinations,
       it_permutations, it_zip_longest, it_accumulate, it_islice, it_repeat, it_count,
       it_starmap_pairwise, ft_partial, ft_reduce, ft_lru_cache]


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_itertools_and_functools_in_one_graph(fn):
    x = torch.randn(3, 3)
    ys = [torch.randn(3, 3) for _ in range(3)]
    if fn is it_product:
        check(fn, (x,))
    else:
        check(fn, (x, ys))


def test_lru_cache_is_guarded_by_identity():
    """A different cached function under the same global name recompiles."""
    global _powers
    cnt = check(ft_lru_cache, (torch.randn(2), []))
    compiled = ember.compile(ft_lru_cache, backend=cnt)
    saved = _powers
    try:
        _powers = functools.lru_cache(lambda n: (5,) * n)
        assert torch.equal(compiled(torch.ones(2), [])[0], torch.full((2,), 5.0))
        assert cnt.frame_count == 2
    finally:
        _powers = saved


_version_calls = []


@functools.lru_cache(maxsize=None)
def _package_version(name, at_least=(2, 0)):
    # transformers' is_torch_available() kind: a body capture cannot trace (re, importlib)
    import importlib.metadata
    import re
    _version_calls.append(name)
    found = tuple(int(p) for p in re.findall(r"\d+", importlib.metadata.version(name))[:2])
    return found >= at_least


@functools.lru_cache(maxsize=None)
def _scaled(x, k):
    return x * k


@functools.lru_cache(maxsize=None)
def _fresh_list(n):
    return list(range(n))


def ft_lru_cache_literal(x):
    if _package_version("torch") and _package_version("torch", at_least=(99, 0)) is False:
        return x + 1
    return x - 1


def test_lru_cache_of_literals_is_called_once_not_traced():
    """A cached function called with literal arguments is called at capture time and its
    literal result is a constant: one graph, no break into its untraceable body, and the
    function runs no more than eager runs it (once per arguments, ever)."""
    _package_version.cache_clear()
    _version_calls.clear()
    cnt = check(ft_lru_cache_literal, (torch.randn(3),), (torch.randn(3),), graphs=1)
    assert cnt.frame_count == 1
    assert _version_calls == ["torch", "torch"]    # one call per distinct arguments


def test_lru_cache_of_tensors_or_with_mutable_results_is_inlined():
    """Tensor arguments cannot be cached at capture time, and a list result is mutable (each
    caller shares it): both calls inline the body, as before."""
    def fn(x):
        return _scaled(x, 2) + len(_fresh_list(3))
    check(fn, (torch.randn(3),), (torch.randn(3),), graphs=1)
