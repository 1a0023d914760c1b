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
from ember.backend import compile_stats
from ember.backend.targets.triton import kernel as triton_codegen
from ember.testing import same

pytest.importorskip("triton")

from triton_targets import INTERPRETED, TARGETS, TOLERANCE  # noqa: E402


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
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)
    return compile_stats.generated_kernel_count


@pytest.mark.parametrize("target", TARGETS)
def test_pointwise_chain_is_one_kernel(target):
    def chain(x, y, z):
        return ((((x * 2 + 1).sin() * y).relu() / (1 + z.exp())).tanh() - 0.5).abs()
    assert run(target, chain, *[torch.randn(64, 33) for _ in range(3)]) == 1


@pytest.mark.parametrize("target", TARGETS)
def test_gelu_backward_regrouped_and_moved_is_one_kernel(target):
    """GPT-2's GELU in the backward: the recomputed output over the matmul's [B*T, H], the
    derivative over the view [B, T, H] after the other matmul; one kernel (the scheduler's
    Regroup and a kernel moved down past a matmul), on the GPU in every dtype."""
    def gelu_backward(h, dy, w):
        g = torch.tanh(h)
        dg = torch.mm(dy, w.t())
        dw = torch.mm(g.t(), dy)
        t = torch.tanh(h.view(4, 32, 48))
        return dw, dg.view(4, 32, 48) * (1 - t * t)
    args = torch.randn(128, 48), torch.randn(128, 16), torch.randn(48, 16)
    assert run(target, gelu_backward, *args, tol=5e-2) == 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stride,layout", [(1, torch.contiguous_format),
                                           (2, torch.channels_last)])
def test_depthwise_convolution_batch_norm_and_silu_are_one_kernel(target, stride, layout,
                                                                   monkeypatch):
    """A 3x3 depthwise convolution is a stencil fused with the batch norm and SiLU after it
    (lowering/convolution.py; the policies are made to generate it: CUDA's is off until
    measured), reading NCHW or channels-last input, on the GPU in every dtype."""
    from ember.backend.targets import CpuPolicy
    from ember.backend.targets.triton.target import TritonTarget
    monkeypatch.setattr(CpuPolicy, "max_generated_depthwise_taps", 25)
    monkeypatch.setattr(TritonTarget, "max_generated_depthwise_taps", 25)

    def block(x, w, b, mean, var):
        y = F.conv2d(x, w, b, stride=stride, padding=1, groups=x.shape[1])
        return F.silu(F.batch_norm(y, mean, var, training=False))
    x = torch.randn(2, 24, 15, 15).contiguous(memory_format=layout)
    args = x, torch.randn(24, 1, 3, 3) / 3, torch.randn(24), torch.randn(24), \
        torch.rand(24) + 0.5
    with config.patch(layout_optimization="off"):
        assert run(target, block, *args) == 1
    assert not compile_stats.extern_calls, dict(compile_stats.extern_calls)


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
def test_reduce_overhead_says_training_graphs_run_without_cuda_graphs(ember_log):
    logs.set_logs("perf_hints")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).cuda()
    compiled = ember.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 8, device="cuda")
    with torch.enable_grad():           # the module's fixture runs tests under no_grad
        compiled(x).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).sum().backward()
    for got, p in zip(grads, model.parameters()):
        assert same(p.grad, got, rtol=1e-4, atol=1e-4)
    assert "cudagraphs: not used, the graph records gradients" in ember_log.text


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
    """The worker protocol: each task answers an error naming the kernel or its cache key;
    the process that asked then compiles the failed ones itself (here: no such file)."""
    from ember.backend.targets.triton.compile_workers import CompileWorkers
    workers = CompileWorkers(1)
    try:
        missing = str(tmp_path / "missing.py")
        config = {"XBLOCK": 8}
        errors, keys = workers.run([(missing, "kernel0", ["float32"], config, 90, 32, True),
                                    (missing, "kernel1", ["float32"], config, 90, 32, False)])
        assert len(errors) == 2 and errors[0].startswith("kernel0: FileNotFoundError")
        assert keys == {}
        assert set(workers.seconds) == {"kernel0", "kernel1"}      # each task timed
        assert list(workers.ready) == [workers.procs[0].pid]
    finally:
        workers.close()
    assert all(p.poll() is not None for p in workers.procs)


_WORKER_KEY_CHECK = """
import importlib.util, sys, torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from ember.backend.targets.triton.compile_workers import CompileWorkers
path = sys.argv[1]
workers = CompileWorkers(1)
errors, keys = workers.run([(path, "kernel0", ["bfloat16", "float32", "bool"],
                             {"XBLOCK": 128, "num_warps": 2}, 90, 32, True)])
workers.close()
assert not errors, errors
class StandIn:      # the parent's JIT, as on an sm_90 GPU, without one
    def get_current_device(self): return 0
    def get_current_stream(self, device): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
driver.set_active(StandIn())
spec = importlib.util.spec_from_file_location("ember_triton_" + path.split("/")[-1][:24], path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
args = [torch.empty(4, dtype=d) for d in (torch.bfloat16, torch.float32, torch.bool)]
compiled = module.kernel0.warmup(*args, grid=(1,), XBLOCK=128, num_warps=2)
print(keys["kernel0"], compiled.hash)
# the parent loads what the worker compiled from Triton's cache directly, past the JIT
from ember.backend.targets.triton import launch
launcher = launch.TritonLauncher(module.kernel0, 1, {"XBLOCK": 128, "num_warps": 2}, False)
src, _ = launch._request(launcher, args, 90, ())
direct = launch._load_compiled(src, keys["kernel0"])
assert direct.asm["cubin"] == compiled.asm["cubin"]
assert direct.metadata == compiled.metadata
"""


_ONE_KERNEL = (
    "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
    "def kernel0(in_ptr0, in_ptr1, out_ptr0, XBLOCK: tl.constexpr):\n"
    "    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
    "    m = x < 4\n"
    "    v = tl.load(in_ptr0 + x, m).to(tl.float32) + tl.load(in_ptr1 + x, m)\n"
    "    tl.store(out_ptr0 + x, v > 0, m)\n")


def _run_script(script: str, tmp_path, *argv: str, workers: int | None = None):
    """``script`` in a new Python, compiling for real (no interpreter) into a Triton cache
    under ``tmp_path``, with this checkout importable."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    if workers is not None:
        env["EMBER_COMPILE_WORKERS"] = str(workers)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", script, *argv], env=env,
                          capture_output=True, text=True, timeout=300)


def test_compile_workers_compile_what_the_parent_would(tmp_path):
    """A worker (Triton only, no torch, no GPU) builds the compile request the parent's
    JITFunction builds for the same call: same Triton cache key, so the parent's compile is
    a cache hit. Compiles for sm_90 with Triton's bundled ptxas; no GPU is needed."""
    kernel = tmp_path / "0123456789abcdef0123456789abcdef.py"
    kernel.write_text(_ONE_KERNEL)
    done = _run_script(_WORKER_KEY_CHECK, tmp_path, str(kernel))
    assert done.returncode == 0, done.stderr[-3000:]
    worker_key, parent_key = done.stdout.split()
    assert worker_key == parent_key


# a script's start: Triton's JIT answering as on an sm_90 GPU, without one; the kernel
# module at argv[1] loaded as Ember loads generated ones; ``args`` for its kernels
_SM90_STAND_IN = """
import importlib.util, sys, torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from ember.backend.targets.triton import launch
path = sys.argv[1]
class StandIn:      # an sm_90 GPU, for the JIT, without one
    def get_current_device(self): return 0
    def get_current_stream(self, device): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
driver.set_active(StandIn())
torch.cuda.get_device_capability = lambda device=None: (9, 0)
spec = importlib.util.spec_from_file_location("ember_triton_" + path.split("/")[-1][:24], path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
args = [torch.empty(4, dtype=d) for d in (torch.float16, torch.float32, torch.bool)]
"""


_PRECOMPILE_CHECK = _SM90_STAND_IN + """
import shutil
def run(fresh):
    launchers = {f"kernel{i}": launch.TritonLauncher(getattr(module, f"kernel{i}"), 1,
                                                     {"XBLOCK": 128, "num_warps": 2}, False)
                 for i in range(5)}
    counts = launch.precompile(launchers, {name: args for name in launchers}, path, fresh)
    return counts, {name: l.compiled.hash for name, l in launchers.items()}
first, keys = run(fresh=True)          # compiled by the workers, loaded directly
again, same_keys = run(fresh=False)    # a later process: the kept keys, loaded directly
shutil.rmtree(sys.argv[2])             # Triton's cache gone: through the JIT, compiled again
gone, new_keys = run(fresh=False)
import ember.backend.targets.triton.compile_workers as workers
def no_request(*args, **kwargs):     # a Triton whose JIT this one cannot imitate
    raise AttributeError("no _pack_args")
workers.compile_request = no_request
other, other_keys = run(fresh=False)   # through the JIT, with a log line
print(first, again, gone, other, keys == same_keys == new_keys == other_keys)
"""


def test_precompile_loads_kernels_past_the_jit_by_their_kept_keys(tmp_path):
    """A module's kernels, compiled by the workers, load from Triton's cache by the keys the
    workers answered; the keys are kept, so a later process loads them the same way; with
    Triton's cache emptied, or a Triton whose compile request cannot be rebuilt, they go
    through the JIT, to the same keys. No GPU needed."""
    import subprocess
    import sys
    body = "".join(
        f"@triton.jit\ndef kernel{i}(in_ptr0, in_ptr1, out_ptr0, XBLOCK: tl.constexpr):\n"
        f"    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
        f"    m = x < 4\n"
        f"    v = tl.load(in_ptr0 + x, m).to(tl.float32) * {i} + tl.load(in_ptr1 + x, m)\n"
        f"    tl.store(out_ptr0 + x, v > 0, m)\n\n\n" for i in range(5))
    kernel = tmp_path / "fedcba9876543210fedcba9876543210.py"
    kernel.write_text("import triton\nimport triton.language as tl\n\n\n" + body)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env["EMBER_COMPILE_WORKERS"] = "2"
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _PRECOMPILE_CHECK, str(kernel),
                           env["TRITON_CACHE_DIR"]], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "(5, 0) (5, 0) (0, 5) (0, 5) True"
    assert (tmp_path / "fedcba9876543210fedcba9876543210.compiled.json").exists()


_CONFIGS_CHECK = _SM90_STAND_IN + """
def run(fresh):
    launchers = {f"kernel0#{b}": launch.TritonLauncher(module.kernel0, 1,
                                                       {"XBLOCK": b, "num_warps": 2}, False)
                 for b in (16, 32, 64, 128)}
    launch.precompile(launchers, {name: args for name in launchers}, path, fresh)
    return {name: (l.compiled.hash, l.compiled.metadata.hash) for name, l in launchers.items()}
first = run(fresh=True)
print(len(set(first.values())), run(fresh=False) == first)
"""


def test_precompile_keeps_one_key_per_config_of_a_kernel(tmp_path):
    """One kernel in several tile configs (a matmul template's ways) is as many binaries: a
    later process loads each config's own, not the last one kept (that one, launched on
    another config's grid, computed wrong values on the GPU). No GPU needed."""
    kernel = tmp_path / "00aa9876543210fedcba9876543210ff.py"
    kernel.write_text(_ONE_KERNEL)
    done = _run_script(_CONFIGS_CHECK, tmp_path, str(kernel), workers=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "4 True"


def test_a_compile_worker_does_not_import_torch():
    """Workers start while the parent traces: importing torch in each would cost seconds."""
    import subprocess
    from ember.backend.targets.triton.compile_workers import worker_command
    command = worker_command()
    command[2] += "; print('triton' in sys.modules, sorted(m for m in sys.modules " \
                  "if m.split('.')[0] in ('torch', 'ember')))"
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    # the worker's prints go to stderr (its stdout carries the protocol)
    assert done.stderr.strip().splitlines()[-1] == "True []"


def test_compile_worker_count_is_checked(monkeypatch):
    from ember.backend.targets.triton import launch
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

    from ember.backend.targets.triton.compile_workers import warm_up_triton
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


class _StandInLauncher:
    """A compiled kernel's launcher in one of Triton's two conventions: the C launch takes
    the kernel's arguments spread after the constants (per-signature launchers), or as one
    tuple after the argument types (the generic launcher)."""

    def __init__(self, spread: bool, scratch: int = 0):
        self.spread, self.global_scratch_size, self.calls = spread, scratch, []
        self.launch = self._c_launch

    def _c_launch(self, *a):
        self.calls.append(a)

    def __call__(self, gx, gy, gz, stream, function, packed, meta, enter, exit_, *args):
        scratch = object() if self.global_scratch_size else None     # per launch
        if self.spread:
            self.launch(gx, gy, gz, stream, function, False, False, scratch, None, packed,
                        meta, enter, exit_, *args)
        else:
            self.launch(gx, gy, gz, stream, function, False, False, packed, meta, enter, exit_,
                        scratch, None, "annotations", "signature", args)


@pytest.mark.parametrize("spread,scratch", [(True, 0), (False, 0), (True, 64)])
def test_launcher_records_the_c_launch_once_then_calls_it_directly(monkeypatch, spread, scratch):
    from ember.backend.targets.triton.launch import TritonLauncher
    launcher_ = _StandInLauncher(spread, scratch)
    compiled = type("Compiled", (), {"run": launcher_, "function": "fn", "packed_metadata": "pm"})
    fn = type("Fn", (), {"warmup": lambda self, *a, grid, **config: compiled})()
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
    launch = TritonLauncher(fn, (3, 2), {"XBLOCK": 64, "num_warps": 4}, interpret=False)
    x, y = torch.ones(2), torch.zeros(2)
    launch(x, y)
    assert len(launcher_.calls) == 1           # the first call launched once, recorded
    launch(y, x)
    launch(x, x)
    assert len(launcher_.calls) == 3 and launcher_.launch == launcher_._c_launch
    first, second = launcher_.calls[0], launcher_.calls[1]
    assert first[:4] == second[:4] == (3, 2, 1, 7)
    kernel_args = second[-3:] if spread else second[-1]
    assert kernel_args[0] is y and kernel_args[1] is x and kernel_args[2] == 64
    if scratch:    # scratch is allocated per launch: later calls keep going through the wrapper
        assert second[7] is not first[7]
    else:
        assert len(first) == len(second)
        assert all(a is b for a, b in zip(first[4:-3 if spread else -1],
                                           second[4:-3 if spread else -1]))
