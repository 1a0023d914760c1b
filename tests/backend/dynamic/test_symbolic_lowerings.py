"""Ops whose lowerings take symbolic sizes (issue 31): pooling, roll, slice assignments
and slices from a symbolic start compile into the
symbolic program's kernels, not ATen calls, equal to eager at several sizes with one
symbolic compile, behind both frontends and on both CPU targets."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_stats

pytestmark = pytest.mark.usefixtures("fresh_no_grad", "cpu_backend")

def _assign_half(x):
    y = x * 2
    y[:, : x.size(1) // 2] = 0.0
    return y


def _assign_tail(x):
    y = x * 2
    y[1:, 2:] = 7.0
    return y


def _assign_from_half(x):
    y = x * 2
    y[x.size(0) // 2:] = 3.0
    return y


def _assign_strided(x):
    y = x * 2
    y[:, 1::2] = -1.0
    return y


# name -> (program, inputs at size n); the sizes are odd and even, so windows past the edge
# (ceil_mode, padding) are met and missed
PROGRAMS = {
    "max_pool": (lambda x: F.max_pool2d(x, 2), lambda n: [torch.randn(2, 3, n, n + 1)]),
    "max_pool_padded": (lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
                        lambda n: [torch.randn(1, 2, n, 5)]),
    "max_pool_indices": (lambda x: F.max_pool2d(x, 2, return_indices=True)[1],
                         lambda n: [torch.randn(1, 2, n, 4)]),
    "avg_pool": (lambda x: F.avg_pool2d(x, 2), lambda n: [torch.randn(1, 3, n, n)]),
    "avg_pool_padded": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                        lambda n: [torch.randn(1, 2, 5, n)]),
    "avg_pool_ceil": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
                      lambda n: [torch.randn(1, 2, n, 4)]),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3), lambda n: [torch.randn(2, 3, n)]),
    "roll": (lambda x: x.roll(1, 0) * 2, lambda n: [torch.randn(n, 3)]),
    # slice assignments into a computed value: as_strided_scatter of a box
    "assign_half": (_assign_half, lambda n: [torch.randn(n, n + 3)]),
    # (a symbolic dim of 2 makes the box [1:, 2:] empty: its start is the dim's end)
    "assign_tail": (_assign_tail, lambda n: [torch.randn(n, n)]),
    "assign_strided": (_assign_strided, lambda n: [torch.randn(3, n)]),
    "assign_from_half": (_assign_from_half, lambda n: [torch.randn(n, 3)]),
    # a slice from a symbolic start
    "slice_from_half": (lambda x: (x * 2)[x.size(0) // 2:] + 1, lambda n: [torch.randn(n, 3)]),
    "slice_last_three": (lambda x: (x * 2)[-3:] + 1, lambda n: [torch.randn(n, 3)]),
    "diagonal": (lambda x: (x * 2).diagonal(1) + 1, lambda n: [torch.randn(n, n + 2)]),
    "roll_dims": (lambda x: x.roll((5, -1), (0, 1)), lambda n: [torch.randn(n, n + 1)]),
}
SIZES = (6, 9, 4)


# behind torch's frontend too: a few (its graphs reach the same lowerings)
BOTH_FRONTENDS = ("max_pool", "avg_pool", "roll", "assign_half")


@pytest.mark.parametrize("name, frontend", [
    *((n, "ember") for n in PROGRAMS), *((n, "torch") for n in BOTH_FRONTENDS)])
def test_lowered_with_symbolic_sizes(name, frontend, cpu_backend):
    fn, make = PROGRAMS[name]
    torch._dynamo.reset()
    compile_stats.reset()
    if frontend == "ember":
        compiled = ember.compile(fn, dynamic=True)
    else:
        compiled = torch.compile(fn, backend="ember", dynamic=True)
    for n in SIZES:
        args = make(n)
        torch.testing.assert_close(compiled(*args), fn(*args))
    torch._dynamo.reset()
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert dict(compile_stats.fallback_ops) == {}


@pytest.mark.parametrize("frontend", ["ember", "torch"])
def test_adaptive_pool_with_a_dynamic_batch(frontend, cpu_backend):
    # (windows over a symbolic plane depend on its size: ATen's kernel there)
    def fn(x):
        return F.adaptive_avg_pool2d(x, (2, 3))
    torch._dynamo.reset()
    if frontend == "ember":
        compiled, mark = ember.compile(fn, dynamic=False), ember.mark_dynamic
    else:
        compiled, mark = torch.compile(fn, backend="ember"), torch._dynamo.mark_dynamic
    for n in SIZES:
        x = torch.randn(n, 2, 5, 7)
        mark(x, 0)
        torch.testing.assert_close(compiled(x), fn(x))
    torch._dynamo.reset()
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert dict(compile_stats.fallback_ops) == {}


def test_max_pool_backward_with_symbolic_sizes(cpu_backend):
    def step(x):
        x = x.detach().requires_grad_()
        F.max_pool2d(x, 2, 1).sum().backward()
        return x.grad

    with torch.enable_grad():
        compiled = ember.compile(lambda x: F.max_pool2d(x, 2, 1), dynamic=True)
        for n in SIZES:
            x = torch.randn(1, 2, n, 5)
            got = x.detach().requires_grad_()
            compiled(got).sum().backward()
            torch.testing.assert_close(got.grad, step(x))
    # (one compile: the forward and backward halves of one training graph; the C++ target
    # runs the backward as ATen's scatter, ``Target.generates_max_pool_backward``)
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert set(compile_stats.fallback_ops) == (
        {"aten.max_pool2d_with_indices_backward.default"} if cpu_backend == "cpp" else set())


def test_slice_from_the_end_of_a_shorter_dim(cpu_backend):
    # x[-3:] of 2 rows starts at 0
    def fn(x):
        return (x * 2)[-3:] + 1
    compiled = ember.compile(fn, dynamic=True)
    for n in (5, 2, 7):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), fn(x))
    assert compile_stats.size_specializations == 0


def _heads(x, w, b):
    # a linear's [N*6, 16] product viewed [N, 6, 2, 8]: the bias add fuses into the reader
    return F.linear(x, w, b).view(x.shape[0], 6, 2, 8).transpose(1, 2).contiguous()


def _kernel_launches() -> int:
    from ember.backend import pipeline
    wrapper = next(s for s in reversed(pipeline.generated_sources) if "def call(" in s)
    return len(re.findall(r"^\s*ember_\w+\(", wrapper, re.M))


def test_views_splitting_a_symbolic_dim_keep_the_body(cpu_backend):
    w, b = torch.randn(16, 16), torch.randn(16)
    ember.compile(_heads, dynamic=False)(torch.randn(5, 6, 16), w, b)
    static = _kernel_launches()
    ember.reset()
    compile_stats.reset()
    compiled = ember.compile(_heads, dynamic=False)
    for n in SIZES:
        x = torch.randn(n, 6, 16)
        ember.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x, w, b), _heads(x, w, b))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert _kernel_launches() == static
