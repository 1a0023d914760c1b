"""Half-precision matmuls on a CPU without half GEMMs (lowering/matmul.py): where oneDNN has
no bfloat16/float16 kernels for the CPU (AVX2), ATen's half ``mm``, ``addmm`` and ``bmm``
are a scalar loop 60x slower than float32's, so Ember multiplies float32 copies of the
operands and rounds the product once in the kernel that reads it, as eager's kernel rounds
its float32 sum. The policy (``CpuPolicy.upcasts_half_matmuls``) is set here either way, so
the test runs on any CPU; C++ target only (Triton's interpreter leaves half-precision graphs
to ATen)."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config, logs
from ember.backend import compile_stats
from ember.backend.targets import CpuPolicy

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="f16")]


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


def _cases(a, w, b, x, y):
    return (F.linear(a, w, b).relu(),            # addmm, its product read by a ReLU
            a @ w.t(),                           # mm, a graph output
            torch.bmm(x, y) * 2,                 # bmm
            F.linear(a, w))                      # mm of a transposed weight


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype) for s in
            ((24, 40), (56, 40), (56,), (3, 24, 40), (3, 40, 16))]


@pytest.mark.parametrize("upcast", [True, False], ids=["no-half-gemm", "half-gemm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_products_in_float32_round_once_like_eagers(dtype, upcast, monkeypatch, ember_log):
    """Upcast, each product is eager's float32 sum of the same values rounded once (within
    one rounding step); on a CPU with half GEMMs the library's half kernels run."""
    monkeypatch.setattr(CpuPolicy, "upcasts_half_matmuls", lambda self, dt: upcast)
    logs.set_logs("perf_hints")
    args = _inputs(dtype)
    got = ember.compile(_cases, backend="ember")(*args)
    for g, e in zip(got, _cases(*args)):
        assert g.dtype == dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)
    upcasts = {r.getMessage().split(" in float32")[0] for r in ember_log.records
               if "in float32 (this CPU has no" in r.getMessage()}
    if not upcast:
        assert not upcasts, ember_log.text
        return
    for g, e in zip(got, _cases(*[t.float() for t in args])):
        step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
        torch.testing.assert_close(g.float(), e.to(dtype).float(), rtol=step, atol=step)
    assert upcasts == {"aten.addmm.default [24, 56]", "aten.mm.default [24, 56]",
                       "aten.bmm.default [3, 24, 16]"}, ember_log.text
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)


def test_the_policy_follows_onednns_half_support():
    from ember.backend.targets import half_gemm_is_slow, target_for
    cpu = target_for(torch.device("cpu"))
    assert cpu.upcasts_half_matmuls(torch.bfloat16) == \
        (not torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert cpu.upcasts_half_matmuls(torch.float16) == \
        (not torch.ops.mkldnn._is_mkldnn_fp16_supported())
    assert not half_gemm_is_slow(torch.float32)


@pytest.mark.parametrize("upcast", [True, False], ids=["no-half-gemm", "half-gemm"])
def test_convolutions_follow_the_matmuls(upcast, monkeypatch, ember_log):
    """A bf16 convolution (with and without bias, channels-last input too) is computed in
    float32 where the half matmuls are (oneDNN has no half kernels for either there)."""
    monkeypatch.setattr(CpuPolicy, "upcasts_half_matmuls", lambda self, dt: upcast)
    logs.set_logs("perf_hints")
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g).bfloat16() / 3 for s in
               ((2, 6, 9, 9), (8, 6, 3, 3), (8,)))

    def fn(x, w, b):
        return (F.conv2d(x, w, b, padding=1).relu(),
                F.conv2d(x.contiguous(memory_format=torch.channels_last), w, stride=2))
    got = ember.compile(fn, backend="ember")(x, w, b)
    for a, e in zip(got, fn(x, w, b)):
        assert a.dtype == e.dtype and a.stride() == e.stride()
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)
    upcasts = [line for line in ember_log.text.splitlines()
               if "aten.convolution.default" in line and "in float32" in line]
    assert bool(upcasts) == upcast, ember_log.text


@pytest.mark.parametrize("upcast", [True, False], ids=["no-half-gemm", "half-gemm"])
def test_convolution_backward_follows_the_matmuls(upcast, monkeypatch, ember_log):
    """A bf16 training step's ``convolution_backward`` (input, weight and bias gradients, or
    only some of them; strided and grouped) is computed in float32 where the half matmuls are, each gradient
    the float32 one rounded once; elsewhere ATen's half kernel runs."""
    monkeypatch.setattr(CpuPolicy, "upcasts_half_matmuls", lambda self, dt: upcast)
    logs.set_logs("perf_hints")
    g = torch.Generator().manual_seed(0)
    x, w1, b1, w2 = (torch.randn(s, generator=g).bfloat16() / 3 for s in
                     ((2, 4, 9, 9), (6, 4, 3, 3), (6,), (8, 3, 3, 3)))

    def step(fn, x, w1, b1, w2):       # (x needs no gradient: the first one asks for two)
        w1, b1, w2 = (t.detach().requires_grad_() for t in (w1, b1, w2))
        fn(x, w1, b1, w2).sum().backward()
        return w1.grad, b1.grad, w2.grad

    def net(x, w1, b1, w2):
        y = F.conv2d(x, w1, b1, stride=2, padding=1).relu()
        return F.conv2d(y, w2, groups=2, padding=1)
    with torch.enable_grad():
        got = step(ember.compile(net, backend="ember"), x, w1, b1, w2)
        want = step(net, x, w1, b1, w2)
        in_f32 = step(net, *(t.float() for t in (x, w1, b1, w2)))
    for a, e, f in zip(got, want, in_f32):
        assert a.dtype == torch.bfloat16 and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=3e-2, atol=3e-2)
        if upcast:      # the forward's rounding is eager's too: gradients near float32's
            torch.testing.assert_close(a.float(), f, rtol=3e-2, atol=3e-2)
    upcasts = {r.getMessage() for r in ember_log.records
               if "convolution_backward" in r.getMessage() and "in float32" in r.getMessage()}
    assert len(upcasts) == (2 if upcast else 0), ember_log.text
