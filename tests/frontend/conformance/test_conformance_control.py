"""Conformance: loops unrolled over Python iterables, while/break/continue, `if` on Python
values and on tensor metadata, all in one graph (two when a Python constant changes)."""
import pytest
import torch
from torch import nn

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def k_for_range(x, n):
    for i in range(n):
        x = x * 2 + i
    return x


def k_for_list_zip_enumerate(xs, ws):
    out = 0
    for i, (x, w) in enumerate(zip(xs, ws)):
        out = out + x * w * (i + 1)
    return out


def k_for_dict_items(x, d):
    for name, scale in d.items():
        if name.startswith("mul"):
            x = x * scale
        else:
            x = x + scale
    return x


def k_while_counter(x):
    i = 0
    while i < 4:
        x = x + i
        i += 1
    return x, i


def k_while_true_break(x):
    n = 0
    while True:
        x = x * 0.5
        n += 1
        if n >= 3:
            break
    return x


def k_break_continue(xs):
    total = xs[0] * 0
    for i, x in enumerate(xs):
        if i == 1:
            continue
        if i == 4:
            break
        total = total + x
    else:
        total = total - 100     # not reached: loop breaks
    return total


def k_for_else(xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    else:
        out = out * 2
    return out


def k_nested_loops(x):
    for i in range(2):
        for j in range(3):
            if (i + j) % 2:
                continue
            x = x + i * j + 1
    return x


def k_loop_over_tensor_shape(x):
    for d in x.shape:
        x = x * d
    return x


def k_loop_over_tensor_rows(x):
    rows = []
    for row in x:
        rows.append(row.sum())
    return torch.stack(rows)


def k_if_python_flag(x, flag, mode):
    if flag:
        x = x + 1
    else:
        x = x - 1
    if mode == "double":
        x = x * 2
    elif mode == "square":
        x = x * x
    return x


def k_ternary_and_boolean_ops(x, a, b):
    y = x * 2 if a > b else x * 3
    z = a and b
    w = None or 5
    return y + z + w, (a or 0), (0 and b)


def k_if_on_metadata(x):
    out = x
    if x.shape[0] > 2:
        out = out + 1
    if x.dim() == 3:
        out = out * 2
    if x.dtype == torch.float32:
        out = out - 0.5
    if x.device.type == "cpu":
        out = out * 3
    if x.ndim >= 2:
        out = out + x.ndim
    if x.numel() > 10:
        out = out / 2
    if x.size(-1) == 4:
        out = out.flip(-1)
    if x.is_floating_point():
        out = out.abs()
    if not x.requires_grad:
        out = out + 7
    if x.is_contiguous():
        out = out.sum(0)
    return out


def k_if_on_metadata_int_tensor(x):
    if x.is_floating_point() or x.dtype is not torch.int64:
        return x * 2
    return x + 1


def k_loop_over_modulelist(x, layers):
    for i, layer in enumerate(layers):
        if i % 2 == 0:
            x = layer(x)
        else:
            x = x + layer(x)
    return x


def k_match_statement(x, kind):
    match kind:
        case "relu":
            return torch.relu(x)
        case "neg":
            return -x
        case _:
            return x


def k_try_except_no_exception(x):
    try:
        y = x + 1
    except ValueError:
        y = x - 1
    finally:
        z = 2
    return y * z


CONTROL = [
    (k_for_range, lambda: (torch.randn(3), 4)),
    (k_for_list_zip_enumerate, lambda: ([torch.randn(3) for _ in range(3)],
                                        [torch.randn(3) for _ in range(3)])),
    (k_for_dict_items, lambda: (torch.randn(3), {"mul_a": 2.0, "add_b": 1.0, "mul_c": 0.5})),
    (k_while_counter, lambda: (torch.randn(3),)),
    (k_while_true_break, lambda: (torch.randn(3),)),
    (k_break_continue, lambda: ([torch.randn(2) for _ in range(6)],)),
    (k_for_else, lambda: ([torch.randn(2) for _ in range(3)],)),
    (k_nested_loops, lambda: (torch.randn(3),)),
    (k_loop_over_tensor_shape, lambda: (torch.randn(2, 3),)),
    (k_loop_over_tensor_rows, lambda: (torch.randn(3, 4),)),
    (k_if_python_flag, lambda: (torch.randn(3), True, "square")),
    (k_ternary_and_boolean_ops, lambda: (torch.randn(3), 2, 3)),
    (k_if_on_metadata, lambda: (torch.randn(3, 2, 4),)),
    (k_if_on_metadata_int_tensor, lambda: (torch.arange(4),)),
    (k_loop_over_modulelist, lambda: (torch.randn(2, 4),
                                      nn.ModuleList([nn.Linear(4, 4) for _ in range(3)]))),
    (k_match_statement, lambda: (torch.randn(3), "neg")),
    (k_try_except_no_exception, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make", CONTROL, ids=[f.__name__ for f, _ in CONTROL])
def test_control(fn, make):
    check(fn, make())


def test_if_on_metadata_other_branches():
    # 2-D, 4 elements, float64, non-contiguous: every metadata branch flips the other way.
    x = torch.randn(4, 1, dtype=torch.float64).t()
    check(k_if_on_metadata, (x,))


def test_if_on_requires_grad():
    check(k_if_on_metadata, (torch.randn(3, 2, 4, requires_grad=True),))


def test_python_flag_changes_between_sets_recompiles():
    x = torch.randn(3)
    check(k_if_python_flag, (x, True, "double"), (torch.randn(3), False, "double"), graphs=2)


def test_python_string_changes_between_sets_recompiles():
    check(k_match_statement, (torch.randn(3), "relu"), (torch.randn(3), "neg"), graphs=2)


def test_shape_change_between_sets_recompiles():
    # dynamic=None: the first graph is specialised on shapes, a new shape compiles again.
    check(lambda x: x * 2 + x.sum(0), (torch.randn(3, 4),), (torch.randn(5, 4),), graphs=2)


def test_same_python_values_no_recompile():
    check(k_for_range, (torch.randn(3), 3), (torch.randn(3), 3), graphs=1)
