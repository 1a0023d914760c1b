"""Values that look data-dependent but are not: dtype tests are metadata (answered at
capture, guarded by the input's dtype), ``max``/``min`` of one-element tensors are tensor
ops, and a list indexed by a tensor breaks the graph there, with a reason, instead of
running the whole frame eagerly."""
import pytest
import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401


def mv_is_floating_point(x):
    return x * 2 if torch.is_floating_point(x) else x + 1


def mv_method_is_floating_point(x):
    return x * 2 if x.is_floating_point() else x + 1


def mv_is_complex(x):
    return x.abs() if x.is_complex() or torch.is_complex(x) else x - 1


def mv_dtype_eq(x):
    return x.float() * 2 if x.dtype == torch.int64 else x - 1


def mv_dtype_in(x):
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x * 3


def mv_dtype_is(x):
    return x * 2 if x.dtype is torch.float32 and x.dtype.is_floating_point else x + 1


def mv_dtype_itemsize(x):
    return x * x.dtype.itemsize + x.element_size()


def mv_max_min_0d(x):
    a, b = x.sum(), x.mean()
    return max(a, b) + min(a, b)


def mv_max_of_three(x):
    return max(x[0, 0], x[1, 1], x[2, 2]) * min([x[0, 1], x[1, 0]])


def mv_max_in_loop(x):
    best = x[0].sum()
    for row in x[1:]:
        best = max(best, row.sum())
    return best


FLOAT = (torch.randn(3, 4),)
INT = (torch.randint(0, 9, (3, 4)),)


@pytest.mark.parametrize("fn", [mv_is_floating_point, mv_method_is_floating_point,
                                mv_is_complex, mv_dtype_eq, mv_dtype_in, mv_dtype_is,
                                mv_dtype_itemsize], ids=lambda f: f.__name__)
@pytest.mark.parametrize("inputs", [FLOAT, INT], ids=["float", "int"])
def test_dtype_tests_are_metadata(fn, inputs):
    check(fn, inputs)


def test_is_complex_on_complex_input():
    check(mv_is_complex, (torch.randn(3, dtype=torch.complex64),))


def test_dtype_tests_recompile_for_another_dtype():
    cnt = check(mv_is_floating_point, FLOAT)
    compiled = ember.compile(mv_is_floating_point, backend=cnt)
    assert torch.equal(compiled(INT[0]), INT[0] + 1)
    assert cnt.frame_count == 2


@pytest.mark.parametrize("fn", [mv_max_min_0d, mv_max_of_three, mv_max_in_loop],
                         ids=lambda f: f.__name__)
def test_max_min_of_scalar_tensors_is_a_tensor_op(fn):
    cnt = check(fn, (torch.randn(3, 3, requires_grad=True),), backward=True)
    ops = [n.target for g in cnt.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.maximum in ops


def mv_max_mixed_dtypes(x):
    return max(x.sum(), x.long().sum()) + 1


def test_max_of_mixed_dtypes_breaks():
    """eager returns whichever object wins, with its own dtype: a break, never maximum()."""
    check(mv_max_mixed_dtypes, (torch.randn(4),), graphs=2)


def mv_list_indexed_by_tensor(x, i):
    scales = [0.5, 2.0, 3.0]
    return x * scales[i] + 1


def test_list_indexed_by_tensor_breaks_with_a_reason():
    inputs = (torch.randn(3), torch.tensor(1))
    # the float crosses the break as a graph input: one resume graph serves both scales
    check(mv_list_indexed_by_tensor, inputs, (torch.randn(3), torch.tensor(2)), graphs=1)
    ember.reset()
    explained = ember.explain(mv_list_indexed_by_tensor)(*inputs)
    assert [r.frame_ran_eagerly for r in explained.break_reasons] == [False]
    assert "indexing a list with a tensor" in explained.break_reasons[0].reason
