"""Random programs over integer semantics and extreme floating-point values, compiled and
compared with eager: every output's values, dtype and shape, or eager's exception.

Each seed gives one program (one compiled graph) of several independent checks, so one
compilation covers many: a check is an op chain on the inputs, its result one output.

- ``int`` programs: two integer inputs (int8, int16, int32, int64 or uint8, values drawn
  from the dtype's extremes and small numbers) through floor/trunc division, remainder,
  fmod, ``//`` and ``%`` by tensors and scalars (-1 included), wrapping add/sub/mul/neg/abs,
  shifts by negative and too-large counts, bitwise ops, casts between integer dtypes, and
  integer sum/prod/amax/amin. Divisors hold no zero (one zero would turn the whole graph
  into an exception).
- ``zero`` programs: one integer division whose divisor holds a zero (a tensor, a Python
  0, or a row broadcast into a kernel that also reduces): eager raises
  ``RuntimeError: ZeroDivisionError``, and so must the compiled program.
- ``float`` programs: a float32 input drawn from +-inf, NaN, +-0, subnormals and huge and
  tiny magnitudes, through sum, mean, var, std, var_mean, vector norms, logsumexp, softmax,
  log_softmax, amax, amin, prod, layer_norm; half of the seeds compute var/std in one
  Welford pass (``WELFORD_MIN_NUMEL``).

Excluded, where eager is not deterministic or not defined: float fmod, remainder and
floor division where the quotient overflows or the divisor of a finite value is 0 or
infinite (eager's vector and scalar kernels differ there; ``_divisor`` makes such
divisors 1); the mean of var_mean and
std_mean of rows holding +-inf (eager's Welford update gives NaN or +-inf by the position
of the inf; the fuzzer zeroes infinities there); truncating division of int32/
int64 ``INT_MIN`` by -1 (eager's own kernel traps: the fuzzer maps such divisors to 1 first);
float-to-integer casts of NaN, inf or out-of-range values (platform-defined in eager: a
float is cast only after ``nan_to_num`` and clamping into range); magnitudes where a sum or
product overflows in one order of accumulation and not in another (huge values are 1e37 at
most, rows 16 elements at most, products see no huge values); layer_norm of rows whose
float32 statistics overflow (eager's output is NaN or 0 depending on the row length
modulo its vector width).

The tests run fixed seeds (``test_fuzz_int_extremes.py``); for a longer search:

    python tests/backend/fuzz/fuzz_int_extremes.py FIRST_SEED COUNT [cpp|triton]

(``triton`` needs ``TRITON_INTERPRET=1`` on a machine without a GPU). It prints each seed
whose outputs or exception differ from eager's, or whose compilation raises.
"""
from __future__ import annotations

import random
import sys

import torch
import torch.nn.functional as F

INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
SHAPE = (3, 6)


def _int_values(rng: random.Random, dtype, n: int, zero_free: bool) -> torch.Tensor:
    info = torch.iinfo(dtype)
    special = [info.min, info.min + 1, -7, -2, -1, 0, 1, 2, 3, 7, info.max - 1, info.max]
    special = [v for v in special if info.min <= v <= info.max]
    values = []
    for _ in range(n):
        v = rng.choice(special) if rng.random() < 0.6 else rng.randint(info.min, info.max)
        if zero_free and v == 0:
            v = rng.choice([1, -1 if info.min < 0 else 1, info.max])
        values.append(v)
    return torch.tensor(values, dtype=dtype).view(SHAPE)


def _safe_trunc(a, b):
    """Truncating division with eager's trap (int32/int64 ``INT_MIN / -1``) avoided."""
    if a.dtype in (torch.int32, torch.int64):
        b = torch.where(b == -1, torch.ones_like(b), b)
    return torch.div(a, b, rounding_mode="trunc")


# integer checks: name -> (fn(a, b) over the inputs, what it says)
INT_CHECKS = {
    "floordiv": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": _safe_trunc,
    "floordiv_minus_one": lambda a, b: a // -1,
    "remainder_minus_one": lambda a, b: torch.remainder(a, -1),
    "fmod_minus_one": lambda a, b: torch.fmod(a, -1),
    "floordiv_scalar": lambda a, b: a // 7,
    "remainder_scalar": lambda a, b: a % -3,
    "floordiv_broadcast": lambda a, b: (a // b[:1]) + (a % b[:, :1]),
    "wrap_arith": lambda a, b: a * b + a - b,
    "wrap_neg_abs": lambda a, b: (-a) ^ a.abs(),
    "shift_left": lambda a, b: a << b,
    "shift_right": lambda a, b: a >> b,
    "shift_scalar": lambda a, b: (a << 3) | (a >> 5),
    "bitwise": lambda a, b: (a & b) | (~a ^ b),
    "cast_narrow": lambda a, b: (a * 3).to(torch.int8) + b.to(torch.uint8),
    "cast_wide": lambda a, b: a.to(torch.int64) * b.to(torch.int16),
    "cast_float": lambda a, b: a.to(torch.float32) / b.to(torch.float32),
    "float_to_int": lambda a, b: (a.to(torch.float32) * 1.5).clamp(-1e6, 1e6).to(torch.int32),
    "sum": lambda a, b: (a // b).sum(-1),
    "prod": lambda a, b: (a % b).prod(0),
    "amax_amin": lambda a, b: torch.fmod(a, b).amax(-1) - a.amin(0)[:3],
    "fused_reduce": lambda a, b: (a // b[0]).sum(-1) + (a % b[:, :1]).amax(-1),
    "scalar_wraps": lambda a, b: a // 300 + a % 300 - (a + 300) * 300,   # 300 wraps in int8
    "scalar_divisor_tensor": lambda a, b: torch.remainder(5, b) + torch.fmod(a, b.amax()),
    "sum_all": lambda a, b: (a * b).sum() + a.prod(),
    "to_bool": lambda a, b: (a % b).to(torch.bool) ^ (a >> 1).to(torch.bool),
}

ZERO_DIVISIONS = {
    "floordiv": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
}
ZERO_PLACES = {
    "tensor": lambda op: lambda a, b: op(a, b),
    "scalar": lambda op: lambda a, b: op(a, 0),
    "fused": lambda op: lambda a, b: (op(a, b[0]).sum(-1), a.amax(-1)),
    # a clamp bound out of an int8's range raises in eager whatever the divisor
    "clamp_bound": lambda op: lambda a, b: op(a.clamp(-300, 300), b),
}

F32 = torch.finfo(torch.float32)


def _divisor(x, y):
    """``y`` with 1 where eager's float fmod, remainder and floor division are not
    deterministic: their vector kernels compute ``x - y * trunc(x / y)`` (NaN where
    ``x / y`` overflows, and for a finite ``x`` by 0 or +-inf), their scalar tails C's fmod
    (floor division by 0: +-inf), so the value depends on an element's position and the
    vector width."""
    unsafe = x.isfinite() & (y.isinf() | (y == 0) | (x.abs() > 1e6 * y.abs()))
    return torch.where(unsafe, torch.ones_like(y), y)


def _finite(x):
    """``x`` with +-inf as 0: eager's var_mean and std_mean mean of a row holding +-inf is
    NaN or +-inf by where the inf lies (its sequential Welford update), Ember's the sum's."""
    return torch.where(x.isinf(), torch.zeros_like(x), x)
# float values: specials, subnormals, huge and tiny (sums of 16 never overflow: 1.6e38)
FLOAT_SPECIALS = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e-45, -1e-45,
                  1e-40, 1e-38, -1e-38, 1e37, -1e37, 1.0, -3.5]
FLOAT_SCALES = [1e-30, 1e-5, 1.0, 1e5, 5e18]    # 5e18: float32 sums of squares overflow
FLOAT_CHECKS = {
    "sum": lambda x: x.sum(-1),
    "sum_all": lambda x: x.sum(),
    "sum_cols": lambda x: x.sum(0),
    "mean": lambda x: x.mean(-1),
    "var": lambda x: x.var(-1),
    "var0": lambda x: x.var(0, correction=0),
    "var_all": lambda x: x.var(),
    "std": lambda x: x.std(-1, keepdim=True),
    "std_all": lambda x: x.std(correction=0),
    "var_mean": lambda x: torch.cat(torch.var_mean(_finite(x), -1)),
    "std_mean": lambda x: torch.cat(torch.std_mean(_finite(x), 0, correction=0)),
    "var_mean_all": lambda x: torch.stack(torch.var_mean(_finite(x))),
    "norm2": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "norm1": lambda x: torch.linalg.vector_norm(x, 1, dim=0),
    "norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=-1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "softmax": lambda x: x.softmax(-1),
    "log_softmax": lambda x: x.log_softmax(0),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(0),
    "prod": lambda x: x.clamp(-4, 4).prod(-1),
    "exp_sum": lambda x: x.clamp(max=80).exp().sum(-1),
    "layer_norm": lambda x: F.layer_norm(x.clamp(-1e15, 1e15), x.shape[-1:]),
    # float division by 0, -0, +-inf, NaN
    "floordiv": lambda x: x // _divisor(x, x.flip(-1)),
    "fmod": lambda x: torch.fmod(x, _divisor(x, x.flip(0))),
    "remainder": lambda x: torch.remainder(x, _divisor(x, x.roll(1, -1))),
    "div_trunc": lambda x: torch.div(x, x.flip(-1), rounding_mode="trunc"),
    "div_floor_scalar": lambda x: torch.div(x, -0.75, rounding_mode="floor") + x // 3.0,
}


def make_program(seed: int):
    """``(kind, fn, inputs, description, welford)``: ``fn(*inputs)`` returns a tuple."""
    rng = random.Random(seed)
    kind = rng.choices(["int", "zero", "float"], [5, 2, 5])[0]
    if kind == "zero":
        name, place = rng.choice(sorted(ZERO_DIVISIONS)), rng.choice(sorted(ZERO_PLACES))
        dtype = rng.choice(INT_DTYPES)
        a = _int_values(rng, dtype, SHAPE[0] * SHAPE[1], zero_free=False)
        b = _int_values(rng, dtype, SHAPE[0] * SHAPE[1], zero_free=True)
        b.view(-1)[rng.randrange(SHAPE[1])] = 0          # in the first row: ``fused`` sees it
        if name == "div_trunc" and dtype in (torch.int32, torch.int64):
            b = torch.where(b == -1, torch.ones_like(b), b)
        fn = ZERO_PLACES[place](ZERO_DIVISIONS[name])
        return kind, lambda a, b: _tuple(fn(a, b)), (a, b), f"{name} by zero ({place}, {dtype})", False
    if kind == "int":
        dtype = rng.choice(INT_DTYPES)
        names = rng.sample(sorted(INT_CHECKS), rng.randint(4, 8))
        a = _int_values(rng, dtype, SHAPE[0] * SHAPE[1], zero_free=False)
        b = _int_values(rng, dtype, SHAPE[0] * SHAPE[1], zero_free=True)
        if rng.random() < 0.3:        # a mixed-dtype pair: promotion
            b = _int_values(rng, rng.choice(INT_DTYPES), SHAPE[0] * SHAPE[1], zero_free=True)

        def int_fn(a, b):
            return tuple(INT_CHECKS[n](a, b) for n in names)
        return kind, int_fn, (a, b), f"{', '.join(names)} of {a.dtype}, {b.dtype}", False
    scale = rng.choice(FLOAT_SCALES)
    rows, cols = rng.choice([(3, 5), (4, 16), (2, 8), (5, 1)])
    values = [rng.choice(FLOAT_SPECIALS) if rng.random() < rng.choice([0.0, 0.1, 0.3])
              else rng.gauss(0, 1) * scale for _ in range(rows * cols)]
    if rng.random() < 0.2:         # a constant row
        values[:cols] = [rng.choice([0.1, 1000.1, 3.3e7, 1e20, -2.5e-20])] * cols
    x = torch.tensor(values, dtype=torch.float32).view(rows, cols)
    names = rng.sample(sorted(FLOAT_CHECKS), rng.randint(5, 10))

    def float_fn(x):
        return tuple(FLOAT_CHECKS[n](x) for n in names)
    return kind, float_fn, (x,), f"{', '.join(names)} of x*{scale:g} {rows}x{cols}", \
        rng.random() < 0.5


def _tuple(value):
    return value if isinstance(value, tuple) else (value,)


def _differs(got, want, x=None) -> str | None:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{list(got.shape)}, eager's {want.dtype}{list(want.shape)}"
    if not want.dtype.is_floating_point:
        return None if torch.equal(got, want) else f"{got.tolist()}, eager's {want.tolist()}"
    if not (torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
            and torch.equal(got[got.isinf()], want[want.isinf()])):
        return f"inf/NaN at other places: {got.tolist()}, eager's {want.tolist()}"
    finite = want.isfinite()
    # statistics of values of magnitude m cancel: a mean is exact to ~eps * m (eager's
    # Welford mean of +-1e37 and small values is off by 1e20), a variance to ~eps * m^2
    m = x[x.isfinite()].abs().max().item() if x is not None and x.isfinite().any() else 1.0
    atol = max(1e-5, 1e-6 * m, 1e-10 * m * m if m * m < F32.max else 0.0)
    if not torch.allclose(got[finite].double(), want[finite].double(), rtol=1e-4, atol=atol):
        return f"{got.tolist()}, eager's {want.tolist()}"
    return None


def difference(seed: int, options=None) -> str | None:
    """Compile seed's program and run it: None when it matches eager (outputs, or the
    exception raised), else what differs."""
    import ember
    from ember.backend.lowering import reductions
    kind, fn, inputs, text, welford = make_program(seed)
    try:
        want, error = fn(*inputs), None
    except RuntimeError as e:
        want, error = None, str(e)
    ember.reset()
    saved = reductions.WELFORD_MIN_NUMEL
    reductions.WELFORD_MIN_NUMEL = 1 if welford else saved
    try:
        got = ember.compile(fn, backend="ember", options=options)(*inputs)
    except RuntimeError as e:
        if error is not None and str(e) == error:
            return None
        return f"{text}: {type(e).__name__}: {e}" + (f" (eager: {error})" if error else "")
    except Exception as e:                   # noqa: BLE001 -- reported as the difference
        return f"{text}: {type(e).__name__}: {e}"
    finally:
        reductions.WELFORD_MIN_NUMEL = saved
    if error is not None:
        return f"{text}: no exception, eager raised {error}"
    names = text.split(" of ")[0].split(", ")
    for i, (g, w) in enumerate(zip(got, want)):
        diff = _differs(g, w, inputs[0] if kind == "float" else None)
        if diff is not None:
            name = names[i] if i < len(names) else str(i)
            return f"{text}: output {i} ({name}) differs: {diff}; inputs {[t.tolist() for t in inputs]}"
    return None


def main(argv: list[str]) -> int:
    from fuzz_programs import search
    first, count = int(argv[0]), int(argv[1])
    options = {"cpu_backend": argv[2]} if len(argv) > 2 else None
    return search(lambda seed: difference(seed, options), first, count)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
