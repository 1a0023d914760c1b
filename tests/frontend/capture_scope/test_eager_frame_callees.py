"""A frame that runs eagerly (the whole frame cannot be captured) still compiles the user
modules and functions it calls (``ember/frontend/eager_calls.py``), through the same compile
entry as a graph break inside an inlined call: results, exceptions and threads as in eager."""
import logging
import threading

import pytest
import torch

import ember
from ember import config, metrics
from ember.testing import CompileCounter, same


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


@ember.disable
def _opaque():
    """A call the graph breaks at; inside the block below it cannot break."""


# entered by hand (not in a ``with``): a break while it is open sends the whole frame to eager
NO_AUTOCAST = dict(device_type="cpu", dtype=torch.bfloat16, enabled=False)


class Block(torch.nn.Module):
    def __init__(self, n=6):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)

    def forward(self, x, scale=1.0):
        if scale == 0:
            raise ValueError("scale must not be 0")
        return torch.relu(self.lin(x)) * scale


torch.manual_seed(0)
block = Block()


def shifted(x):
    return x.sin() + 1


def wrapper(x):
    ctx = torch.autocast(**NO_AUTOCAST)
    ctx.__enter__()
    _opaque()
    ctx.__exit__(None, None, None)
    y = shifted(x)                       # a global function
    for layer in (block, block):         # a local called with an explicit NULL
        y = layer(y)
    args, kwargs = (y,), {"scale": 2.0}
    return block(*args, **kwargs) + block(y, scale=0.5)


def test_wrapper_frame_runs_eagerly_and_compiles_its_callees(caplog):
    cnt = CompileCounter()
    x = torch.randn(3, 6)
    root = logging.getLogger("ember")    # Ember's loggers do not propagate once logs are on
    root.addHandler(caplog.handler)
    ember.logs.set_logs("graph_breaks")
    try:
        with caplog.at_level(logging.INFO, logger="ember"):
            compiled = ember.compile(wrapper, backend=cnt)
            assert same(compiled(x), wrapper(x))
    finally:
        root.removeHandler(caplog.handler)
        ember.logs.set_logs("")
    assert "wrapper (" in caplog.text and "runs eagerly (call to _opaque" in caplog.text
    assert metrics.counters["frontend"]["frames_eager"] == 1
    # shifted, and Block.forward (one entry without and one with autograd history, each
    # call's scale a constant guarded by value: 1.0, 2.0, 0.5)
    names = {g.code.count("sin") > 0 for g in cnt.graphs}
    assert names == {True, False} and cnt.frame_count >= 2
    assert "the modules and functions it calls are compiled" in caplog.text
    frames = cnt.frame_count
    assert same(compiled(x), wrapper(x))
    assert cnt.frame_count == frames     # the callees' entries are reused


def test_callees_compile_through_the_ember_backend():
    def run(x):
        ctx = torch.autocast(**NO_AUTOCAST)
        ctx.__enter__()
        _opaque()
        ctx.__exit__(None, None, None)
        return block(x) * 3

    from ember.backend import compile_stats
    x = torch.randn(4, 6)
    with torch.no_grad():
        assert same(ember.compile(run)(x), run(x), rtol=1e-4, atol=1e-5)
    assert compile_stats.generated_kernel_count > 0     # the relu and the scaling, fused


class Wrapper(torch.nn.Module):
    """DDP's shape: a forward of its own around ``self.module(*inputs, **kwargs)``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        ctx = torch.autocast(**NO_AUTOCAST)
        ctx.__enter__()
        _opaque()
        ctx.__exit__(None, None, None)
        return self.module(*inputs, **kwargs)


def test_compiled_wrapper_module_compiles_the_module_it_wraps():
    cnt = CompileCounter()
    model = Wrapper(Block())
    x = torch.randn(2, 6, requires_grad=True)
    compiled = ember.compile(model, backend=cnt)
    out = compiled(x, scale=3.0)
    expected = model(x, scale=3.0)
    assert same(out, expected) and cnt.frame_count == 1
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    expected.sum().backward()
    assert same(grad, x.grad)


def test_exceptions_raised_in_a_compiled_callee_propagate_as_in_eager():
    def catches(x):
        ctx = torch.autocast(**NO_AUTOCAST)
        ctx.__enter__()
        _opaque()
        ctx.__exit__(None, None, None)
        try:
            return block(x, scale=0)
        except ValueError as e:
            return str(e)

    def raises(x):
        ctx = torch.autocast(**NO_AUTOCAST)
        ctx.__enter__()
        _opaque()
        ctx.__exit__(None, None, None)
        return block(x[:, :2])           # a shape the Linear rejects

    x = torch.randn(2, 6)
    assert ember.compile(catches, backend=CompileCounter())(x) == catches(x)
    with pytest.raises(RuntimeError) as eager:
        raises(x)
    with pytest.raises(RuntimeError) as compiled:
        ember.compile(raises, backend=CompileCounter())(x)
    assert str(compiled.value) == str(eager.value)


def inner_eager(x):
    """Called from an eager frame: compiled on its own, runs eagerly too, and compiles the
    module it calls in turn."""
    ctx = torch.autocast(**NO_AUTOCAST)
    ctx.__enter__()
    _opaque()
    ctx.__exit__(None, None, None)
    return block(x) - 1


def outer_eager(x):
    ctx = torch.autocast(**NO_AUTOCAST)
    ctx.__enter__()
    _opaque()
    ctx.__exit__(None, None, None)
    return inner_eager(x) * 2


def test_nested_frames_that_run_eagerly():
    cnt = CompileCounter()
    x = torch.randn(2, 6)
    assert same(ember.compile(outer_eager, backend=cnt)(x), outer_eager(x))
    assert metrics.counters["frontend"]["frames_eager"] == 2
    assert cnt.frame_count == 1          # Block.forward


def recursive(x, n):
    ctx = torch.autocast(**NO_AUTOCAST)
    ctx.__enter__()
    _opaque()
    ctx.__exit__(None, None, None)
    if n == 0:
        return block(x)
    return recursive(x, n - 1) + 1       # the failing frame: runs eagerly, never captured again


def test_recursion_into_the_frame_that_failed_is_not_captured_again():
    cnt = CompileCounter()
    x = torch.randn(2, 6)
    assert same(ember.compile(recursive, backend=cnt)(x, 3), recursive(x, 3))
    assert metrics.counters["frontend"]["frames_eager"] == 1
    assert cnt.frame_count == 1


def test_disabled_builtin_and_compiled_callees_are_called_as_they_are():
    seq = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh())
    lone = torch.nn.Linear(6, 6)
    disabled_block = Block()
    ember.disable(disabled_block)
    compiled_block = ember.compile(Block(), backend="eager")

    @ember.disable
    def disabled_fn(x):
        return x * 2

    def run(x):
        ctx = torch.autocast(**NO_AUTOCAST)
        ctx.__enter__()
        _opaque()
        ctx.__exit__(None, None, None)
        y = lone(x) + disabled_block(x) + disabled_fn(x) + compiled_block(x)
        return seq(y)                    # a Sequential is a model: compiled

    cnt = CompileCounter()
    x = torch.randn(2, 6)
    with torch.no_grad():
        assert same(ember.compile(run, backend=cnt)(x), run(x))
    assert cnt.frame_count == 1
    assert "tanh" in cnt.graphs[0].code


def test_cache_size_limit_does_not_compile_the_callees():
    def flagged(x, flag):
        if flag:                         # a new flag: a new entry
            return block(x) + 1
        return block(x) - 1

    cnt = CompileCounter()
    compiled = ember.compile(flagged, backend=cnt)
    x = torch.randn(2, 6)
    with config.patch(cache_size_limit=1):
        assert same(compiled(x, True), flagged(x, True))
        assert same(compiled(x, False), flagged(x, False))
    assert cnt.frame_count == 1 and compiled._eager_code is None


def test_threads_share_the_callees_and_other_threads_run_as_in_eager():
    cnt = CompileCounter()
    compiled = ember.compile(wrapper, backend=cnt)
    plain = Block()
    xs = [torch.randn(3, 6) for _ in range(8)]
    expected = [wrapper(x) for x in xs]
    plain_expected = [plain(x) for x in xs]
    errors, results = [], {}

    def work(i):
        try:
            results[i] = (compiled(xs[i]), plain(xs[i]))
        except BaseException as e:       # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(len(xs)):
        assert same(results[i][0], expected[i]) and same(results[i][1], plain_expected[i])
    assert metrics.counters["frontend"]["frames_eager"] == 1


# -- the rewritten code: every call shape runs as written, the callables pass through route --

def _double(x):
    return x * 2


class _Obj:
    factor = 3

    def scale(self, x, *, by=1):
        return x * self.factor * by

    @classmethod
    def make(cls):
        return cls()


def shapes(x, flag):
    obj = _Obj.make()
    fns = [_double, abs]
    total = _double(x) + obj.scale(x) + obj.scale(x, by=2) + fns[0](x)
    total += (_double if flag else abs)(x)            # a jump inside the callable
    total += _double(*(x,)) + obj.scale(*(x,), **{"by": 3})
    total += sum(f(x) for f in fns)                   # a generator: its own code, not routed
    try:
        total += int("nope")
    except ValueError:
        total += len([_double(i) for i in range(3)])
    with open(__file__) as handle:                    # a with block around a call
        total += len(handle.readline()) > 0
    g = lambda y: _double(y) + x                      # noqa: E731  (a closure)
    return total + g(1) + max(1, _double(x))


def gen_shapes(n):
    for i in range(n):
        yield _double(i)


@pytest.mark.parametrize("fn, args", [(shapes, (2, True)), (shapes, (-5, False)),
                                      (gen_shapes, (4,))])
def test_routed_code_runs_every_call_shape_as_written(fn, args):
    import types
    from ember.api import _function_running
    from ember.frontend.eager_calls import routed_code

    seen = []

    def route(callee):
        seen.append(callee)
        return callee

    code = routed_code(fn.__code__, route)
    routed = _function_running(fn, code)
    out = routed(*args)
    expected = fn(*args)
    if isinstance(out, types.GeneratorType):
        out, expected = list(out), list(expected)
    assert out == expected
    assert _double in seen
    if fn is shapes:   # method calls pass as bound methods, a subscripted callable too
        assert any(getattr(s, "__func__", None) is _Obj.scale for s in seen)
        assert sum(s is _double for s in seen) >= 4
    assert not any(s is route for s in seen)


def _scaler(k):
    def scale(x):
        return x * k
    return scale


def test_functions_made_on_every_call_are_not_captured_each_time():
    def run(x, fn):
        ctx = torch.autocast(**NO_AUTOCAST)
        ctx.__enter__()
        _opaque()
        ctx.__exit__(None, None, None)
        inner = lambda t: t + 1          # noqa: E731  (made anew by each call of the frame)
        return inner(x) + fn(x)

    cnt = CompileCounter()
    compiled = ember.compile(run, backend=cnt)
    x = torch.randn(3)
    with config.patch(cache_size_limit=2):
        for k in range(5):               # a new closure from the factory each time
            assert same(compiled(x, _scaler(k)), run(x, _scaler(k)))
    assert cnt.frame_count == 2          # the first two closures; the lambda never


def breaks_then_runs_eagerly(x):
    y = block(x) + 1                     # the first graph
    _opaque()                            # a break: the rest is a resume function
    ctx = torch.autocast(**NO_AUTOCAST)
    ctx.__enter__()
    _opaque()                            # the resume function cannot break here: eager
    ctx.__exit__(None, None, None)
    return block(y)                      # compiled on its own from the resume function


def test_a_resume_function_that_runs_eagerly_compiles_its_callees():
    cnt = CompileCounter()
    x = torch.randn(2, 6)
    assert same(ember.compile(breaks_then_runs_eagerly, backend=cnt)(x),
                breaks_then_runs_eagerly(x))
    assert metrics.counters["frontend"]["frames_eager"] == 1
    assert cnt.frame_count == 2          # the frame's first graph, Block.forward on its own


def _library_workload():
    import argparse
    import difflib
    import json
    import pprint
    import textwrap
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--a", type=int, default=3)
    parser.add_argument("b", nargs="*")
    text = json.dumps({"a": [1, 2.5, None, "x\u1234"], "b": {"c": True}}, indent=2,
                      sort_keys=True)
    return (vars(parser.parse_args(["--a", "5", "q", "r"])),
            textwrap.fill("hello world " * 20, width=30), text, json.loads(text),
            pprint.pformat({f"k{i}": list(range(i)) for i in range(12)}, width=40),
            list(difflib.unified_diff(["abc", "def"], ["abd", "def"])))


def test_routed_code_of_library_modules_computes_the_same():
    """Every function of a few pure-Python standard modules, rewritten with a route that
    returns what it gets: the same results (classes, closures, handlers, generators)."""
    import argparse
    import difflib
    import inspect
    import json.decoder
    import json.encoder
    import pprint
    import textwrap
    import types
    from ember.frontend.eager_calls import routed_code

    expected = _library_workload()
    swapped = []
    try:
        for mod in (argparse, difflib, json.decoder, json.encoder, pprint, textwrap):
            objs = list(vars(mod).values())
            objs += [v for o in objs if inspect.isclass(o) and o.__module__ == mod.__name__
                     for v in vars(o).values()]
            for obj in objs:
                fn = getattr(obj, "__func__", getattr(obj, "fget", obj))
                if isinstance(fn, types.FunctionType) and fn.__module__ == mod.__name__:
                    code = routed_code(fn.__code__, lambda c: c)
                    if code is not None:
                        swapped.append((fn, fn.__code__))
                        fn.__code__ = code
        assert len(swapped) > 150
        assert _library_workload() == expected
    finally:
        for fn, code in swapped:
            fn.__code__ = code
