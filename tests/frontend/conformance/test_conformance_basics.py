"""Conformance: locals, globals, closures/cells, constants, operators on tensors and Python numbers.

Each program is compared with eager PyTorch on two input sets and must produce exactly one
graph (see conformance_util.check).
"""
import operator

import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)

# ----------------------------------------------------------------------------- globals

SCALE = 3.0
OFFSET = 2
AXES = (0, 1)
NAMES = ("alpha", "beta")
GLOBAL_TENSOR = torch.arange(4.0)


class _Config:
    """A tensor-free, module-level configuration object."""
    hidden = 4
    use_bias = True
    eps = 1e-5
    act = "relu"

    def __init__(self):
        self.depth = 3


CONFIG = _Config()


def g_constants(x):
    return x * SCALE + OFFSET


def g_tuple_constant(x):
    return x.sum(dim=AXES[1]) + len(NAMES)


def g_config_attrs(x):
    y = x * CONFIG.hidden
    if CONFIG.use_bias:
        y = y + CONFIG.eps
    for _ in range(CONFIG.depth):
        y = y * 0.5
    if CONFIG.act == "relu":
        y = torch.relu(y)
    return y


def g_global_tensor(x):
    return x + GLOBAL_TENSOR


def g_global_function(x):
    return _helper_double(x) + 1


def _helper_double(x):
    return x * 2


@pytest.mark.parametrize("fn", [g_constants, g_tuple_constant, g_config_attrs,
                                g_global_tensor, g_global_function], ids=lambda f: f.__name__)
def test_globals(fn):
    check(fn, (torch.randn(3, 4),))


# ----------------------------------------------------------------------------- locals / constants

def l_many_locals(x, y):
    a = x + y
    b = a * 2
    c = b - x
    a = c / 3          # rebinding
    del b
    return a, c


def l_constants(x):
    s = "text"
    n = None
    t = (1, 2.5, True)
    if n is None and s == "text":
        x = x * t[1] + t[0] - int(t[2])
    return x, s, t


def l_swap(x, y):
    x, y = y, x
    return x - y


def test_locals_many():
    check(l_many_locals, (torch.randn(3), torch.randn(3)), ops=4)


def test_locals_constants():
    check(l_constants, (torch.randn(2, 3),))


def test_locals_swap():
    check(l_swap, (torch.randn(3), torch.randn(3)), ops=1)


def test_builtin_names():
    def fn(x):
        n = len([1, 2, 3])
        m = max(n, 2)
        return x * m + abs(-1)
    check(fn, (torch.randn(4),))


# ----------------------------------------------------------------------------- closures / cells

def _make_scaled(k):
    def fn(x):
        return x * k
    return fn


def test_closure_free_var():
    check(_make_scaled(2.5), (torch.randn(3),), ops=1)


def test_closure_free_tensor():
    t = torch.randn(3)

    def fn(x):
        return x + t
    check(fn, (torch.randn(3),))


def test_nested_def_reads_local():
    def fn(x):
        y = x * 2

        def inner(z):
            return z + y
        return inner(x)
    check(fn, (torch.randn(3),))


def test_nested_def_nonlocal_int():
    def fn(x):
        total = 0

        def add(v):
            nonlocal total
            total += v
        add(2)
        add(3)
        return x * total, total
    check(fn, (torch.randn(3),))


def test_nested_def_nonlocal_tensor():
    def fn(x):
        acc = x

        def step():
            nonlocal acc
            acc = acc * 2 + 1
        step()
        step()
        return acc
    check(fn, (torch.randn(3),))


def test_nested_closure_returned_and_called():
    def fn(x):
        def make(k):
            return lambda t: t * k
        f2, f3 = make(2), make(3)
        return f2(x) + f3(x)
    check(fn, (torch.randn(3),))


def test_closure_cell_shared_by_two_inner_functions():
    def fn(x):
        count = 0

        def inc():
            nonlocal count
            count += 1

        def get():
            return count
        inc()
        inc()
        inc()
        return x + get()
    check(fn, (torch.randn(3),))


# ----------------------------------------------------------------------------- binary ops

FLOAT_BINOPS = [
    ("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
    ("truediv", operator.truediv), ("floordiv", operator.floordiv), ("mod", operator.mod),
    ("pow", operator.pow),
]
INT_BINOPS = FLOAT_BINOPS[:3] + [("floordiv", operator.floordiv), ("mod", operator.mod),
                                 ("and", operator.and_), ("or", operator.or_),
                                 ("xor", operator.xor), ("lshift", operator.lshift),
                                 ("rshift", operator.rshift)]


def _binop_fn(op, swap=False, scalar=None):
    if scalar is None:
        def fn(x, y):
            return op(x, y)
    elif swap:
        def fn(x):
            return op(scalar, x)
    else:
        def fn(x):
            return op(x, scalar)
    return fn


@pytest.mark.parametrize("name,op", FLOAT_BINOPS, ids=[n for n, _ in FLOAT_BINOPS])
def test_binop_float_tensors(name, op):
    x = torch.rand(3, 4) + 0.5
    y = torch.rand(3, 4) + 0.5
    check(_binop_fn(op), (x, y), ops=1)


@pytest.mark.parametrize("name,op", INT_BINOPS, ids=[n for n, _ in INT_BINOPS])
def test_binop_int_tensors(name, op):
    x = torch.randint(1, 50, (3, 4))
    y = torch.randint(1, 4, (3, 4))
    check(_binop_fn(op), (x, y), ops=1)


@pytest.mark.parametrize("name,op", [("and", operator.and_), ("or", operator.or_),
                                     ("xor", operator.xor)])
def test_binop_bool_tensors(name, op):
    check(_binop_fn(op), (torch.rand(5) > 0.5, torch.rand(5) > 0.5), ops=1)


@pytest.mark.parametrize("swap", [False, True], ids=["tensor_op_scalar", "scalar_op_tensor"])
@pytest.mark.parametrize("name,op", FLOAT_BINOPS, ids=[n for n, _ in FLOAT_BINOPS])
def test_binop_tensor_python_scalar(name, op, swap):
    check(_binop_fn(op, swap=swap, scalar=1.5), (torch.rand(3, 4) + 0.5,), ops=1)


def test_binop_int_tensor_python_int_shift_and_mask():
    def fn(x):
        return (x << 2) | 1, (x >> 1) & 3, x ^ 5, 7 & x
    check(fn, (torch.randint(0, 64, (6,)),))


def test_matmul_operator():
    def fn(a, b, v):
        return a @ b, a @ v
    check(fn, (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4)), ops=2)


def test_binop_broadcast_and_mixed_dtype():
    def fn(x, i):
        return x + i, i * 2.5, x[None] - x[:, None]
    check(fn, (torch.randn(3), torch.arange(3)))


PY_NUMBER_OPS = FLOAT_BINOPS + [("lt", operator.lt), ("le", operator.le), ("eq", operator.eq),
                                ("ne", operator.ne), ("gt", operator.gt), ("ge", operator.ge)]


@pytest.mark.parametrize("a,b", [(7, 3), (-7, 2), (2.5, 1.5), (3, 0.5)],
                         ids=["int_int", "neg_int", "float_float", "int_float"])
def test_python_number_ops(a, b):
    def fn(x, a, b):
        vals = [op(a, b) for _, op in PY_NUMBER_OPS]
        return x * vals[0] + vals[2], vals
    check(fn, (torch.randn(3), a, b))


def test_python_int_bitwise_ops():
    def fn(x, a, b):
        r = (a & b, a | b, a ^ b, a << b, a >> 1, ~a, -a, +a, abs(-a))
        return x + sum(r), r
    check(fn, (torch.randn(2), 13, 3))


# ----------------------------------------------------------------------------- in-place operators

INPLACE_FLOAT = ["+=", "-=", "*=", "/=", "//=", "%=", "**="]
INPLACE_INT = ["+=", "-=", "*=", "//=", "%=", "&=", "|=", "^=", "<<=", ">>="]


def _inplace_fn(op_src, target_is_input):
    src = ("def fn(x, y):\n"
           + ("" if target_is_input else "    x = x.clone()\n")
           + f"    x {op_src} y\n"
           + "    return x\n")
    ns = {}
    exec(compile(src, f"<inplace {op_src}>", "exec"), ns)
    return ns["fn"]


@pytest.mark.parametrize("op_src", INPLACE_FLOAT)
def test_inplace_float_on_clone(op_src):
    check(_inplace_fn(op_src, False), (torch.rand(3, 4) + 0.5, torch.rand(3, 4) + 0.5))


@pytest.mark.parametrize("op_src", INPLACE_INT)
def test_inplace_int_on_clone(op_src):
    check(_inplace_fn(op_src, False), (torch.randint(1, 50, (6,)), torch.randint(1, 4, (6,))))


@pytest.mark.parametrize("op_src", ["+=", "*=", "-="])
def test_inplace_on_input_mutates_it(op_src):
    check(_inplace_fn(op_src, True), (torch.randn(3, 4), torch.randn(3, 4)))


def test_inplace_python_scalar_on_tensor():
    def fn(x):
        y = x.clone()
        y += 1
        y *= 2.5
        y -= 3
        y /= 2
        return y
    check(fn, (torch.randn(4),))


def test_inplace_python_ints():
    def fn(x, n):
        n += 3
        n *= 2
        n //= 3
        n **= 2
        n %= 7
        return x * n, n
    check(fn, (torch.randn(3), 5))


def test_augassign_rebinds_for_immutable_tuple():
    def fn(x, y):
        t = (x,)
        t += (y,)
        return torch.stack(t)
    check(fn, (torch.randn(3), torch.randn(3)))


# ----------------------------------------------------------------------------- unary

def test_unary_float():
    def fn(x):
        return -x, +x, abs(x), x.abs(), x.neg()
    check(fn, (torch.randn(3, 4),))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_unary_invert(dtype):
    def fn(x):
        return ~x
    x = torch.randint(-5, 5, (6,)).to(dtype)
    check(fn, (x,), ops=1)


def test_unary_not_on_python_values():
    def fn(x, flag):
        return x + (not flag), not []
    check(fn, (torch.randn(2), False))


# ----------------------------------------------------------------------------- comparisons

CMP_OPS = [("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt),
           ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge)]


@pytest.mark.parametrize("name,op", CMP_OPS, ids=[n for n, _ in CMP_OPS])
def test_compare_tensors(name, op):
    def fn(x, y):
        return op(x, y), op(x, 0.0), op(0.5, x)
    check(fn, (torch.randn(5), torch.randn(5)), ops=3)


def test_compare_chained_python_numbers():
    def fn(x, a, b, c):
        ok = a < b <= c
        return torch.where(x > 0, x, x * ok), ok
    check(fn, (torch.randn(4), 1, 2, 2))


def test_compare_is_and_is_not():
    def fn(x, y, z):
        out = x
        if y is None:
            out = out + 1
        if z is not None:
            out = out * z
        return out
    check(fn, (torch.randn(3), None, torch.randn(3)))


def test_in_and_not_in_python_containers():
    def fn(x, lst, d, s):
        r = x
        if 2 in lst:
            r = r + 1
        if 9 not in lst:
            r = r * 2
        if "k" in d:
            r = r + d["k"]
        if 3 in s and 4 not in s:
            r = r - 1
        return r, "b" in "abc", (1, 2) in [(1, 2)]
    check(fn, (torch.randn(3), [1, 2, 3], {"k": 2.0}, {3, 5}))
