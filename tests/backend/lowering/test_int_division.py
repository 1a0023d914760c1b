"""Integer division in generated code, against eager on both CPU targets: a zero divisor
raises eager's ``RuntimeError: ZeroDivisionError`` (the C++ kernels trapped with SIGFPE, or
SIGILL for a constant 0, and fmod/remainder returned garbage), ``INT_MIN // -1`` and its
remainders wrap as eager's do (SIGFPE before), and a constant divisor keeps the unchecked
fast path."""
from __future__ import annotations

import pytest
import torch

import ember
from ember.testing import run_and_get_code
from fuzz_int_extremes import ZERO_DIVISIONS, ZERO_PLACES

pytestmark = pytest.mark.usefixtures("cpu_backend", "fresh_no_grad")

# the divisions, and the ways a zero reaches them (a tensor divisor, a Python 0, a broadcast
# row inside a kernel that also reduces...): the fuzzer's tables
DIVISIONS, ZERO_DIVISORS = ZERO_DIVISIONS, ZERO_PLACES


def _eager_error(fn, *args):
    with pytest.raises(RuntimeError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("divisor", sorted(ZERO_DIVISORS))
@pytest.mark.parametrize("name", sorted(DIVISIONS))
def test_zero_divisor_raises_like_eager(name, divisor):
    fn = ZERO_DIVISORS[divisor](DIVISIONS[name])
    a = torch.arange(-6, 6, dtype=torch.int32).view(3, 4)
    b = torch.tensor([[3, 0, -2, 5]] * 3, dtype=torch.int32)
    message = _eager_error(fn, a, b)
    compiled = ember.compile(fn, backend="ember")
    with pytest.raises(RuntimeError, match="^" + message + "$"):
        compiled(a, b)
    if divisor != "scalar":   # called again with no zero, it computes (the flag was cleared)
        b = torch.where(b == 0, 7, b)
        torch.testing.assert_close(compiled(a, b), fn(a, b))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.uint8])
def test_extreme_quotients_wrap_like_eager(dtype):
    # INT_MIN by -1 (eager wraps floor division, remainder and fmod; its truncating division
    # of int32/int64 traps: not compared), mixed signs, the largest magnitudes
    info = torch.iinfo(dtype)
    values = [info.min, info.min + 1, -7, -1, 0, 1, 7, info.max - 1, info.max]
    a = torch.tensor([v for v in values for _ in values], dtype=dtype)
    b = torch.tensor([v for _ in values for v in values], dtype=dtype)
    b = torch.where(b == 0, torch.ones_like(b), b)
    trunc_ok = dtype in (torch.int8, torch.int16, torch.uint8)

    def fn(a, b):
        out = (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="floor"),
               a // -1 if dtype != torch.uint8 else a // 3, torch.fmod(a, -1), a % -1)
        return out + ((torch.div(a, b, rounding_mode="trunc"),) if trunc_ok else ())
    got = ember.compile(fn, backend="ember")(a, b)
    for g, e in zip(got, fn(a, b)):
        assert g.dtype == e.dtype and torch.equal(g, e), (g, e)


def test_int64_fmod_is_exact():
    # std::fmod went through double: wrong past 2**53
    a = torch.tensor([2**62 + 1, -(2**62) - 3, 2**53 + 1], dtype=torch.int64)
    b = torch.tensor([3, 7, 2], dtype=torch.int64)
    got = ember.compile(lambda a, b: torch.fmod(a, b), backend="ember")(a, b)
    assert torch.equal(got, torch.fmod(a, b))


def test_constant_divisor_is_not_checked(cpu_backend):
    # the fast path: a constant divisor other than 0 and -1 needs no flag
    fn = lambda a: (a // 4, a % 3, torch.fmod(a, -5))   # noqa: E731
    a = torch.arange(-20, 20, dtype=torch.int64)
    got, code = run_and_get_code(ember.compile(fn, backend="ember"), a)
    for g, e in zip(got, fn(a)):
        assert torch.equal(g, e)
    assert "ZeroDivisionError" not in "\n".join(code)


def test_clamp_bound_out_of_range_raises_like_eager():
    # found by fuzz_int_extremes.py: a bound an int8 cannot hold was wrapped (300 -> 44)
    # where eager raises; the ones eager takes wrap (uint8's -1 is 255)
    a = torch.tensor([100, -100, 5], dtype=torch.int8)
    fn = lambda t: t.clamp(-300, 300)   # noqa: E731
    message = _eager_error(fn, a)
    with pytest.raises(RuntimeError, match=message):
        ember.compile(fn, backend="ember")(a)
    u = a.to(torch.uint8)
    fn = lambda t: (t.clamp(-1), t.clamp(max=-200), t.clamp(3, 200))   # noqa: E731
    for g, e in zip(ember.compile(fn, backend="ember")(u), fn(u)):
        assert torch.equal(g, e)


def test_divisor_from_a_uint8_reduction():
    # found by fuzz_int_extremes.py: the interpreter's max of uint8 values is int32, which
    # Triton would not divide a uint8 by ("different signedness")
    a = torch.tensor([5, 250, 7], dtype=torch.uint8)
    b = torch.tensor([3, 2, 9], dtype=torch.uint8)
    fn = lambda a, b: (torch.fmod(a, b.amax()), a // b.amin(), a % b.sum(dtype=torch.uint8))  # noqa: E731
    for g, e in zip(ember.compile(fn, backend="ember")(a, b), fn(a, b)):
        assert g.dtype == e.dtype and torch.equal(g, e)
