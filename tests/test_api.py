"""The public API: argument checking, decorator forms, caching, reset, disable,
allow_in_graph, compiled modules, recompiles, fullgraph errors, logs and debug dumps."""
import logging
import os

import pytest
import torch

import ember
from ember import config, logs
from ember.frontend.exc import Unsupported
from ember.testing import CompileCounter, same


def add_one(x):
    return x + 1


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


# -- argument checking ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(backend="nope"), ValueError, "unknown backend 'nope'"),
    (dict(backend=3), TypeError, "backend must be"),
    (dict(mode="fastest"), ValueError, "unknown mode 'fastest'"),
    (dict(options={"bogus": True}), ValueError, "unknown option 'bogus'"),
    (dict(options={"freezing": "yes"}), TypeError, "option 'freezing' expects bool"),
    (dict(backend="eager", options={"freezing": True}), ValueError, "only understood"),
    (dict(fullgraph="yes"), TypeError, "fullgraph must be a bool"),
    (dict(dynamic="maybe"), TypeError, "dynamic must be"),
])
def test_bad_arguments_raise_clear_errors(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        ember.compile(add_one, **kwargs)


def test_not_callable_raises_type_error():
    with pytest.raises(TypeError, match="expects a function or an nn.Module, got int"):
        ember.compile(3)


def test_decorator_forms():
    cnt = CompileCounter()

    @ember.compile
    def f(x):
        return x * 2

    @ember.compile(backend=cnt)
    def g(x):
        return x - 1

    x = torch.randn(3)
    assert same(f(x), x * 2)
    assert same(g(x), x - 1)
    assert cnt.frame_count == 1
    assert g.__name__ == "g"


def test_cache_hit_does_not_recompile_and_reset_drops_entries():
    cnt = CompileCounter()
    f = ember.compile(add_one, backend=cnt)
    for _ in range(3):
        f(torch.randn(4))
    assert cnt.frame_count == 1
    ember.reset()
    f(torch.randn(4))
    assert cnt.frame_count == 2


def test_shape_dtype_and_python_value_changes_recompile():
    cnt = CompileCounter()
    f = ember.compile(lambda x, k: x * k, backend=cnt)
    x = torch.randn(4)
    assert same(f(x, 2), x * 2)
    assert same(f(x, 3), x * 3)
    assert same(f(torch.ones(5, dtype=torch.float64), 3), torch.ones(5, dtype=torch.float64) * 3)
    assert cnt.frame_count == 3


SCALE = 2.0


def test_changed_global_recompiles():
    global SCALE
    cnt = CompileCounter()

    def f(x):
        return x * SCALE

    cf = ember.compile(f, backend=cnt)
    x = torch.randn(3)
    assert same(cf(x), x * 2.0)
    SCALE = 5.0
    try:
        assert same(cf(x), x * 5.0)
    finally:
        SCALE = 2.0
    assert cnt.frame_count == 2


def test_cache_size_limit_then_eager_with_warning(caplog):
    cnt = CompileCounter()
    f = ember.compile(lambda x, k: x + k, backend=cnt)
    with config.patch(cache_size_limit=2), caplog.at_level(logging.WARNING, logger="ember"):
        for k in range(4):
            assert same(f(torch.zeros(2), k), torch.zeros(2) + k)
    assert cnt.frame_count == 2
    assert "cache_size_limit (2) reached" in caplog.text


@pytest.fixture
def ember_log(caplog):
    """caplog that also sees Ember's loggers (they do not propagate once EMBER_LOGS is on)."""
    root = logging.getLogger("ember")
    root.addHandler(caplog.handler)
    yield caplog
    root.removeHandler(caplog.handler)
    ember.logs.set_logs("")


def test_recompile_log_names_failing_guard(ember_log):
    caplog = ember_log
    ember.logs.set_logs("recompiles")
    f = ember.compile(add_one, backend="eager")
    with caplog.at_level(logging.INFO, logger="ember"):
        f(torch.randn(3))
        f(torch.randn(3, 2))
    assert "TENSOR_MATCH L['x']" in caplog.text


def test_grad_mode_is_guarded():
    cnt = CompileCounter()
    f = ember.compile(lambda x: x * 2, backend=cnt)
    x = torch.randn(3, requires_grad=True)
    assert f(x).requires_grad
    with torch.no_grad():
        assert not f(x).requires_grad
    assert cnt.frame_count == 2


# -- disable / allow_in_graph ------------------------------------------------------------------

def test_disable_keeps_function_eager_and_caller_falls_back():
    cnt = CompileCounter()

    @ember.disable
    def helper(x):
        return x.sum()

    def f(x):
        return helper(x * 2) + 1

    cf = ember.compile(f, backend=cnt)
    x = torch.randn(3)
    assert same(cf(x), f(x))
    assert cnt.frame_count == 2   # the graph breaks at the call: x * 2, then + 1
    assert same(ember.compile(helper, backend=cnt)(x), x.sum())
    assert cnt.frame_count == 2   # the disabled function itself captured nothing


def test_allow_in_graph_makes_one_node():
    def opaque(x):
        return x.relu() * 3

    ember.allow_in_graph(opaque)
    cnt = CompileCounter()
    f = ember.compile(lambda x: opaque(x) + 1, backend=cnt)
    x = torch.randn(5)
    assert same(f(x), x.relu() * 3 + 1)
    targets = [n.target for n in cnt.graphs[0].graph.nodes if n.op == "call_function"]
    assert opaque in targets
    with pytest.raises(TypeError):
        ember.allow_in_graph(5)


# -- modules -----------------------------------------------------------------------------------

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.scale = 1.5

    def forward(self, x):
        return self.drop(self.fc(x)) * self.scale


def test_compiled_module_behaves_like_the_module():
    net = Net()
    cm = ember.compile(net, backend="eager")
    assert isinstance(cm, torch.nn.Module)
    assert list(cm.state_dict()) == list(net.state_dict())
    assert cm.fc is net.fc and cm.scale == 1.5
    assert [p for p in cm.parameters()] == [p for p in net.parameters()]
    assert cm.eval() is cm and not net.training
    x = torch.randn(2, 4)
    assert same(cm(x), net(x))
    cm.scale = 3.0       # attribute writes reach the module and recompile
    assert net.scale == 3.0
    assert same(cm(x), net(x))


def test_mixin_class_swapped_onto_compiled_module_stays_on_the_wrapper():
    """FSDP2's fully_shard(module) sets ``module.__class__`` to a subclass with its mixin:
    on a compiled module that is the wrapper's class; the original keeps its own."""
    class Mixin:
        def extra(self):
            return "mixin"

    net = Net().eval()
    cm = ember.compile(net, backend="eager")
    cm.__class__ = type("MixedCompiled", (Mixin, type(cm)), {})
    assert type(net) is Net and cm.extra() == "mixin"
    x = torch.randn(2, 4)
    assert same(cm(x), net(x))


def test_training_flag_change_recompiles_not_wrong_answer():
    torch.manual_seed(0)
    net = Net().eval()
    cnt = CompileCounter()
    cm = ember.compile(net, backend=cnt)
    x = torch.randn(64, 4)
    assert same(cm(x), net(x))
    cm.train()
    out = cm(x)
    assert (out == 0).float().mean() > 0.2    # dropout active now
    assert cnt.frame_count == 2


def test_parameters_are_read_at_call_time():
    net = torch.nn.Linear(3, 3)
    cm = ember.compile(net, backend="eager")
    x = torch.randn(2, 3)
    cm(x)
    with torch.no_grad():
        net.weight.mul_(2)
    assert same(cm(x), net(x))


# -- fullgraph, logs, debug dumps --------------------------------------------------------------

def test_fullgraph_raises_with_reason_and_location():
    def f(x):
        print("hi")
        return x + 1

    cf = ember.compile(f, fullgraph=True, backend="eager")
    with pytest.raises(Unsupported, match=r"print.*test_api.py:\d+"):
        cf(torch.randn(2))


def test_graph_log_prints_code(ember_log):
    caplog = ember_log
    ember.logs.set_logs("graph,guards")
    with caplog.at_level(logging.INFO, logger="ember"):
        ember.compile(add_one, backend="eager")(torch.randn(2))
    assert "captured graph of add_one" in caplog.text
    assert "guards of add_one" in caplog.text and "TENSOR_MATCH" in caplog.text


def test_unknown_log_artifact_is_an_error():
    with pytest.raises(ValueError, match="unknown artifacts"):
        ember.logs.set_logs("grpah")


def test_debug_dir_dumps_each_stage(tmp_path):
    with config.patch(debug_dir=str(tmp_path)):
        ember.compile(add_one, backend="eager")(torch.randn(2))
    (frame,) = list(tmp_path.iterdir())
    names = sorted(p.name for p in frame.iterdir())
    assert names == ["entry.py", "entry_bytecode.txt", "graph.py", "guards.txt",
                     "original_bytecode.txt"]
    assert "def add_one(x)" in (frame / "entry.py").read_text()
    assert "BINARY_OP" in (frame / "original_bytecode.txt").read_text()


def test_config_patch_rejects_unknown_and_mistyped():
    with pytest.raises(ValueError, match="unknown ember config option"):
        config.patch(cache_limit=3)
    with pytest.raises(TypeError):
        config.patch(cache_size_limit="3")


def test_config_assignment_is_checked_and_code_shaping_changes_recompile(ember_log):
    logs.set_logs("recompiles")
    cnt = CompileCounter()
    f = ember.compile(add_one, backend=cnt)
    x = torch.randn(4)
    with pytest.raises(TypeError, match="inline_depth_limit"):
        config.inline_depth_limit = "3"
    was = config.inline_depth_limit
    f(x)
    config.cache_size_limit = config.cache_size_limit      # no change: nothing dropped
    f(x)
    assert cnt.frame_count == 1
    try:
        config.inline_depth_limit = was + 1                 # compiled code depends on it
        assert same(f(x), add_one(x))
        assert cnt.frame_count == 2
        assert "config.inline_depth_limit changed" in ember_log.text
        other = "off" if config.layout_optimization != "off" else "auto"
        with config.patch(layout_optimization=other):
            assert same(f(x), add_one(x))
        assert cnt.frame_count == 3
    finally:
        config.inline_depth_limit = was


def test_layout_option_change_takes_effect_on_the_next_call():
    """A convolution compiled NCHW, then under channels_last: the next call's generated
    wrapper converts to channels-last (before, the old entry ran on)."""
    from ember.backend import compile as backend_compile
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), config.patch(layout_optimization="off"):
        f = ember.compile(conv, backend="ember")
        f(x)
        with config.patch(layout_optimization="channels_last"):
            backend_compile.generated_sources.clear()
            assert same(f(x), conv(x), atol=1e-4, rtol=1e-4)
            assert backend_compile.generated_sources, "the option change did not recompile"
            # the input converted to channels-last strides before the convolution
            assert "(192, 1, 24, 3)" in backend_compile.generated_sources[0]


# -- side effects --------------------------------------------------------------------------

class Box:
    def __init__(self):
        self.count = 0


def test_side_effects_are_replayed():
    def f(x, items, box):
        items.append(x * 2)
        box.count = box.count + 1
        box.last = x.sum()
        return x + 1

    cnt = CompileCounter()
    cf = ember.compile(f, backend=cnt)
    x = torch.randn(3)
    items_e, box_e = [], Box()
    items_c, box_c = [], Box()
    out_e = f(x, items_e, box_e)
    out_c = cf(x, items_c, box_c)
    assert same(out_e, out_c) and same(items_e, items_c)
    assert box_c.count == 1 and same(box_c.last, box_e.last)
    assert cnt.frame_count == 1


def test_submodule_hooks_run_eagerly_and_later_hooks_recompile():
    calls = []
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    cnt = CompileCounter()
    cm = ember.compile(net, backend=cnt)
    x = torch.randn(2, 3)
    assert same(cm(x), net(x))
    assert cnt.frame_count == 1
    net[0].register_forward_hook(lambda mod, inp, out: calls.append(1))
    assert same(cm(x), net(x))       # the new hook's guard fails: frame now runs eagerly
    assert len(calls) == 2           # the hook ran for the compiled call too


def test_exception_of_a_frame_run_eagerly_has_no_compiler_context():
    """A frame that cannot be captured runs eagerly; an exception it raises is the user's
    alone (no 'during handling of Unsupported' context in its traceback)."""
    def f(x):
        del_me = 1
        g = lambda: del_me  # noqa: E731  (a cell, deleted below: the frame runs eagerly)
        del del_me
        raise KeyError(x.shape[0])

    with pytest.raises(KeyError) as info:
        ember.compile(f, backend="eager")(torch.randn(2))
    assert info.value.__context__ is None
