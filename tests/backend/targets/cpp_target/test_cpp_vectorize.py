"""Generated C++ loops vectorise: g++ reports each hot loop as vectorised, and selects keep
eager's exact bits. A loop left scalar still computes the right values, so only the
compiler's own report catches the slowdown (a padded pooling window's `?:` let g++ sink its
loads into branches: 0.78 ms for a 14x14x512 max pool against 0.05 vectorised)."""
import pathlib
import subprocess

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend.targets.cpp import build
from ember.backend.targets.cpp.prelude import PRELUDE
from ember.testing import run_and_get_code


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


def _vectorised_lines(kernel_source: str, tmp_path: pathlib.Path) -> set[int]:
    """The source lines of loops g++ reports as vectorised, counted from the kernel's first
    line."""
    cpp = tmp_path / "k.cpp"
    cpp.write_text(PRELUDE + "\n" + kernel_source)
    report = tmp_path / "vec.txt"
    subprocess.run([build.cxx(), *build.cxx_flags(), str(cpp), "-o", str(tmp_path / "k.so"),
                    f"-fopt-info-vec-optimized={report}"], check=True)
    offset = PRELUDE.count("\n") + 1
    return {int(line.split(":")[1]) - offset for line in report.read_text().splitlines()
            if "loop vectorized" in line}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_padded_max_pool_channel_loop_vectorises(dtype, tmp_path):
    x = torch.randn(1, 64, 8, 8, dtype=dtype).to(memory_format=torch.channels_last)
    fn = lambda x: F.max_pool2d(x, 3, 1, 1)   # noqa: E731
    out, sources = run_and_get_code(fn, x)
    torch.testing.assert_close(out, fn(x))
    kernel = next(s for s in sources if 'extern "C"' in s)
    inner = next(i for i, line in enumerate(kernel.splitlines(), 1)
                 if "for (int64_t r0" in line)
    # g++ names the loop by its header or its first statement
    assert _vectorised_lines(kernel, tmp_path) & {inner, inner + 1}, kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_where_keeps_the_chosen_values_bits(dtype):
    """``where`` on a condition fixed in the inner loop is a select of bits, on a
    per-element one a ``?:`` (one blend); NaN payloads, signed zeros and infinities come
    through either as eager's."""
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1e-40,
                            -3.5], dtype=dtype)
    a = special.repeat(37, 1)
    b = special.flip(0).repeat(37, 1)
    per_row = (torch.arange(37) % 3 == 0).view(37, 1)
    per_element = torch.arange(37 * 7).view(37, 7) % 3 == 0

    def fn(r, e, a, b):
        return torch.where(r, a * 1, b + 0.0), torch.where(e, a * 1, b + 0.0)
    out, sources = run_and_get_code(fn, per_row, per_element, a, b)
    bits = torch.int32 if dtype is torch.float32 else torch.int64
    for got, want in zip(out, fn(per_row, per_element, a, b)):
        assert torch.equal(got.view(bits), want.view(bits))
    text = "\n".join(sources)
    assert "ember_select(" in text and " ? " in text, text


def test_gather_loop_with_range_checks_vectorises(tmp_path):
    """Bilinear upsampling gathers four input elements per output through computed
    indices, each range-checked: the checks are branch-free, so the loop stays vectorised
    (deeplabv3's 14x14 -> 224x224 head: 2.8x faster than with a flag store per check)."""
    x = torch.randn(1, 21, 14, 14)
    fn = lambda x: F.interpolate(x, size=(224, 224), mode="bilinear")   # noqa: E731
    out, sources = run_and_get_code(fn, x)
    torch.testing.assert_close(out, fn(x))
    kernel = next(s for s in sources if 'extern "C"' in s and "ember_flags_r |=" in s)
    lines = kernel.splitlines()
    inner = max(i for i, line in enumerate(lines, 1) if "for (int64_t r0" in line)
    assert "reduction(|:ember_flags_r)" in lines[inner - 2], kernel
    # g++ names the loop by its pragma, its header or its first statement
    assert _vectorised_lines(kernel, tmp_path) & {inner - 1, inner, inner + 1}, kernel


@pytest.mark.parametrize("bad", [-41, 40, 10**6])
def test_a_bad_index_in_a_vectorised_gather_still_raises(bad):
    table = torch.randn(40, 64)
    idx = torch.arange(100) % 40
    idx[57] = bad
    fn = lambda i, t: (t[i] * 2).sum(1)   # noqa: E731
    with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 40"):
        ember.compile(fn)(idx, table)
    idx[57] = 3
    torch.testing.assert_close(ember.compile(fn)(idx, table), fn(idx, table))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_half_precision_loops_vectorise(dtype, tmp_path):
    """float16/bfloat16 loads and stores convert with bit arithmetic and bit selects
    (prelude.h), so a loop over half values vectorises like one over floats: a pointwise
    GELU of a sum, and a row sum's lane loop."""
    a, b = torch.randn(64, 1024, dtype=dtype), torch.randn(64, 1024, dtype=dtype)
    for fn, args in [(lambda a, b: F.gelu(a + b), (a, b)), (lambda a: a.sum(1), (a,))]:
        out, sources = run_and_get_code(fn, *args)
        torch.testing.assert_close(out, fn(*args), rtol=2e-2, atol=2e-2)
        kernel = next(s for s in sources if 'extern "C"' in s)
        lines = kernel.splitlines()
        assert any("ember_from_" in line for line in lines), kernel
        # the simd loops that load half values: g++ names each by its header (the line
        # after the pragma) or its first statement
        loops = [i for i, line in enumerate(lines, 1) if "#pragma omp simd" in line and
                 any("ember_from_" in body for body in lines[i:i + 4])]
        vectorised = _vectorised_lines(kernel, tmp_path)
        assert loops and all({i + 1, i + 2, i + 3} & vectorised for i in loops), kernel


@pytest.mark.parametrize("name", ["where", "leaky_relu", "tanh"])
def test_loops_with_a_float_select_vectorise(name, tmp_path):
    """A ``?:`` between float values (``where``, leaky ReLU, tanh's two ranges) vectorises on
    AVX2 too, which has no masked arithmetic: ``-fno-trapping-math`` lets g++ compute both
    sides (without it an AVX2 AMD EPYC left all three loops scalar)."""
    fn = {"where": lambda x: torch.where(x > 0, x, x * 3), "leaky_relu": F.leaky_relu,
          "tanh": torch.tanh}[name]
    x = torch.randn(64, 1024)
    out, sources = run_and_get_code(lambda t: fn(t + 1), x)
    torch.testing.assert_close(out, fn(x + 1))
    kernel = next(s for s in sources if 'extern "C"' in s)
    loops = [i for i, line in enumerate(kernel.splitlines(), 1) if "#pragma omp simd" in line]
    vectorised = _vectorised_lines(kernel, tmp_path)
    assert loops and all({i + 1, i + 2, i + 3} & vectorised for i in loops), kernel
