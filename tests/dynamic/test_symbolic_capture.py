"""Capture with symbolic sizes: the graph a backend receives, Python on sizes, guards.

Every result is compared with eager at every size (sizes 0 and 1, equal dims and strided
inputs included); compile counts say what one symbolic entry serves.
"""
import math
import operator

import pytest
import torch

import ember
from dynamic_util import Recorder
from ember.testing import CompileCounter, same


def check_sizes(fn, shapes, *, dynamic=True, compiles=None, make=torch.randn):
    """Run ``fn`` compiled and eager on one input of each shape; the CompileCounter."""
    counter = CompileCounter()
    compiled = ember.compile(fn, backend=counter, dynamic=dynamic)
    for shape in shapes:
        x = make(shape)
        assert same(fn(x.clone()), compiled(x.clone())), shape
    if compiles is not None:
        assert counter.frame_count == compiles, counter.frame_count
    return counter


# -- the backend contract --------------------------------------------------------------------

def half_rows(x):
    return x.view(-1, x.size(1) // 2) * x.size(0)


def test_backend_gets_symbol_placeholders_then_tensors():
    rec = Recorder()
    x = torch.randn(6, 4)
    ember.compile(half_rows, backend=rec, dynamic=True)(x)
    (gm, example), = rec.calls
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [n.target for n in placeholders] == ["s0", "s1", "L_x"]
    s0, s1, real = example
    assert isinstance(s0, torch.SymInt) and isinstance(s1, torch.SymInt)
    assert str(s0.node.expr) == "s0" and s0.node.hint == 6 and s1.node.hint == 4
    assert real is x                                   # the real tensor, not a fake
    fake = placeholders[2].meta["val"]
    assert [str(s.node.expr) for s in fake.shape] == ["s0", "s1"]
    assert [str(s) for s in fake.stride()] == ["s1", "1"]
    assert placeholders[0].meta["val"] is not None
    # sizes are computed from the placeholders, never read from a tensor in the graph
    targets = [n.target for n in gm.graph.nodes if n.op.startswith("call_")]
    assert operator.floordiv in targets and operator.mul in targets
    assert not any(t in ("size", "sym_size") for t in targets)
    floordiv = next(n for n in gm.graph.nodes if n.target is operator.floordiv)
    assert floordiv.args == (placeholders[1], 2)
    # the graph runs on plain ints for the symbols
    assert same(gm(6, 4, x)[0], half_rows(x))


def test_static_graphs_have_no_symbols():
    rec = Recorder()
    ember.compile(half_rows, backend=rec, dynamic=False)(torch.randn(6, 4))
    (gm, example), = rec.calls
    assert [n.target for n in gm.graph.nodes if n.op == "placeholder"] == ["L_x"]
    assert not any(isinstance(e, torch.SymInt) for e in example)


def test_entry_passes_sizes_read_from_the_inputs():
    compiled = ember.compile(half_rows, backend=Recorder(), dynamic=True)
    compiled(torch.randn(6, 4))
    source = compiled._entries[0].source
    assert "___s0 = x.size()" in source and "(___s0[0], ___s0[1], x)" in source


# -- Python on sizes ---------------------------------------------------------------------------

def arange_cols(x):
    return x + torch.arange(x.size(1))


def view_flat(x):
    return x.view(x.shape[0] * x.shape[1]).sum() + x.numel()


def slice_by_size(x):
    return x[: x.size(0) // 2 + 1] * 2


def math_on_sizes(x):
    return x / math.sqrt(x.size(-1)) + math.ceil(x.size(0) / 3)


def min_max_sizes(x):
    k = min(x.size(0), 4)
    return x[:k] * max(x.size(1), 2)


def new_from_sizes(x):
    return torch.cat([x, x.new_zeros(x.size(0), 2), torch.full((x.size(0), 1), x.size(1),
                                                                dtype=x.dtype)], 1)


def len_and_shape_eq(x, y):
    if x.shape == y.shape:
        return x + y + len(x)
    return x.sum(0) - y.sum(0)


@pytest.mark.parametrize("fn", [arange_cols, view_flat, slice_by_size, math_on_sizes,
                                min_max_sizes, new_from_sizes])
def test_python_on_sizes_one_entry_many_sizes(fn):
    shapes = [(2, 3), (5, 7), (9, 4), (6, 6), (3, 11)]
    check_sizes(fn, shapes, compiles=1)


def test_sizes_compared_item_by_item():
    counter = CompileCounter()
    compiled = ember.compile(len_and_shape_eq, backend=counter, dynamic=True)
    for a, b in [((3, 4), (3, 4)), ((5, 4), (5, 4)), ((5, 4), (2, 4)), ((7, 4), (3, 4)),
                 ((6, 2), (6, 2))]:
        x, y = torch.randn(a), torch.randn(b)
        assert same(len_and_shape_eq(x, y), compiled(x, y)), (a, b)
    assert counter.frame_count == 2    # equal shapes, unequal dim 0


def branch(x):
    if x.size(0) > 16:
        return x * 2
    return x - 1


def test_branch_on_size_takes_the_right_branch_at_every_size():
    check_sizes(branch, [(4, 3), (20, 3), (16, 3), (17, 3), (2, 3), (40, 3)], compiles=2)


def even_width(x):
    if x.size(1) % 2 == 0:
        return x.view(x.size(0), -1, 2).sum(-1)
    return x.sum(-1, keepdim=True)


def test_modulo_guard():
    check_sizes(even_width, [(3, 4), (3, 6), (3, 5), (4, 8), (2, 9)], compiles=2)


def unrolled(x):
    acc = x[0]
    for i in range(1, x.size(0)):
        acc = acc + x[i] * i
    return acc


def test_range_of_a_size_specialises_with_a_guard():
    check_sizes(unrolled, [(2, 3), (3, 3), (2, 3), (4, 3)], compiles=3)


def keyed(x):
    table = {x.size(1): 2.0}
    return x * table[x.size(1)], f"rows={x.size(0)}"


def test_fstring_and_dict_key_specialise():
    check_sizes(keyed, [(2, 3), (5, 3), (5, 3), (4, 6)], compiles=3)


def returns_sizes(x):
    return x * 2, x.shape[0] + 1, x.size(1) // 2, x.size(0) > 3


def test_sizes_returned_after_the_graph_are_computed_from_the_inputs():
    counter = check_sizes(returns_sizes, [(2, 3), (5, 7), (9, 4)], compiles=1)
    compiled = ember.compile(returns_sizes, backend=counter, dynamic=True)
    out = compiled(torch.randn(6, 5))
    assert out[1:] == (7, 2, True) and type(out[1]) is int and type(out[3]) is bool


def test_sizes_0_and_1_are_specialised():
    check_sizes(lambda x: x.sum(0) + x.mean(), [(0, 3), (1, 3), (2, 3), (5, 3), (1, 3),
                                                (0, 3), (7, 3)], compiles=3)


def test_equal_dims_share_a_symbol_under_dynamic_true():
    def square(x, y):
        return x @ x.t() + y
    counter = CompileCounter()
    compiled = ember.compile(square, backend=counter, dynamic=True)
    for n in (3, 5, 8):
        x, y = torch.randn(n, n), torch.randn(n, n)
        assert same(square(x, y), compiled(x, y), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1
    # then unequal: the duck-sizing guard fails and a new entry is compiled
    def outer(x):
        return x.sum(0)
    check_sizes(outer, [(3, 3), (4, 4), (4, 5), (6, 2)], compiles=2)


def test_strided_inputs_keep_their_stride_pattern():
    counter = CompileCounter()
    compiled = ember.compile(lambda x: x * 2 + x[0], backend=counter, dynamic=True)
    inputs = [torch.randn(4, 6), torch.randn(5, 7), torch.randn(6, 5).t(),
              torch.randn(3, 8)[:, ::2], torch.randn(9, 3).t(), torch.randn(4, 9)]
    for x in inputs:
        assert same(x * 2 + x[0], compiled(x)), (x.shape, x.stride())
    # contiguous, transposed and column-sliced inputs each need their own entry
    assert counter.frame_count == 3


def test_data_dependent_size_is_a_graph_break_with_a_reason():
    def nz(x):
        idx = x.nonzero()
        return idx.sum() + x.size(0)
    out = ember.explain(nz, dynamic=True)(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    assert out.graph_break_count >= 1
    assert any("data-dependent" in r.reason or "nonzero" in r.reason
               for r in out.break_reasons), [r.reason for r in out.break_reasons]
    check_sizes(nz, [(2, 2), (3, 4), (5, 2)], make=lambda s: torch.randn(s).relu())


def test_item_as_a_size_breaks_the_graph():
    def by_item(x, n):
        return x[: int(n.item())] * 2
    counter = CompileCounter()
    compiled = ember.compile(by_item, backend=counter, dynamic=True)
    for rows, n in ((4, 2), (6, 3), (8, 5)):
        x, k = torch.randn(rows, 3), torch.tensor(n)
        assert same(by_item(x, k), compiled(x, k))


def size_objects_as_arguments(x):
    return x.new_zeros(x.shape) + x.expand(x.shape) + torch.zeros(x.shape[1:]) + x.view(x.shape)


def test_torch_size_of_symbolic_sizes_as_an_argument():
    check_sizes(size_objects_as_arguments, [(2, 3), (5, 7), (9, 4)], compiles=1)


def _needs_static_sizes(x):
    if isinstance(x.shape[0], torch.SymInt):
        raise RuntimeError("this function cannot take symbolic sizes")
    return x * 2


def test_a_capture_failing_on_symbolic_sizes_is_captured_static(ember_log):
    ember.logs.set_logs("recompiles")
    picky = ember.allow_in_graph(_needs_static_sizes)

    def fn(x):
        return picky(x) + 1
    # every size compiles its own static entry, and none runs eagerly
    counter = check_sizes(fn, [(2, 3), (5, 3), (7, 3)], compiles=3)
    assert all(not any(isinstance(e.meta.get("val"), torch.SymInt) for e in gm.graph.nodes)
               for gm in counter.graphs)
    assert "capturing with static sizes" in ember_log.text


def float_sizes(x):
    k = x.size(0) // 0.5                  # a float in Python: 2 * n as a float
    return x * k, k, math.floor(x.size(1) / 2.0), float(x.size(0))


def test_float_results_of_sizes_stay_floats():
    counter = CompileCounter()
    compiled = ember.compile(float_sizes, backend=counter, dynamic=True)
    for n, m in ((3, 5), (6, 4), (9, 7)):
        x = torch.arange(n * m).reshape(n, m)          # an int tensor: k's type decides dtype
        want, got = float_sizes(x), compiled(x)
        assert same(want, got) and got[0].dtype == want[0].dtype == torch.float32
        assert [type(v) for v in got[1:]] == [type(v) for v in want[1:]] == [float, int, float]
    assert counter.frame_count == 1


def numpy_sizes(x):
    a = x.numpy()
    return a.shape, a.size, len(a), a.nbytes


def test_sizes_read_through_numpy_metadata_are_symbolic_not_baked():
    counter = CompileCounter()
    compiled = ember.compile(numpy_sizes, backend=counter, dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(n, 2)
        got = compiled(x)
        flat = [*got[0], *got[1:]]
        assert got == numpy_sizes(x) and all(type(v) is int for v in flat), got


def python_number_builtins(x):
    q, r = divmod(x.size(0), 3)
    return x * q + r + pow(x.size(1), 2) + math.log(x.size(0))


def test_builtins_without_a_symbolic_rule_specialise_instead_of_breaking():
    out = ember.explain(python_number_builtins, dynamic=True)(torch.randn(5, 3))
    assert out.graph_count == 1 and out.graph_break_count == 0
    check_sizes(python_number_builtins, [(5, 3), (7, 4), (5, 3)], compiles=2)


def test_lazy_module_initialises_from_a_symbolic_input():
    m, ref = torch.nn.Sequential(torch.nn.LazyLinear(3)), torch.nn.Sequential(
        torch.nn.LazyLinear(3))
    compiled = ember.compile(m, backend=CompileCounter(), dynamic=True)
    for n in (4, 6):
        x = torch.randn(n, 5)
        torch.manual_seed(1)
        got = compiled(x)
        torch.manual_seed(1)
        assert same(got, ref(x), rtol=1e-5, atol=1e-6)
    assert type(m[0]) is torch.nn.Linear and m[0].weight.shape == (3, 5)
