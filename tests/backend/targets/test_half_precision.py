"""float16 and bfloat16 on the CPU targets, against eager.

The C++ target computes half values in float and rounds what it stores once, to nearest
even (targets/cpp/prelude.h): a single op whose eager kernel also computes in float and
rounds once gives eager's bits, special values (inf, NaN, -0.0, subnormals, ties, float16's
overflow to inf) included. A chain of ops rounds only at its end (eager rounds after each
op), and transcendental functions may differ from eager's in float's last bits, so those
are compared within one half-precision ulp.

Triton's interpreter computes half precision wrongly (DESIGN.md): its target has no half
kernels, so there these graphs run ATen's kernels and the tests check only the results
(the lowering rules both targets share, such as the rounding of scalar operands, come
through either way).
"""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_stats
from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("fresh_no_grad")

HALF = [torch.bfloat16, torch.float16]
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}    # relative, one ulp at most


def _ids(dtype):
    return str(dtype).replace("torch.", "")


def _compiled(fn, *args):
    compile_stats.reset()
    return ember.compile(fn, backend="ember")(*args)


def _check_kernels(cpu_backend):
    """On the C++ target every op ran in generated kernels (no ATen fallback)."""
    if cpu_backend == "cpp":
        assert compile_stats.generated_kernel_count > 0
        assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)


def _same(actual, expected):
    """Equal values and dtype (NaN equal to NaN; -0.0 told from 0.0)."""
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
        if a.is_floating_point():
            assert torch.equal(torch.signbit(a), torch.signbit(e)) or bool(a.isnan().any())


def _close(actual, expected, ulps=1):
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        tol = ulps * ULP[a.dtype] if a.dtype in ULP else 1e-5
        torch.testing.assert_close(a.float(), e.float(), rtol=tol, atol=tol, equal_nan=True)


def _special_floats() -> torch.Tensor:
    """float32 values that meet each case of the conversions to float16 and bfloat16."""
    tiny = torch.finfo(torch.float32).tiny
    values = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -1.5,
              tiny, tiny / 4, -tiny / 3,                       # float32 normal and subnormal
              3.4e38, -3.4e38, 1e30,                           # bfloat16: round up to inf
              1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8,                 # bfloat16 ties: to even
              1.0 + 2 ** -8 + 2 ** -20,                         # just above a tie
              1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11,               # float16 ties
              65504.0, 65519.0, 65520.0, 70000.0, -1e5,         # float16 max, overflow to inf
              2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -26,  # float16 subnormals, ties
              2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 6.1e-5, -2.0 ** -20, 1e-10]
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_stores_round_to_nearest_even(dtype, cpu_backend):
    """float32 -> half in a kernel: eager's bits for every special case."""
    x = _special_floats()
    fn = lambda x: (x.to(dtype), (x * 2).to(dtype), x.to(torch.float64).to(dtype))  # noqa: E731
    _same(_compiled(fn, x), fn(x))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_loads_widen_every_bit_pattern(dtype, cpu_backend):
    """half -> float32, float64, int32, bool and the other half dtype, for all 65536 bit
    patterns (subnormals, infinities, NaNs)."""
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype)
    other = torch.float16 if dtype is torch.bfloat16 else torch.bfloat16
    finite = torch.where(x.isfinite() & (x.float().abs() < 2 ** 30), x, torch.zeros_like(x))
    fn = lambda x, f: (x.float(), x.double(), x != 0, x.to(other), f.to(torch.int32),  # noqa: E731
                       x.float().neg().to(dtype))
    _same(_compiled(fn, x, finite), fn(x, finite))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_integer_casts(dtype, cpu_backend):
    """Integers to half round through float32, as eager's conversions do (2**24 + 1 and
    2**60 + 3 round twice); half to integers truncates."""
    n = torch.tensor([0, 1, -1, 255, 257, 2049, 65505, 2 ** 24 + 1, -(2 ** 31), 2 ** 60 + 3],
                     dtype=torch.int64)
    def fn(n):
        return (n.to(dtype), n.to(torch.int32).to(dtype), n.to(torch.uint8).to(dtype),
                (n.to(dtype) * 0.5).to(torch.int64), n.to(torch.bool).to(dtype))
    _same(_compiled(fn, n), fn(n))
    _check_kernels(cpu_backend)


def _operands(dtype):
    torch.manual_seed(0)
    a = (torch.randn(3, 257) * 4).to(dtype)
    b = (torch.randn(3, 257) * 4).to(dtype)
    a[0, :8] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 0.1, 3.0,
                             65504.0 if dtype is torch.float16 else 3e38])
    b[0, :8] = torch.tensor([-0.0, 0.0, 1.0, float("inf"), 2.0, 0.1, 0.0, 2.0])
    return a, b


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_single_ops_match_eager_bits(dtype, cpu_backend):
    """One op each, computed in float and rounded once as eager's kernels do: eager's bits,
    float16's overflow to inf included. Python scalars: eager rounds them to the dtype
    (``x + 0.1`` adds bfloat16's 0.1, ``x == 0.1`` compares with it), except in mul and div."""
    a, b = _operands(dtype)
    fns = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
           lambda a, b: -a, lambda a, b: a.abs(), lambda a, b: a.relu(),
           lambda a, b: torch.maximum(a, b), lambda a, b: torch.minimum(a, b),
           lambda a, b: torch.where(a > b, a, b), lambda a, b: a.clamp(-1.5, 0.7),
           lambda a, b: a + 0.1, lambda a, b: a - 1 / 3, lambda a, b: a * 0.1,
           lambda a, b: a / 3.0, lambda a, b: 2.7 - a, lambda a, b: a * 1000.0,
           lambda a, b: a == 0.1, lambda a, b: a > 0.1, lambda a, b: a <= b,
           lambda a, b: a != b, lambda a, b: a.isnan(), lambda a, b: a.isinf(),
           lambda a, b: a.sqrt(), lambda a, b: a.floor(), lambda a, b: a.sign()]
    fn = lambda a, b: tuple(f(a, b) for f in fns)  # noqa: E731
    _same(_compiled(fn, a, b), fn(a, b))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_mixed_dtypes_promote_as_eager(dtype, cpu_backend):
    a, _ = _operands(dtype)
    f = torch.randn(3, 257)
    i = torch.randint(-5, 5, (3, 257))
    other = torch.float16 if dtype is torch.bfloat16 else torch.bfloat16
    fn = lambda a, f, i: (a + f, f * a, a + i, i * 2.5 + a, a + a.to(other),  # noqa: E731
                          a.float() + 1, (a + 1).float(), a < f)
    _same(_compiled(fn, a, f, i), fn(a, f, i))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_comparisons_and_reductions_read_rounded_results(dtype, cpu_backend):
    """An op's half result read by a comparison, isinf or a reduction is rounded first, as
    eager's op rounded it: float16's ``a * b`` past 65504 is inf, products equal after
    rounding tie in argmax."""
    torch.manual_seed(0)
    a, b = (torch.randn(64, 300) * 300).to(dtype), (torch.randn(64, 300) * 300).to(dtype)
    c = (torch.randn(64, 300) * 9e4).to(dtype)
    fn = lambda a, b, c: ((a * b).isinf(), (a * b) > c, (a * b).argmax(1),  # noqa: E731
                          (a + b == b + a), (a * b).amax(1), (a * 0.37).argmin(1))
    _same(_compiled(fn, a, b, c), fn(a, b, c))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_max_and_min_of_half_results_round_once(dtype, cpu_backend):
    """max and min of an op's half result (softmax's max of ``x * scale``) are eager's, NaN
    and infinities (float16's ``x * 2`` past 65504) included; the C++ kernel reduces the
    float products and rounds the max once, after the loop (rounding is monotonic), not
    every element."""
    torch.manual_seed(0)
    x = (torch.randn(6, 1000) * 100).to(dtype)
    x[1, 7], x[2, 5], x[3, :] = float("nan"), float("-inf"), -float("inf")
    x[4, 9] = 40000.0 if dtype is torch.float16 else 3e38
    fn = lambda x: ((x * 2.0).amax(1), (x * 0.37).amin(1), (x * 0.37).amax(0))  # noqa: E731
    got, sources = run_and_get_code(fn, x)
    _same(got, fn(x))
    soft = lambda x: (torch.softmax(x[:1] * 0.125, -1),)  # noqa: E731
    _close(_compiled(soft, x), soft(x), ulps=2)
    if cpu_backend == "cpp":
        half = "bf16" if dtype is torch.bfloat16 else "f16"
        assert any(f"ember_round_{half}(acc_" in s for s in sources)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_chains_and_transcendentals(dtype, cpu_backend):
    """A fused chain rounds once where eager rounds per op, and exp/tanh/erf differ from
    eager's in float's last bits: one ulp at most (two for the chain)."""
    a, b = (t.clamp(-8, 8).nan_to_num(0.0) for t in _operands(dtype))
    fn = lambda a, b: (a.exp(), a.tanh(), a.sigmoid(), F.gelu(a), F.silu(a))  # noqa: E731
    _close(_compiled(fn, a, b), fn(a, b))
    chain = lambda a, b: ((a * b + 1).relu() * 0.5,)  # noqa: E731
    _close(_compiled(chain, a, b), chain(a, b), ulps=2)
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_reductions_accumulate_in_float(dtype, cpu_backend):
    """sum, mean, var, std of half inputs return half computed with float accumulators (a
    bfloat16 accumulator of 4096 ones would stop at 256); max and argmax exact."""
    torch.manual_seed(0)
    x = (torch.rand(4, 4096) + 0.5).to(dtype)
    fn = lambda x: (x.sum(), x.sum(1), x.mean(1), x.var(1), x.std(), x.float().sum(1),  # noqa: E731
                    x.sum(0), x.mean())
    _close(_compiled(fn, x), fn(x))
    exact = lambda x: (x.amax(1), x.amin(0), x.argmax(1), x.max())  # noqa: E731
    _same(_compiled(exact, x), exact(x))
    ones = torch.ones(4096, dtype=dtype)
    _same(_compiled(lambda t: (t.sum(),), ones), (ones.sum(),))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_mean_rounds_once(dtype, cpu_backend):
    """mean sums and divides in float and rounds once, as eager (not a half sum divided
    and rounded again). Multiples of 1/64 below 2: float sums them exactly in any order."""
    torch.manual_seed(0)
    x = (torch.randint(-128, 128, (64, 1000)) / 64).to(dtype)
    fn = lambda x: (x.mean(1), x.mean(0, keepdim=True), x.mean(), x.sum(1))  # noqa: E731
    _same(_compiled(fn, x), fn(x))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_scatter_sums_round_as_eager(dtype, cpu_backend):
    """Duplicate indices: eager's CPU index_add and scatter_add sum in float and round
    once, its index_put with accumulate rounds after each addition."""
    torch.manual_seed(0)
    x, v = torch.randn(50, 8).to(dtype), torch.randn(200, 8).to(dtype)
    idx = torch.randint(0, 50, (200,))
    fn = lambda x, v, idx: (x.index_add(0, idx, v),  # noqa: E731
                            x.scatter_add(0, idx[:, None].expand(200, 8), v),
                            x.clone().index_put_((idx,), v, accumulate=True))
    _same(_compiled(fn, x, v, idx), fn(x, v, idx))
    _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", HALF, ids=_ids)
def test_softmax_and_layer_norm(dtype, cpu_backend):
    torch.manual_seed(0)
    x = (torch.randn(8, 384) * 3).to(dtype)
    w, b = torch.randn(384).to(dtype), torch.randn(384).to(dtype)
    def fn(x, w, b):
        return (x.softmax(-1), x.log_softmax(-1), F.layer_norm(x, (384,), w, b),
                x.softmax(0), F.layer_norm(x, (384,)))
    _close(_compiled(fn, x, w, b), fn(x, w, b), ulps=2)
    _check_kernels(cpu_backend)


def test_autocast_bfloat16_uses_half_kernels(cpu_backend, monkeypatch):
    """``torch.autocast("cpu", torch.bfloat16)`` inside the compiled frame: the linear runs
    in bfloat16 (the library's: on a CPU without bf16 GEMMs Ember would multiply in float32,
    test_half_matmuls.py), the GELU, the residual add and the layer norm after it in
    generated kernels reading and writing bfloat16."""
    from ember.backend.targets import CpuPolicy
    monkeypatch.setattr(CpuPolicy, "upcasts_half_matmuls", lambda self, dtype: False)
    torch.manual_seed(0)
    lin, norm = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)
    x = torch.randn(16, 64)

    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = F.gelu(lin(x))
            return norm(h + x), h
    expected = fn(x)
    compile_stats.reset()
    actual, sources = run_and_get_code(fn, x)
    assert actual[1].dtype == torch.bfloat16 and actual[0].dtype == expected[0].dtype
    _close(actual, expected, ulps=2)
    if cpu_backend == "cpp":
        assert any("ember_to_bf16" in s for s in sources), sources
        assert dict(compile_stats.extern_calls) == {"aten.addmm.default": 1}
        _check_kernels(cpu_backend)


@pytest.mark.parametrize("dtype", [
    torch.float16,
    pytest.param(torch.bfloat16, marks=pytest.mark.skip(
        reason="Triton's interpreter converts bfloat16 wrongly (NaNs, rounding): its target "
               "has no bfloat16 kernels")),
], ids=_ids)
def test_triton_interpreter_half_loads_stores_casts(dtype, cpu_backend, monkeypatch):
    """The Triton target's half loads (widened to float32), stores (rounded) and casts,
    run by the interpreter: its target has no half kernels (DESIGN.md), so the test lets it
    generate them for float16, whose numpy conversions are IEEE's."""
    if cpu_backend != "triton":
        pytest.skip("the Triton interpreter's own half kernels")
    from ember.backend.targets import COMMON_DTYPES
    from ember.backend.targets.triton import target as triton_target
    monkeypatch.setattr(triton_target, "COMMON_DTYPES", COMMON_DTYPES | {dtype})
    x = _special_floats()
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    n = torch.tensor([0, 1, -1, 257, 2049, 65505, 2 ** 24 + 1], dtype=torch.int64)
    fn = lambda x, h, n: (x.to(dtype), h.float(), h.view(256, 256).t() * 1,  # noqa: E731
                          n.to(dtype), h.to(torch.float64))
    _same(_compiled(fn, x, bits, n), fn(x, bits, n))
    assert compile_stats.generated_kernel_count > 0
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)
