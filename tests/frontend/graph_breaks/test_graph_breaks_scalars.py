"""Floats that cross a graph break (``s = t.item()``) are graph inputs of the resume
function where they are a tensor op's scalar operand, not guarded constants: one resume
graph serves every value, and each op computes what eager computes with the Python float
(result dtypes included). Any other use reads the value and guards it.
"""
import pytest
import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401
from ember.testing import CompileCounter, same


def sc_scale(x):
    s = x.double().sum().item()
    print("sc-scale")
    return x * s, s + x, x / s, torch.add(x, s), x > s, (x.float() - s).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16, torch.int64, torch.bool])
def test_float_from_item_is_a_graph_input(dtype, capsys):
    cnt = CompileCounter()
    compiled = ember.compile(sc_scale, backend=cnt)
    for i in range(4):
        x = (torch.randn(5) * 3).to(dtype) if dtype != torch.bool else torch.randn(5) > 0
        if dtype == torch.bool:
            x[0] = True                      # a non-zero sum: no division by zero
        got, want = compiled(x), _eager(sc_scale, x)
        assert same(got, want, rtol=0, atol=0), (dtype, i)
    # sum | print | the rest, whatever the sum's value
    assert cnt.frame_count == 2


def _eager(fn, *args):
    return fn(*args)


def sc_inplace(x, w):
    s = w.mean().item()
    print("sc-inplace")
    y = x.clone()
    y.mul_(s)
    y += s
    return y


def test_float_from_item_in_place_ops():
    check(sc_inplace, (torch.randn(4), torch.randn(3)), graphs=2)


def sc_branch(x):
    s = x.sum().item()
    print("sc-branch")
    if s > 0:                      # control flow reads the value: guarded
        return x * s
    return x - s


def test_float_in_control_flow_is_guarded():
    check(sc_branch, (torch.rand(3) + 0.1,), (-torch.rand(3) - 0.1,), graphs=None)
    cnt = CompileCounter()
    compiled = ember.compile(sc_branch, backend=cnt)
    x = torch.rand(3) + 0.1
    compiled(x)
    compiled(x)
    assert same(compiled(-x), sc_branch(-x))
    assert cnt.frame_count == 3


def sc_python_math(x):
    s = x.sum().item()
    print("sc-python-math")
    return x * (s * 2), s


def test_float_in_python_arithmetic_is_specialised_and_returned():
    check(sc_python_math, (torch.randn(3),), graphs=None)


def sc_two_breaks(x, log):
    s = x.abs().sum().item()
    log.append("first")
    print("sc-two-breaks")
    y = x * s
    print("again")
    return y + s, s


def test_float_crosses_two_breaks(capsys):
    check(sc_two_breaks, (torch.randn(3), []), graphs=3)


def sc_complex(x):
    s = x.abs().sum().item()
    print("sc-complex")
    return x * s


def test_float_with_complex_tensor_is_specialised():
    check(sc_complex, (torch.randn(3, dtype=torch.complex64),), graphs=None)


def test_float_graph_input_through_the_compiler():
    cnt = CompileCounter("ember")
    compiled = ember.compile(sc_scale, backend=cnt)
    for _ in range(3):
        x = torch.randn(6)
        assert same(compiled(x), sc_scale(x), rtol=1e-6, atol=1e-6)
    assert cnt.frame_count == 2


def sc_int_item(x, n):
    k = int(x.sum().item() > 0) + n
    print("sc-int")
    return x.reshape(-1)[:k]


def test_int_crossing_the_break_stays_guarded():
    cnt = CompileCounter()
    compiled = ember.compile(sc_int_item, backend=cnt)
    x = torch.rand(4) + 0.1
    assert same(compiled(x, 1), sc_int_item(x, 1))
    assert same(compiled(x, 2), sc_int_item(x, 2))
    assert same(compiled(-x, 2), sc_int_item(-x, 2))
