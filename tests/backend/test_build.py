"""ember.backend.build: compile C++ kernels, cache them on disk by content hash, load them."""
from __future__ import annotations

import ctypes
import time

import pytest
import torch

from ember.backend import build

ADD_ONE = r"""
#include <cstdint>
extern "C" void add_one(const float* in, float* out, long n) {
  #pragma omp parallel for
  for (long i = 0; i < n; i++) out[i] = in[i] + 1.0f;
}
"""

FMA = r"""
#include <cstdint>
extern "C" void muladd(const float* a, const float* b, const float* c, float* out, int64_t n) {
  #pragma omp parallel for simd
  for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i] + c[i];
}
"""


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    build.build_stats.reset()
    return tmp_path / "cache"


def test_add_one_openmp_matches_eager(tmp_cache):
    lib = build.load_cpp(ADD_ONE)
    fn = build.kernel_function(lib, "add_one", 3)
    x = torch.randn(100_003)
    out = torch.empty_like(x)
    fn(x.data_ptr(), out.data_ptr(), x.numel())
    assert torch.equal(out, x + 1)
    # the library lives in the cache named by EMBER_CACHE_DIR, with its source next to it
    (so,) = (tmp_cache / "cpp").glob("*/*.so")
    assert so.with_suffix(".cpp").read_text() == ADD_ONE
    assert so.parent.name == so.stem[:2]
    assert not list(so.parent.glob("*.tmp*"))


def test_cache_hits_and_misses(tmp_cache):
    build.load_cpp(ADD_ONE)
    assert build.build_stats.compiled == 1
    so = build.compile_cpp(ADD_ONE)
    mtime = so.stat().st_mtime_ns
    # same source again: no compiler run (in-process memo, then on-disk cache)
    build.load_cpp(ADD_ONE)
    assert build.build_stats.compiled == 1 and build.build_stats.memo_hits == 1
    assert build.compile_cpp(ADD_ONE) == so
    assert build.build_stats.compiled == 1 and build.build_stats.cache_hits >= 1
    assert so.stat().st_mtime_ns == mtime
    # a different source, or different flags, compiles
    build.load_cpp(ADD_ONE + "\n// v2\n")
    assert build.build_stats.compiled == 2
    build.compile_cpp(ADD_ONE, extra_flags=("-DEMBER_TEST=1",))
    assert build.build_stats.compiled == 3
    assert len(list((tmp_cache / "cpp").glob("*/*.so"))) == 3


def test_cache_dir_switch(tmp_path, monkeypatch):
    build.load_cpp(ADD_ONE)
    other = tmp_path / "other"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(other))
    assert build.cache_dir() == other
    lib = build.load_cpp(ADD_ONE)   # not memoized across cache directories
    assert build.build_stats.compiled == 2
    assert len(list((other / "cpp").glob("*/*.so"))) == 1
    x = torch.arange(10, dtype=torch.float32)
    out = torch.empty_like(x)
    build.kernel_function(lib, "add_one", 3)(x.data_ptr(), out.data_ptr(), 10)
    assert torch.equal(out, x + 1)


def test_compile_many_in_order(tmp_cache):
    sources = [f'extern "C" long value() {{ return {i * 7}; }}\n' for i in range(4)]
    libs = build.compile_many(sources)
    assert build.build_stats.compiled == 4
    values = []
    for lib in libs:
        fn = lib["value"]
        fn.restype = ctypes.c_long
        values.append(fn())
    assert values == [0, 7, 14, 21]
    # again: all from the in-process memo, no compiler run; duplicates compile once
    assert build.compile_many(sources) == libs
    assert build.build_stats.compiled == 4
    dup = 'extern "C" long value() { return 99; }\n'
    libs2 = build.compile_many([dup, sources[0], dup])
    assert build.build_stats.compiled == 5
    assert libs2[0] is libs2[2] and libs2[1] is libs[0]


def test_compile_error(tmp_cache):
    good = 'extern "C" void ok() {}\n'
    bad = 'extern "C" void broken( { return 1 }\n'
    with pytest.raises(build.CppCompileError) as info:
        build.compile_many([good, bad])
    msg = str(info.value)
    assert "error" in msg and ".cpp" in msg
    assert info.value.source_path.exists()
    assert info.value.source_path.read_text() == bad
    assert build.build_stats.compiled == 1 and build.build_stats.failed == 1  # good one cached
    with pytest.raises(build.CppCompileError, match="expected"):
        build.load_cpp(bad)
    assert not list((tmp_cache / "cpp").glob("*/*.tmp*"))


def test_no_fma_contraction_matches_eager_bitwise():
    assert "-ffp-contract=off" in build.cxx_flags()
    fn = build.kernel_function(build.load_cpp(FMA), "muladd", 5)
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(1 << 16, generator=g) for _ in range(3))
    out = torch.empty_like(a)
    fn(a.data_ptr(), b.data_ptr(), c.data_ptr(), out.data_ptr(), a.numel())
    assert torch.equal(out, a * b + c)
    # the fused result differs on such data, so the check above has teeth
    fused = (a.double() * b.double() + c.double()).float()
    assert not torch.equal(fused, a * b + c)


def test_int64_scalar_through_pointer_slot():
    src = '#include <cstdint>\nextern "C" void put(int64_t* out, int64_t s) { out[0] = s; }\n'
    fn = build.kernel_function(build.load_cpp(src), "put", 2)
    out = torch.zeros(1, dtype=torch.int64)
    for v in (0, -5, 2**63 - 1, -2**63):
        fn(out.data_ptr(), v)
        assert out.item() == v


def test_one_openmp_runtime():
    build.load_cpp(ADD_ONE)
    with open("/proc/self/maps") as f:
        gomp = {line.split()[-1] for line in f if "libgomp" in line}
    assert len(gomp) == 1, gomp


def test_call_overhead_is_small():
    src = 'extern "C" void noop(const float* a, const float* b, float* c) {}\n'
    fn = build.kernel_function(build.load_cpp(src), "noop", 3)
    p = torch.zeros(1).data_ptr()
    n = 20000
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn(p, p, p)
        best = min(best, (time.perf_counter() - start) / n)
    assert best < 20e-6, f"{best * 1e6:.2f} us per call"


def test_concurrent_compiles_of_one_kernel(tmp_cache):
    """Racing compilers of the same kernel (the situation of two processes sharing a cache):
    each writes its own temp file and renames it into place, so the .so is always whole."""
    import concurrent.futures
    src = 'extern "C" long seven() { return 7; }\n'
    so, flags, compiler = build._so_path(src, ())
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: build._compile(src, so, flags, compiler), range(4)))
    assert paths == [so] * 4 and build.build_stats.compiled == 4
    f = build.load_cpp(src)["seven"]
    f.restype = ctypes.c_long
    assert f() == 7
    assert len(list((tmp_cache / "cpp").glob("*/*.so"))) == 1
    assert not list((tmp_cache / "cpp").glob("*/*.tmp*"))


def test_float_exp_calls_sleef_and_matches_eager_at_the_edges():
    """Kernels' float ``exp`` is SLEEF's (torch's CPU library), vectorised through the
    prelude's vector-function variants: each within one unit in the last place of the
    true value (so within two of eager's, whose vectors may be wider), special values
    exact (libmvec's was 4x slower here, 12x with -inf lanes)."""
    import ember
    from ember.backend import compile as backend_compile
    from ember.backend.codegen.cpp import prelude
    if build.sleef_pointers() is None:
        pytest.skip("this torch build exports no SLEEF expf for x86-64 (kernels use libm's)")
    assert "_ZGVdN8v_ember_expf" in prelude("ember_exp(x)")
    assert "_ZGVdN8v_ember_expf" not in prelude("x + 1")     # kernels without exp: libm
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, 88.7, 88.8, -87.3, -103.9, -104.0, 1e-40,
                          -1e30, 1e30, float("inf"), float("-inf"), float("nan")])
    torch.manual_seed(0)
    x = torch.cat([edges, torch.randn(10_000) * 20, edges.flip(0)])
    backend_compile.generated_sources.clear()
    got = ember.compile(lambda t: torch.exp(t) * 1.0, backend="ember")(x)
    want = torch.exp(x)
    assert torch.equal(got.isnan(), want.isnan())
    special = ~torch.isfinite(want) | (want == 0) | x.abs().le(1e-30)
    assert torch.equal(got[special & ~want.isnan()], want[special & ~want.isnan()])
    # two units in the last place: 2 * 2**-22 relative at worst; denormals: absolute
    torch.testing.assert_close(got, want, rtol=4.8e-7, atol=1e-44, equal_nan=True)
    assert any("ember_exp(" in s for s in backend_compile.generated_sources)
