"""Transposed reads (``x.t().contiguous()``, NCHW -> NHWC) in C++ kernels run over tiles copied
through ``ember_transpose_tile`` (strategies/tiles.py). Results are eager's bit for bit: sizes
that are not multiples of the 8 x 8 blocks or of the tile, empty tensors, strided inputs,
every element size, special values; and on both CPU targets."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend.targets.cpp.build import load_cpp
from ember.backend.targets.cpp.prelude import PRELUDE
from ember.backend.targets.cpp.strategies import tiles
from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("fresh_no_grad", "always_tiled")


@pytest.fixture
def always_tiled(monkeypatch):
    """Small transposes too run over tiles (their rows would stay in cache untiled), so
    odd sizes exercise the tile code."""
    monkeypatch.setattr(tiles, "TILE_CACHED_BYTES", 0)


def _bits(t):
    """The tensor's bits (NaN payloads and -0.0 told apart), as integers."""
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _check(fn, *args):
    ember.reset()
    result, sources = run_and_get_code(fn, *args)
    expected = fn(*args)
    assert result.dtype == expected.dtype and result.shape == expected.shape
    assert result.stride() == expected.stride()
    assert torch.equal(_bits(result), _bits(expected))
    return "\n".join(sources)


def _transpose(x):
    return x.t().contiguous()


def _special(shape, dtype):
    x = torch.randn(shape).to(dtype) if dtype.is_floating_point else \
        torch.randint(-100, 100, shape).to(dtype)
    if dtype.is_floating_point and x.numel() >= 4:
        flat = x.view(-1)
        flat[:5] = torch.tensor([float("nan"), float("-inf"), -0.0, float("inf"), float("nan")])
        _bits(flat)[4] += 1        # a NaN with other payload bits
    return x


@pytest.mark.parametrize("shape", [(37, 101), (64, 16), (65, 17), (8, 200), (0, 50), (3, 1)])
def test_transpose_sizes(shape, cpu_backend):
    x = _special(shape, torch.float32)
    code = _check(_transpose, x)
    if cpu_backend == "cpp" and shape[0] >= 16 and shape[1] > 1:
        assert "ember_transpose_tile" in code


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.int8, torch.bool], ids=str)
def test_transpose_dtypes(dtype, cpu_backend):
    x = _special((70, 90), dtype) if dtype != torch.bool else torch.randn(70, 90) > 0
    code = _check(_transpose, x)
    if cpu_backend == "cpp":
        assert "ember_transpose_tile" in code


def test_strided_input_and_fused_body(cpu_backend):
    base = torch.randn(150, 260)
    x = base[3:77, 5:90]                     # 74 x 85, strides (260, 1)
    b = torch.randn(74)
    code = _check(lambda x, b: (x.t().contiguous() * 2 + b).relu(), x, b)   # no NaN: x randn
    if cpu_backend == "cpp":
        assert "ember_transpose_tile" in code


def test_channels_first_to_last(cpu_backend):
    x = _special((2, 40, 9, 11), torch.float32)
    code = _check(lambda x: x.contiguous(memory_format=torch.channels_last) + 1, x)
    if cpu_backend == "cpp":
        assert "ember_transpose_tile" in code


def test_masked_transposed_read_is_not_tiled(cpu_backend):
    # a padded transposed read: its elements in the padding lie outside the input, so the
    # read stays under its guard (no tile copies it)
    x = torch.randn(40, 30)
    code = _check(lambda x: F.pad(x.t(), (3, 2)).contiguous(), x)
    if cpu_backend == "cpp":
        assert "ember_transpose_tile" not in code


def test_contiguous_read_is_not_tiled():
    code = _check(lambda x: x * 2, torch.randn(64, 64))
    assert "ember_transpose_tile" not in code


@pytest.mark.parametrize("flags", [(), ("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")],
                         ids=["native", "avx2", "sse"])
def test_transpose_tile_without_avx512(flags):
    # the vector shuffles are g++'s for the host ISA: every ISA must move the same bits
    source = PRELUDE + """
extern "C" void t32(const float* s, int64_t stride, float* d, int64_t nx, int64_t nr) {
  ember_transpose_tile<16>(s, stride, d, nx, nr); }
extern "C" void t16(const uint16_t* s, int64_t stride, uint16_t* d, int64_t nx, int64_t nr) {
  ember_transpose_tile<32>(s, stride, d, nx, nr); }
extern "C" void t64(const double* s, int64_t stride, double* d, int64_t nx, int64_t nr) {
  ember_transpose_tile<8>(s, stride, d, nx, nr); }
"""
    lib = load_cpp(source, extra_flags=flags)
    for name, dtype, tr in (("t32", torch.float32, 16), ("t16", torch.int16, 32),
                            ("t64", torch.float64, 8)):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                       ctypes.c_int64]
        for nx, nr in ((64, tr), (61, tr - 3), (8, 8), (5, 3)):
            src = torch.arange(100 * 70).to(dtype).view(100, 70)    # row j along r
            dst = torch.zeros(64 * tr, dtype=dtype)
            fn(src.data_ptr(), 70, dst.data_ptr(), nx, nr)
            expected = src[:nr, :nx].t()
            assert torch.equal(dst.view(64, tr)[:nx, :nr], expected), (name, nx, nr)


def test_symbolic_sizes(cpu_backend):
    # the stride of the transposed read is a size symbol
    def fn(x, y):
        return x.t().contiguous() * 2 + y

    compiled = ember.compile(fn, dynamic=True)
    for n, m in ((37, 101), (130, 70), (5, 3)):
        x, y = _special((n, m), torch.float32), torch.randn(m, n)
        torch.testing.assert_close(compiled(x, y), fn(x, y), rtol=0, atol=0, equal_nan=True)
    if cpu_backend == "cpp":
        from ember.backend import compile as backend_compile
        assert "ember_transpose_tile<16>(p_arg0 + (xb + (rb * s" in "\n".join(
            backend_compile.generated_sources)


@pytest.mark.parametrize("shape, tiled", [((4, 64, 56, 56), False), ((2, 64, 32, 32), True)])
def test_nhwc_copy_is_tiled_where_rows_would_leave_the_cache(shape, tiled, monkeypatch):
    # 56 x 56 planes: the 64 lines an untiled loop reads stay in L1 for the next pixels;
    # 32 x 32 planes lie 4 KiB apart: their lines share one L1 set
    monkeypatch.setattr(tiles, "TILE_CACHED_BYTES", 16 << 10)
    code = _check(lambda x: x.contiguous(memory_format=torch.channels_last), torch.randn(shape))
    assert ("ember_transpose_tile" in code) == tiled
    assert "ember_transpose_tile" in _check(_transpose, torch.randn(1024, 300))   # 1024 lines
