"""Ember's frontend with the "ember" backend under ``dynamic=True`` (issue 31): programs
whose graphs compute with sizes (floats of sizes, sizes the capture pins) compile once for
every size, on both CPU targets, equal to eager at each size."""
from __future__ import annotations

import math

import pytest
import torch

import ember
from ember.backend import compile_stats
from ember.testing import CompileCounter

pytestmark = pytest.mark.usefixtures("fresh_no_grad", "cpu_backend")


def _scores(q, k):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.size(-1)), -1)


# name -> (program, inputs at size n); every one compiles once, symbolically
FLOATS_OF_SIZES = {
    "pow_half": (lambda x: x / x.shape[-1] ** 0.5, lambda n: [torch.randn(3, n)]),
    "math_sqrt": (lambda x: x / math.sqrt(x.size(-1)), lambda n: [torch.randn(3, n)]),
    "attention_scale": (_scores, lambda n: [torch.randn(2, n, 6), torch.randn(2, n, 6)]),
    "true_division": (lambda x: x * (x.shape[0] / 3), lambda n: [torch.randn(n, 2)]),
    # sizes rounded from floats: in the kernels' loop bounds
    "int_of_float": (lambda x: x[: int(x.shape[0] * 0.5)] * 2, lambda n: [torch.randn(n)]),
    "floor_ceil": (lambda x: x[math.floor(x.shape[0] / 3):math.ceil(x.shape[0] * 0.75)] + 1,
                   lambda n: [torch.randn(n)]),
}


@pytest.mark.parametrize("name", FLOATS_OF_SIZES)
def test_floats_of_sizes_stay_symbolic(name, cpu_backend):
    fn, make = FLOATS_OF_SIZES[name]
    compile_stats.reset()
    compiled = ember.compile(fn, dynamic=True)
    for n in (4, 9, 7):
        args = make(n)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-5, atol=1e-5)
    assert dict(compile_stats.symbolic_declines) == {}
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


def split_first_rest(x):
    first, rest = torch.split(x, [1, x.size(0) - 1])
    return rest - first


def test_a_size_capture_pins_is_no_graph_input(cpu_backend):
    # at 2 rows the broadcast of rest (1 row) guards s0 - 1 == 1: the third graph is the
    # static one, as torch.compile's, and the backend compiles it statically
    counter = CompileCounter("ember")
    compiled = ember.compile(split_first_rest, backend=counter)
    compile_stats.reset()
    for n in (3, 5, 8, 2, 2):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), split_first_rest(x))
    assert counter.frame_count == 3
    assert [n.name for n in counter.graphs[-1].graph.nodes if n.op == "placeholder"] == ["l_x"]
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert dict(compile_stats.symbolic_declines) == {}


def test_slice_builtin_with_a_size_bound_stays_symbolic(cpu_backend):
    # slice(None, s // 2) as x[: s // 2] builds it: no guard on the bound's value
    def fn(x):
        return x[:, slice(None, x.size(1) // 2)] * 2

    compile_stats.reset()
    compiled = ember.compile(fn, dynamic=True)
    for n in (6, 9, 4):
        x = torch.randn(n, n + 3)
        torch.testing.assert_close(compiled(x), fn(x))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
