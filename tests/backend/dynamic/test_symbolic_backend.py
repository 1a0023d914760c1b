"""Graphs with symbolic sizes compiled by the "ember" backend (issue 31, items 5 and 6):
one symbolic C++ compile serves every size, checked against eager at several sizes, behind
torch.compile's own frontend (``dynamic=True``) and on graphs built by hand with Ember's
ShapeEnv (the convention of Ember's frontend)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config, logs
from ember.backend import compile_stats, pipeline
from ember.backend_registry import ember_backend
from ember.fake import FakeTensorMode
from ember.shapes import ShapeEnv

pytestmark = pytest.mark.usefixtures("fresh_no_grad")


@pytest.fixture(autouse=True)
def _forget_torch_frontend_graphs():
    """These tests compile through torch's own frontend, which keeps every compiled graph (and
    the kernel libraries it loaded) until ``torch._dynamo.reset()``: let the next test start
    without them. (A fixture here, not a conftest.py: tests import helpers named
    ``conftest`` from their folders, and a second one would shadow them.)"""
    yield
    torch._dynamo.reset()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# sizes no fixed dim of the programs equals (torch's duck sizing would tie them)
SIZES = (11, 17, 23)

# name -> (program, inputs at size n); every one compiles once, symbolically
PROGRAMS = {
    # pointwise
    "pointwise": (lambda x: (x * 2 + 1).relu().sigmoid(), lambda n: [torch.randn(n, 3)]),
    "broadcast": (lambda x, y: x * y + x, lambda n: [torch.randn(n, 4), torch.randn(4)]),
    "where": (lambda x: torch.where(x > 0, x, 0.0), lambda n: [torch.randn(n, 7)]),
    "size_arithmetic": (lambda x: x * x.shape[0] + x.shape[1],
                        lambda n: [torch.randn(n, n + 2)]),
    "arange": (lambda x: x + torch.arange(x.shape[0]), lambda n: [torch.randn(n)]),
    # (Python's floor semantics where a size expression goes negative: C's / and % differ)
    "negative_floor": (lambda x: x * ((x.shape[0] - 15) // 3) + (x.shape[0] - 19) % 5,
                       lambda n: [torch.randn(n)]),
    "ones": (lambda x: x + torch.ones(x.shape[0], 1), lambda n: [torch.randn(n, 3)]),
    # reductions over a symbolic dim
    "sum_last": (lambda x: x.sum(-1), lambda n: [torch.randn(3, n)]),
    "sum_first": (lambda x: x.sum(0), lambda n: [torch.randn(n, 5)]),
    # (column blocks over a symbolic last outer dim; lane blocks over a long row)
    "sum_columns": (lambda x: x.sum(1), lambda n: [torch.randn(3, 40, n + 20)]),
    "sum_long_rows": (lambda x: x.sum(1), lambda n: [torch.randn(3, 70 + n)]),
    "mean": (lambda x: x.mean(1, keepdim=True), lambda n: [torch.randn(4, n)]),
    "amax": (lambda x: x.amax(-1), lambda n: [torch.randn(n, n + 1)]),
    "softmax": (lambda x: torch.softmax(x, -1), lambda n: [torch.randn(2, n)]),
    "log_softmax": (lambda x: torch.log_softmax(x, 0), lambda n: [torch.randn(n, 3)]),
    "var": (lambda x: x.var(0), lambda n: [torch.randn(n, 4)]),
    "layer_norm": (lambda x: F.layer_norm(x, (x.shape[-1],)), lambda n: [torch.randn(3, n)]),
    # views, reshapes, slicing
    "view": (lambda x: x.view(-1, 2).sum(1), lambda n: [torch.randn(2 * n)]),
    "reshape_transposed": (lambda x: x.reshape(x.shape[0] * x.shape[1]) + 1,
                           lambda n: [torch.randn(n, 3).t()]),
    "permute": (lambda x: x.permute(1, 0).contiguous() * 2, lambda n: [torch.randn(n, 5)]),
    "slice": (lambda x: x[1:-1, ::2] * 3, lambda n: [torch.randn(n + 2, n)]),
    "slice_by_size": (lambda x, y: (x * 2).sum(1) + y[: x.shape[0] // 2].sum(),
                      lambda n: [torch.randn(n, 5), torch.randn(n + 1)]),
    "expand": (lambda x: x.unsqueeze(1).expand(-1, 3, -1) + 1, lambda n: [torch.randn(n, 2)]),
    # cat
    "cat": (lambda x, y: torch.cat([x, y], 0) * 2,
            lambda n: [torch.randn(n, 3), torch.randn(n + 1, 3)]),
    "cat_dim1": (lambda x, y: torch.cat([x, y.relu()], 1),
                 lambda n: [torch.randn(4, n), torch.randn(4, 3)]),
    # matmul: library calls with symbolic sizes
    "matmul": (lambda x, w: x @ w, lambda n: [torch.randn(n, 8), torch.randn(8, 5)]),
    "linear": (lambda x, w, b: F.linear(x, w, b).relu(),
               lambda n: [torch.randn(n, 8), torch.randn(6, 8), torch.randn(6)]),
    "bmm": (lambda x, y: torch.bmm(x, y), lambda n: [torch.randn(2, n, 4), torch.randn(2, 4, n)]),
    # indexing
    "index": (lambda x, i: x[i] * 2, lambda n: [torch.randn(n, 3), torch.tensor([0, 1, 1])]),
    "embedding": (lambda w, i: F.embedding(i, w) + 1,
                  lambda n: [torch.randn(10, 4), torch.randint(0, 10, (n,))]),
    "gather": (lambda x, i: x.gather(1, i) * 2,
               lambda n: [torch.randn(n, 6), torch.randint(0, 6, (n, 2))]),
    "scatter_add": (lambda x, i, v: x.scatter_add(0, i, v),
                    lambda n: [torch.zeros(5, 3), torch.randint(0, 5, (n, 3)), torch.randn(n, 3)]),
    "split": (lambda x: torch.mul(*x.split(x.shape[1] // 2, 1)), lambda n: [torch.randn(3, 2 * n)]),
    "repeat": (lambda x: x.repeat(2, 1) + 1, lambda n: [torch.randn(n, 3)]),
    # floats of sizes, attention, interpolation
    "scaled_scores": (lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1),
                      lambda n: [torch.randn(2, n, 8), torch.randn(2, n, 8)]),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             lambda n: [torch.randn(1, 2, n, 8) for _ in range(3)]),
    "interpolate": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
                    lambda n: [torch.randn(1, 2, n, 3)]),
    # an ATen fallback inside the symbolic program (cumsum has no lowering)
    "cumsum": (lambda x: x.cumsum(0) * 2, lambda n: [torch.randn(n)]),
    # (more pooling: test_symbolic_lowerings.py)
    "max_pool": (lambda x: F.max_pool2d(x, 2), lambda n: [torch.randn(1, 2, 2 * n, 6)]),
}


def _write_input(x):
    x.add_(1)
    return x * 2


# modules and input mutations (checked separately: parameters, eps as a tensor)
MODULES = {
    "mlp": (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)),
            lambda n: [torch.randn(n, 8)]),
    "conv_bn_relu": (torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1),
                                         torch.nn.BatchNorm2d(4).eval(), torch.nn.ReLU()),
                     lambda n: [torch.randn(2, 3, n, n + 1)]),
    "input_mutation": (_write_input, lambda n: [torch.randn(n, 3)]),
}


def _reset():
    torch._dynamo.reset()
    compile_stats.reset()


@pytest.mark.parametrize("name", [*PROGRAMS, *MODULES])
def test_torch_compile_dynamic_is_one_symbolic_compile(name):
    """Equal to eager at every size (inputs written as eager writes them), one symbolic
    compile, no per-size compile."""
    _reset()
    fn, make = PROGRAMS.get(name) or MODULES[name]
    compiled = torch.compile(fn, backend="ember", dynamic=True)
    for n in SIZES:
        args = make(n)
        expected_args = [a.clone() for a in args]
        torch.testing.assert_close(compiled(*args), fn(*expected_args), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(args, expected_args)
    assert dict(compile_stats.symbolic_declines) == {}
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


def test_kernels_take_sizes_as_arguments():
    _reset()
    compiled = torch.compile(lambda x: (x * 2).sum(1), backend="ember", dynamic=True)
    x = torch.randn(11, 5)
    torch.testing.assert_close(compiled(x), (x * 2).sum(1))
    kernels = [s for s in pipeline.generated_sources if 'extern "C"' in s]
    assert kernels and all("int64_t s0" in k and "int64_t s1" in k for k in kernels)


def _hand_built(fn, real: torch.Tensor, dynamic_dims):
    """``fn(size, x)`` traced to FX as Ember's frontend would hand it over: the size a
    placeholder whose example is an Ember SymInt, ``x``'s symbolic fake in meta["val"]."""
    env = ShapeEnv()
    fake = FakeTensorMode(shape_env=env).from_real(real, dynamic_dims=dynamic_dims,
                                                   source="L['x']")
    gm = torch.fx.symbolic_trace(fn)
    size_node, x_node = [n for n in gm.graph.nodes if n.op == "placeholder"]
    size = fake.shape[0]
    size_node.meta["val"] = size
    x_node.meta["val"] = fake
    return gm, [size, real]


def test_hand_built_graph_with_ember_symints():
    def fn(s, x):
        return (torch.softmax(x, 0)[: s // 2] * s,)

    x = torch.randn(9, 3)
    gm, example = _hand_built(fn, x, {0})
    assert isinstance(example[0], torch.SymInt)
    compiled = ember_backend(gm, example)
    for n in (9, 14, 31):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(n, x), fn(n, x))
    assert compile_stats.symbolic_compiles == 1
    assert compile_stats.size_specializations == 0


def test_sizes_failing_a_guard_are_compiled_per_size(ember_log):
    def fn(s, x):
        return (x.view(s // 2, 2, -1).sum(1) * s,)     # the view guards s % 2 == 0

    gm, example = _hand_built(fn, torch.randn(8, 3), {0})
    compiled = ember_backend(gm, example)
    for n in (8, 12, 30):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(n, x), fn(n, x))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)

    # an odd size breaks the guard s % 2 == 0: a static compile for it serves it (eager
    # views [1, 2, 3] here, as the static program does)
    logs.set_logs("perf_hints")
    with config.patch(suppress_errors=False):
        x = torch.randn(3, 2)
        torch.testing.assert_close(compiled(3, x), fn(3, x))
        torch.testing.assert_close(compiled(3, x), fn(3, x))
    assert compile_stats.size_specializations == 1
    assert "fail the symbolic program's guards" in ember_log.text


def test_a_declined_symbolic_compile_is_served_per_size(ember_log, monkeypatch):
    from ember.backend import symbolic

    def declines(*args, **kwargs):
        raise NotImplementedError("declined by the test")
    monkeypatch.setattr(symbolic, "compile_symbolic", declines)
    logs.set_logs("perf_hints")
    _reset()
    fn = PROGRAMS["slice_by_size"][0]
    compiled = torch.compile(fn, backend="ember", dynamic=True)
    for n in (11, 17, 11):
        args = PROGRAMS["slice_by_size"][1](n)
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert compile_stats.symbolic_compiles == 0
    assert compile_stats.size_specializations == 2      # 11 again: the kept compile
    assert dict(compile_stats.symbolic_declines) == {"declined by the test": 1}
    assert "declined by the test" in ember_log.text


def test_a_bug_in_the_symbolic_path_raises_in_tests(monkeypatch):
    from ember.backend import symbolic

    def fails(*args, **kwargs):
        raise ValueError("a bug")
    monkeypatch.setattr(symbolic, "compile_symbolic", fails)
    gm, example = _hand_built(lambda s, x: (x * s,), torch.randn(4, 3), {0})
    with pytest.raises(ValueError, match="a bug"):
        ember_backend(gm, example)
    with config.patch(fallback_on_lowering_error=True):
        compiled = ember_backend(gm, example)
    x = torch.randn(5, 3)
    torch.testing.assert_close(compiled(5, x), (x * 5,))
    assert compile_stats.size_specializations == 1


@pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1")
def test_triton_target_compiles_symbolic_graphs_once():
    # Triton kernels take size arguments too (more: targets/triton_target/
    # test_symbolic_triton.py)
    _reset()
    fn = PROGRAMS["softmax"][0]
    compiled = torch.compile(fn, backend="ember", dynamic=True,
                             options={"cpu_backend": "triton"})
    for n in (11, 17):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x), fn(x))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert dict(compile_stats.symbolic_declines) == {}


def test_module_float_attributes_are_guarded_constants():
    # under dynamic=True torch's frontend passes eps as a 0-dim tensor read by .item()
    _reset()
    norm = torch.nn.LayerNorm(6)
    compiled = torch.compile(norm, backend="ember", dynamic=True)
    for n in (11, 17):
        x = torch.randn(n, 3, 6)
        torch.testing.assert_close(compiled(x), norm(x))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    norm.eps = 0.5
    x = torch.randn(11, 3, 6)
    torch.testing.assert_close(compiled(x), norm(x))


def test_item_of_an_input_is_a_guarded_constant():
    def fn(s, x, eps):
        return (x * eps.item() + s,)

    gm = torch.fx.symbolic_trace(fn)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = fake_mode.from_real(torch.randn(5, 3), dynamic_dims={0}, source="L['x']")
    placeholders[0].meta["val"], placeholders[1].meta["val"] = fake.shape[0], fake
    compiled = ember_backend(gm, [fake.shape[0], torch.randn(5, 3), torch.tensor(0.25)])
    for n, eps in ((5, 0.25), (9, 0.25), (9, 0.5)):
        x, e = torch.randn(n, 3), torch.tensor(eps)
        torch.testing.assert_close(compiled(n, x, e), fn(n, x, e))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 1)


def _train_step(model, x, target):
    out = model(x)
    loss = F.mse_loss(out[0], target)
    loss.backward()         # out[1] gets no gradient: the backward without its part
    return loss.detach(), out[1].detach()


class _TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.a, self.b = torch.nn.Linear(16, 1), torch.nn.Linear(16, 3)

    def forward(self, x):
        h = self.body(x)
        return self.a(h), torch.softmax(self.b(h), -1)


def test_training_graph_compiles_once_for_every_size():
    import copy
    _reset()
    with torch.enable_grad():
        model = _TwoHeads()
        reference = copy.deepcopy(model)
        compiled = torch.compile(model, backend="ember", dynamic=True)
        for n in SIZES:
            x, target = torch.randn(n, 8), torch.randn(n, 1)
            got, want = _train_step(compiled, x, target), _train_step(reference, x, target)
            torch.testing.assert_close(got, want)
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad)
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


def test_graph_cache_keys_on_the_symbolic_program(tmp_path, monkeypatch, ember_log):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EMBER_GRAPH_CACHE", raising=False)
    logs.set_logs("output_code")
    fn = PROGRAMS["slice_by_size"][0]
    for first in (11, 29):     # the second compile sees other sizes: the same entry
        _reset()
        compiled = torch.compile(fn, backend="ember", dynamic=True)
        for n in (first, 17):
            args = PROGRAMS["slice_by_size"][1](n)
            torch.testing.assert_close(compiled(*args), fn(*args))
    hits = [r for r in ember_log.records if "graph cache hit (symbolic" in r.getMessage()]
    assert len({id(r) for r in hits}) == 1      # (the handler may see a record twice)
    assert compile_stats.size_specializations == 0


def test_negative_int_inputs_are_compiled_per_size():
    # size symbols are >= 2: an int input seen negative is no size (compiled per value),
    # and a negative value later fails the symbolic program's guards
    _reset()

    def fn(x, n):
        return x * n + n // 3

    compiled = torch.compile(fn, backend="ember", dynamic=True)
    for n in (-4, 5, -2):
        x = torch.randn(6)
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert compile_stats.symbolic_compiles == 0
    assert [r.endswith("is negative") for r in compile_stats.symbolic_declines] == [True]


def test_debug_option_logs_the_symbolic_program(ember_log):
    _reset()
    compiled = torch.compile(lambda x: x.sum(0), backend="ember", dynamic=True,
                             options={"debug": True})
    x = torch.randn(11, 3)
    torch.testing.assert_close(compiled(x), x.sum(0))
    assert "int64_t s0" in ember_log.text


def test_view_inputs_and_inputs_sharing_memory():
    _reset()
    compiled = torch.compile(lambda x: x * 2 + 1, backend="ember", dynamic=True)
    for n in SIZES:     # a view with an offset: seen from its data pointer
        x = torch.randn(n + 3, 4)[2:, 1:]
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)

    def write_read(x, y):
        x.add_(1)
        return y * 2

    _reset()
    compiled = torch.compile(write_read, backend="ember", dynamic=True)
    for n in SIZES:     # y aliases x: the read sees the write
        base, expected = torch.randn(n, n), None
        ref = base.clone()
        expected = write_read(ref, ref.t())
        torch.testing.assert_close(compiled(base, base.t()), expected)
        torch.testing.assert_close(base, ref)


def test_dynamic_batch_keeps_static_loop_transforms():
    # only the batch is symbolic (torch's automatic dynamic): the 4 x 4 plane still runs
    # as one loop of 16, and a channels-last value is still computed channel-fastest
    _reset()

    def fn(x, b):
        return (x * 2 + b).relu()

    compiled = torch.compile(fn, backend="ember")
    b = torch.randn(8, 1, 1)
    for n in (3, 5, 9):
        x = torch.randn(n, 8, 4, 4)
        xc = x.to(memory_format=torch.channels_last)
        torch.testing.assert_close(compiled(x, b), fn(x, b))
        torch.testing.assert_close(compiled(xc, b), fn(xc, b))
        assert compiled(xc, b).stride() == fn(xc, b).stride()
    kernels = [s for s in pipeline.generated_sources if "int64_t s0" in s]
    assert any("r0 < 16;" in k for k in kernels)                  # h and w merged
    assert any("p_arg1[r0]" in k for k in kernels)                # channels fastest


def test_hand_built_graph_with_shared_symbols_and_strides():
    # Ember's frontend: x and y share the symbol of their equal dim (duck sizing), y is
    # transposed (its strides are expressions), the view's size is an operator on a size
    def fn(s, x, y):
        return ((x + y.t()).reshape(s * 3) * 2,)

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    x, y = torch.randn(6, 3), torch.randn(6, 3).t()
    fx, fy = (mode.from_real(x, dynamic_dims={0}, source="L['x']"),
              mode.from_real(y, dynamic_dims={1}, source="L['y']"))
    assert fy.stride() == (1, 3)
    assert fx.shape[0].node.expr == fy.shape[1].node.expr      # one symbol
    gm = torch.fx.symbolic_trace(fn)
    s_node, x_node, y_node = [n for n in gm.graph.nodes if n.op == "placeholder"]
    s_node.meta["val"], x_node.meta["val"], y_node.meta["val"] = fx.shape[0], fx, fy
    compiled = ember_backend(gm, [fx.shape[0], x, y])
    for n in (6, 13, 20):
        x, y = torch.randn(n, 3), torch.randn(n, 3).t()
        torch.testing.assert_close(compiled(n, x, y), fn(n, x, y))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


def test_two_size_inputs_of_one_symbol():
    # a frontend that equated two sizes (a guard s1 == s0) hands both over as one symbol
    def fn(a, b, x):
        return (x * a + b,)

    env = ShapeEnv()
    fake = FakeTensorMode(shape_env=env).from_real(torch.randn(5), dynamic_dims={0},
                                                   source="L['x']")
    gm = torch.fx.symbolic_trace(fn)
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    nodes[0].meta["val"] = nodes[1].meta["val"] = fake.shape[0]
    nodes[2].meta["val"] = fake
    compiled = ember_backend(gm, [fake.shape[0], fake.shape[0], torch.randn(5)])
    for n in (5, 8):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(n, n, x), fn(n, n, x))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


def test_backend_called_with_some_options_only():
    # ember_backend(gm, inputs, cpu_backend=...) as tests and tools call it: the options
    # not given keep their defaults, as compile_graph's keywords do
    gm, example = _hand_built(lambda s, x: (x * s,), torch.randn(4, 3), {0})
    compiled = ember_backend(gm, example, cpu_backend="cpp")
    x = torch.randn(6, 3)
    torch.testing.assert_close(compiled(6, x), (x * 6,))
    assert compile_stats.symbolic_compiles == 1


@pytest.mark.parametrize("frontend", ["ember", "torch"])
def test_marked_ranges_reach_the_backend(frontend, monkeypatch):
    """``mark_dynamic(min=, max=)`` bounds the backend's symbol too (a choice may rest on
    them: a reduction whose length the range bounds keeps its rows in registers)."""
    from ember.backend import symbolic
    _reset()
    ranges = []
    original = symbolic.symbolic_inputs

    def spy(gm, example_inputs):
        result = original(gm, example_inputs)
        ranges.append([result[0].range_of(s) for s in result[0].symbols])
        return result
    monkeypatch.setattr(symbolic, "symbolic_inputs", spy)

    def fn(x):
        return torch.softmax(x, -1)
    if frontend == "ember":
        compiled, mark = ember.compile(fn, dynamic=False), ember.mark_dynamic
    else:
        compiled, mark = torch.compile(fn, backend="ember"), torch._dynamo.mark_dynamic
    for n in (8, 40, 64):
        x = torch.randn(3, n)
        mark(x, 1, min=4, max=64)
        torch.testing.assert_close(compiled(x), fn(x))
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    ((bounds,),) = ranges
    assert (int(bounds.lower), int(bounds.upper)) == (4, 64)


def test_dead_buffers_of_a_symbolic_size_lend_their_memory():
    # each matmul's product dies at the next one: a buffer of the same size expression
    # takes its memory over instead of a fresh allocation per call, as in static programs
    def fn(x, w):
        for _ in range(3):
            x = torch.relu(x @ w) * 2
        return x

    _reset()
    compiled = torch.compile(fn, backend="ember", dynamic=True)
    w = torch.randn(16, 16)
    for n in SIZES:
        x = torch.randn(n, 16)
        torch.testing.assert_close(compiled(x, w), fn(x, w), rtol=1e-5, atol=1e-5)
    wrapper = next(s for s in reversed(pipeline.generated_sources) if "def call(" in s)
    assert "s0" in wrapper and "# reuse" in wrapper


def test_buffers_kept_between_calls_follow_the_sizes():
    # intermediates are kept between calls at the latest call's sizes (as a static
    # program keeps its own), made again when the sizes change; results never share them
    def fn(x, w):
        h = torch.relu(x @ w)
        return (h @ w).softmax(-1), h.sum(0)

    _reset()
    compiled = torch.compile(fn, backend="ember", dynamic=True)
    w = torch.randn(16, 16)
    results = []
    for n in (11, 17, 11, 5, 17):
        x = torch.randn(n, 16)
        results.append((compiled(x, w), fn(x, w)))
    for got, want in results:      # earlier results are untouched by later calls
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    wrapper = next(s for s in reversed(pipeline.generated_sources) if "def call(" in s)
    assert "_kept_sizes[0] != (s0" in wrapper and "# kept" in wrapper
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


def test_symbolic_program_returns_what_its_graph_returns():
    """A bare tensor, nested containers: shaped as the graph shapes them, compiled once
    (a nested output failed in code generation and fell back to per-size compiles)."""
    def single(s, x):
        return torch.softmax(x, 0)[: s // 2] * s

    def nested(s, x):
        return [x.sin() * s, (x.cos(),)]
    for fn in (single, nested):
        compile_stats.reset()
        gm, example = _hand_built(fn, torch.randn(9, 3), {0})
        compiled = ember_backend(gm, example)
        for n in (9, 14):
            x = torch.randn(n, 3)
            got, want = compiled(n, x), fn(n, x)
            assert type(got) is type(want)
            torch.testing.assert_close(got, want)
        assert compile_stats.symbolic_compiles == 1
        assert compile_stats.size_specializations == 0
