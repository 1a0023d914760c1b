"""Depthwise convolutions generated as stencils (lowering/convolution.py): one Pointwise body
per output that sums ``weight * input`` over the filter's taps after the bias, in float32,
fused with what reads it. CUDA generates them (``max_generated_depthwise_taps`` 25); the CPU
targets leave them to oneDNN, so here their policy is made to generate them, and the stencil
runs under both CPU code generators (``cpu_backend``: C++, and Triton's interpreter) against
eager's convolution.

One compiled function covers several filter sizes, strides, paddings and dilations, so each
code generator compiles a few times for the whole file."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend import compile_stats
from ember.backend.targets import CpuPolicy

pytestmark = pytest.mark.usefixtures("cpu_backend")
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _generated(monkeypatch):
    monkeypatch.setattr(CpuPolicy, "max_generated_depthwise_taps", 25)
    ember.reset()
    with config.patch(suppress_errors=False, layout_optimization="off"), torch.no_grad():
        yield


# (filter size, stride, padding, dilation): 3x3 and 5x5 as MobileNet and EfficientNet run
# them, strided, unpadded, dilated, a 3x5 filter with its own padding per dim
CASES = [((3, 3), 1, 1, 1), ((3, 3), 2, 1, 1), ((5, 5), 1, 2, 1), ((5, 5), 2, 2, 1),
         ((3, 3), 1, 0, 1), ((3, 3), 1, 2, 2), ((3, 5), (2, 1), (1, 2), 1)]


def _weights(channels, cases, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return [torch.randn((channels, 1) + k, generator=g).to(dtype) / 3 for k, *_ in cases]


def _all_cases(x, bias, *weights):
    return [F.conv2d(x, w, bias if i % 2 else None, stride=s, padding=p, dilation=d,
                     groups=x.shape[1])
            for i, (w, (_, s, p, d)) in enumerate(zip(weights, CASES))]


def _check(fn, *args, rtol=1e-5, atol=1e-5):
    compiled = ember.compile(fn, backend="ember")
    expected, actual = fn(*args), compiled(*args)
    for e, a in zip(expected, actual):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride()
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
    # every convolution generated: no library call runs one
    assert not compile_stats.extern_calls, dict(compile_stats.extern_calls)
    return compiled


def test_filter_sizes_strides_paddings_and_dilations_match_eager():
    x = torch.randn(2, 6, 11, 10)
    _check(_all_cases, x, torch.randn(6), *_weights(6, CASES))


def test_channels_last_input_keeps_eager_strides():
    x = torch.randn(2, 6, 11, 10).contiguous(memory_format=torch.channels_last)
    _check(_all_cases, x, torch.randn(6), *_weights(6, CASES))


def test_padding_taps_are_skipped_as_eager_skips_them():
    """An infinite weight whose tap reads only padding at the border adds nothing there
    (a product with the padding would be NaN); NaN and inf inputs spread as in eager."""
    x = torch.randn(1, 4, 7, 7)
    x[0, 1, 3, 3] = NAN
    x[0, 2, 0, 0] = INF
    w = torch.randn(4, 1, 3, 3)
    w[0, 0, 0, 0] = INF
    w[3, 0, 2, 2] = -INF
    expected = F.conv2d(x, w, padding=1, groups=4)
    assert torch.isfinite(expected[0, 0, 0, :]).any()      # eager skips the padding taps
    _check(lambda x, w: [F.conv2d(x, w, padding=1, groups=4)], x, w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rounds_once_from_float(dtype, cpu_backend):
    """In half precision the taps are summed in float32 and rounded once: eager's float32
    result of the same (rounded) values, rounded to ``dtype``, within one rounding step."""
    if cpu_backend == "triton":
        pytest.skip("Triton's interpreter computes half precision wrongly, so its target "
                    "leaves half-precision graphs to ATen; test_triton.py's depthwise test "
                    "runs the stencil in float16 and bfloat16 on the GPU")
    x = torch.randn(2, 6, 11, 10).to(dtype)
    bias, weights = torch.randn(6).to(dtype), _weights(6, CASES, dtype)
    compiled = ember.compile(_all_cases, backend="ember")
    actual = compiled(x, bias, *weights)
    expected = _all_cases(x.float(), bias.float(), *[w.float() for w in weights])
    for e, a in zip(expected, actual):
        assert a.dtype == dtype
        step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
        torch.testing.assert_close(a.float(), e, rtol=step, atol=1e-3)
        # most elements are exactly eager's float32 result rounded
        assert (a == e.to(dtype)).float().mean() > 0.9
    assert not compile_stats.extern_calls, dict(compile_stats.extern_calls)


def test_batch_norm_and_activation_fuse_into_the_stencil():
    def block(x, w, mean, var):
        return F.hardswish(F.batch_norm(F.conv2d(x, w, padding=2, groups=8), mean, var,
                                        training=False))
    args = torch.randn(2, 8, 9, 9), torch.randn(8, 1, 5, 5), torch.randn(8), \
        torch.rand(8) + 0.5
    _check(lambda *a: [block(*a)], *args)
    assert compile_stats.generated_kernel_count == 1


def test_one_program_serves_every_batch_and_plane_size():
    fn = _check(_all_cases, torch.randn(2, 6, 11, 10), torch.randn(6), *_weights(6, CASES))
    for shape in ((3, 6, 13, 9), (1, 6, 8, 8)):
        x, bias = torch.randn(shape), torch.randn(6)
        weights = _weights(6, CASES)
        for e, a in zip(_all_cases(x, bias, *weights), fn(x, bias, *weights)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    assert compile_stats.size_specializations == 0


@pytest.mark.parametrize("case", ["7x7", "channel multiplier", "grouped", "cpu policy"])
def test_other_convolutions_run_the_library(monkeypatch, case):
    """More taps than the target generates, two filters per channel, groups of several
    channels, and the CPU's own policy: the library's convolution, results alike."""
    if case == "cpu policy":
        monkeypatch.setattr(CpuPolicy, "max_generated_depthwise_taps", 0)
    w, groups = {"7x7": (torch.randn(6, 1, 7, 7), 6),
                 "channel multiplier": (torch.randn(12, 1, 3, 3), 6),
                 "grouped": (torch.randn(6, 2, 3, 3), 3),
                 "cpu policy": (torch.randn(6, 1, 3, 3), 6)}[case]

    def fn(x, w):
        return F.conv2d(x, w, padding=1, groups=groups).relu()
    x = torch.randn(2, 6, 9, 9)
    torch.testing.assert_close(ember.compile(fn, backend="ember")(x, w), fn(x, w),
                               rtol=1e-4, atol=1e-4)
    assert sum(n for op, n in compile_stats.extern_calls.items() if "convolution" in op) == 1


def test_training_gradients_match_eager():
    """The forward's stencil; the backward is the library's convolution backward."""
    conv = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
    x = torch.randn(2, 8, 9, 9, requires_grad=True)
    with torch.enable_grad():
        compiled = ember.compile(lambda x: conv(x).tanh().sum(), backend="ember")
        compiled(x).backward()
        got = [x.grad.clone(), conv.weight.grad.clone(), conv.bias.grad.clone()]
        x.grad = conv.weight.grad = conv.bias.grad = None
        conv(x).tanh().sum().backward()
    for g, e in zip(got, [x.grad, conv.weight.grad, conv.bias.grad]):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    calls = dict(compile_stats.extern_calls)
    assert "aten.convolution.default" not in calls and \
        calls.get("aten.convolution_backward.default") == 1, calls
