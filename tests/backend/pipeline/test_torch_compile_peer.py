"""Ember's backend behind torch.compile's own frontend (the torch_dynamo_backends entry
point): graphs TorchDynamo captures compile to Ember kernels with eager's results."""
import importlib.metadata

import pytest
import torch

import ember
from ember.backend import compile_stats
from ember.backend.options import resolve_options
from ember.backend_registry import ember_backend


def _entry_point_registered() -> bool:
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    return any(ep.name == "ember" for ep in eps)


@pytest.mark.slow
def test_torch_compile_with_ember_backend_matches_eager():
    torch._dynamo.reset()
    compile_stats.reset()

    def f(x, y):
        return torch.softmax(x * y + 1, -1).sum(0)

    x, y = torch.randn(8, 32), torch.randn(8, 32)
    with torch.no_grad():
        out = torch.compile(f, backend=ember_backend, dynamic=False)(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert compile_stats.generated_kernel_count >= 1


@pytest.mark.slow
@pytest.mark.skipif(not _entry_point_registered(), reason="package not installed (pip -e .)")
def test_backend_is_found_by_name_through_the_entry_point():
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(lambda t: (t + 1).relu(), backend="ember", dynamic=False)(
            torch.randn(5))
    assert out.shape == (5,)


def test_inputs_of_unknown_types_are_refused_with_a_clear_error():
    # (SymInt inputs compile: tests/backend/dynamic/)
    gm = torch.fx.symbolic_trace(lambda x, n: x * n)
    with pytest.raises(NotImplementedError, match="input of type _Unknown"):
        ember_backend(gm, [torch.randn(3), _Unknown()])


class _Unknown:
    """A graph input of a type no frontend passes."""


# -- torch.compile's mode= and options= ---------------------------------------------------------
# torch.compile hands every backend its mode= and options= as keywords (when set); the ember
# backend resolves and checks them with ember.compile's own function (resolve_options).

def _add_one(x):
    return x + 1


def _ember_by_name():
    return "ember" if _entry_point_registered() else ember_backend


@pytest.fixture
def dynamo_reset():
    """torch.compile's caches emptied before and after (``received``, in
    tests/backend/conftest.py, must see each compile)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kwargs", [
    dict(mode="reduce-overhead"), dict(mode="max-autotune"),
    dict(mode="max-autotune-no-cudagraphs"), dict(mode="default"),
    dict(options={"debug": True, "fallback_random": False}),
    dict(options={"cpu_backend": "triton", "max_autotune": True})],
    ids=lambda kwargs: str(kwargs))
def test_torch_compile_mode_and_options_reach_the_backend_as_from_ember_compile(
        received, dynamo_reset, kwargs):
    x = torch.randn(3)
    with torch.no_grad():
        assert torch.equal(torch.compile(_add_one, backend=_ember_by_name(), dynamic=False,
                                         **kwargs)(x), x + 1)
        ember.reset()
        assert torch.equal(ember.compile(_add_one, **kwargs)(x), x + 1)
    through_torch, through_ember = received
    assert through_torch == through_ember
    assert through_torch == resolve_options(kwargs.get("mode"), kwargs.get("options"))


@pytest.mark.parametrize("kwargs", [dict(mode="reduce-overhead"),
                                    dict(options={"cpu_backend": "triton"})],
                         ids=["reduce-overhead", "triton"])
def test_torch_compile_with_mode_or_options_compiles_with_ember(kwargs):
    torch._dynamo.reset()
    compile_stats.reset()

    def f(x):
        return torch.softmax(x * 2 + 1, -1)
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = torch.compile(f, backend=_ember_by_name(), dynamic=False, **kwargs)(x)
    torch.testing.assert_close(out, f(x))
    assert compile_stats.generated_kernel_count >= 1


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(options={"fast": True}), ValueError, "unknown option 'fast'; known options: "),
    (dict(options={"cpu_backend": "fortran"}), ValueError,
     "option 'cpu_backend' must be one of 'cpp', 'triton', got 'fortran'"),
    (dict(options={"cudagraphs": 1}), TypeError, "option 'cudagraphs' expects bool, got int"),
    (dict(mode="fastest"), ValueError, "unknown mode 'fastest'; known modes: "),
])
def test_torch_compile_bad_mode_or_options_raise_ember_compiles_errors(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        ember.compile(_add_one, **kwargs)
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(_add_one, backend=_ember_by_name(), dynamic=False, **kwargs)(
            torch.randn(3))
    # torch.compile wraps a backend's error (BackendCompilerFailed) and keeps it
    error = getattr(info.value, "inner_exception", info.value)
    assert type(error) is exc and words in str(error), info.value


def test_backend_called_with_mode_and_options_keywords(received, dynamo_reset):
    gm = torch.fx.symbolic_trace(_add_one)
    x = torch.randn(3)
    assert torch.equal(ember_backend(gm, [x], mode="reduce-overhead")(x), x + 1)
    assert ember_backend(gm, [x], options={"debug": True})(x).shape == (3,)
    assert received == [resolve_options("reduce-overhead", None),
                        resolve_options(None, {"debug": True})]
    with pytest.raises(TypeError, match="options must be a dict, got list"):
        ember_backend(gm, [x], options=[("debug", True)])
    with pytest.raises(TypeError, match="got mode=/options= and resolved options"):
        ember_backend(gm, [x], mode="reduce-overhead", debug=True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_data_dependent_op_runs_as_captured(dynamic):
    # torch.compile's frontend keeps histogram in the graph; its output sizes depend on
    # the data, which the backend's fakes do not have: the graph runs as captured
    torch._dynamo.reset()

    def f(x):
        return torch.histogram(x * 2, 5)

    for n in (20, 31):
        x = torch.randn(n)
        got = torch.compile(f, backend=ember_backend, dynamic=dynamic)(x)
        want = f(x)
        torch.testing.assert_close(got.hist, want.hist)
        torch.testing.assert_close(got.bin_edges, want.bin_edges)
