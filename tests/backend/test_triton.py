"""The Triton target: generated kernels match eager and fuse as on the C++ target.

Each case runs twice: on CPU tensors through Triton's interpreter (``cpu_backend="triton"``,
CI; ``TRITON_INTERPRET=1`` is set by tests/conftest.py when there is no GPU), and on CUDA
tensors in float32, float16 and bfloat16 (``gpu`` marker, the H200).
"""
import os

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config, logs
from ember.backend import metrics
from ember.backend.codegen import triton as triton_codegen
from ember.testing import same

pytest.importorskip("triton")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TARGETS = [
    pytest.param(("cpu", torch.float32), id="interp-f32", marks=pytest.mark.skipif(
        not INTERPRETED, reason="Triton's interpreter is enabled only in processes started "
                                "with TRITON_INTERPRET=1 (tests/conftest.py does it without "
                                "a GPU)")),
    *[pytest.param(("cuda", dt), id=f"cuda-{name}", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")])
      for dt, name in ((torch.float32, "f32"), (torch.float16, "f16"),
                       (torch.bfloat16, "bf16"))],
]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}


@pytest.fixture(autouse=True)
def _strict():
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


def compile_for(fn, device):
    options = {"cpu_backend": "triton"} if device == "cpu" else {}
    return ember.compile(fn, backend="ember", options=options)


def run(target, fn, *inputs, tol=None):
    """Compile for the target, compare with eager (float inputs cast to the target dtype),
    return the number of kernels generated."""
    device, dtype = target
    inputs = [t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
              for t in inputs]
    ember.reset()
    compiled = compile_for(fn, device)
    expected = fn(*[t.clone() for t in inputs])
    actual = compiled(*[t.clone() for t in inputs])
    tol = tol or TOLERANCE[dtype]
    assert same(expected, actual, rtol=tol, atol=tol), (expected, actual)
    # later calls launch compiled kernels directly (launch.TritonLauncher's fast path)
    for _ in range(2):
        assert same(expected, compiled(*[t.clone() for t in inputs]), rtol=tol, atol=tol)
    assert not metrics.fallback_ops, dict(metrics.fallback_ops)
    return metrics.generated_kernel_count


@pytest.mark.parametrize("target", TARGETS)
def test_pointwise_chain_is_one_kernel(target):
    def chain(x, y, z):
        return ((((x * 2 + 1).sin() * y).relu() / (1 + z.exp())).tanh() - 0.5).abs()
    assert run(target, chain, *[torch.randn(64, 33) for _ in range(3)]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype,fast", [(torch.bfloat16, True), (torch.float16, True),
                                        (torch.float32, False)])
@pytest.mark.parametrize("enabled", [True, False])
def test_half_values_use_approximate_sin_and_division(dtype, fast, enabled):
    from ember.backend import compile as backend_compile

    def fn(x, y):
        return (x * 3).sin() / (y.abs() + 1) + x.cos()
    x, y = [torch.randn(1000, 257, device="cuda", dtype=dtype) * 20 for _ in range(2)]
    with config.patch(half_fast_math=enabled):
        out = compile_for(fn, "cuda")(x, y)
    kernel = backend_compile.generated_sources[-1]
    approximate = ("fast_sinf" in kernel, "fast_cosf" in kernel, "fast_dividef" in kernel)
    assert approximate == (fast and enabled,) * 3, kernel
    expected = fn(x.double(), y.double())
    # within half precision's own rounding of eager's result
    assert same(expected.to(dtype), out, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("target", TARGETS)
def test_softmax_layer_norm_one_kernel_each(target):
    x = torch.randn(16, 100)
    assert run(target, lambda t: torch.softmax(t, -1), x) == 1
    assert run(target, lambda t: torch.log_softmax(t, 1), x) == 1
    assert run(target, lambda t: torch.softmax(t, 0), x) == 1
    assert run(target, lambda t, r, w, b: F.gelu(F.layer_norm(t + r, (100,), w, b)),
               x, torch.randn(16, 100), torch.randn(100), torch.randn(100)) == 1


REDUCTIONS = [
    lambda x: x.sum(), lambda x: x.sum(0), lambda x: x.mean(-1, keepdim=True),
    lambda x: x.amax(1), lambda x: x.amin(0), lambda x: x.var(1), lambda x: x.std(0),
    lambda x: (x > 0).any(1), lambda x: (x > -3).all(), lambda x: (x / 2).exp().prod(1),
    lambda x: x.argmax(1), lambda x: x.argmin(0), lambda x: torch.var_mean(x, 1),
    lambda x: x.sum((0, 2)), lambda x: x.logsumexp(-1),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_reductions(target, looped, monkeypatch):
    if looped:   # rows longer than a block: the looped kernels with lane accumulators
        monkeypatch.setattr(triton_codegen, "PERSISTENT_MAX", 8)
        monkeypatch.setattr(triton_codegen, "INTERPRETER_TILE", 16)
        monkeypatch.setattr(triton_codegen, "LOOP_RBLOCK", 16)
    x = torch.randn(6, 37, 5)
    x[1, 3, 2] = float("nan")
    for reduce in REDUCTIONS:
        run(target, reduce, x if "argm" not in reduce.__code__.co_names else x.nan_to_num())
    ties = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0]])
    run(target, lambda t: t.argmax(1), ties)
    run(target, lambda t: t.amax(1), ties)


@pytest.mark.parametrize("target", TARGETS)
def test_indexing_and_scatter(target):
    emb = torch.randn(10, 8)
    idx = torch.randint(0, 10, (5, 3))
    run(target, lambda e, i: F.embedding(i, e) * 2, emb, idx)
    run(target, lambda e, i: e[i[:, 0] - 10] + 1, emb, idx)   # negative indices wrap
    run(target, lambda e, i: torch.gather(e, 1, i % 8), emb, idx)
    run(target, lambda e, i: e.index_put((i[:, 0],), torch.ones_like(e[:5]),
                                         accumulate=True), emb, idx)


@pytest.mark.parametrize("target", TARGETS)
def test_views_cat_pad_pool(target):
    x = torch.randn(2, 3, 8, 8)
    run(target, lambda t: t.transpose(2, 3).contiguous() * 2, x)
    # NCHW -> NHWC with 3 channels: a 2-D grid of tiles (few rows must not mean few programs)
    run(target, lambda t: t.contiguous(memory_format=torch.channels_last) + 1,
        torch.randn(2, 3, 40, 40))
    run(target, lambda t: torch.cat([t, t * 2], 1).relu(), x)
    run(target, lambda t: F.pad(t, (1, 2, 0, 1)) + 1, x)
    run(target, lambda t: F.max_pool2d(t, 3, 2, 1), x)
    run(target, lambda t: F.avg_pool2d(t, 2), x)
    run(target, lambda t: F.adaptive_avg_pool2d(t, 1).flatten(1), x)


@pytest.mark.parametrize("target", TARGETS)
def test_integer_and_math_ops(target):
    a = torch.randint(-20, 20, (40,))
    b = torch.randint(1, 7, (40,)) * torch.where(torch.rand(40) > 0.5, 1, -1)
    run(target, lambda p, q: (torch.div(p, q, rounding_mode="trunc"), p % q, torch.fmod(p, q),
                              p & q, p * 3 - q), a, b)
    x = torch.rand(40) * 1.8 - 0.9
    math = (torch.tanh, torch.expm1, torch.log1p, torch.asin, torch.acos, torch.atan,
            torch.sinh, torch.cosh, torch.asinh, torch.atanh, torch.erfc, torch.round,
            torch.sign, torch.trunc, torch.frac, torch.sigmoid, torch.rsqrt)
    for fn in math:
        run(target, lambda t, fn=fn: fn(t) * 1.5, x.abs() if fn is torch.rsqrt else x)
    run(target, lambda t, u: (torch.pow(t.abs(), u), torch.copysign(t, u),
                              torch.remainder(t, u), torch.clamp(t, -0.5, 0.5)),
        x, torch.rand(40) + 0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
def test_reduce_overhead_replays_cuda_graphs():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64)).cuda().eval()
    compiled = ember.compile(model, mode="reduce-overhead")
    inputs = [torch.randn(8, 32, device="cuda") for _ in range(3)]
    outputs = [compiled(x) for x in inputs]       # capture, then replays
    for x, out in zip(inputs, outputs):           # earlier results are not overwritten
        assert same(model(x), out, rtol=1e-4, atol=1e-4)
    with torch.no_grad():                         # a changed weight is seen (same address)
        model[0].weight.mul_(2)
    assert same(model(inputs[0]), compiled(inputs[0]), rtol=1e-4, atol=1e-4)
    model[0].weight = torch.nn.Parameter(model[0].weight * 0.5)   # a new address
    assert same(model(inputs[1]), compiled(inputs[1]), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")
def test_reduce_overhead_reads_module_buffers_by_address(ember_log):
    """Batch-norm statistics are not copied per replay; changing them in place is seen, and
    a replaced buffer captures again."""
    logs.set_logs("perf_hints")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU()).cuda().eval()
    compiled = ember.compile(model, mode="reduce-overhead")
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.no_grad():
        for _ in range(2):
            assert same(model(x), compiled(x), rtol=1e-4, atol=1e-4)
        assert "6 parameters and buffers by address" in ember_log.text   # w, b, γ, β, μ, σ²
        model[1].running_mean.add_(0.5)
        assert same(model(x), compiled(x), rtol=1e-4, atol=1e-4)
        model[1].running_var = model[1].running_var * 2
        assert same(model(x), compiled(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS[:2])
def test_max_autotune_times_configs_and_caches_the_choice(target, tmp_path, monkeypatch):
    """Candidates are timed on the real buffers: a softmax whose output overwrites its
    exponentials in place, and an accumulating scatter, still give eager's values."""
    device, dtype = target
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(triton_codegen, "PERSISTENT_MAX", 8)   # looped: several RBLOCKs
    monkeypatch.setattr(triton_codegen, "INTERPRETER_TILE", 16)
    x = torch.randn(8, 600, device=device, dtype=dtype)
    idx = torch.randint(0, 8, (20,), device=device)
    fns = [lambda t: torch.softmax(t, -1),
           lambda t, i: t.index_put((i,), t.new_ones(20, 600), accumulate=True)]
    for fn, args in zip(fns, [(x,), (x, idx)]):
        ember.reset()
        options = {"max_autotune": True, **({"cpu_backend": "triton"} if device == "cpu"
                                            else {})}
        compiled = ember.compile(fn, options=options)
        for _ in range(2):
            assert same(fn(*args), compiled(*args), rtol=1e-4, atol=1e-4)
    assert list((tmp_path / "autotune").glob("*.json"))     # the choices, on disk


def test_compile_workers_report_what_they_could_not_compile(tmp_path):
    """The worker protocol: each task answers None or an error naming the kernel; the
    process that asked then compiles those itself (here nothing compiles: no such file)."""
    from ember.backend.compile_workers import CompileWorkers
    workers = CompileWorkers(1)
    try:
        missing = str(tmp_path / "missing.py")
        errors = workers.run([(missing, "kernel0", [torch.float32], (1,), {"XBLOCK": 8}, 0),
                              (missing, "kernel1", [torch.float32], (1,), {"XBLOCK": 8}, 0)])
        assert len(errors) == 2 and errors[0].startswith("kernel0: FileNotFoundError")
    finally:
        workers.close()
    assert all(p.poll() is not None for p in workers.procs)


def test_compile_worker_count_is_checked(monkeypatch):
    from ember.backend import launch
    monkeypatch.setenv("EMBER_COMPILE_WORKERS", "many")
    with pytest.raises(ValueError, match="EMBER_COMPILE_WORKERS='many'"):
        launch._worker_count()


def test_triton_cache_key_is_computed_once_across_threads(monkeypatch):
    """Threads loading kernels at once wait for one computation of Triton's cache key
    (about a second each; ``lru_cache`` alone lets every thread compute it)."""
    import functools
    import threading
    import time

    import triton.runtime.cache

    from ember.backend.compile_workers import warm_up_triton
    calls = []

    @functools.lru_cache()
    def slow_key():
        calls.append(1)
        time.sleep(0.2)
        return "key"
    monkeypatch.setattr(triton.runtime.cache, "triton_key", slow_key)
    threads = [threading.Thread(target=warm_up_triton) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
