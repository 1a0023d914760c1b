"""Split reductions (ember/backend/lowering/reductions.py): a reduction to few results runs
as two kernels, partial results then their reduction, and still computes eager's values.
The Triton target splits them all; the C++ target splits column reductions only (a row
reduction's threads split its rows themselves)."""
import os

import pytest
import torch

import ember
from ember.backend import compile as compile_module, compile_stats
from ember.testing import same

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
NEEDS_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                                 reason="needs a CUDA GPU")]
TRITON = [pytest.param(("cpu", {"cpu_backend": "triton"}), marks=pytest.mark.skipif(
    not INTERPRETED, reason="Triton's interpreter is enabled only in processes started with "
                            "TRITON_INTERPRET=1 (tests/conftest.py, without a GPU)")),
          pytest.param(("cuda", {}), marks=NEEDS_GPU)]

CASES = {   # name: (function, input shape, kernels when split)
    "column-sum": (lambda x: x.sum(0), (4096, 96), 2),
    "whole-sum": (lambda x: x.sum(), (512, 96), 2),
    "column-amax": (lambda x: x.amax(0, keepdim=True), (4096, 24), 2),
    "column-amin": (lambda x: x.amin(0), (2048, 8), 2),
    "batch-norm-mean": (lambda x: x.mean((0, 2, 3)), (16, 8, 14, 14), 2),
    # one pass: each chunk's mean and M2, then Chan's combination (two kernels, not four)
    "batch-norm-var": (lambda x: x.var((0, 2, 3)), (16, 8, 14, 14), 2),
    "column-any": (lambda x: (x > 3).any(0), (4096, 4), 2),
    "column-all": (lambda x: (x > -4).all(0), (4096, 4), 2),
    "sum-of-a-product": (lambda x: (x * x.sin()).sum(1), (4, 4096), 2),
}


def _kernels() -> int:
    return compile_stats.generated_kernel_count


@pytest.mark.parametrize("target", TRITON, ids=["triton-interp", "cuda"])
@pytest.mark.parametrize("name", list(CASES))
def test_split_reduction_matches_eager(target, name):
    device, options = target
    fn, shape, kernels = CASES[name]
    torch.manual_seed(0)
    x = torch.randn(*shape, device=device)
    ember.reset()
    with torch.no_grad():
        out, expected = ember.compile(fn, options=options)(x), fn(x)
    assert same(expected, out, rtol=1e-4, atol=1e-4)
    assert _kernels() == kernels


def test_a_reduction_whose_dims_do_not_divide_stays_one_kernel():
    """8191 rows (a prime) cannot be cut into equal chunks: one kernel, eager's values."""
    if not INTERPRETED:
        pytest.skip("runs the Triton interpreter (TRITON_INTERPRET=1, set without a GPU)")
    x = torch.randn(8191, 3)
    ember.reset()
    with torch.no_grad():
        out = ember.compile(lambda x: x.sum(0), options={"cpu_backend": "triton"})(x)
    assert same(x.sum(0), out, rtol=1e-4, atol=1e-4)
    assert _kernels() == 1


def test_column_kernels_halve_their_block_toward_the_fewest_programs(monkeypatch):
    """``COLUMN_MIN_PROGRAMS`` (a tuning constant, off by default): a column kernel's
    XBLOCK halves until it runs that many programs; the values stay eager's. The second
    kernel of a column sum over 96 columns: 2 programs of 64 by default, 48 of 2 at 32."""
    if not INTERPRETED:
        pytest.skip("runs the Triton interpreter (TRITON_INTERPRET=1, set without a GPU)")
    import re

    from ember.backend.targets.triton import kernel as triton_kernel
    x = torch.randn(4096, 96)
    blocks = {}
    for fewest in (0, 32):
        monkeypatch.setattr(triton_kernel, "COLUMN_MIN_PROGRAMS", fewest)
        monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
        ember.reset()
        compile_module.generated_sources.clear()
        with torch.no_grad():
            out = ember.compile(lambda x: x.sum(0), options={"cpu_backend": "triton"})(x)
        assert same(x.sum(0), out, rtol=1e-4, atol=1e-4)
        wrapper = next(s for s in compile_module.generated_sources if "def call(" in s)
        blocks[fewest] = [int(b) for b in re.findall(r"XBLOCK=(\d+)", wrapper)][-1]
    assert blocks == {0: 64, 32: 2}


COLUMNS = ["column-sum", "column-amax", "column-amin", "column-any", "column-all"]


@pytest.mark.parametrize("name", COLUMNS + ["batch-norm-mean", "batch-norm-var",
                                            "sum-of-a-product"])
def test_the_cpp_target_splits_column_reductions_only(name):
    fn, shape, kernels = CASES[name]
    torch.manual_seed(0)
    x = torch.randn(*shape)
    ember.reset()
    with torch.no_grad():
        out, expected = ember.compile(fn)(x), fn(x)
    assert same(expected, out, rtol=1e-4, atol=1e-4)
    # NCHW batch norm statistics and a sum along rows read along a reduced dim: one kernel
    assert _kernels() == (kernels if name in COLUMNS else 1)


def test_a_weight_norm_splits_its_column_norm_on_the_cpu():
    """Wav2Vec2's positional convolution weight, normalised over all but its last dim."""
    w, g = torch.randn(96, 48, 128), torch.randn(1, 1, 128)
    ember.reset()
    with torch.no_grad():
        out = ember.compile(lambda w, g: torch._weight_norm(w, g, 2))(w, g)
    assert same(torch._weight_norm(w, g, 2), out, rtol=1e-5, atol=1e-6)
    assert _kernels() >= 2


@pytest.mark.gpu
def test_welford_column_kernels_step_through_smaller_tiles():
    """A column kernel updating a Welford state (mean, M2, count per element) loops over
    ``COLUMN_WELFORD_TILE`` elements a step, column sums over ``COLUMN_TILE``: batch norm's
    statistics of 64x256x56x56 bf16 took 53 us a call instead of 75 on an H100."""
    if not torch.cuda.is_available() or INTERPRETED:
        pytest.skip("needs a CUDA GPU (the interpreter's tiles are its own)")
    import re

    from ember.backend.targets.triton import kernel as triton_kernel
    x = torch.randn(8, 64, 28, 28, device="cuda").to(memory_format=torch.channels_last)
    tiles = {}
    for name, fn in (("var", lambda x: torch.var_mean(x, (0, 2, 3), correction=0)),
                     ("sum", lambda x: x.sum((0, 2, 3)))):
        ember.reset()
        compile_module.generated_sources.clear()
        with torch.no_grad():
            out = ember.compile(fn)(x)
        assert same(fn(x), out, rtol=1e-4, atol=1e-4)
        wrapper = next(s for s in compile_module.generated_sources if "def call(" in s)
        first = re.search(r"XBLOCK=(\d+), RBLOCK=(\d+)", wrapper)
        tiles[name] = int(first.group(1)) * int(first.group(2))
    assert tiles == {"var": triton_kernel.COLUMN_WELFORD_TILE,
                     "sum": triton_kernel.COLUMN_TILE}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_half_sum_keeps_float32_partials(dtype):
    """Partial sums of half values are float32: the result is as close to the float32 sum
    as eager's (which accumulates in float32 and rounds once)."""
    if not torch.cuda.is_available() or INTERPRETED:
        pytest.skip("needs a CUDA GPU (the CPU targets compute no half precision)")
    torch.manual_seed(0)
    x = torch.randn(65536, 64, device="cuda", dtype=dtype)
    ember.reset()
    with torch.no_grad():
        out = ember.compile(lambda x: x.sum(0))(x)
    reference = x.float().sum(0)
    assert _kernels() == 2
    assert (out.float() - reference).abs().max() <= \
        (x.sum(0).float() - reference).abs().max() * 2 + 1e-3


@pytest.mark.parametrize("target", TRITON, ids=["triton-interp", "cuda"])
@pytest.mark.parametrize("fn", [lambda x: x.sum((0, 2, 3)), lambda x: x.var((0, 2, 3)),
                                lambda x: (x * x.cos()).amax((0, 2, 3))],
                         ids=["sum", "var", "amax"])
def test_channels_last_batch_norm_sums_split_chunk_major(target, fn):
    """Over channels-last data the channels are innermost: the partial results are laid out
    ``[chunks, C]`` (both kernels reduce columns of contiguous channels), NCHW data keeps
    ``[C, chunks]``; both compute eager's values."""
    device, options = target
    torch.manual_seed(0)
    nchw = torch.randn(16, 4, 14, 14, device=device)
    for x, partials in ((nchw, "(4, 8)"), (nchw.to(memory_format=torch.channels_last),
                                          "(8, 4)")):
        ember.reset()
        with torch.no_grad():
            compiled = ember.compile(fn, options=options)
            out = compiled(x)
        assert same(fn(x), out, rtol=1e-4, atol=1e-4)
        wrapper = next(s for s in reversed(compile_module.generated_sources)
                       if s.startswith("import torch"))
        assert f"empty_strided({partials}, " in wrapper


@pytest.mark.parametrize("target", TRITON + [pytest.param(("cpu", {}), id="cpp")],
                         ids=["triton-interp", "cuda", "cpp"])
@pytest.mark.parametrize("fn", [lambda x: x.sum((0, 2, 3)), lambda x: x.var((0, 2, 3))],
                         ids=["sum", "var"])
def test_channels_last_chunks_are_contiguous_runs_of_rows(target, fn):
    """A chunk of a split reduction over channels-last data is a contiguous run of rows: 4
    images of 32x32 cut at H into 4 pieces make 16 chunks of 8x32 rows, partials
    ``[4, 4, C]``. (Cutting H into 16 and reducing N inside each chunk read rows 32 KB apart
    in every tile.)"""
    device, options = target
    torch.manual_seed(0)
    x = torch.randn(4, 8, 32, 32, device=device).to(memory_format=torch.channels_last)
    ember.reset()
    with torch.no_grad():
        out = ember.compile(fn, options=options)(x)
    assert same(fn(x), out, rtol=1e-4, atol=1e-4)
    wrapper = next(s for s in reversed(compile_module.generated_sources)
                   if s.startswith("import torch"))
    assert "empty_strided((4, 4, 8), " in wrapper


@pytest.mark.parametrize("target", TRITON, ids=["triton-interp", "cuda"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_split_var_mean_of_offset_data_is_as_accurate_as_eager(target, channels_last):
    """Split var_mean combines the chunks' means and M2s (Chan's formula), so values far
    from zero (mean 100, std 3) lose no more than eager's own var_mean does."""
    device, options = target
    torch.manual_seed(0)
    x = torch.randn(16, 8, 14, 14, device=device) * 3 + 100
    if channels_last:
        x = x.to(memory_format=torch.channels_last)

    def fn(x):
        return torch.var_mean(x, (0, 2, 3), correction=0)
    ember.reset()
    with torch.no_grad():
        out, eager = ember.compile(fn, options=options)(x), fn(x)
    assert _kernels() == 2
    reference = fn(x.double())
    for got, ours, want in zip(out, eager, reference):
        assert (got.double() - want).abs().max() <= \
            4 * (ours.double() - want).abs().max() + 1e-6
