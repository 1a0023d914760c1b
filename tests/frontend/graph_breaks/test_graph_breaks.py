"""Graph breaks: a frame splits into graphs around what cannot be captured, and every split
computes what eager computes (outputs, Python state, grad mode, exceptions, printed text).

Each program is compared with eager by ``conformance_util.check`` (two input sets) and the
number of graphs that reached the backend is asserted.
"""
import array
import functools
import logging
import os

import numpy as np
import pytest
import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401
from ember.testing import CompileCounter, same


# -- breaks at one instruction of the top frame -----------------------------------------------

def gb_print(x):
    y = x * 2
    print("gb-print", y.shape[0], sep="|")
    return y + 1


def test_print_splits_the_graph(capsys):
    check(gb_print, (torch.randn(3),), graphs=2)
    assert capsys.readouterr().out.count("gb-print|3") == 4


def gb_item(x):
    s = x.sum().item()
    if s > 0:
        return x + s
    return x - 1


def test_item_feeding_python_takes_both_branches():
    check(gb_item, (torch.rand(4) + 0.1,), (-torch.rand(4) - 0.1,), graphs=3)


def gb_tensor_branch(x, y):
    z = x * y
    if z.sum() > 0:
        z = z + 1
    else:
        z = z - 1
    return z * 2


def test_branch_on_tensor_value_both_ways():
    check(gb_tensor_branch, (torch.ones(3), torch.ones(3)), (torch.ones(3), -torch.ones(3)),
          graphs=3)


def gb_tensor_or(x, y):
    r = (x.sum() > 0) or y
    return r * 2


def test_short_circuit_on_tensor():
    check(gb_tensor_or, (torch.ones(2), torch.zeros(2)), (-torch.ones(2), torch.ones(2)),
          graphs=None)


def gb_unknown_c_function(x):
    y = x.relu()
    pid = os.getpid()
    return y + 1, pid > 0


def test_unknown_c_function():
    check(gb_unknown_c_function, (torch.randn(3),), graphs=2)


def gb_c_method_called(x, get):
    y = x * 2
    return y + len(get())


def test_c_method_of_an_object_passed_in_breaks_at_its_call():
    """A bound C method of an object capture cannot model (an ``array.array``'s ``tolist``;
    transformers' ``np.random.rand(1).item`` across a break) is passed on as it is: its call
    breaks the graph; the frame used to run eagerly (a break at the LOAD_FAST of it)."""
    check(gb_c_method_called, (torch.randn(3), array.array("d", [1.0, 2.0]).tolist), graphs=2)
    explained = ember.explain(gb_c_method_called)(torch.randn(3),
                                                  array.array("d", [3.0]).tolist)
    assert not any(r.frame_ran_eagerly for r in explained.break_reasons)


def gb_ndarray_slice(x, arr):
    return x * 2, arr[:, :2]


def test_slicing_an_ndarray_keeps_the_frame_compiled():
    """An extension type's ``__getitem__`` is not run at capture time behind an equality
    guard (an array's ``==`` answers an array): the frame used to run eagerly on 3.12 and
    raise an internal TypeError (an unhashable slice in the guard's key) on 3.11."""
    check(gb_ndarray_slice, (torch.randn(2), np.arange(6.0).reshape(2, 3)), graphs=1)


def test_guards_with_unhashable_constants_are_deduplicated_by_text():
    from ember.frontend import guards
    from ember.frontend.source import LocalSource
    guard_set = guards.GuardSet()
    for _ in range(2):
        guard_set.add(guards.call_result_match(LocalSource("x"), list.__getitem__,
                                               (slice(0, 2),), [1, 2]))
    assert len(list(guard_set)) == 1


def gb_raise(x, n):
    y = x + 1
    if n > 2:
        raise ValueError(f"n too large: {n}")
    return y


def test_raise_after_graph_has_eager_exception():
    # x + 1 is dead once the frame raises: no graph at all
    check(gb_raise, (torch.randn(3), 5), graphs=0, raises=ValueError)


def triple(t):
    return t * 3


def gb_live_values(x, scale):
    pair = (x + 1, scale)
    items = [x * 2, "tag"]
    table = {"a": x - 1}
    fn = triple
    part = functools.partial(torch.add, alpha=2)
    method = x.mul
    print("gb-live")
    return pair[0] * pair[1], items, table["a"], fn(x), part(x, x), method(2)


def test_live_values_of_every_kind_cross_the_break():
    check(gb_live_values, (torch.randn(3), 2.0), graphs=2)


# -- loops, with blocks, try blocks ----------------------------------------------------------

def gb_loop(x, n):
    seen = []
    for i in range(n):
        x = x + i
        print("gb-loop", i)
        seen.append(i)
    return x, seen


def test_break_inside_a_for_loop(capsys):
    check(gb_loop, (torch.zeros(2), 3), graphs=3)
    assert capsys.readouterr().out.count("gb-loop 2") == 4


def gb_loop_over_modules(x, layers):
    for layer in layers:
        x = layer(x)
        if x.sum() > 100:
            x = x / 2
    return x


def test_tensor_branch_inside_a_loop_over_modules():
    layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    check(gb_loop_over_modules, (torch.randn(2, 4), layers), graphs=None)


def gb_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("gb-no-grad", torch.is_grad_enabled())
        z = y * 3
    return z + x, torch.is_grad_enabled()


def test_break_inside_no_grad_keeps_grad_mode(capsys):
    # x * 2 | print | y * 3, the block's exit, z + x
    check(gb_no_grad, (torch.randn(3, requires_grad=True),), graphs=2)
    assert capsys.readouterr().out.count("gb-no-grad False") == 4
    assert torch.is_grad_enabled()


def gb_nested_grad_modes(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
            if b.sum() > 0:
                b = b + 1
        c = a + b
    return c, b.requires_grad, a.requires_grad


def test_break_inside_nested_grad_modes():
    x = torch.randn(3, requires_grad=True)
    check(gb_nested_grad_modes, (x,), ((-x.detach().abs()).requires_grad_(),), graphs=None)
    assert torch.is_grad_enabled()


def gb_no_grad_raises(x):
    with torch.no_grad():
        y = x * 2
        y.sum().item()
        raise KeyError("inside no_grad")


def test_exception_at_break_inside_no_grad_restores_grad_mode():
    check(gb_no_grad_raises, (torch.randn(3, requires_grad=True),), graphs=None,
          raises=KeyError)
    assert torch.is_grad_enabled()


def gb_try(x, lst):
    y = x + 1
    try:
        z = y * lst[5]      # IndexError at the break: the handler must run
    except IndexError:
        z = y - 1
    return z


def test_exception_at_break_inside_try_reaches_its_handler():
    # x + 1 | lst[5] raises | the handler, captured from its PUSH_EXC_INFO: y - 1
    check(gb_try, (torch.randn(3), [1, 2]), graphs=2)


def gb_try_no_exception(x, log):
    y = x + 1
    try:
        print("gb-try", len(log))
        z = y * 2
    except ValueError:
        z = y - 1
    log.append(1)
    return z


def test_break_inside_try_without_exception(capsys):
    # x + 1 | print | y * 2 and the return
    check(gb_try_no_exception, (torch.randn(3), []), graphs=2)
    assert capsys.readouterr().out.count("gb-try 0") == 4


def gb_try_unmatched(x, d, log):
    y = x * 2
    try:
        try:
            z = y + d["missing"]        # KeyError: not the inner handler's, the outer's
        except IndexError:
            log.append("inner")
            z = y
        finally:
            log.append("finally")
    except KeyError as e:
        log.append(("outer", e.args))
        z = y * 3
    return z + 1, log


def test_exception_at_break_skips_an_unmatched_handler_and_runs_finally():
    # y * 2 | d["missing"] raises | the handlers: finally's body, the outer except clause
    check(gb_try_unmatched, (torch.randn(3), {"k": 1}, []), graphs=2)


def gb_try_raise(x, n):
    y = x.sum()
    try:
        if y.item() > 100:       # never: the break's own branch
            y = y * 0
        raise ValueError(n)      # a raise at a break: caught below
    except ValueError as e:
        y = y + e.args[0]
    return y


def test_raise_at_break_inside_try_is_caught():
    check(gb_try_raise, (torch.randn(3), 2), graphs=None)


def gb_try_escapes(x, log):
    try:
        y = x * 2
        log.append(len(log))
        y.sum().item()
        raise KeyError("escapes")
    finally:
        log.append("finally")


def test_exception_at_break_runs_finally_and_propagates():
    check(gb_try_escapes, (torch.randn(3), []), graphs=None, raises=KeyError)


def gb_finally(x, log):
    try:
        y = x * 2
        print("gb-finally")
    finally:
        log.append(1)
    return y


def test_break_inside_try_finally(capsys):
    check(gb_finally, (torch.randn(3), []), graphs=1)
    assert capsys.readouterr().out.count("gb-finally") == 4


class Recorder:
    def __init__(self, suppress=False):
        self.events = []
        self.suppress = suppress

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        self.events.append(("exit", kind and kind.__name__, value and value.args))
        return self.suppress


def gb_user_context(x, rec):
    with rec:
        y = x * 2
        print("gb-user-context")
        y = y + 1
    return y


def test_break_inside_user_context_manager(capsys):
    # x * 2 | print | y + 1 and the exit
    check(gb_user_context, (torch.randn(3), Recorder()), graphs=2)
    assert capsys.readouterr().out.count("gb-user-context") == 4


def gb_user_context_raises(x, rec):
    with rec as r:
        y = x * 2
        r.events.append(int(y.sum().item() > 100))
        raise KeyError("in the block")
    return y


def test_exception_at_break_inside_user_context_manager_reaches_exit_once():
    check(gb_user_context_raises, (torch.randn(3), Recorder()), graphs=None, raises=KeyError)


def test_user_context_manager_suppressing_the_exception_of_a_break():
    check(gb_user_context_raises, (torch.randn(3), Recorder(suppress=True)), graphs=None)


def gb_nested_blocks(x, outer, inner, log):
    try:
        with outer:
            with torch.no_grad():
                with inner:
                    y = x * 2
                    log.append(torch.is_grad_enabled())
                    y = y + [][0]       # IndexError: through inner, no_grad and outer
    except IndexError:
        log.append(("caught", torch.is_grad_enabled()))
        y = x - 1
    return y, torch.is_grad_enabled()


def test_exception_at_break_unwinds_nested_blocks_in_order():
    check(gb_nested_blocks, (torch.randn(3, requires_grad=True), Recorder(), Recorder(), []),
          graphs=None)
    assert torch.is_grad_enabled()


# -- frames whose locals are closed over (cells) ----------------------------------------------

class ClosureModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        scale = 2
        f = lambda t: t * scale       # noqa: E731
        print("gb-cells", scale)
        return f(self.fc(x))


def test_break_in_a_frame_with_cells(capsys):
    # print | fc and f: f is a new object on each call; the resume guards its code and
    # cells, so one capture serves every call
    check(ClosureModel(), (torch.randn(2, 4),), module=True, graphs=1)
    assert capsys.readouterr().out.count("gb-cells 2") == 4


def gb_made_function(x, n):
    scale = n
    f = lambda t: t * scale         # noqa: E731
    print("gb-made", n)
    return f(x)


def test_function_made_before_the_break_with_new_cell_contents():
    # the resume reads scale through f's cell: a new n recaptures it
    check(gb_made_function, (torch.randn(3), 2), (torch.randn(3), 3), graphs=2)


def gb_cell_shared(x, log):
    scale = 2
    bump = 0

    def f(t):
        nonlocal bump
        bump += 1
        return t * scale + bump
    y = f(x)
    print("gb-cell-shared", scale, bump)   # a break that sees the cells' values
    scale = 3                       # written after the break: f must see it
    z = f(y)
    print("gb-cell-shared", scale, bump)   # a second break, in the resume function
    g = lambda: scale + bump        # noqa: E731  (made after the break)
    return z, g(), bump, f.__closure__[0].cell_contents


def test_cells_are_shared_across_the_break(capsys):
    # f(x) | print | f(y) | print | g() and f.__closure__ (the resume of a resume also
    # receives the cells)
    check(gb_cell_shared, (torch.randn(3), []), graphs=None)
    text = capsys.readouterr().out
    assert text.count("gb-cell-shared 2 1") == text.count("gb-cell-shared 3 2") == 4
    out = ember.explain(gb_cell_shared)(torch.randn(3), [])
    assert out.graph_break_count == 2 and not any(r.frame_ran_eagerly
                                                  for r in out.break_reasons)


def gb_cell_argument(x, k, log):
    h = lambda: k * 2               # noqa: E731  (k, a parameter, is a cell)
    log.append(h())
    k = k + 1
    return x * h(), h(), h.__closure__[0].cell_contents


def test_cell_of_a_parameter_across_the_break():
    check(gb_cell_argument, (torch.randn(3), 2, []), graphs=None)


def gb_cell_unbound(x, log):
    print("gb-unbound")             # the break: `later` is not assigned yet
    later = x * 2
    return (lambda: later)()


def gb_cell_unbound_read(x, flag):
    print("gb-unbound-read")        # the break: `later` is not assigned yet
    if flag:
        later = x * 2
    g = lambda: later               # noqa: E731
    return g() + 1                  # NameError when flag is False, as in eager


def gb_cell_unbound_own_read(x, flag):
    def g():
        return later
    print("gb-unbound-own")
    if flag:
        later = x * 2
    return later + 1                # UnboundLocalError when flag is False


def test_cell_unbound_at_the_break():
    # the resume function receives the empty cell: print | later = x * 2 and the rest
    check(gb_cell_unbound, (torch.randn(3), []), graphs=1)
    out = ember.explain(gb_cell_unbound)(torch.randn(3), [])
    assert out.graph_break_count == 1 and not out.break_reasons[-1].frame_ran_eagerly
    check(gb_cell_unbound_read, (torch.randn(3), True), graphs=1)
    check(gb_cell_unbound_read, (torch.randn(3), False), graphs=None, raises=NameError)
    check(gb_cell_unbound_own_read, (torch.randn(3), True), graphs=1)
    check(gb_cell_unbound_own_read, (torch.randn(3), False), graphs=None,
          raises=UnboundLocalError)


def gb_cell_deleted(x):
    scale = 2
    f = lambda: scale               # noqa: E731
    print("gb-cell-deleted")
    r = x * f()
    del scale                       # DELETE_DEREF: a later f() raises NameError
    return r


def gb_cell_deleted_then_read(x, log):
    scale = 2
    f = lambda: scale               # noqa: E731
    log.append(len(log))            # the break
    r = x * f()
    del scale
    log.append(len(log))            # a second break: the resume of a resume
    return r * f()                  # NameError: f's cell is empty


def gb_cell_deleted_then_assigned(x, log):
    scale = 2
    f = lambda: scale               # noqa: E731
    del scale
    log.append(len(log))            # the break, with the cell empty
    scale = 3
    return x * f()


def gb_cell_deleted_twice(x, log):
    scale = 2
    f = lambda: scale               # noqa: E731
    log.append(len(log))
    del scale
    del scale                       # UnboundLocalError
    return x * f()


def test_deleting_a_cell():
    # print | x * f() and the deletion (replayed on the real cell)
    check(gb_cell_deleted, (torch.randn(3),), graphs=1)
    explained = ember.explain(gb_cell_deleted)(torch.randn(3))
    assert not any(r.frame_ran_eagerly for r in explained.break_reasons)
    check(gb_cell_deleted_then_read, (torch.randn(3), []), graphs=None, raises=NameError)
    check(gb_cell_deleted_then_assigned, (torch.randn(3), []), graphs=1)
    check(gb_cell_deleted_twice, (torch.randn(3), []), graphs=None, raises=UnboundLocalError)


def gb_cells_and_try(x, log):
    n = 1
    add = lambda t: t + n           # noqa: E731
    try:
        n = 5
        log.append(len(log))
        y = add(x) * [][0]
    except IndexError:
        n = n + 1
        y = add(x)
    return y, n


def test_cells_with_an_exception_at_the_break():
    check(gb_cells_and_try, (torch.randn(3), []), graphs=None)


# -- Python state mutated before the break is visible to the instruction -----------------------

CALLS = 0
LOG = []


@ember.disable
def snapshot(obj, lst, d):
    LOG.append((obj.n, len(lst), dict(d), CALLS))


class Counter:
    def __init__(self):
        self.n = 0


def gb_mutations(x, obj, lst, d):
    obj.n = obj.n + 1
    lst.append(x.sum())
    d["k"] = len(lst)
    global CALLS
    CALLS += 1
    snapshot(obj, lst, d)      # runs at the break: must see every mutation above
    lst.append(x.mean())
    return x * obj.n + len(lst)


def test_mutations_before_the_break_are_applied_before_it_runs():
    global CALLS
    LOG.clear()
    obj_e, obj_c = Counter(), Counter()
    lst_e, lst_c, d_e, d_c = [], [], {}, {}
    cnt = CompileCounter()
    compiled = ember.compile(gb_mutations, backend=cnt)
    x = torch.randn(3)
    for i in range(3):
        CALLS = 0
        want = gb_mutations(x, obj_e, lst_e, d_e)
        CALLS = 0
        got = compiled(x, obj_c, lst_c, d_c)
        assert same(want, got) and CALLS == 1
    assert LOG[0::2] == LOG[1::2], LOG
    assert obj_e.n == obj_c.n == 3 and len(lst_e) == len(lst_c) == 6 and d_e == d_c
    assert same(lst_e, lst_c)
    # obj.n and len(lst) are read as Python values: each call captures both halves anew
    assert cnt.frame_count == 6


def gb_closure_counter():
    count = 0

    def bump(x):
        nonlocal count
        count += 1
        print("gb-closure", count)
        return x + count
    return bump, lambda: count


def test_closure_cell_written_before_the_break():
    bump_e, read_e = gb_closure_counter()
    bump_c, read_c = gb_closure_counter()
    compiled = ember.compile(bump_c, backend=CompileCounter())
    x = torch.randn(2)
    for _ in range(3):
        assert same(bump_e(x), compiled(x))
    assert read_e() == read_c() == 3


# -- breaks inside inlined calls ---------------------------------------------------------------

def inner_prints(x):
    y = x + 1
    print("gb-inner")
    return y * 2


def middle(x):
    return inner_prints(x * 3) - 1


def gb_inlined(x):
    a = x.sin()
    b = middle(a)
    return b.cos()


def test_break_inside_inlined_calls_compiles_callees_on_their_own():
    # top: sin | middle: x * 3 | inner: x + 1 | inner resume: * 2 | middle resume: - 1
    # | top resume: cos
    check(gb_inlined, (torch.randn(3),), graphs=6)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.fc(x)
        if x.mean() > 10:     # never true here: the branch reads the value
            x = x * 0
        return x.relu()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.blocks(x))


def test_break_inside_submodule_forward():
    check(Net().eval(), (torch.randn(2, 4),), module=True, graphs=None)


# -- fullgraph, explain, logs ------------------------------------------------------------------

def test_fullgraph_raises_graph_break_error_with_location():
    compiled = ember.compile(gb_print, fullgraph=True, backend="eager")
    with pytest.raises(ember.GraphBreakError, match=r"print.*test_graph_breaks.py:\d+"):
        compiled(torch.randn(3))


def test_fullgraph_inside_inlined_call_names_the_inner_line():
    compiled = ember.compile(gb_inlined, fullgraph=True, backend="eager")
    with pytest.raises(ember.GraphBreakError) as info:
        compiled(torch.randn(3))
    assert info.value.filename == __file__
    assert "print" in open(__file__).read().splitlines()[info.value.lineno - 1]


def test_explain_reports_graphs_and_reasons(capsys):
    out = ember.explain(gb_tensor_branch)(torch.ones(3), torch.ones(3))
    assert out.graph_count == 2 and out.graph_break_count == 1
    (reason,) = out.break_reasons
    assert "tensor's value" in reason.reason
    assert reason.location.startswith(f"{__file__}:")
    assert reason.source_line == "if z.sum() > 0:"
    assert out.ops_per_graph[0][0].__name__ == "mul"
    text = str(out)
    assert "Graph count: 2" in text and "if z.sum() > 0:" in text


SCRATCH = 0


def gb_del_global(x):
    global SCRATCH
    SCRATCH = 1
    del SCRATCH                  # no graph break runs DELETE_GLOBAL yet
    return x + 1


def test_explain_counts_a_frame_that_ran_eagerly():
    out = ember.explain(gb_del_global)(torch.randn(3))
    assert out.graph_count == 0
    assert out.break_reasons[0].frame_ran_eagerly
    assert "DELETE_GLOBAL" in out.break_reasons[0].reason


def test_graph_breaks_log_shows_user_stack(ember_log):
    ember.logs.set_logs("graph_breaks")
    ember.compile(gb_inlined, backend="eager")(torch.randn(3))
    text = ember_log.text
    assert "graph break in gb_inlined" in text
    assert "b = middle(a)" in text and 'print("gb-inner")' in text
    ember_log.clear()
    assert logging.getLogger("ember.graph_breaks").isEnabledFor(logging.INFO)


# -- a model that prints and branches on .item(), through the compiler -------------------------

class Chatty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc1(x).relu()
        print("gb-chatty", h.shape)
        if h.sum().item() > 0:
            h = h * 2
        return self.fc2(h)


@pytest.mark.parametrize("backend", [None, "ember"])
def test_model_that_prints_and_branches_on_item(backend):
    torch.manual_seed(0)
    model = Chatty().eval()
    cnt = CompileCounter(backend)
    compiled = ember.compile(model, backend=cnt)
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert same(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        assert same(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    # fc1+relu | shape printed: sum for .item() | the branch's value is a guarded constant:
    # h * 2 and fc2; the second call reuses all three
    assert cnt.frame_count == 3


def gb_cell_deleted_no_break(x):
    scale = 2
    f = lambda: scale               # noqa: E731
    r = x * f()
    del scale
    return r


def _nonlocal_deleter():
    value = 3

    def f(x):
        nonlocal value
        r = x + value
        del value                   # the enclosing frame's cell: emptied after the graph
        return r
    return f


def test_deleting_cells_without_a_break():
    check(gb_cell_deleted_no_break, (torch.randn(3),), graphs=1)
    eager_f, inner = _nonlocal_deleter(), _nonlocal_deleter()
    compiled_f = ember.compile(inner)
    x = torch.randn(3)
    assert torch.equal(eager_f(x), compiled_f(x))
    for cell in (eager_f.__closure__[0], inner.__closure__[0]):
        try:
            cell.cell_contents
        except ValueError:
            pass
        else:
            raise AssertionError("the cell is not empty")
    for fn in (eager_f, compiled_f):
        try:
            fn(x)
        except NameError:
            pass
        else:
            raise AssertionError("the second call reads the deleted cell")
