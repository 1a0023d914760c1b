"""Pooling lowerings (max_pool2d_with_indices and its backward, avg_pool2d,
_adaptive_avg_pool2d) become generated kernels that match eager: values within float
tolerance (NaN where eager has NaN), max-pool indices exactly (first maximum in scan order,
the last NaN, ties, padding).

Each test compiles one function that pools with several configurations, so the C++ compiler
runs a few times for the whole file; several inputs of one shape reuse the compiled code.
Every test runs on both CPU targets (the ``cpu_backend`` fixture, ``conftest.py``): C++
kernels, and Triton kernels under Triton's interpreter."""
import copy
import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember import config
from ember.aot import training
from ember.backend import compile_stats
from ember.testing import run_and_get_code

NAN, INF = float("nan"), float("inf")


pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


def _inputs(shape, dtype=torch.float32):
    """Random values; NaNs (two in one window, a whole row) and infinities; all-equal (every
    window a tie); all -inf (the index is the window's first in-bounds position); small
    integers (many ties)."""
    g = torch.Generator().manual_seed(0)
    rand = torch.randn(shape, generator=g, dtype=dtype)
    special = rand.clone()
    special[..., 1, 1] = NAN
    special[..., 1, 2] = NAN
    special[..., 3, :] = NAN
    special[..., 0, 0] = -INF
    special[..., -1, -1] = INF
    ties = torch.full(shape, 2.0, dtype=dtype)
    low = torch.full(shape, -INF, dtype=dtype)
    ints = torch.randint(-2, 3, shape, generator=g).to(dtype)
    return [rand, special, ties, low, ints]


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


def check(fn, inputs, *, fallbacks_allowed=()):
    """Compile once, compare with eager on every input, and require no ATen fallback other
    than ``fallbacks_allowed``."""
    compiled = ember.compile(fn, backend="ember")
    for x in inputs:
        expected, actual = _flat(fn(x)), _flat(compiled(x))
        assert len(expected) == len(actual)
        for e, a in zip(expected, actual):
            assert e.dtype == a.dtype and e.shape == a.shape
            if e.is_floating_point():
                torch.testing.assert_close(a, e, equal_nan=True)
            else:
                assert torch.equal(a, e), (e, a)
    fallbacks = dict(compile_stats.fallback_ops)
    assert set(fallbacks) <= set(fallbacks_allowed), fallbacks
    assert fallbacks_allowed or compile_stats.generated_kernel_count >= 1


@pytest.mark.parametrize("kernel,stride", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_max_pool2d_values_and_indices(kernel, stride):
    configs = list(itertools.product([0, 1], [1, 2], [False, True]))   # padding, dilation, ceil

    def fn(x):
        return [F.max_pool2d(x, kernel, stride, p, d, ceil_mode=c, return_indices=True)
                for p, d, c in configs]
    check(fn, _inputs((2, 3, 9, 7)))


@pytest.mark.parametrize("shape", [(1, 2, 8, 11), (3, 7, 6)], ids=["batch1", "unbatched"])
def test_max_pool2d_other_shapes(shape):
    def fn(x):
        return [F.max_pool2d(x, 3, 2, 1, return_indices=True),
                F.max_pool2d(x, (2, 3), (1, 2), (1, 0), (2, 1), ceil_mode=True,
                             return_indices=True),
                F.max_pool2d(x, 2)]
    check(fn, _inputs(shape))


def test_max_pool2d_float64_and_channels_last():
    def fn(x):
        return F.max_pool2d(x, 3, 2, 1, return_indices=True)
    check(fn, _inputs((2, 3, 7, 7), torch.float64))
    ember.reset()
    check(fn, [x.to(memory_format=torch.channels_last) for x in _inputs((2, 4, 7, 7))])


def test_resnet_stem_max_pool_is_a_generated_kernel(cpu_backend):
    stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)).eval()
    x = torch.randn(2, 3, 30, 30)
    out, sources = run_and_get_code(stem, x)
    torch.testing.assert_close(out, stem(x))
    wrapper = sources[0]
    assert "aten.max_pool2d" not in wrapper, wrapper     # (kernel names say max_pool2d)
    assert not compile_stats.fallback_ops
    # only the values are used: no kernel computes (or stores) the int64 indices
    text = "\n".join(sources)
    if cpu_backend == "cpp":
        assert "int64_t*" not in text
    else:
        assert not [line for line in text.splitlines() if "tl.store" in line and "int64" in line]


@pytest.mark.parametrize("pool,body,kernels", [
    ((3, 1, 1), "affine", 2),     # overlapping windows of a costly body: computed once first
    ((2, 2, 0), "affine", 1),     # each element read once: the body stays inline
    ((2, 2, 0), "cat", 1),        # a concatenation's masked loads: each read once, inline
    ((3, 1, 1), "relu", 1)])      # a load and an op: recomputed per tap
def test_pool_input_is_computed_once_when_recomputing_it_costs(pool, body, kernels,
                                                              cpu_backend):
    """A pooling window that would recompute its input's body for every tap reads a
    realized buffer instead; results match eager's either way. A concatenation's masked
    regions stay inline: the C++ loops split at its parts' boundaries (googlenet's 2x2 pool
    of a concatenation took as long realized as inline)."""
    def fn(x, y, w, b):
        if body == "affine":
            v = x * w + b
        elif body == "cat":
            v = torch.cat([torch.relu(x * w + b), torch.relu(y)], 1)
        else:
            v = torch.relu(x)
        return F.max_pool2d(v, *pool)
    x, y = torch.randn(2, 4, 8, 8), torch.randn(2, 3, 8, 8)
    w, b = torch.randn(4, 1, 1), torch.randn(4, 1, 1)
    compile_stats.reset()
    out, _ = run_and_get_code(fn, x, y, w, b)
    torch.testing.assert_close(out, fn(x, y, w, b))
    assert not compile_stats.fallback_ops
    assert compile_stats.generated_kernel_count == kernels


def test_max_pool2d_output_read_twice_and_indices_used():
    def fn(x):
        y, i = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        return y.relu() + y.sigmoid() * y, i + 1, i * 2
    check(fn, _inputs((2, 3, 9, 9)))


def test_max_pool2d_unsupported_cases_fall_back():
    check(lambda x: F.max_pool2d(x, 2, return_indices=True),
          [torch.randint(-5, 5, (1, 2, 6, 6))], fallbacks_allowed={
              "aten.max_pool2d_with_indices.default"})
    ember.reset()
    check(lambda x: F.max_pool2d(x, 9, 1, return_indices=True), [torch.randn(1, 2, 11, 10)],
          fallbacks_allowed={"aten.max_pool2d_with_indices.default"})


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_avg_pool2d(ceil_mode):
    configs = list(itertools.product([2, 3], [2], [0, 1], [True, False]))   # k, s, p, cip
    configs += [(2, 1, 0, True), (2, 1, 1, False), (3, 1, 1, True), (3, 1, 1, False)]

    def fn(x):
        out = [F.avg_pool2d(x, k, s, p, ceil_mode, count_include_pad=cip)
               for k, s, p, cip in configs]
        out.append(F.avg_pool2d(x, 3, 2, 1, ceil_mode, divisor_override=5))
        return out
    check(fn, _inputs((2, 3, 9, 8)))


def test_avg_pool2d_unbatched_and_large_window():
    def fn(x):
        return [F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, (2, 3), ceil_mode=True),
                # 9x9 windows: a sum reduction instead of an unrolled body
                F.avg_pool2d(x, 9, 2, 4, ceil_mode=True, count_include_pad=False)]
    check(fn, _inputs((3, 13, 12)))


def test_adaptive_avg_pool2d():
    keep_height = nn.AdaptiveAvgPool2d((None, 3))

    def fn(x):
        return [F.adaptive_avg_pool2d(x, (2, 2)), F.adaptive_avg_pool2d(x, (3, 7)),
                F.adaptive_avg_pool2d(x, (4, 5)), keep_height(x)]
    check(fn, _inputs((2, 3, 6, 14)))
    ember.reset()
    # large windows (a reduction), divisible and not; unbatched
    check(lambda x: F.adaptive_avg_pool2d(x, (2, 3)), _inputs((3, 18, 19)))


def _pool_backward(x, k, s, p, ceil, dilation=1):
    y, i = F.max_pool2d(x, k, s, p, dilation, ceil_mode=ceil, return_indices=True)
    grad = torch.cos(y * 3)         # a different gradient per output (NaN where y is)
    return torch.ops.aten.max_pool2d_with_indices_backward(
        grad, x, [k, k], [s, s], [p, p], [dilation, dilation], ceil, i)


def test_max_pool2d_backward(cpu_backend):
    """Each input's gradient sums the outputs that chose it: overlapping windows (stride 1),
    padding, ceil_mode, ties, NaNs (the ``_inputs`` cases), channels-last; a dilated pool
    runs ATen's kernel, as every pool does on the C++ target
    (``Target.generates_max_pool_backward``: ATen's scatter is faster there)."""
    configs = [(3, 1, 1, False), (3, 2, 0, True), (3, 2, 1, False), (2, 2, 0, False)]
    aten_backward = {"aten.max_pool2d_with_indices_backward.default"} \
        if cpu_backend == "cpp" else set()

    def fn(x):
        return [_pool_backward(x, *config) for config in configs]
    rand, special, ties, low, ints = _inputs((2, 3, 9, 7))
    check(fn, [special, ints], fallbacks_allowed=aten_backward)
    ember.reset()
    check(lambda x: _pool_backward(x, 3, 2, 1, False),
          [_inputs((2, 4, 7, 8))[0].to(memory_format=torch.channels_last)],
          fallbacks_allowed=aten_backward)
    ember.reset()
    check(lambda x: _pool_backward(x, 3, 1, 1, False, dilation=2), _inputs((1, 2, 9, 9))[:1],
          fallbacks_allowed={"aten.max_pool2d_with_indices_backward.default"})


def test_resnet_stem_trains_with_generated_pooling_kernels(cpu_backend):
    """Training through conv, batch norm, relu and max pool: the pool's backward is a
    generated kernel (ATen's on the C++ target), and every gradient matches eager's."""
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    twin = copy.deepcopy(stem)
    x = torch.randn(2, 3, 30, 30)
    compiled_before = training.stats["compiled"]
    with torch.enable_grad():
        stem(x).square().sum().backward()
        ember.compile(twin, backend="ember")(x).square().sum().backward()
    for a, b in zip(stem.parameters(), twin.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-4)
    assert training.stats["compiled"] == compiled_before + 1     # forward and backward
    assert ("aten.max_pool2d_with_indices_backward.default" in compile_stats.fallback_ops) \
        == (cpu_backend == "cpp")
