"""An index out of range in a generated kernel raises what eager raises for that op: gather,
scatter, scatter_add and index_add raise RuntimeError in eager, embedding, index_select,
``x[idx]``, ``x[idx] = v`` and index_put IndexError (the kernel flags the check of each op
kind apart; ``ops.IndexCheck``). Both CPU targets (the ``cpu_backend`` fixture)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_stats

pytestmark = pytest.mark.usefixtures("cpu_backend")

X = torch.randn(3, 4)
BAD = torch.tensor([0, 5, 1])            # 5: out of range of dim 0 (size 3)
BAD_ROW = torch.tensor([[0, 5, 1, 2]])
NEG = torch.tensor([0, -9, 1])           # wraps to -6: still out of range


def _setitem(x, i):
    y = x.clone()
    y[i] = 1.0
    return y + 1


CASES = {
    "gather": (lambda x, i: torch.gather(x, 0, i) + 1, BAD_ROW),
    "gather_negative": (lambda x, i: torch.gather(x, 0, i) + 1, torch.tensor([[0, -1, 1, 2]])),
    "scatter": (lambda x, i: torch.zeros(3, 4).scatter(0, i, x[:1]) + 1, BAD_ROW),
    "scatter_add": (lambda x, i: torch.zeros(3, 4).scatter_add(0, i, x[:1]) + 1, BAD_ROW),
    "index_select": (lambda x, i: torch.index_select(x, 0, i) + 1, BAD),
    "index_add": (lambda x, i: torch.zeros(3, 4).index_add(0, i, x) + 1, BAD),
    "index_copy": (lambda x, i: torch.zeros(3, 4).index_copy(0, i, x) + 1, BAD),
    "take": (lambda x, i: torch.take(x, i * 4) + 1, BAD),
    "embedding": (lambda x, i: F.embedding(i, x) + 1, BAD),
    "getitem": (lambda x, i: x[i] + 1, BAD),
    "getitem_negative": (lambda x, i: x[i] + 1, NEG),
    "getitem_two": (lambda x, i: x[i, i] + 1, BAD),
    "getitem_dim1": (lambda x, i: x[:, i + 1] + 1, BAD),
    "setitem": (_setitem, BAD),
    "index_put": (lambda x, i: torch.zeros(3, 4).index_put((i,), x[0]) + 1, BAD),
    "index_put_accumulate": (lambda x, i: torch.zeros(3, 4).index_put(
        (i,), x[0], accumulate=True) + 1, BAD),
}


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as e:   # noqa: BLE001 - the exception is what is compared
        return e
    raise AssertionError("no exception raised")


@pytest.mark.parametrize("name", list(CASES))
def test_index_out_of_range_raises_eagers_exception(name):
    fn, index = CASES[name]
    want = _raised(fn, X, index)
    ember.reset()
    compiled = ember.compile(fn, backend="ember")
    got = _raised(compiled, X, index)
    assert type(got) is type(want), (got, want)
    assert "out of range" in str(got) or "out of bounds" in str(got), got
    good = index.clamp(0, 2)
    torch.testing.assert_close(compiled(X, good), fn(X, good))


def test_generated_kernels_raise_the_ops_exception():
    # the cases above that a kernel computes (not an ATen fallback)
    for name in ("gather", "scatter_add", "index_select", "index_add", "embedding",
                 "getitem", "index_put"):
        fn, index = CASES[name]
        ember.reset()
        compiled = ember.compile(fn, backend="ember")
        compiled(X, index.clamp(0, 2))
        assert not compile_stats.fallback_ops, name


def test_a_kernel_fusing_two_checks_raises_the_first_ops():
    # one kernel gathers (RuntimeError in eager) and embeds (IndexError): each op's own
    # index out of range raises that op's exception, the first op's when both are
    def fn(x, i, j):
        return torch.gather(x, 0, i) + F.embedding(j, x)[:1]
    ok_i, ok_j = torch.tensor([[0, 1, 2, 0]]), torch.tensor([1])
    for i, j in ((BAD_ROW, ok_j), (ok_i, torch.tensor([7])), (BAD_ROW, torch.tensor([7]))):
        want = _raised(fn, X, i, j)
        ember.reset()
        got = _raised(ember.compile(fn, backend="ember"), X, i, j)
        assert type(got) is type(want), (i, j, got, want)
