"""Shape guards of symbolic entries: what the entry checks, what a recompile logs, what
``ember.explain`` reports."""
import re

import torch

import ember
from ember.testing import CompileCounter, same


def branchy(x, y):
    if x.size(0) > 16:                       # the guard's line
        return x * 2 + y
    return x - y


def test_entry_checks_the_relations_capture_recorded():
    compiled = ember.compile(branchy, backend=CompileCounter(), dynamic=True)
    compiled(torch.randn(4, 3), torch.randn(4, 3))
    src = compiled._entries[0].source
    # size() and stride() read once per input; then duck sizing (y's sizes equal x's),
    # lower bounds, the branch taken, all in one check
    x_size, x_stride, y_size = "___s0", "___s1", "___s2"
    for text in (f"{x_size} = x.size()", f"{x_stride} = x.stride()", f"{y_size} = y.size()",
                 f"{x_stride} == ({x_size}[1], 1)", f"({x_size}[0] >= 2)",
                 f"({x_size}[0] <= 16)", f"({y_size}[0] == {x_size}[0])",
                 f"({y_size}[1] == {x_size}[1])"):
        assert text in src, text
    # the diagnostic twin names each guard on its own
    assert [g.detail.split("  (")[0] for g in compiled._entries[0].guards
            if g.kind == "SHAPE"] == [
        "L['x'].size(0) >= 2", "L['x'].size(1) >= 2", "L['x'].size(0) <= 16",
        "L['y'].size(0) == L['x'].size(0)", "L['y'].size(1) == L['x'].size(1)"]


def test_recompile_log_names_the_relation_the_dim_and_the_user_line(ember_log):
    ember.logs.set_logs("recompiles")
    counter = CompileCounter()
    compiled = ember.compile(branchy, backend=counter, dynamic=True)
    for n in (4, 6, 20, 30, 5):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        assert same(branchy(x, y), compiled(x, y))
    assert counter.frame_count == 2
    line = next(r.getMessage() for r in ember_log.records if "recompiling" in r.getMessage())
    assert "dynamic from now on" not in ember_log.text      # dynamic=True: from the start
    lineno = branchy.__code__.co_firstlineno + 1
    assert "L['x'].size(0) <= 16" in line, line
    assert re.search(rf"test_dynamic_guards.py:{lineno}\b", line), line


def test_recompile_log_names_a_failed_duck_sizing_guard(ember_log):
    ember.logs.set_logs("recompiles")
    compiled = ember.compile(lambda x, y: x.sum(0) + y.sum(0), backend=CompileCounter(),
                             dynamic=True)
    compiled(torch.randn(4, 3), torch.randn(4, 3))
    compiled(torch.randn(4, 3), torch.randn(5, 3))
    text = ember_log.text
    assert "L['y'].size(0) == L['x'].size(0)" in text and "duck" in text, text


def test_recompile_log_names_a_static_dim_that_changed(ember_log):
    ember.logs.set_logs("recompiles")
    compiled = ember.compile(lambda x: x * 2, backend=CompileCounter())
    compiled(torch.randn(4, 3))
    compiled(torch.randn(5, 3))      # the static entry's tensor guard fails
    assert "TENSOR_MATCH L['x']" in ember_log.text
    assert "L['x'].size(0) is dynamic from now on (automatic dynamic" in ember_log.text


def test_explain_reports_which_dims_are_dynamic_and_why():
    def f(x, y):
        return x.sum(0) + y

    out = ember.explain(f, dynamic=True)(torch.randn(5, 3), torch.randn(3))
    assert [str(d) for d in out.dynamic_dims] == [
        "L['x'].size(0): dynamic=True", "L['x'].size(1): dynamic=True",
        "L['y'].size(0): dynamic=True"]
    assert "Dynamic dims:" in str(out)

    x = torch.randn(5, 3)
    ember.mark_dynamic(x, 0, min=2, max=64)
    out = ember.explain(f)(x, torch.randn(3))
    assert [str(d) for d in out.dynamic_dims] == ["L['x'].size(0) in [2, 64]: mark_dynamic"]

    # automatic: the same explain(f) saw another size of dim 0 before
    explain_f = ember.explain(f)
    assert explain_f(torch.randn(5, 3), torch.randn(3)).dynamic_dims == []
    out = explain_f(torch.randn(7, 3), torch.randn(3))
    (dim,) = out.dynamic_dims
    assert (dim.source, dim.dim) == ("L['x']", 0) and dim.reason.startswith("automatic")

    out = ember.explain(f, dynamic=False)(torch.randn(5, 3), torch.randn(3))
    assert out.dynamic_dims == [] and "every size static" in str(out)


def test_a_specialised_dim_is_not_reported_dynamic():
    def f(x):
        return x.reshape(x.size(0), 3, -1) if x.size(1) == 6 else x
    out = ember.explain(f, dynamic=True)(torch.randn(4, 6))
    assert [str(d) for d in out.dynamic_dims] == ["L['x'].size(0): dynamic=True"]


def test_guards_of_a_symbolic_entry_reject_what_it_cannot_serve():
    counter = CompileCounter()
    compiled = ember.compile(lambda x: x.view(-1) * 2, backend=counter, dynamic=True)
    compiled(torch.randn(4, 3))
    run = compiled._entries[0].run
    miss = run(torch.randn(4, 3).t())                    # not contiguous: view would fail
    assert miss is not None and not isinstance(miss, torch.Tensor)
    assert isinstance(run(torch.randn(7, 9)), torch.Tensor)
    assert not isinstance(run(torch.randn(1, 3)), torch.Tensor)          # size 1
    assert not isinstance(run(torch.randn(4, 3, dtype=torch.float64)), torch.Tensor)
    assert not isinstance(run(torch.randn(4)), torch.Tensor)              # rank


def test_entries_and_graphs_do_not_keep_the_capture_alive(monkeypatch):
    """The shape env lives on in every fake and SymInt of a graph the backend keeps, and
    the entry keeps its code generator: neither may hold the capture's state (its graph
    builder, the user objects it tracked)."""
    import gc
    import weakref

    from ember.frontend import output_graph
    made = []
    init = output_graph.OutputGraph.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))
    monkeypatch.setattr(output_graph.OutputGraph, "__init__", recording_init)
    counter = CompileCounter()                       # holds every graph it was given
    compiled = ember.compile(lambda x: (x * 2).view(-1)[: x.size(0)], backend=counter,
                             dynamic=True)
    for n in (3, 5):
        x = torch.randn(n, 4)
        assert same(compiled(x), (x * 2).view(-1)[:n])
    gc.collect()
    assert made and all(ref() is None for ref in made)
    assert counter.frame_count == 1 and compiled._entries
