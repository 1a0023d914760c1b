"""``ember.compile``'s ``mode=`` and ``options=`` reach the "ember" backend as keywords of
``compile_graph``, or raise (unknown, wrong type, value not allowed, not implemented); and a
lowering that raises is an error under the strict config (the tests') and an ATen fallback
with a warning under the lenient one (the users' default)."""
from __future__ import annotations

import dataclasses
import inspect
import logging

import pytest
import torch

import ember
from ember import config, logs
from ember.backend import compile as backend_compile
from ember.backend import compile_stats
from ember.backend.lowering import LOWERINGS
from ember.backend.options import DEFAULTS, MODES, OPTIONS, resolve_options
from ember.backend_registry import ember_backend

aten = torch.ops.aten


def add_one(x):
    return x + 1


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


# -- the option table and compile_graph agree --------------------------------------------------

def test_compile_graph_takes_exactly_the_options_as_keywords_with_their_defaults():
    params = inspect.signature(backend_compile.compile_graph).parameters
    keywords = {name: p.default for name, p in params.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == DEFAULTS
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name, spec in OPTIONS.items():
        assert spec.doc and isinstance(spec.default, spec.type), name
        assert spec.allowed is None or spec.default in spec.allowed, name


def test_compile_graph_rejects_unknown_options_and_bad_values():
    gm = torch.fx.symbolic_trace(add_one)
    x = torch.randn(3)
    with pytest.raises(TypeError, match="bogus"):
        backend_compile.compile_graph(gm, [x], bogus=True)
    with pytest.raises(ValueError, match="option 'cpu_backend' must be one of 'cpp', 'triton'"):
        backend_compile.compile_graph(gm, [x], cpu_backend="fortran")


# -- mode= and options= reach the backend ------------------------------------------------------

@pytest.mark.parametrize("mode, options, expected", [
    (None, None, {}),
    ("default", None, {}),
    ("reduce-overhead", None, {"cudagraphs": True}),
    (None, {"cudagraphs": True, "debug": True}, {"cudagraphs": True, "debug": True}),
    (None, {"cpu_backend": "cpp"}, {}),
    # explicit options override the mode's
    ("reduce-overhead", {"cudagraphs": False}, {}),
    ("max-autotune", {"max_autotune": False}, {"cudagraphs": True}),
    ("max-autotune-no-cudagraphs", {"max_autotune": False}, {}),
])
def test_mode_and_options_reach_compile_graph(received, mode, options, expected):
    f = ember.compile(add_one, mode=mode, options=options)
    x = torch.randn(3)
    assert torch.equal(f(x), x + 1)
    assert received == [{**DEFAULTS, **expected}]


def test_ember_backend_passed_as_a_callable_takes_options_too(received):
    f = ember.compile(add_one, backend=ember_backend, mode="reduce-overhead")
    f(torch.randn(3))
    assert received == [{**DEFAULTS, "cudagraphs": True}]


def test_mode_table():
    assert MODES == {None: {}, "default": {}, "reduce-overhead": {"cudagraphs": True},
                     "max-autotune": {"max_autotune": True, "cudagraphs": True},
                     "max-autotune-no-cudagraphs": {"max_autotune": True}}
    assert resolve_options("reduce-overhead", {}) == {**DEFAULTS, "cudagraphs": True}


def test_other_backends_keep_the_two_argument_contract():
    seen = []

    def backend(gm, example_inputs):   # no **options: a third-party backend
        seen.append(len(example_inputs))
        return gm.forward
    for mode in (None, "default"):
        ember.reset()
        x = torch.randn(3)
        assert torch.equal(ember.compile(add_one, backend=backend, mode=mode)(x), x + 1)
    assert seen == [1, 1]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", lambda gm, inputs: gm.forward])
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune",
                                  "max-autotune-no-cudagraphs"])
def test_mode_with_another_backend_raises(backend, mode):
    with pytest.raises(ValueError, match=f"mode='{mode}' is only understood by the 'ember' "
                                         f"backend"):
        ember.compile(add_one, backend=backend, mode=mode)


# -- options that do not take effect yet raise; bad values raise ------------------------------

@pytest.fixture
def freezing_unimplemented(monkeypatch):
    """Every option is implemented today: pretend one is not, to test the machinery."""
    monkeypatch.setitem(OPTIONS, "freezing",
                        dataclasses.replace(OPTIONS["freezing"], implemented=False))


@pytest.mark.parametrize("kwargs, words", [
    (dict(options={"freezing": True}), "option 'freezing' is not implemented yet"),
])
def test_unimplemented_options_raise_at_compile_time(kwargs, words, freezing_unimplemented):
    with pytest.raises(NotImplementedError, match=f"ember.compile {words}"):
        ember.compile(add_one, **kwargs)


def test_unimplemented_option_left_at_its_default_is_accepted(received):
    ember.compile(add_one, options={"freezing": False, "max_autotune": False})(torch.randn(2))
    assert received == [DEFAULTS]


@pytest.mark.parametrize("options, exc, words", [
    ({"cpu_backend": "cuda"}, ValueError,
     r"option 'cpu_backend' must be one of 'cpp', 'triton', got 'cuda'"),
    ({"cpu_backend": 1}, TypeError, "option 'cpu_backend' expects str, got int"),
    ({"cudagraphs": 1}, TypeError, "option 'cudagraphs' expects bool, got int"),
    ({"debug": "yes"}, TypeError, "option 'debug' expects bool, got str"),
    ({"fast": True}, ValueError, "unknown option 'fast'; known options: cpu_backend, "
                                 "cudagraphs, debug, eager_choice, fallback_random, freezing, "
                                 "max_autotune"),
    ({"eager_choice": "fast"}, ValueError,
     r"option 'eager_choice' must be one of 'auto', 'timed', 'off', got 'fast'"),
    ({"eager_choice": True}, TypeError, "option 'eager_choice' expects str, got bool"),
    ({"fallback_random": 0}, TypeError, "option 'fallback_random' expects bool, got int"),
    ([("debug", True)], TypeError, "options must be a dict, got list"),
])
def test_bad_option_values_raise(options, exc, words):
    with pytest.raises(exc, match=words):
        ember.compile(add_one, options=options)


# -- what the implemented options do on the CPU ------------------------------------------------

def test_cudagraphs_on_a_cpu_graph_is_a_logged_perf_hint(ember_log):
    logs.set_logs("perf_hints")
    f = ember.compile(add_one, mode="reduce-overhead")
    x = torch.randn(5)
    assert torch.equal(f(x), x + 1)
    assert compile_stats.generated_kernel_count == 1      # still compiled
    assert "CUDA graphs are not used: graph is on cpu" in ember_log.text


def test_debug_logs_the_generated_code_of_that_graph_only(ember_log):
    x = torch.randn(5)
    assert torch.equal(ember.compile(add_one, options={"debug": True})(x), x + 1)
    text = ember_log.text
    assert "wrapper:" in text and "kernels:" in text and "def call(" in text
    assert not logs.enabled("output_code")             # switched off again afterwards
    ember_log.clear()
    ember.compile(lambda t: t * 2)(x)                  # without debug: nothing logged
    assert "wrapper:" not in ember_log.text


# -- lowering errors ---------------------------------------------------------------------------

def _neg(x):
    return torch.neg(x) * 2


@pytest.fixture
def broken_neg(monkeypatch):
    """aten.neg's lowering replaced, for one test, by one that raises ``error``."""
    def install(error):
        def broken_lowering(ctx, x):
            if error is NotImplemented:
                return NotImplemented
            raise error
        monkeypatch.setitem(LOWERINGS, aten.neg.default, broken_lowering)
    return install


def test_lowering_error_raises_under_the_strict_config(broken_neg):
    broken_neg(ValueError("boom"))
    assert not config.fallback_on_lowering_error       # tests/conftest.py
    with pytest.raises(RuntimeError, match=r"the lowering of aten\.neg\.default "
                                           r"\(.*broken_lowering\) raised ValueError: boom") as e:
        ember.compile(_neg)(torch.randn(4))
    assert isinstance(e.value.__cause__, ValueError)


def test_lowering_error_falls_back_with_a_warning_under_the_lenient_config(broken_neg,
                                                                           ember_log):
    broken_neg(TypeError("boom"))
    x = torch.randn(4)
    with config.patch(fallback_on_lowering_error=True):
        out = ember.compile(_neg)(x)
    assert torch.equal(out, -x * 2)
    assert compile_stats.fallback_ops["aten.neg.default"] == 1
    assert compile_stats.generated_kernel_count == 1          # the rest is still compiled
    warnings = [r.getMessage() for r in ember_log.records if r.levelno == logging.WARNING]
    assert any("lowering of aten.neg.default" in w and "TypeError: boom" in w
               for w in warnings), warnings


def test_strict_lowering_error_under_suppress_errors_runs_the_graph_as_captured(broken_neg,
                                                                               ember_log):
    broken_neg(IndexError("boom"))
    x = torch.randn(4)
    with config.patch(suppress_errors=True):
        assert torch.equal(ember.compile(_neg)(x), -x * 2)
    assert compile_stats.generated_kernel_count == 0
    assert "lowering of aten.neg.default" in ember_log.text


@pytest.mark.parametrize("decline", [NotImplementedError("not this case"), NotImplemented],
                         ids=["raises NotImplementedError", "returns NotImplemented"])
def test_a_lowering_that_declines_falls_back_quietly_even_when_strict(broken_neg, ember_log,
                                                                      decline):
    broken_neg(decline)
    logs.set_logs("perf_hints")
    x = torch.randn(4)
    assert torch.equal(ember.compile(_neg)(x), -x * 2)
    assert compile_stats.fallback_ops["aten.neg.default"] == 1
    assert not [r for r in ember_log.records if r.levelno >= logging.WARNING]
    assert "lowering of aten.neg.default declines" in ember_log.text
