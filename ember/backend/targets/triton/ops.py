"""The Triton ops handler: Triton expressions for the ``ops`` a loop body calls.

Values carry the IR dtype and the tile axes they vary over (``dims``: a subset of
``{"x", "r"}``), which give each load and store its mask. Half-precision values are held in
float32 (a load upcasts, a store rounds to the storage dtype, an explicit ``to_dtype`` to
float16/bfloat16 rounds and widens again), so fused chains compute like eager's float32
"opmath" per op.

Math goes through ``tl`` where Triton has the function; the rest through libdevice on the
GPU. Triton's interpreter (``TRITON_INTERPRET=1``, used to run generated code on CPUs) has
no libdevice: there the same names are small ``@triton.jit`` helpers computed in float64
(``INTERPRETER_MATH``), accurate well past float32's rounding.

Integer division (``//``, ``%``, fmod, trunc and floor division) by anything but a constant
other than 0 and -1 divides by a safe divisor (1 where the divisor is 0 or -1; the
quotient by -1 is the wrapping negation): no kernel traps or overflows. Under the
interpreter (CPU tensors) a zero divisor also sets a flag the kernel is passed, and the
wrapper raises eager's ``RuntimeError: ZeroDivisionError``; on a GPU nothing is raised
(eager's CUDA kernels do not raise either, and a flag would cost a synchronisation), and a
zero divisor's quotient is the dividend (remainder 0).
"""
from __future__ import annotations

import math

import sympy
import torch

from ember import config
from ember.backend.codegen.common import HALF, IndexPrinter, Value, float_of_sizes

TL_TYPES = {torch.float32: "tl.float32", torch.float64: "tl.float64",
            torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
            torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
            torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}


def compute_type(dtype: torch.dtype) -> str:
    """The Triton type a value of ``dtype`` is computed in."""
    return "tl.float32" if dtype in HALF else TL_TYPES[dtype]


class TritonValue(Value):
    __slots__ = ("dims",)

    def __init__(self, name: str, dtype: torch.dtype, dims: frozenset = frozenset()):
        super().__init__(name, dtype)
        self.dims = dims


class TritonIndexPrinter(IndexPrinter):
    def floordiv(self, a: str, b: str) -> str:
        return f"({a} // {b})"     # operands are non-negative: truncation is the floor

    def python_mod(self, a: str, b: str) -> str:
        """Python's ``a % b`` (the divisor's sign) from Triton's, which truncates like C:
        right for every sign of either operand, for a divisor other than 0."""
        return f"((({a} % {b}) + {b}) % {b})"

    def python_floordiv(self, a: str, b: str) -> str:
        # a minus its Python remainder divides exactly: truncation is the floor there
        return f"(({a} - {self.python_mod(a, b)}) // {b})"

    fold_template = "tl.{fn}imum({a}, {b})"

    def float_to_int(self, rounding: str, e) -> str:
        value = triton_float(e)
        if rounding != "trunc":     # (a cast to an int truncates)
            value = f"tl.{rounding}({value})"
        return f"({value}).to(tl.int64)"


triton_index = TritonIndexPrinter()


def triton_float(e) -> str:
    """Triton (float64 arithmetic) for a float expression of sizes (``codegen.common``)."""
    return float_of_sizes(e, lambda i: f"({triton_index(i)}).to(tl.float64)", "tl.sqrt({})",
                          None)


# ops that are one tl expression on every target: {0} (and {1}) the operands; in
# UNARY_TRITON {1} is the type it computes in (``TritonTarget.op_templates``:
# ``targets.register_op`` adds to these)
UNARY_TRITON = {
    "neg": "-{0}", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "log": "tl.log({0})", "log2": "tl.log2({0})", "sqrt": "tl.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})",
    "erf": "tl.erf({0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "gelu": "({0}) * 0.5 * (1.0 + tl.erf(({0}) * 0.7071067811865476))",
    "gelu_grad": "0.5 * (1.0 + tl.erf(({0}) * 0.7071067811865476)) + ({0}) * "
                 "(0.3989422804014327 * tl.exp(({0}) * ({0}) * -0.5))",
    "sigmoid": "tl.sigmoid({0})", "reciprocal": "1.0 / {0}", "square": "{0} * {0}",
    "relu": "tl.where(({0} > 0) | ({0} != {0}), {0}, 0)",
    "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    "frac": "{0} - tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    "sign": "({0} > 0).to({1}) - ({0} < 0).to({1})",     # 0 for NaN, as eager's
    "log10": "tl.log({0}) * 0.4342944819032518",
}
BINARY_TRITON = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}",
    # nested selects, not |: see TritonOpsHandler.truth
    "maximum": "tl.where({0} != {0}, {0}, tl.where({0} > {1}, {0}, {1}))",
    "minimum": "tl.where({0} != {0}, {0}, tl.where({0} < {1}, {0}, {1}))",
    "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
    "bitwise_left_shift": "{0} << {1}", "bitwise_right_shift": "{0} >> {1}",
}
_BOOL_BITWISE = {"bitwise_and": "logical_and", "bitwise_or": "logical_or",
                 "bitwise_xor": "logical_xor"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# ops that are the identity on some dtypes: rounding on integers (tl's and libdevice's
# versions take floats only), sign on bool (its formula subtracts, which bool lacks)
_IDENTITY_ON = {**dict.fromkeys(("floor", "ceil", "trunc", "round"),
                                lambda dtype: not dtype.is_floating_point),
                "sign": lambda dtype: dtype is torch.bool}
# Approximate versions for values eager rounds to float16/bfloat16 (their errors, ~1e-6
# relative, are far below half precision's 5e-4 and 4e-3): the precise sin and IEEE division
# cost enough instructions to make a memory-bound chain compute-bound (H200, the 10-op
# pointwise benchmark: 79% of copy bandwidth precise, 101% approximate). GPU only.
_FAST_HALF = {"sin": "libdevice.fast_sinf({0})", "cos": "libdevice.fast_cosf({0})",
              "truediv": "libdevice.fast_dividef({0}, {1})"}
# libdevice on the GPU; the interpreter's helpers of the same names (below)
_LIBM_UNARY = ("expm1", "log1p", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
               "asinh", "acosh", "atanh", "erfc", "nearbyint")
_LIBM_BINARY = ("pow", "atan2", "hypot", "copysign", "nextafter", "fmod")

HELPERS = '''
@triton.jit
def ember_floordiv_int(a, b):
    q = a // b
    return tl.where((a % b != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def ember_floordiv_float(a, b):
    # Python's floor division, from the exact remainder (``%`` on floats is C's fmod):
    # floor(a / b) is off by one where the quotient rounds up to an integer
    m = a % b
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1.0, d)
    f = tl.floor(d)
    f = tl.where(d - f > 0.5, f + 1.0, f)
    q = a / b
    return tl.where(b == 0, q, tl.where(d == 0, q * 0.0, f))


@triton.jit
def ember_remainder(a, b):
    m = a % b
    return tl.where((m != 0) & ((m < 0) != (b < 0)), m + b, m)


@triton.jit
def ember_prod(a, b):
    return a * b


@triton.jit
def ember_max(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def ember_min(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def ember_argmax(a, ai, b, bi):
    # the larger value; NaN wins; on a tie (or two NaNs) the first index
    a_nan = a != a
    b_nan = b != b
    pick = (a > b) | (a_nan & ~b_nan) | (((a == b) | (a_nan & b_nan)) & (ai < bi))
    return tl.where(pick, a, b), tl.where(pick, ai, bi)


@triton.jit
def ember_argmin(a, ai, b, bi):
    a_nan = a != a
    b_nan = b != b
    pick = (a < b) | (a_nan & ~b_nan) | (((a == b) | (a_nan & b_nan)) & (ai < bi))
    return tl.where(pick, a, b), tl.where(pick, ai, bi)


@triton.jit
def ember_welford(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # Chan et al.: the state of two disjoint sets of elements merged
    n = n_a + n_b
    w = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    d = mean_b - mean_a
    return mean_a + d * w, m2_a + m2_b + d * d * n_a * w, n
'''

GPU_IMPORTS = "from triton.language.extra import libdevice\n"

# float64 formulas for the interpreter, where libdevice does not exist
INTERPRETER_MATH = '''
@triton.jit
def ember_expm1(x):
    d = x.to(tl.float64)
    small = tl.abs(d) < 1e-5
    return tl.where(small, d + 0.5 * d * d, tl.exp(d) - 1.0).to(x.dtype)


@triton.jit
def ember_log1p(x):
    d = x.to(tl.float64)
    u = 1.0 + d
    return tl.where(u == 1.0, d, tl.log(u) * d / (u - 1.0)).to(x.dtype)


@triton.jit
def ember_tan(x):
    d = x.to(tl.float64)
    return (tl.sin(d) / tl.cos(d)).to(x.dtype)


@triton.jit
def ember_atan(x):
    d = x.to(tl.float64)
    a = tl.abs(d)
    inv = a > 1.0
    t = tl.where(inv, 1.0 / a, a)
    # argument reduction to |t| <= tan(pi/12), then a short series
    big = t > 0.2679491924311227
    t2 = tl.where(big, (t * 1.7320508075688772 - 1.0) / (t + 1.7320508075688772), t)
    s = t2 * t2
    p = t2 * (1.0 + s * (-1.0 / 3 + s * (1.0 / 5 + s * (-1.0 / 7 + s * (1.0 / 9 + s * (
        -1.0 / 11 + s * (1.0 / 13 + s * (-1.0 / 15 + s * (1.0 / 17 - s / 19)))))))))
    p = tl.where(big, p + 0.5235987755982988, p)
    p = tl.where(inv, 1.5707963267948966 - p, p)
    return tl.where(d < 0, -p, p).to(x.dtype)


@triton.jit
def ember_asin(x):
    d = x.to(tl.float64)
    return ember_atan(d / tl.sqrt(1.0 - d * d)).to(x.dtype)


@triton.jit
def ember_acos(x):
    d = x.to(tl.float64)
    return (1.5707963267948966 - ember_atan(d / tl.sqrt(1.0 - d * d))).to(x.dtype)


@triton.jit
def ember_sinh(x):
    d = x.to(tl.float64)
    return tl.where(tl.abs(d) < 1e-5, d, 0.5 * (tl.exp(d) - tl.exp(-d))).to(x.dtype)


@triton.jit
def ember_cosh(x):
    d = x.to(tl.float64)
    return (0.5 * (tl.exp(d) + tl.exp(-d))).to(x.dtype)


@triton.jit
def ember_tanh(x):
    d = x.to(tl.float64)
    e = tl.exp(-2.0 * tl.abs(d))
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(tl.abs(d) < 1e-5, tl.abs(d), t)
    return tl.where(d < 0, -t, t).to(x.dtype)


@triton.jit
def ember_asinh(x):
    d = x.to(tl.float64)
    a = tl.abs(d)
    r = tl.where(a < 1e-5, a, tl.log(a + tl.sqrt(a * a + 1.0)))
    return tl.where(d < 0, -r, r).to(x.dtype)


@triton.jit
def ember_acosh(x):
    d = x.to(tl.float64)
    return tl.log(d + tl.sqrt(d * d - 1.0)).to(x.dtype)


@triton.jit
def ember_atanh(x):
    d = x.to(tl.float64)
    return tl.where(tl.abs(d) < 1e-5, d, 0.5 * tl.log((1.0 + d) / (1.0 - d))).to(x.dtype)


@triton.jit
def ember_erfc(x):
    d = x.to(tl.float64)
    return (1.0 - tl.erf(d)).to(x.dtype)


@triton.jit
def ember_nearbyint(x):
    # round half to even
    f = tl.floor(x)
    diff = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0
    r = tl.where(diff > 0.5, f + 1.0, tl.where(diff < 0.5, f, tl.where(odd, f + 1.0, f)))
    return tl.where(r == 0, x * 0.0, r)     # -0.2 rounds to -0.0, as rint does


@triton.jit
def ember_pow(a, b):
    da = a.to(tl.float64)
    db = b.to(tl.float64)
    r = tl.exp2(db * tl.log2(tl.abs(da)))
    whole = tl.floor(db) == db
    odd = whole & ((db - 2.0 * tl.floor(db * 0.5)) != 0)
    # nested selects, not &: a 0-d b would reach & as numbers (TritonOpsHandler.truth)
    r = tl.where(da < 0, tl.where(odd, -r, tl.where(whole, r, float("nan"))), r)
    r = tl.where(db == 0, 1.0, r)
    return r.to(a.dtype)


@triton.jit
def ember_atan2(y, x):
    dy = y.to(tl.float64)
    dx = x.to(tl.float64)
    base = ember_atan(dy / dx)
    r = tl.where(dx > 0, base, tl.where(dy >= 0, base + 3.141592653589793,
                                          base - 3.141592653589793))
    r = tl.where(dx == 0, tl.where(dy > 0, 1.5707963267948966,
                                   tl.where(dy < 0, -1.5707963267948966, 0.0)), r)
    return r.to(y.dtype)


@triton.jit
def ember_hypot(a, b):
    da = a.to(tl.float64)
    db = b.to(tl.float64)
    return tl.sqrt(da * da + db * db).to(a.dtype)


@triton.jit
def ember_copysign(a, b):
    neg = (b < 0) | ((b == 0) & (1.0 / b < 0))
    return tl.where(neg, -tl.abs(a), tl.abs(a))


@triton.jit
def ember_fmod(a, b):
    return a % b
'''


def interpreter_math_missing() -> list[str]:
    """Functions of _LIBM_* without an interpreter formula (none are allowed)."""
    return [n for n in _LIBM_UNARY + _LIBM_BINARY
            if n != "nextafter" and f"def ember_{n}(" not in INTERPRETER_MATH]


def triton_constant(value, dtype: torch.dtype) -> str:
    if isinstance(value, sympy.Expr):
        value = int(value) if value.is_Integer else float(value)
    if dtype is torch.bool:
        return f"tl.full([], {bool(value)}, tl.int1)"
    if dtype.is_floating_point:
        value = float(value)
        text = repr(value) if math.isfinite(value) else f'float("{value}")'
    else:
        # wrapped into the dtype's range, as a cast in eager wraps it (uint8's clamp(-3, 7)
        # clamps from 253)
        info = torch.iinfo(dtype)
        text = str((int(value) - info.min) % (1 << info.bits) + info.min)
    return f"tl.full([], {text}, {compute_type(dtype)})"


class TritonOpsHandler:
    """Emits Triton for the ops a body calls, into the kernel's current scope."""

    def __init__(self, kernel):
        self.k = kernel

    def _emit(self, text: str, dtype: torch.dtype, *operands) -> TritonValue:
        dims = frozenset().union(*[getattr(o, "dims", frozenset()) for o in operands])
        return self.k.cse(text, dtype, dims)

    def load(self, name: str, index) -> TritonValue:
        return self.k.load(name, index)

    def constant(self, value, dtype) -> TritonValue:
        if isinstance(value, sympy.Expr) and value.free_symbols:    # a symbolic size
            text = f"({triton_index(value)})" if value.is_integer else triton_float(value)
            if dtype is torch.bool:
                return self._emit(f"({text} != 0)", dtype)
            return self._emit(f"{text}.to({compute_type(dtype)})", dtype)
        out = self._emit(triton_constant(value, dtype), dtype)
        if not dtype.is_floating_point and dtype is not torch.bool and (
                isinstance(value, int) or (isinstance(value, sympy.Expr) and value.is_Integer)):
            self.k.int_constants[out.name] = int(value)
        return out

    def index_expr(self, expr, dtype) -> TritonValue:
        if not sympy.sympify(expr).free_symbols:   # a Python int has no .to()
            return self.constant(expr, dtype)
        text, dims = self.k.index(expr)
        return self.k.cse(f"({text}).to({compute_type(dtype)})", dtype, dims)

    def to_dtype(self, x: TritonValue, dtype) -> TritonValue:
        if x.dtype == dtype:
            return x
        if dtype is torch.bool:
            return self._emit(f"({x} != 0)", dtype, x)
        if dtype in HALF:   # round as eager would, then compute on in float32
            return self._emit(f"{x}.to({TL_TYPES[dtype]}).to(tl.float32)", dtype, x)
        if x.dtype in HALF and dtype is torch.float32:
            return TritonValue(x.name, dtype, x.dims)
        return self._emit(f"{x}.to({TL_TYPES[dtype]})", dtype, x)

    def where(self, c, a, b) -> TritonValue:
        return self._emit(f"tl.where({c}, {a}, {b})", a.dtype, c, a, b)

    def rand(self, seed, offset):
        return self._emit(f"tl.rand({seed}, {offset}.to(tl.uint32))", torch.float32,
                          seed, offset)

    def randn(self, seed, offset):
        return self._emit(f"tl.randn({seed}, {offset}.to(tl.uint32))", torch.float32,
                          seed, offset)

    def masked(self, mask, body, other):
        """``body()`` where ``mask`` holds (its loads masked by it too), ``other`` elsewhere."""
        self.k.load_masks.append(mask)
        try:
            value = body()
        finally:
            self.k.load_masks.pop()
        if not isinstance(other, TritonValue):
            other = self.constant(other, value.dtype)
        return self.where(mask, value, other)

    def logical_not(self, a):
        return self._emit(f"({a} == 0)", torch.bool, a)

    def truth(self, a, beside: frozenset) -> str:
        """``a != 0`` as an operand of & | ^ beside values varying over the axes ``beside``.
        Triton's interpreter gives a 0-d comparison its operands' type, so broadcast
        against a block it arrives as numbers, which & | ^ reject: there it is rebuilt from
        int1 constants."""
        if self.k.interpret and not a.dims and beside:
            return f"tl.where({a} != 0, True, False)"
        return f"({a} != 0)"

    def _logical(self, sign: str, a, b):
        return self._emit(f"{self.truth(a, b.dims)} {sign} {self.truth(b, a.dims)}",
                          torch.bool, a, b)

    def logical_and(self, a, b):
        return self._logical("&", a, b)

    def logical_or(self, a, b):
        return self._logical("|", a, b)

    def logical_xor(self, a, b):
        return self._logical("^", a, b)

    def bitwise_not(self, a):
        if a.dtype is torch.bool:
            return self._emit(f"({a} == 0)", torch.bool, a)
        # all ones of the dtype (the interpreter's ``~`` of an unsigned value overflows)
        return self._emit(f"{a} ^ {triton_constant(-1, a.dtype)}", a.dtype, a)

    def isnan(self, a):
        return self._emit(f"({a} != {a})", torch.bool, a)

    def isinf(self, a):
        return self._emit(f"(tl.abs({a}) == float(\"inf\"))", torch.bool, a)

    def floordiv(self, a, b):
        if a.dtype.is_floating_point:
            return self._emit(f"ember_floordiv_float({a}, {b})", a.dtype, a, b)
        return self._int_division("ember_floordiv_int({0}, {1})", a, b, negate=True)

    def truncdiv(self, a, b):
        if a.dtype.is_floating_point:
            q = self._emit(f"{a} / {b}", a.dtype, a, b)
            return self._emit(f"tl.where({q} < 0, tl.ceil({q}), tl.floor({q}))", a.dtype, q)
        return self._int_division("{0} // {1}", a, b, negate=True)   # Triton divides like C

    def remainder(self, a, b):
        if a.dtype.is_floating_point:
            return self._emit(f"ember_remainder({a}, {b})", a.dtype, a, b)
        return self._int_division("ember_remainder({0}, {1})", a, b)   # x % -1 == x % 1

    def fmod(self, a, b):
        if a.dtype.is_floating_point:
            return self._emit(f"{a} % {b}", a.dtype, a, b)
        return self._int_division("{0} % {1}", a, b)

    def _int_division(self, template: str, a, b, negate: bool = False) -> TritonValue:
        """An integer division (``template`` of the operands): by a constant other than 0
        and -1 as it is; otherwise by a safe divisor, 1 where ``b`` is 0 or -1 (a quotient
        by -1 is the wrapping negation; INT_MIN / -1 overflows), and under the interpreter
        each zero divisor of an element computed sets the kernel's flag, which the wrapper
        turns into eager's ZeroDivisionError. On a GPU a zero divisor gives what the kernel
        gives (eager's CUDA kernels do not raise either), but never a trap."""
        known = self.k.int_constants.get(b.name)
        if known is not None and known not in (0, -1):
            return self._emit(template.format(a, b), a.dtype, a, b)
        one = triton_constant(1, a.dtype)
        signed = a.dtype.is_signed
        safe = f"tl.where({b} == 0, {one}, tl.where({b} == -1, {one}, {b}))" if signed else \
            f"tl.where({b} == 0, {one}, {b})"
        divisor = self._emit(safe, a.dtype, b)
        q = self._emit(template.format(a, divisor), a.dtype, a, divisor)
        if negate and signed:
            q = self._emit(f"tl.where({b} == -1, -{q}, {q})", a.dtype, b, q)
        if self.k.interpret and self.k.flags_errors:
            self.k.flag_zero_division(b, a.dims | b.dims)
        return q

    def pow(self, a, b):
        return self._libm("pow", a.dtype, a, b)

    def _libm(self, name: str, dtype, *args) -> TritonValue:
        fn = f"ember_{name}" if self.k.interpret else f"libdevice.{name}"
        if name == "nextafter" and self.k.interpret:
            raise NotImplementedError("nextafter under the Triton interpreter")
        return self._emit(f"{fn}({', '.join(map(str, args))})", dtype, *args)

    def indirect_indexing(self, value, size, wrap_negative=False, check=None) -> sympy.Symbol:
        return self.k.indirect_indexing(value, size, wrap_negative, check)

    def __getattr__(self, name):
        op = self._op(name)
        if name in _IDENTITY_ON:
            return lambda a: a if _IDENTITY_ON[name](a.dtype) else op(a)
        return op

    def _fast(self, name: str, dtype: torch.dtype) -> bool:
        return name in _FAST_HALF and dtype in HALF and not self.k.interpret and \
            config.half_fast_math

    def _op(self, name):
        if name in UNARY_TRITON:
            def unary(a):
                template = _FAST_HALF[name] if self._fast(name, a.dtype) else UNARY_TRITON[name]
                return self._emit(template.format(a, compute_type(a.dtype)), a.dtype, a)
            return unary
        if name in BINARY_TRITON:
            logical = _BOOL_BITWISE.get(name)

            def binary(a, b):
                if logical and a.dtype is torch.bool:   # operands may be 0-d comparisons
                    return getattr(self, logical)(a, b)
                template = _FAST_HALF[name] if self._fast(name, a.dtype) else BINARY_TRITON[name]
                return self._emit(template.format(a, b), a.dtype, a, b)
            return binary
        if name in _COMPARE:
            sign = _COMPARE[name]
            return lambda a, b: self._emit(f"{a} {sign} {b}", torch.bool, a, b)
        if name in _LIBM_UNARY:
            return lambda a: self._libm(name, a.dtype, a)
        if name == "round":
            return lambda a: self._libm("nearbyint", a.dtype, a)
        if name in _LIBM_BINARY:
            return lambda a, b: self._libm(name, a.dtype, a, b)
        raise AttributeError(f"no Triton for ops.{name}")
