"""Graphs with symbolic sizes on the Triton target (issue 31, item 5): kernels take the
size symbols as int arguments, so one compile serves every size, checked against eager at
several sizes, through Ember's frontend (``ember.compile(dynamic=True)``) and behind
torch.compile's (``backend="ember"``). On CPU tensors through Triton's interpreter (CI);
the ``gpu`` tests run the same on CUDA in float32 and bfloat16 at realistic sizes."""
from __future__ import annotations

import json
import os
import re

import pytest
import sympy
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_stats, pipeline

pytest.importorskip("triton")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1")
on_gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                              reason="needs a CUDA GPU")]
pytestmark = pytest.mark.usefixtures("fresh_no_grad")
OPTIONS = {"cpu_backend": "triton"}

# the first size is the hint the kernels' blocks are chosen from; the reductions then run
# over rows much longer (3000: a block sized by the hint would drop most of the row) and
# shorter than it
SIZES = (8, 3000, 5)
SMALL_SIZES = (11, 17, 6)

# name -> (program, inputs at size n, sizes)
PROGRAMS = {
    "pointwise": (lambda x: (x * 2 + 1).relu().sigmoid(), lambda n: [torch.randn(n, 3)],
                  SMALL_SIZES),
    "broadcast": (lambda x, y: x * y + x, lambda n: [torch.randn(n, 4), torch.randn(4)],
                  SMALL_SIZES),
    "size_arithmetic": (lambda x: x * x.shape[0] + x.shape[1],
                        lambda n: [torch.randn(n, n + 2)], SMALL_SIZES),
    # Python's floor semantics where a size expression is negative (Triton truncates)
    "negative_floor": (lambda x: x * ((x.shape[0] - 15) // 4) + (x.shape[0] - 19) % 5,
                       lambda n: [torch.randn(n)], SMALL_SIZES),
    "scaled": (lambda x: x / x.shape[-1] ** 0.5, lambda n: [torch.randn(2, n)], SMALL_SIZES),
    # reductions over a symbolic dim
    "sum": (lambda x: x.sum(-1), lambda n: [torch.randn(3, n)], SIZES),
    "sum_first": (lambda x: x.sum(0), lambda n: [torch.randn(n, 5)], SIZES),
    "mean": (lambda x: x.mean(1, keepdim=True), lambda n: [torch.randn(4, n)], SIZES),
    "amax": (lambda x: x.amax(-1), lambda n: [torch.randn(2, n)], SIZES),
    "argmax": (lambda x: x.argmax(-1), lambda n: [torch.randn(2, n)], SIZES),
    "softmax": (lambda x: torch.softmax(x, -1), lambda n: [torch.randn(2, n)], SIZES),
    "layer_norm": (lambda x, w: F.layer_norm(x, (x.shape[-1],), w),
                   lambda n: [torch.randn(3, n), torch.randn(n)], SIZES),
    "var": (lambda x: x.var(1), lambda n: [torch.randn(2, n)], SIZES),
    # symbolic rows of a static reduction
    "rows_softmax": (lambda x: torch.log_softmax(x, -1), lambda n: [torch.randn(n, 12)],
                     SMALL_SIZES),
    # views, slicing, cat
    "view": (lambda x: x.view(-1, 2).sum(1), lambda n: [torch.randn(2 * n)], SMALL_SIZES),
    "permute": (lambda x: x.permute(1, 0).contiguous() * 2, lambda n: [torch.randn(n, 5)],
                SMALL_SIZES),
    "slice": (lambda x: x[1:-1, ::2] * 3, lambda n: [torch.randn(n + 2, n)], SMALL_SIZES),
    "cat": (lambda x, y: torch.cat([x, y.relu()], 1),
            lambda n: [torch.randn(4, n), torch.randn(4, 3)], SMALL_SIZES),
    # indexing
    "gather": (lambda x, i: x.gather(1, i) * 2,
               lambda n: [torch.randn(n, 6), torch.randint(0, 6, (n, 2))], SMALL_SIZES),
    "embedding": (lambda w, i: F.embedding(i, w) + 1,
                  lambda n: [torch.randn(10, 4), torch.randint(0, 10, (n,))], SMALL_SIZES),
    # a library matmul with its pointwise epilogue
    "linear_relu": (lambda x, w, b: F.linear(x, w, b).relu() * 2,
                    lambda n: [torch.randn(n, 8), torch.randn(6, 8), torch.randn(6)],
                    SMALL_SIZES),
}


def _check(compiled, fn, make, sizes):
    for n in sizes:
        args = make(n)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-4, atol=1e-4)
    assert dict(compile_stats.symbolic_declines) == {}
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


@interpreted
@pytest.mark.parametrize("name", PROGRAMS)
def test_ember_compile_dynamic_is_one_triton_compile(name):
    fn, make, sizes = PROGRAMS[name]
    compile_stats.reset()
    _check(ember.compile(fn, dynamic=True, options=OPTIONS), fn, make, sizes)


@interpreted
@pytest.mark.parametrize("name", ["scaled", "softmax", "layer_norm", "gather", "linear_relu"])
def test_torch_compile_dynamic_is_one_triton_compile(name):
    fn, make, sizes = PROGRAMS[name]
    torch._dynamo.reset()
    compile_stats.reset()
    _check(torch.compile(fn, backend="ember", dynamic=True, options=OPTIONS), fn, make, sizes)


def _triton_kernels() -> list[str]:
    return [s for s in pipeline.generated_sources if "@triton.jit" in s]


@interpreted
def test_kernels_take_sizes_as_int_arguments():
    """Sizes are parameters after the buffers, not constexprs and not specialised on their
    value; a symbolic reduction length loops over blocks."""
    fn = PROGRAMS["softmax"][0]
    compiled = ember.compile(fn, dynamic=True, options=OPTIONS)
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), fn(x))
    kernels = _triton_kernels()
    assert len(kernels) == 1
    head = re.search(r"@triton\.jit\((.*)\)\ndef \w+\((.*)\):", kernels[0])
    assert head, kernels[0]
    params = [p.strip() for p in head.group(2).split(",")]
    sizes = [p for p in params if re.fullmatch(r"s\d+", p)]
    assert sizes and head.group(1) == f"do_not_specialize={sizes!r}"
    assert params.index(sizes[0]) > max(i for i, p in enumerate(params) if p.startswith("p_"))
    assert not any(s in p for s in sizes for p in params if "constexpr" in p)
    assert "for roffset in range(0, s" in kernels[0]


@interpreted
def test_static_kernels_are_unchanged():
    """A static graph's kernels take no sizes and are decorated as before."""
    compiled = ember.compile(lambda x: torch.softmax(x, -1), options=OPTIONS)
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), torch.softmax(x, -1))
    (kernel,) = _triton_kernels()
    assert "@triton.jit\ndef " in kernel and "do_not_specialize" not in kernel
    assert "xmask = xindex < 2" in kernel and "rmask = rindex < 8" in kernel


@interpreted
def test_autotune_per_size_bucket(monkeypatch, tmp_path):
    """max_autotune times a kernel's configs per size bucket (kept on disk under the
    source and the bucket); every choice is right at every size."""
    from ember.backend.targets.triton import launch
    monkeypatch.setattr(launch, "_autotune_path",
                        lambda key: tmp_path / "autotune" / f"{key}.json")
    fn = lambda x: (x * 2).sum(-1)    # noqa: E731
    compiled = ember.compile(fn, dynamic=True, options={**OPTIONS, "max_autotune": True})
    for n in (8, 3000, 5, 3000):
        x = torch.randn(3, n)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-4)
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    names = sorted(p.name for p in (tmp_path / "autotune").iterdir())
    # one choice per bucket of (rows, sizes): 3 rows of 8, 4096 and 8 elements (5 and 8
    # share a bucket, 3000 is timed once)
    assert [n.split("-", 1)[1] for n in names] == ["4x4x4096.json", "4x4x8.json"], names
    for name in names:
        assert "XBLOCK" in json.loads((tmp_path / "autotune" / name).read_text())


@interpreted
def test_int32_indices_are_guarded(ember_log):
    """int32 indices hold where the sizes keep every index below 2^31: a guard of the
    symbolic program (larger sizes fail it and are compiled per size)."""
    from ember import logs
    logs.set_logs("output_code")
    fn = lambda x: x.sum(-1)     # noqa: E731
    compiled = ember.compile(fn, dynamic=True, options=OPTIONS)
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), fn(x))
    guards = [r.getMessage() for r in ember_log.records if "guards:" in r.getMessage()]
    # indices below 2^31, and the size arguments (passed as int32) below 2^31 too
    assert guards and "(a[0] * a[1]) <= 2147483646" in guards[-1], guards
    assert "a[1] <= 2147483647" in guards[-1], guards


def test_rows_the_ranges_bound_may_stay_in_registers():
    """A persistent reduction's block must hold the longest row at any size: the ranges'
    upper bound where they have one, else the reduction loops."""
    from ember.backend import sizevars
    from ember.backend.targets.triton.kernel import _upper_bound
    from ember.shapes import ShapeEnv
    env = ShapeEnv()
    bounded, free = env.create_symbol(8, "a", max=64), env.create_symbol(9, "b")
    with sizevars.symbols(env):
        assert _upper_bound(bounded * 2) == 128
        assert _upper_bound(free) is None and _upper_bound(bounded * free) is None
        assert _upper_bound(sympy.Integer(7)) == 7


# -- CUDA, realistic sizes ----------------------------------------------------------------------

def _gpu_check(fn, make, sizes, dtype, tol):
    compile_stats.reset()
    compiled = ember.compile(fn, dynamic=True)
    for n in sizes:
        args = [a.cuda().to(dtype) if a.is_floating_point() else a.cuda() for a in make(n)]
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=tol, atol=tol)
    assert dict(compile_stats.symbolic_declines) == {}
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


GPU_DTYPES = [pytest.param(torch.float32, 1e-4, id="f32", marks=on_gpu),
              pytest.param(torch.bfloat16, 4e-2, id="bf16", marks=on_gpu)]


@pytest.mark.parametrize("dtype,tol", GPU_DTYPES)
def test_gpu_mlp_dynamic_batch(dtype, tol):
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256))
    _gpu_check(mlp.cuda().to(dtype), lambda n: [torch.randn(n, 256)], (64, 7, 333, 4096),
               dtype, tol)


@pytest.mark.parametrize("dtype,tol", GPU_DTYPES)
def test_gpu_layer_norm_dynamic_rows(dtype, tol):
    fn = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)    # noqa: E731
    w, b = torch.randn(768), torch.randn(768)
    _gpu_check(fn, lambda n: [torch.randn(n, 768), w, b], (1000, 70000, 4097, 2), dtype, tol)


@pytest.mark.parametrize("dtype,tol", GPU_DTYPES)
def test_gpu_softmax_dynamic_row_length(dtype, tol):
    fn = lambda x: torch.softmax(x * 0.5, -1)    # noqa: E731
    _gpu_check(fn, lambda n: [torch.randn(512, n)], (7, 4096, 100, 1000, 2), dtype, tol)


@pytest.mark.parametrize("dtype,tol", GPU_DTYPES[:1])
def test_gpu_cudagraphs_are_recorded_per_size(dtype, tol, monkeypatch):
    """``mode="reduce-overhead"``: one symbolic compile, a CUDA graph captured per size
    over it; results kept across calls; the oldest size dropped past the limit and
    captured again when it returns."""
    from ember.backend.runtime import cudagraphs
    monkeypatch.setattr(cudagraphs, "SIZES_KEPT", 2)
    fn = lambda x: torch.softmax(x * 2, -1).relu()     # noqa: E731
    compile_stats.reset()
    compiled = ember.compile(fn, dynamic=True, mode="reduce-overhead")
    xs = {n: torch.randn(n, 32 + n, device="cuda") for n in (64, 100, 77)}
    outs = [(x, compiled(x)) for n in (64, 100, 64, 77, 64, 100) for x in [xs[n]]]
    for x, out in outs:
        torch.testing.assert_close(out, fn(x))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert not compile_stats.symbolic_declines
