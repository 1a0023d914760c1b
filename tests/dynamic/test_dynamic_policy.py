"""The ``dynamic=`` policy and the marks: which input dims are captured symbolic.

Each test compiles with a recording backend (it keeps every graph and its example inputs and
runs the graph as captured), calls at several sizes, compares every result with eager and
checks how many graphs were compiled and which dims were symbolic.
"""
import pytest
import torch

import ember
from dynamic_util import Recorder
from ember.testing import same


def run_all(fn, calls, dynamic=None, marks=None):
    rec = Recorder()
    compiled = ember.compile(fn, backend=rec, dynamic=dynamic)
    for args in calls:
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        if marks:
            marks(*args)
        assert same(fn(*args), compiled(*args)), [tuple(a.shape) for a in args]
    rec.compiled = compiled
    return rec


def scale(x):
    return x * 2 + 1


def test_default_compiles_static_first_then_the_dims_that_changed():
    rec = run_all(scale, [(torch.randn(n, 4),) for n in (3, 5, 7, 9, 12, 3)])
    assert rec.count == 2
    assert rec.symbolic_dims(0) == {"L_x": []}
    assert rec.symbolic_dims(1) == {"L_x": [0]}      # dim 1 never changed: static
    assert not any(isinstance(e, torch.SymInt) for e in rec.calls[0][1])


def test_default_second_dim_change_makes_it_dynamic_too():
    shapes = [(3, 4), (5, 4), (5, 6), (7, 9), (2, 3)]
    rec = run_all(scale, [(torch.randn(s),) for s in shapes])
    assert rec.count == 3
    assert rec.symbolic_dims(1) == {"L_x": [0]}
    assert rec.symbolic_dims(2) == {"L_x": [0, 1]}


def test_dynamic_true_every_dim_symbolic_from_the_start():
    rec = run_all(scale, [(torch.randn(s),) for s in [(3, 4), (5, 6), (9, 2), (4, 4)]],
                  dynamic=True)
    assert rec.count == 1
    assert rec.symbolic_dims(0) == {"L_x": [0, 1]}


def test_dynamic_false_never_symbolic():
    rec = run_all(scale, [(torch.randn(n, 4),) for n in (3, 5, 7, 5, 3)], dynamic=False)
    assert rec.count == 3
    assert all(dims == {"L_x": []} for dims in (rec.symbolic_dims(i) for i in range(3)))


def test_parameters_and_buffers_stay_static_under_dynamic_true():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5)).eval()
    rec = Recorder()
    compiled = ember.compile(model, backend=rec, dynamic=True)
    for n in (3, 7, 12):
        x = torch.randn(n, 6)
        assert same(model(x), compiled(x), rtol=1e-5, atol=1e-6)
    assert rec.count == 1
    dims = rec.symbolic_dims()
    assert dims.pop("L_input") == [0]     # dim 1 meets the weight: equal to 6, specialised
    assert len(dims) == 6 and all(d == [] for d in dims.values()), dims  # weights, stats


def test_module_tensor_attribute_stays_static():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.randn(4)            # a plain tensor attribute, not a buffer

        def forward(self, x):
            return x * self.table

    model = Scaled()
    rec = Recorder()
    compiled = ember.compile(model, backend=rec, dynamic=True)
    for n in (2, 5, 9):
        x = torch.randn(n, 4)
        assert same(model(x), compiled(x))
    assert rec.count == 1
    static = [d for name, d in rec.symbolic_dims().items() if "table" in name]
    assert static == [[]]


def test_mark_dynamic_is_symbolic_from_the_first_compile():
    def mark(x):
        ember.mark_dynamic(x, 0)
    rec = run_all(scale, [(torch.randn(n, 4),) for n in (3, 5, 9, 17)], marks=mark)
    assert rec.count == 1
    assert rec.symbolic_dims(0) == {"L_x": [0]}


def test_mark_dynamic_bounds_are_guarded():
    def mark(x):
        ember.mark_dynamic(x, 0, min=3, max=8)
    rec = run_all(scale, [(torch.randn(n, 4),) for n in (3, 5, 8)], marks=mark)
    assert rec.count == 1
    # an unmarked size outside [3, 8] fails the entry's bound guard and compiles again
    # (symbolic without bounds: the frame saw dim 0 change); 2 then hits that entry
    for n in (10, 2):
        x = torch.randn(n, 4)
        assert same(scale(x), rec.compiled(x))
    assert rec.count == 2
    shape_guards = [g.detail for g in rec.compiled._entries[0].guards if g.kind == "SHAPE"]
    assert [d.split("  (")[0] for d in shape_guards] == ["L['x'].size(0) >= 3",
                                                         "L['x'].size(0) <= 8"]
    assert all("test_dynamic_policy.py" in d for d in shape_guards)


def test_marked_size_outside_its_bounds_is_an_error():
    x = torch.randn(10, 4)
    ember.mark_dynamic(x, 0, max=8)
    with pytest.raises(ember.ConstraintViolation, match=r"L\['x'\], 0.*outside"):
        ember.compile(scale, backend=Recorder())(x)


def test_mark_static_beats_dynamic_true():
    def mark(x):
        ember.mark_static(x, 1)
    shapes = [(3, 4), (5, 4), (5, 6), (3, 6), (9, 4)]
    rec = run_all(scale, [(torch.randn(s),) for s in shapes], dynamic=True, marks=mark)
    assert rec.count == 2
    assert rec.symbolic_dims(0) == {"L_x": [0]}


def test_mark_static_is_never_made_dynamic_automatically():
    def mark(x):
        ember.mark_static(x, 0)
    rec = run_all(scale, [(torch.randn(n, 4),) for n in (3, 5, 9, 17)], marks=mark)
    assert rec.count == 4


def test_maybe_mark_dynamic_may_be_specialised():
    def loop(x):
        acc = x[0]
        for i in range(1, x.size(0)):       # specialises dim 0
            acc = acc + x[i]
        return acc

    def mark(x):
        ember.maybe_mark_dynamic(x, 0)
    rec = run_all(loop, [(torch.randn(n, 3),) for n in (2, 3, 4)], marks=mark)
    assert rec.count == 3


def test_mark_dynamic_then_specialised_is_an_error_naming_the_line():
    def loop(x):
        acc = x[0]
        for i in range(1, x.size(0)):
            acc = acc + x[i]
        return acc

    x = torch.randn(4, 3)
    ember.mark_dynamic(x, 0)
    with pytest.raises(ember.ConstraintViolation,
                       match=r"mark_dynamic\(L\['x'\], 0\).*specialised.*constant 4 at "
                             r".*test_dynamic_policy.py:\d+"):
        ember.compile(loop, backend=Recorder())(x)


def test_mark_api_errors_name_the_problem():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match="dim 2 is out of range for a tensor of 2 dims"):
        ember.mark_dynamic(x, 2)
    with pytest.raises(IndexError, match="dim -3"):
        ember.mark_static(x, -3)
    with pytest.raises(IndexError, match="0 dims"):
        ember.maybe_mark_dynamic(torch.tensor(1.0), 0)
    with pytest.raises(TypeError, match="expects a tensor"):
        ember.mark_dynamic([1, 2], 0)
    with pytest.raises(TypeError, match="dim must be an int"):
        ember.mark_dynamic(x, "0")
    with pytest.raises(ValueError, match="min=5 is larger than max=3"):
        ember.mark_dynamic(x, 0, min=5, max=3)
    ember.mark_static(x, 1)
    with pytest.raises(ValueError, match="dim 1 is already marked static"):
        ember.mark_dynamic(x, 1)
    ember.mark_dynamic(x, -2)
    with pytest.raises(ValueError, match="dim 0 is already marked dynamic"):
        ember.mark_static(x, 0)
    # stored on the tensor object, as torch's marks are
    assert x._ember_dynamic_dims == {0: (None, None)} and x._ember_static_dims == {1}


def test_reset_forgets_the_sizes_frames_saw():
    rec = Recorder()
    compiled = ember.compile(scale, backend=rec)
    compiled(torch.randn(3, 4))
    compiled(torch.randn(5, 4))
    assert rec.symbolic_dims(1) == {"L_x": [0]}
    ember.reset()
    compiled(torch.randn(7, 4))
    assert rec.count == 3 and rec.symbolic_dims(2) == {"L_x": []}


def test_automatic_dynamic_through_a_graph_break_and_its_resume_function():
    def broken(x):
        y = x * 2
        print("ember-dynamic-test")        # graph break
        return y + x.size(0)

    rec = run_all(broken, [(torch.randn(n, 3),) for n in (3, 5, 7, 9)])
    # the frame and its resume function: static once, symbolic once each
    assert rec.count == 4
    assert [d for d in rec.symbolic_dims(-1).values()] in ([[0]], [[0], [0]])


def first_rows(x, k):
    return x[:k] * k + k


def test_int_argument_is_symbolic_once_it_changed():
    rec = run_all(first_rows, [(torch.randn(9, 3), k) for k in (3, 5, 7, 4, 2, 1, 0)])
    assert rec.count == 4            # 3 (constant), then symbolic; 1 and 0 specialised
    gm, example = rec.calls[1]
    ints = [e for e in example if isinstance(e, torch.SymInt)]
    assert len(ints) == 1 and ints[0].node.hint == 5
    source = rec.compiled._entries[1].source
    assert "type(k) is" in source and "(k >= 2)" in source


def test_int_argument_under_dynamic_false_stays_a_constant():
    rec = run_all(first_rows, [(torch.randn(9, 3), k) for k in (3, 5, 7)], dynamic=False)
    assert rec.count == 3
    assert not any(isinstance(e, torch.SymInt) for _, ex in rec.calls for e in ex)


def test_a_size_crossing_a_graph_break_stays_symbolic():
    def broken(x):
        n = x.size(0)
        print("ember-dynamic-test")        # graph break: n reaches the resume function
        return x * n

    rec = run_all(broken, [(torch.randn(n, 3),) for n in (3, 5, 7, 9, 4)])
    assert rec.count == 2                  # the resume function: 3, then n symbolic
    explain_broken = ember.explain(broken)
    explain_broken(torch.randn(6, 3))
    explained = explain_broken(torch.randn(8, 3))
    assert "L['n']: automatic dynamic: its value changed between captures of the frame" in [
        str(d) for d in explained.dynamic_dims]


def test_each_compile_of_a_function_starts_static():
    """Automatic dynamic remembers sizes per ember.compile(...) result: compiling the same
    function again (another model instance, another test) starts from static sizes."""
    first = run_all(scale, [(torch.randn(n, 4),) for n in (3, 5)])
    assert first.symbolic_dims(1) == {"L_x": [0]}
    second = run_all(scale, [(torch.randn(n, 4),) for n in (7,)])
    assert second.symbolic_dims(0) == {"L_x": []}


def test_int_argument_under_dynamic_true_is_not_duck_sized_onto_a_dim():
    # k == x.size(1) at the first call only by coincidence: no guard ties them
    rec = run_all(first_rows, [(torch.randn(9, 3), k) for k in (3, 5, 7, 2)], dynamic=True)
    assert rec.count == 1
