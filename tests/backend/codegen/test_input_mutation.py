"""Graph inputs mutated in place: the backend writes the new values into the inputs' memory
after everything that reads the old values (outputs computed lazily, other new values), on
both CPU targets (the ``cpu_backend`` fixture, ``conftest.py``)."""
import pytest
import torch

import ember
from ember import config
from ember.testing import same

pytestmark = pytest.mark.usefixtures("cpu_backend")


def later_output(x):
    y = x + 1
    x.mul_(2)
    return y


def accumulate_other_input(x, y):
    x.add_(1)
    y.add_(x)


def element_of_mutated(x):
    x.add_(1)
    return x[0]


def reduction_then_mutation(x):
    y = x.sum()
    x.mul_(2)
    return y


def cross_copies(x, y):
    z = x * y
    x.copy_(y)
    y.copy_(z)
    return z


def swap(x, y):
    t = x.clone()
    x.copy_(y)
    y.copy_(t)


def view_before_mutation(x):
    y = x[0]
    x.add_(1)
    return y


def shifted_self_read(x):
    x.add_(x.flip(0))
    return x.sum()


@pytest.mark.parametrize("fn,n", [
    (later_output, 1), (accumulate_other_input, 2), (element_of_mutated, 1),
    (reduction_then_mutation, 1), (cross_copies, 2), (swap, 2), (view_before_mutation, 1),
    (shifted_self_read, 1)], ids=lambda v: getattr(v, "__name__", str(v)))
def test_mutated_inputs_match_eager(fn, n):
    ember.reset()
    torch.manual_seed(0)
    inputs = [torch.randn(5, 3) for _ in range(n)]
    eager_in = [t.clone() for t in inputs]
    ours_in = [t.clone() for t in inputs]
    with config.patch(suppress_errors=False), torch.no_grad():
        expected = fn(*eager_in)
        actual = ember.compile(fn, backend="ember")(*ours_in)
    assert same(expected, actual)
    assert same(eager_in, ours_in)


def test_copy_of_a_same_dtype_cast_of_itself_generates_nothing():
    """timm's eval BatchNormAct writes ``running_mean.copy_(running_mean.to(float32))``: no
    kernel, and the graph does not count as mutating its inputs (CUDA graphs need that)."""
    from ember.backend import compile_stats

    def fn(x, stat):
        stat.copy_(stat.to(torch.float32))
        return x + 1
    ember.reset()
    x, stat = torch.randn(8), torch.randn(4)
    before = stat.clone()
    with config.patch(suppress_errors=False):
        out = ember.compile(fn)(x, stat)
    assert same(out, x + 1) and same(stat, before)
    assert compile_stats.generated_kernel_count == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_mutated_where_the_target_has_no_half_kernels(dtype):
    """The C++ target has no float16/bfloat16 kernels: the new values come from ATen and are
    written by ATen (the write was a C++ kernel over a float16 buffer: a KeyError while
    generating it). Batch norm's running statistics are the common case."""
    def fn(x, w, b, mean, var, other, filled):
        out = torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, 0.5, 0.6)[0]
        other.copy_(x[0, :, 0].float() * 3)
        filled.fill_(2.5)
        return out

    def inputs():
        torch.manual_seed(0)
        return [torch.randn(3, 5, 4, dtype=dtype), torch.randn(5, dtype=dtype),
                torch.randn(5, dtype=dtype), torch.randn(5, dtype=dtype),
                torch.rand(5, dtype=dtype) + 0.5, torch.zeros(5, dtype=dtype),
                torch.zeros(2, dtype=dtype)]
    want, got = inputs(), inputs()
    expected = fn(*want)
    ember.reset()
    with config.patch(suppress_errors=False):
        result = ember.compile(fn)(*got)
    torch.testing.assert_close(result, expected)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
