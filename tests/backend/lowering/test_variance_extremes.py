"""var, std, var_mean, std_mean and the norms' statistics of huge and constant values,
against eager on both CPU targets. Eager's CPU var/std keep float64 statistics for float32
(Ember's float32 sums of squared deviations overflowed: inf where eager has 1e34, NaN for
a constant row of 1e20); its layer_norm and group_norm keep float32 ones (eager's
variance is inf there, its output 0); a constant row normalises to exactly 0. Each case
runs one pass (Welford) and two passes (``WELFORD_MIN_NUMEL``)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend.lowering import reductions
from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("cpu_backend", "fresh_no_grad")


@pytest.fixture(params=["two_pass", "welford"])
def passes(request, monkeypatch):
    if request.param == "welford":
        monkeypatch.setattr(reductions, "WELFORD_MIN_NUMEL", 1)
    return request.param


def assert_like_eager(got, want, scale: float):
    """Values within float32 rounding of statistics of values of magnitude ``scale``
    (a variance's error grows with the mean squared), inf and NaN where eager has them."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.isinf(), w.isinf()), (g, w)
        finite = w.isfinite()
        torch.testing.assert_close(g[finite], w[finite], rtol=1e-4, atol=1e-10 * scale)


def check(fn, x, scale):
    want = fn(x)
    got = ember.compile(fn, backend="ember")(x)
    assert_like_eager(got, want, scale)


def test_variance_of_huge_values(passes):
    torch.manual_seed(0)
    x = torch.randn(3, 2000) * 1e18          # sums of squared deviations pass 1e39
    check(lambda t: (t.var(-1), t.std(-1, correction=0), *torch.var_mean(t, -1),
                     *torch.std_mean(t, 1, correction=0, keepdim=True)), x, 1e36)
    check(lambda t: (t.var((0, 2), keepdim=True), t.std(0)), x.view(3, 40, 50), 1e36)


def test_variance_of_constant_rows(passes):
    x = torch.tensor([1e20, 1000.1, -3.5, 0.1]).repeat_interleave(3000).view(4, 3000)
    check(lambda t: (t.var(-1), t.std(-1), *torch.var_mean(t, -1, correction=0)), x, 1e40)


def test_variance_of_one_result_takes_eager_float_mean():
    # eager's var of one value: the mean in float32 (whose sum overflows here: NaN), then
    # double deviations; var_mean's mean is double (finite)
    x = torch.full((2, 600), 1e36)
    check(lambda t: (t.var(), t.std(), *torch.var_mean(t)), x, 1e72)
    check(lambda t: (t.var(),), torch.randn(2, 600) * 1e17, 1e34)


def test_norm_statistics_of_huge_and_constant_values():
    torch.manual_seed(0)
    big = torch.randn(4, 3, 1000) * 1e18
    const = torch.tensor([0.1, 1000.1, 3.3e7, 1e19]).repeat_interleave(3000).view(4, 3, 1000)
    for x in (big, const):
        check(lambda t: (F.layer_norm(t, (1000,)), F.group_norm(t, 3),
                         F.batch_norm(t, None, None, training=True)), x, 1.0)
    # (not of constant rows: eager's instance norm computes x * a + b there, not exactly
    # 0: -2.9e-7 for rows of 0.1, -1.1e14 for 1e19; Ember's (x - mean) * a is 0)
    check(lambda t: (F.instance_norm(t),), big, 1.0)


def test_batch_norm_running_statistics_of_huge_values():
    # eager's CPU batch norm sums in double but stores its sum of squared deviations in
    # float32: inf here (a double variance would be 1e36), its output 0, running_var inf
    torch.manual_seed(0)
    x = torch.randn(4, 3, 1000) * 1e18

    def fn(t, mean, var):
        return F.batch_norm(t, mean, var, training=True)
    stats, expected_stats = [torch.zeros(3), torch.ones(3)], [torch.zeros(3), torch.ones(3)]
    got = ember.compile(fn, backend="ember")(x, *stats)
    assert_like_eager([got, *stats], [fn(x, *expected_stats), *expected_stats], 1e36)


def test_norm_of_one_element_is_its_magnitude():
    # found by fuzz_int_extremes.py: a 2-norm over a dim of size 1 squared 1e20 (inf);
    # eager's is |x| for every order but 0
    x = torch.tensor([[1e20], [0.0], [-2.0], [float("nan")], [float("-inf")]])
    check(lambda t: tuple(torch.linalg.vector_norm(t, p, dim=-1)
                          for p in (0, 1, 2, 3, 0.5, -1, float("inf"), float("-inf"))), x, 1.0)



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_norm_statistics_are_float32(dtype, cpu_backend):
    # a half norm's statistics are float32 sums (eager's are float32 too): exact for a
    # constant row, whose values normalise to exactly 0 (b with an affine; eager's Welford
    # mean is not exact there: 1.2e-7 for 0.1, 0.3 for -3.3e4); a group longer than 2**16
    # (2**13 for float16) keeps float64 sums, which stay exact there
    torch.manual_seed(0)
    const = torch.tensor([0.1, 1000.1, -3.3e4, 7.0]).repeat_interleave(2 * 777).view(4, 2, 777)
    rand = torch.randn(4, 2, 777) * 30 + 5
    w, b = torch.randn(777).to(dtype), torch.randn(777).to(dtype)

    def fn(t):
        return F.layer_norm(t, (777,), w, b), F.group_norm(t, 2), F.layer_norm(t, (777,))
    for x, exact in ((const.to(dtype), True), (rand.to(dtype), False)):
        ember.reset()
        result, sources = run_and_get_code(fn, x)
        for got, want, exactly in zip(result, fn(x), (b.expand(4, 2, 777), 0, 0)):
            assert got.dtype == want.dtype and got.shape == want.shape
            if exact:
                assert bool((got == exactly).all())
            else:
                torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7,
                                           atol=2 ** -7)
        if cpu_backend == "cpp":      # no float64 sums of widened half values
            assert not [line for line in "\n".join(sources).splitlines()
                        if "_fine[" in line and "double" in line]
    for size in (2 ** 17, 10001):     # past float16's 2**13 only, then past both
        # all significant bits set: 1.99609375 (bfloat16), 1.9990234375 (float16)
        full = 2 - torch.finfo(dtype).eps
        long_group = torch.full((1, 1, size), full, dtype=dtype)
        ember.reset()
        assert bool((ember.compile(lambda t: F.group_norm(t, 1))(long_group) == 0).all())
